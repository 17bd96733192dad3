"""Requests that expand in memory, end to end: the issue's three bodies (a 1 MiB KServe v1
body of 262,000 instances, 40,000 one-element gRPC inputs, 16,000 REST inputs) and an answer
over ``max_response_size`` are refused with 413 / RESOURCE_EXHAUSTED naming the setting,
while the server's and the workers' memory stays put, no worker is restarted, and a normal
request is answered right after; raising the setting lets such a request through.

Before the limits, the v1 body grew its worker by ~720 MiB and got it killed ("malformed or
oversized frame"), the gRPC inputs grew the server and the worker by ~110 MiB each, the REST
inputs by ~40 MiB each (peaks measured as here)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import psutil
import pytest

from trioserve._proto.inference import (
    InferTensorContents,
    ModelInferRequest,
    ModelInferRequestInferInputTensor,
)

from .server import HANDLERS, Server, archive, running

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20
# Peak RSS growth allowed while a hostile request is refused: to the server (which parses
# the request before it can count what is in it: ~30 MiB for the v1 body), and to each worker
# (which never sees it). A gRPC message's inputs are counted on the wire before it is
# decoded (core/protowire.py's caps), so it costs the server little more than its bytes:
# before that count, the 1.3 MiB of 40,000 inputs decoded to ~40 MiB of objects.
SERVER_BOUND = 50 * MIB
GRPC_SERVER_BOUND = 16 * MIB
WORKER_BOUND = 16 * MIB
INFER = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("limits-store")
    archive(path, "echo", str(REPO / "handlers" / "echo" / "echo_handler.py"))
    config = HANDLERS / "oip-config.yaml"  # batchSize 4
    archive(path, "oip", str(HANDLERS / "oip_handler.py"), "-c", str(config))
    return path


@pytest.fixture(scope="module")
def server(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Default request limits; answers up to 1 MiB (so the oip model's frame limit is 5 MiB:
    one answer of 6 MiB would have been refused by the server and its worker restarted)."""
    workdir = tmp_path_factory.mktemp("limits")
    properties = {"max_response_size": str(MIB)}
    with running(Server(workdir, store, "echo.mar,oip.mar", properties=properties)) as server:
        yield server


class PeakRss:
    """The peak RSS growth of some processes while a block runs, sampled every few ms."""

    def __init__(self, pids: list[int]) -> None:
        self._procs = [psutil.Process(pid) for pid in pids]
        self._base = [p.memory_info().rss for p in self._procs]
        self._peak = list(self._base)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            for i, proc in enumerate(self._procs):
                try:
                    self._peak[i] = max(self._peak[i], proc.memory_info().rss)
                except psutil.NoSuchProcess:
                    pass
            self._stop.wait(0.002)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def growth(self) -> list[int]:
        return [peak - base for peak, base in zip(self._peak, self._base, strict=True)]


def refused_and_unharmed(
    server: Server, send: Callable[[], Any], server_bound: int = SERVER_BOUND
) -> Any:
    """Run ``send`` watching the server's and the workers' memory; check that their peaks
    grew less than ``server_bound`` and WORKER_BOUND, that the same workers still run and
    still answer; return what ``send`` returned."""
    workers = sorted(server.worker_pids())
    assert len(workers) == 2
    assert server.process is not None
    with PeakRss([server.process.pid, *workers]) as rss:
        result = send()
    grown = rss.growth()
    shown = [f"{g / MIB:.1f} MiB" for g in grown]
    assert grown[0] < server_bound and max(grown[1:]) < WORKER_BOUND, shown
    assert sorted(server.worker_pids()) == workers, "a worker was restarted"
    assert_answers_normally(server)
    return result


def assert_answers_normally(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        r = http.post("/v1/models/echo:predict", json={"instances": [1, [2, 3]]})
        assert (r.status_code, r.json()) == (200, {"predictions": [1, [2, 3]]})
        body = {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}
        r = http.post("/v2/models/oip/infer", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == [2.0, 4.0]


def assert_names_the_setting(message: str, setting: str, count: str) -> None:
    assert setting in message and count in message, message


def test_a_1_mib_v1_body_of_262000_instances_is_a_413(server: Server) -> None:
    body = b'{"instances":[' + b",".join([b"[0]"] * 262_000) + b"]}"
    assert len(body) <= MIB

    def send() -> httpx.Response:
        headers = {"content-type": "application/json"}
        url = f"{server.url}/v1/models/echo:predict"
        return httpx.post(url, content=body, headers=headers, timeout=60)

    r = refused_and_unharmed(server, send)
    assert r.status_code == 413, r.text[:300]
    assert_names_the_setting(r.json()["error"], "max_request_instances", "262000 instances")


def test_16000_rest_inputs_are_a_413(server: Server) -> None:
    body = rest_inputs(16_000)
    assert len(body) <= 1.1 * MIB

    def send() -> httpx.Response:
        url = f"{server.url}/v2/models/oip/infer"
        return httpx.post(url, content=body, headers={"content-type": "application/json"})

    r = refused_and_unharmed(server, send)
    assert r.status_code == 413, r.text[:300]
    assert_names_the_setting(r.json()["error"], "max_request_inputs", "16000 inputs")


def test_40000_one_element_grpc_inputs_are_resource_exhausted(server: Server) -> None:
    message = ModelInferRequest(
        model_name="oip",
        inputs=[
            ModelInferRequestInferInputTensor(
                name=f"i{i}",
                datatype="FP32",
                shape=[1],
                contents=InferTensorContents(fp32_contents=[1.0]),
            )
            for i in range(40_000)
        ],
    )
    data = bytes(message)
    assert len(data) <= 1.3 * MIB

    def send() -> grpc.RpcError:
        with grpc.insecure_channel(server.grpc_target) as channel:
            call = channel.unary_unary(INFER, request_serializer=bytes, response_deserializer=bytes)
            with pytest.raises(grpc.RpcError) as excinfo:
                call(data, timeout=60)
        return excinfo.value

    error = refused_and_unharmed(server, send, GRPC_SERVER_BOUND)
    assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, error
    # Counted on the wire, before decoding: the count stops one past the limit.
    assert_names_the_setting(error.details(), "max_request_inputs", "more than 2048 entries")


def test_an_answer_over_max_response_size_is_a_413_not_a_restarted_worker(
    server: Server,
) -> None:
    """The oip model doubles 786,432 FP32 values into FP64: a 6 MiB answer, more than the
    1 MiB max_response_size, and more than the 5 MiB frame the server reads from a worker of
    batchSize 4 (which used to restart the worker)."""
    count = 3 * MIB // 4
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": [count],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 4 * count},
                }
            ]
        }
    ).encode()
    workers = sorted(server.worker_pids())
    r = httpx.post(
        f"{server.url}/v2/models/oip/infer",
        content=head + bytes(4 * count),
        headers={"inference-header-content-length": str(len(head))},
        timeout=60,
    )
    assert r.status_code == 413, r.text[:300]
    assert_names_the_setting(r.json()["error"], "max_response_size", f"{8 * count} bytes")
    assert sorted(server.worker_pids()) == workers
    assert_answers_normally(server)


def rest_inputs(count: int) -> bytes:
    inputs = [
        {"name": f"i{i}", "shape": [1], "datatype": "FP32", "data": [1]} for i in range(count)
    ]
    return json.dumps({"inputs": inputs}, separators=(",", ":")).encode()


def test_raising_the_setting_lets_the_request_through(
    store: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """max_request_inputs raised by its TS_ variable: the 16,000 inputs are answered."""
    workdir = tmp_path_factory.mktemp("limits-raised")
    raised = Server(
        workdir,
        store,
        "oip.mar",
        properties={"enable_envvars_config": "true"},
        env={"TS_MAX_REQUEST_INPUTS": "16000"},
    )
    with running(raised):
        started = time.monotonic()
        r = httpx.post(
            f"{raised.url}/v2/models/oip/infer",
            content=rest_inputs(16_000),
            headers={"content-type": "application/json"},
            timeout=120,
        )
        assert r.status_code == 200, (r.text[:300], time.monotonic() - started)
        outputs = r.json()["outputs"]
        assert len(outputs) == 16_000 and outputs[-1]["data"] == [2.0]
