"""Triton's client tools against a real trioserve (docs/triton.md): ``perf_analyzer`` over
REST, gRPC and gRPC ``--streaming``, and Triton's model configuration and statistics
extensions read with tritonclient (REST and gRPC), with real workers.

perf_analyzer comes from scripts/get_perf_analyzer.sh (``make setup`` runs it); the tests
skip only when the binary is there but cannot run on this machine (say, Debian's libb64-0d
is missing), with its own error as the reason.

A little over 400 lines: perf_analyzer's runs and the configuration and statistics they read
share one module-scoped server (one start of six models with real workers), so they stay
in one module."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from .server import Server, archive

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
PERF_ANALYZER = REPO / ".tools" / "perf_analyzer" / "perf_analyzer"
# tritonclient 2.48.0's binary: its OpenAI service kind is what genai-perf drives.
PERF_ANALYZER_OPENAI = REPO / ".tools" / "perf_analyzer" / "perf_analyzer_openai"
MLSERVER_MODELS = Path(__file__).parent / "mlserver_models"
HANDLERS = Path(__file__).parent / "handlers"
# perf_analyzer finds a model's statistics under an integer version: the models run as "1".
VERSION = "1"
WINDOW = 20  # requests per measurement window


@pytest.fixture(scope="module")
def perf_analyzer() -> Path:
    if not (PERF_ANALYZER.exists() and PERF_ANALYZER_OPENAI.exists()):
        subprocess.run([str(REPO / "scripts" / "get_perf_analyzer.sh")], check=True, timeout=300)
    probe = subprocess.run(
        [str(PERF_ANALYZER), "--version"], capture_output=True, text=True, timeout=30
    )
    if "error while loading shared libraries" in probe.stderr:
        pytest.skip(f"perf_analyzer cannot run on this machine: {probe.stderr.strip()}")
    return PERF_ANALYZER


def _folder_model(store: Path, source: Path, name: str) -> None:
    shutil.copytree(source, store / name)
    path = store / name / "model-settings.json"
    settings = json.loads(path.read_text())
    settings.setdefault("parameters", {})["version"] = VERSION
    path.write_text(json.dumps(settings))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    store = tmp_path_factory.mktemp("triton-store")
    _folder_model(store, MLSERVER_MODELS / "doubler", "doubler")
    _folder_model(store, MLSERVER_MODELS / "batcher", "batcher")
    _folder_model(store, REPO / "handlers" / "textgen", "textgen")
    archive(store, "tensor", "tensor_handler.py", "-c", str(HANDLERS / "tensor-config.yaml"))
    archive(store, "stateful", "stateful_handler.py", "-c", str(HANDLERS / "stateful-config.yaml"))
    # A TorchServe handler that declares no tensorInputs.
    archive(
        store, "oip", "oip_handler.py", "-c", str(HANDLERS / "oip-config.yaml"), version=VERSION
    )
    server = Server(
        tmp_path_factory.mktemp("triton"),
        store,
        "doubler=doubler,batcher=batcher,textgen=textgen,tensor=tensor.mar,stateful=stateful.mar,"
        "oip=oip.mar",
        # perf_analyzer's --streaming decodes Triton's ModelStreamInferResponse.
        properties={"oip_grpc_stream_shape": "triton"},
    )
    server.start()
    yield server
    server.stop()
    server.kill()


def _host(url: str) -> str:
    return url.removeprefix("http://")


def run_perf_analyzer(binary: Path, *args: str, succeeds: bool = True) -> str:
    result = subprocess.run(
        [
            str(binary),
            *args,
            "--measurement-mode",
            "count_windows",
            "--measurement-request-count",
            str(WINDOW),
            "--stability-percentage",
            "50",
            "--max-trials",
            "10",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert (result.returncode == 0) is succeeds, output
    print(output)  # shown with -s, and on failure
    return output


def client_count(output: str) -> int:
    found = re.search(r"Client:\s*\n\s*Request count: (\d+)", output)
    assert found is not None, output
    return int(found.group(1))


def server_counts(output: str) -> tuple[int, int, int]:
    """(inference count, execution count, successful requests) of the last window, which
    perf_analyzer computed from trioserve's statistics."""
    found = re.search(
        r"Server:\s*\n\s*Inference count: (\d+)\s*\n\s*Execution count: (\d+)\s*\n"
        r"\s*Successful request count: (\d+)",
        output,
    )
    assert found is not None, output
    inferences, executions, successes = map(int, found.groups())
    return inferences, executions, successes


def http_stats(server: Server, model: str) -> dict[str, Any]:
    client = triton_http.InferenceServerClient(_host(server.url))
    try:
        stats = client.get_inference_statistics(model, VERSION)
    finally:
        client.close()
    (entry,) = stats["model_stats"]
    return dict(entry)


def delta(before: dict[str, Any], after: dict[str, Any], *keys: str) -> int:
    """How much the statistic at ``keys`` grew."""
    old, new = before, after
    for key in keys:
        old, new = old[key], new[key]
    return int(new) - int(old)


# -- perf_analyzer ----------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_measures_a_model_over(
    perf_analyzer: Path, server: Server, protocol: str
) -> None:
    url = _host(server.url) if protocol == "http" else server.grpc_target
    before = http_stats(server, "doubler")
    output = run_perf_analyzer(
        perf_analyzer, "-m", "doubler", "-u", url, "-i", protocol, "--shape", "x:1,3"
    )
    count = client_count(output)
    assert count >= WINDOW
    # The server side of the last window is trioserve's statistics, read when the window
    # opened and closed: the same requests, give or take the one in flight at either end
    # (whose batch may be counted and its answer not read yet).
    inferences, executions, successes = server_counts(output)
    assert inferences == executions  # concurrency 1: batches of one request
    assert abs(successes - inferences) <= 1
    assert abs(successes - count) <= 2
    after = http_stats(server, "doubler")
    sent = (
        after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    )
    assert sent >= count  # warm-up and every window, the last one included
    assert after["inference_count"] - before["inference_count"] == sent
    assert after["inference_stats"]["fail"]["count"] == before["inference_stats"]["fail"]["count"]


def test_perf_analyzer_streams_a_decoupled_model_over_grpc(
    perf_analyzer: Path, server: Server, tmp_path: Path
) -> None:
    data = tmp_path / "prompts.json"
    data.write_text(json.dumps({"data": [{"prompt": ["the quick brown fox"]}]}))
    before = http_stats(server, "textgen")
    output = run_perf_analyzer(
        perf_analyzer,
        "-m", "textgen", "-x", VERSION, "-u", server.grpc_target, "-i", "grpc", "--streaming",
        "--input-data", str(data), "--request-parameter", "max_tokens:1:int",
    )  # fmt: skip
    assert "Detected decoupled model" in output
    assert client_count(output) >= WINDOW
    # The stream is one request of the model (docs/triton.md); perf_analyzer ends it by
    # cancelling the call rather than half-closing it: one failed request, counted once the
    # server has seen the cancellation (which may come after perf_analyzer's exit).
    deadline = time.monotonic() + 10
    after = http_stats(server, "textgen")
    while delta(before, after, "inference_stats", "fail", "count") == 0:
        assert time.monotonic() < deadline, after
        time.sleep(0.05)
        after = http_stats(server, "textgen")
    assert delta(before, after, "inference_stats", "success", "count") == 0


def test_a_half_closed_stream_to_an_mlserver_model_is_one_successful_request(
    server: Server,
) -> None:
    before = http_stats(server, "textgen")
    answers: list[Any] = []
    client = triton_grpc.InferenceServerClient(server.grpc_target)
    try:
        client.start_stream(callback=lambda result, error: answers.append(error or result))
        for prompt in (b"one two three", b"four five"):
            tensor = triton_grpc.InferInput("prompt", [1], "BYTES")
            tensor.set_data_from_numpy(np.array([prompt], dtype=np.object_))
            client.async_stream_infer("textgen", [tensor], parameters={"max_tokens": 2})
        client.stop_stream()  # half-closes, then waits for the stream's end
    finally:
        client.close()
    assert answers and not any(isinstance(a, Exception) for a in answers), answers
    after = http_stats(server, "textgen")
    assert delta(before, after, "inference_stats", "success", "count") == 1
    assert delta(before, after, "inference_stats", "fail", "count") == 0
    assert delta(before, after, "inference_count") == delta(before, after, "execution_count") == 1


def test_perf_analyzer_stops_clearly_when_a_model_declares_no_inputs(
    perf_analyzer: Path, server: Server
) -> None:
    """Its configuration has no input, so perf_analyzer sends requests without inputs, which
    REST refuses: it stops at once, naming what is missing (docs/triton.md)."""
    for config in both_configs(server, "oip", VERSION):
        assert config.get("input", []) == []
    output = run_perf_analyzer(perf_analyzer, "-m", "oip", "-u", _host(server.url), succeeds=False)
    assert "inputs is required" in output


def test_perf_analyzer_with_token_authorization(
    perf_analyzer: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """REST takes the inference key as a header (-H, on every request perf_analyzer makes);
    perf_analyzer 2.41 sends no header over gRPC, so there it is refused (docs/triton.md)."""
    store = tmp_path_factory.mktemp("token-store")
    _folder_model(store, MLSERVER_MODELS / "doubler", "doubler")
    server = Server(tmp_path_factory.mktemp("token"), store, "doubler=doubler", tokens=True)
    server.start()
    try:
        key = f"Authorization:Bearer {server.key('inference')}"
        output = run_perf_analyzer(
            perf_analyzer, "-m", "doubler", "-u", _host(server.url), "--shape", "x:1,3", "-H", key
        )
        assert client_count(output) >= WINDOW
        refused = run_perf_analyzer(
            perf_analyzer,
            *("-m", "doubler", "-u", server.grpc_target, "-i", "grpc", "--shape", "x:1,3"),
            succeeds=False,
        )
        assert "Token Authorization failed" in refused
    finally:
        server.stop()
        server.kill()


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_perf_analyzers_openai_service_kind_measures_chat_completions(
    perf_analyzer: Path, server: Server, tmp_path: Path, stream: bool
) -> None:
    """What genai-perf runs against an OpenAI endpoint: perf_analyzer's ``openai`` service
    kind posting the payloads it is given to ``/v1/chat/completions`` (SSE when they ask for a
    stream) and counting the answers."""
    payload = {"model": "textgen", "messages": [{"role": "user", "content": "hello"}],
               "max_tokens": 8, "stream": stream}  # fmt: skip
    data = tmp_path / "payloads.json"
    data.write_text(json.dumps({"data": [{"payload": [payload]}]}))
    output = run_perf_analyzer(
        PERF_ANALYZER_OPENAI,
        "-m", "textgen", "--service-kind", "openai", "--endpoint", "v1/chat/completions",
        "-u", _host(server.url), "-i", "http", "--async", "--input-data", str(data),
    )  # fmt: skip
    assert "Service Kind: OPENAI" in output
    assert client_count(output) >= WINDOW


# -- the configuration extension ------------------------------------------------------


def test_server_metadata_advertises_the_extensions(server: Server) -> None:
    http = triton_http.InferenceServerClient(_host(server.url))
    grpc = triton_grpc.InferenceServerClient(server.grpc_target)
    try:
        for extensions in (
            http.get_server_metadata()["extensions"],
            grpc.get_server_metadata(as_json=True)["extensions"],
        ):
            assert {"model_configuration", "statistics"} <= set(extensions)
    finally:
        http.close()
        grpc.close()


def both_configs(server: Server, model: str, version: str = "") -> list[dict[str, Any]]:
    """The model's configuration over REST and over gRPC (decoded by tritonclient's own
    model_config_pb2, then as JSON), which must agree."""
    http = triton_http.InferenceServerClient(_host(server.url))
    grpc = triton_grpc.InferenceServerClient(server.grpc_target)
    try:
        rest = http.get_model_config(model, version)
        wire = grpc.get_model_config(model, version, as_json=True)["config"]
    finally:
        http.close()
        grpc.close()
    return [rest, wire]


def _dims(tensor: dict[str, Any]) -> list[int]:
    return [int(d) for d in tensor["dims"]]  # protobuf's JSON writes int64 as strings


def test_config_of_a_model_declaring_its_tensors(server: Server) -> None:
    for config in both_configs(server, "doubler", VERSION):
        assert config["name"] == "doubler"
        assert config["platform"] == "numpy"
        assert config["backend"] == "mlserver"
        assert config.get("max_batch_size", 0) == 0
        (tensor,) = config["input"]
        assert (tensor["name"], tensor["data_type"], _dims(tensor)) == ("x", "TYPE_FP32", [-1, 3])
        (output,) = config["output"]
        assert (output["name"], output["data_type"], _dims(output)) == ("x", "TYPE_FP32", [-1, 3])
        # Its runtime keeps MLModel's predict_stream: one answer per request.
        assert config.get("model_transaction_policy", {}).get("decoupled", False) is False
        assert "dynamic_batching" not in config


def test_config_of_a_streaming_mlserver_model(server: Server) -> None:
    for config in both_configs(server, "textgen", VERSION):
        # Its runtime overrides predict_stream, as its worker said when it loaded.
        assert config["model_transaction_policy"]["decoupled"] is True
        (prompt,) = config["input"]
        assert (prompt["name"], prompt["data_type"], _dims(prompt)) == (
            "prompt",
            "TYPE_STRING",
            [1],
        )


def test_config_of_an_adaptively_batched_mlserver_model(server: Server) -> None:
    for config in both_configs(server, "batcher"):
        assert config["max_batch_size"] == 8
        assert int(config["dynamic_batching"]["max_queue_delay_microseconds"]) == 200_000


def test_config_of_a_batching_torchserve_model(server: Server) -> None:
    for config in both_configs(server, "tensor"):
        assert config["backend"] == "torchserve"
        assert config["platform"] == "pytorch_torchserve"
        # A request never holds the batch dimension: the whole declared shape, no batching.
        assert config.get("max_batch_size", 0) == 0
        (tensor,) = config["input"]
        assert (tensor["data_type"], _dims(tensor)) == ("TYPE_FP32", [-1, 2])
        assert int(config["dynamic_batching"]["max_queue_delay_microseconds"]) == 2_000_000
        assert config.get("model_transaction_policy", {}).get("decoupled", False) is False


def test_config_of_a_stateful_model(server: Server) -> None:
    for config in both_configs(server, "stateful"):
        assert "sequence_batching" in config
        assert "dynamic_batching" not in config
        assert config.get("input", []) == []


def test_config_of_an_unknown_model_is_not_found(server: Server) -> None:
    http = triton_http.InferenceServerClient(_host(server.url))
    grpc = triton_grpc.InferenceServerClient(server.grpc_target)
    try:
        with pytest.raises(Exception, match="nosuch"):
            http.get_model_config("nosuch")
        with pytest.raises(Exception, match="nosuch"):
            grpc.get_model_config("nosuch")
    finally:
        http.close()
        grpc.close()


# -- the statistics extension -----------------------------------------------------------


def test_statistics_count_the_requests_sent(server: Server) -> None:
    http = triton_http.InferenceServerClient(_host(server.url))
    grpc = triton_grpc.InferenceServerClient(server.grpc_target)
    try:
        before = http.get_inference_statistics("tensor")["model_stats"][0]
        data = np.ones((1, 2), dtype=np.float32)
        for client, module in ((http, triton_http), (grpc, triton_grpc)):
            for _ in range(3):
                tensor = module.InferInput("body", [1, 2], "FP32")
                tensor.set_data_from_numpy(data)
                client.infer("tensor", [tensor])
        rest = http.get_inference_statistics("tensor")["model_stats"][0]
        wire = grpc.get_inference_statistics("tensor", as_json=True)["model_stats"][0]
        every = http.get_inference_statistics()["model_stats"]
    finally:
        http.close()
        grpc.close()

    def delta(after: dict[str, Any], *keys: str) -> int:
        value, start = after, before
        for key in keys:
            value, start = value[key], start[key]
        return int(value) - int(start)

    for after in (rest, wire):
        assert delta(after, "inference_stats", "success", "count") == 6
        assert delta(after, "inference_stats", "queue", "count") == 6
        assert delta(after, "inference_stats", "compute_infer", "count") == 6
        assert delta(after, "inference_count") == 6
        assert 1 <= delta(after, "execution_count") <= 6
        assert int(after["inference_stats"]["success"]["ns"]) > int(
            after["inference_stats"]["queue"]["ns"]
        )
        assert int(after["last_inference"]) > 0
        sizes = {
            int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in after["batch_stats"]
        }
        assert sum(size * count for size, count in sizes.items()) == int(after["inference_count"])
    assert {(e["name"], e["version"]) for e in every} >= {
        ("doubler", VERSION),
        ("tensor", "1.0"),
        ("stateful", "1.0"),
    }


def test_a_refused_request_counts_as_a_failure(server: Server) -> None:
    client = triton_http.InferenceServerClient(_host(server.url))
    try:
        before = client.get_inference_statistics("tensor")["model_stats"][0]
        tensor = triton_http.InferInput("body", [1, 3], "FP32")  # rows of 2 declared
        tensor.set_data_from_numpy(np.ones((1, 3), dtype=np.float32))
        with pytest.raises(Exception, match="body"):
            client.infer("tensor", [tensor])
        after = client.get_inference_statistics("tensor")["model_stats"][0]
    finally:
        client.close()
    assert after["inference_stats"]["fail"]["count"] == (
        before["inference_stats"]["fail"]["count"] + 1
    )
    assert after["inference_stats"]["success"] == before["inference_stats"]["success"]
    assert after["last_inference"] >= before["last_inference"]
