"""Streaming MLServer models end to end: ``predict_stream`` in a real worker, streamed over
SSE (``infer_stream`` / ``generate_stream``) and gRPC ``ModelStreamInfer`` (stream in and
out), cancelled all the way into the model's generator when the client goes away
(tests/e2e/mlserver_models/streamer)."""

from __future__ import annotations

import json
import shutil
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import httpx
import psutil
import pytest

from trioserve._proto.inference import (
    InferParameter,
    InferTensorContents,
    ModelInferRequest,
    ModelInferRequestInferInputTensor,
    ModelInferResponse,
    ModelStreamInferResponse,
)

from .server import Server, running
from .test_mlserver_models import mlserver_client

pytestmark = pytest.mark.e2e

MODELS = Path(__file__).parent / "mlserver_models"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    store = tmp_path_factory.mktemp("stream-store")
    for name in ("streamer", "doubler", "batcher"):
        shutil.copytree(MODELS / name, store / name)
    # The streamer again, with merge_stream_replies on.
    shutil.copytree(MODELS / "streamer", store / "merger")
    settings = json.loads((store / "merger" / "model-settings.json").read_text())
    settings["name"] = "merger"
    settings["parameters"]["merge_stream_replies"] = True
    (store / "merger" / "model-settings.json").write_text(json.dumps(settings))
    work = tmp_path_factory.mktemp("stream")
    (work / "markers").mkdir()
    server = Server(
        work, store, "streamer=streamer,doubler=doubler,batcher=batcher,merger=merger",
        env={"TRIOSERVE_TEST_MARKERS": str(work / "markers")},
    )  # fmt: skip
    server.start()
    yield server
    server.stop()
    server.kill()


def text_request(text: str, request_id: str, **parameters: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": request_id,
        "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [text]}],
    }
    if parameters:
        body["parameters"] = parameters
    return body


def events(response: httpx.Response) -> Iterator[tuple[str, Any]]:
    """``(event name, data)`` of each SSE event, as they arrive."""
    name = "message"
    for line in response.iter_lines():
        if line.startswith("event:"):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("data:"):
            yield name, json.loads(line.split(":", 1)[1])
            name = "message"


def wait_for(path: Path, timeout: float = 5.0) -> float:
    began = time.monotonic()
    while not path.exists():
        assert time.monotonic() - began < timeout, f"{path.name} was not written"
        time.sleep(0.01)
    return time.monotonic() - began


@pytest.mark.parametrize("route", ["generate_stream", "infer_stream"])
def test_sse_streams_one_event_per_yielded_response(server: Server, route: str) -> None:
    body = text_request("the quick brown fox", f"sse-{route}")
    with httpx.stream("POST", f"{server.url}/v2/models/streamer/{route}", json=body,
                      timeout=30) as response:  # fmt: skip
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        got = list(events(response))
    assert [name for name, _ in got] == ["message"] * 4
    assert [data["outputs"][0]["data"] for _, data in got] == [
        ["the"],
        ["quick"],
        ["brown"],
        ["fox"],
    ]
    assert {data["model_name"] for _, data in got} == {"streamer"}
    marker = Path(server.workdir, "markers", f"closed-sse-{route}")
    wait_for(marker)


TWELVE = "one two three four five six seven eight nine ten eleven twelve"


def sse_texts(server: Server, model: str, request_id: str) -> list[str]:
    body = text_request(TWELVE, request_id)
    with httpx.stream("POST", f"{server.url}/v2/models/{model}/generate_stream", json=body,
                      timeout=30) as response:  # fmt: skip
        assert response.status_code == 200
        got = list(events(response))
    assert {name for name, _ in got} == {"message"}
    for _, data in got:
        (output,) = data["outputs"]
        assert (output["name"], output["datatype"], output["shape"]) == ("token", "BYTES", [1, 1])
    return [data["outputs"][0]["data"][0] for _, data in got]


def test_with_merge_stream_replies_the_waiting_tokens_go_as_one_event(server: Server) -> None:
    """The model yields its twelve words on one turn of its loop (no delay), so they reach
    the server together: the first goes on its own, the rest waiting behind it are merged
    (their texts concatenated, every word there, in order)."""
    texts = sse_texts(server, "merger", "merged")
    words = TWELVE.split()
    assert texts[0] == words[0]
    assert "".join(texts) == "".join(words)
    assert len(texts) < len(words), texts


def test_without_merge_stream_replies_each_yield_is_one_event(server: Server) -> None:
    """The same burst to the same model without the option: one event per yield."""
    assert sse_texts(server, "streamer", "unmerged") == TWELVE.split()


def test_a_model_without_predict_stream_answers_one_event(server: Server) -> None:
    body = {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}
    with httpx.stream("POST", f"{server.url}/v2/models/doubler/infer_stream", json=body,
                      timeout=30) as response:  # fmt: skip
        got = list(events(response))
    assert len(got) == 1 and got[0][1]["outputs"][0]["data"] == [2.5, 5.0]


def test_an_error_mid_stream_follows_the_responses_so_far(server: Server) -> None:
    body = text_request("one two boom three", "boom-1")
    with httpx.stream("POST", f"{server.url}/v2/models/streamer/generate_stream", json=body,
                      timeout=30) as response:  # fmt: skip
        got = list(events(response))
    assert [data["outputs"][0]["data"] for _, data in got[:2]] == [["one"], ["two"]]
    name, data = got[2]
    assert name == "error" and "boom: the model failed mid-stream" in data["error"]
    assert len(got) == 3
    # the worker is still there
    r = httpx.post(f"{server.url}/v2/models/streamer/infer", json=text_request("a b", "after"),
                   timeout=30)  # fmt: skip
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2]


def test_closing_the_sse_connection_stops_the_model(server: Server) -> None:
    body = text_request("forever", "sse-cancel", delay=0.01)
    marker = Path(server.workdir, "markers", "closed-sse-cancel")
    with httpx.stream("POST", f"{server.url}/v2/models/streamer/generate_stream", json=body,
                      timeout=30) as response:  # fmt: skip
        stream = events(response)
        assert [next(stream)[1]["outputs"][0]["data"] for _ in range(3)] == [
            ["tick0"], ["tick1"], ["tick2"],
        ]  # fmt: skip
        assert not marker.exists()
    assert wait_for(marker, timeout=5) < 1.0
    # the slot is free: the next stream is answered
    with httpx.stream("POST", f"{server.url}/v2/models/streamer/generate_stream",
                      json=text_request("still here", "next"), timeout=30) as response:  # fmt: skip
        assert len(list(events(response))) == 2


def test_adaptive_batching_merges_requests_and_splits_the_answer(server: Server) -> None:
    """max_batch_size 8, max_batch_time 0.2 s: requests queued while the worker is busy reach
    one predict call as one request (rows concatenated) and each gets its own rows back."""
    busy = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP64", "data": [[0, 0]]}],
            "parameters": {"sleep": 0.5}}  # fmt: skip

    def one(i: int) -> dict[str, Any]:
        rows = 1 + i % 2
        data = [[float(i), float(i) + 0.5] for _ in range(rows)]
        body = {"id": f"b-{i}", "inputs": [
            {"name": "x", "shape": [rows, 2], "datatype": "FP64", "data": data}]}  # fmt: skip
        r = httpx.post(f"{server.url}/v2/models/batcher/infer", json=body, timeout=30)
        assert r.status_code == 200, r.text
        return {"sent": data, **r.json()}

    with ThreadPoolExecutor(9) as pool:
        holding = pool.submit(httpx.post, f"{server.url}/v2/models/batcher/infer", json=busy,
                              timeout=30)  # fmt: skip
        time.sleep(0.1)
        answers = list(pool.map(one, range(8)))
        assert holding.result().status_code == 200
    for i, answer in enumerate(answers):
        y, rows = answer["outputs"]
        assert answer["id"] == f"b-{i}"
        assert y["shape"] == [len(answer["sent"]), 2]
        assert y["data"] == [2 * v for row in answer["sent"] for v in row]
        assert rows["shape"] == [len(answer["sent"]), 1]
    merged = max(answer["outputs"][1]["data"][0] for answer in answers)
    assert merged > 2, "no two requests were merged into one predict call"


def test_a_slow_reader_does_not_make_the_worker_run_ahead(server: Server) -> None:
    """The worker stops pulling from the generator once a stream's window of unread
    responses is full: a client that stops reading holds the model back (unheld, the model
    would yield a tick every ~1 ms: some 1000 in the second nobody reads)."""
    body = text_request("forever", "slow-reader", delay=0.001, pad=100_000)
    marker = Path(server.workdir, "markers", "closed-slow-reader")
    with httpx.stream("POST", f"{server.url}/v2/models/streamer/generate_stream", json=body,
                      timeout=30) as response:  # fmt: skip
        stream = events(response)
        assert next(stream)[1]["outputs"][0]["data"][0].startswith("tick0x")
        assert server.process is not None
        rss_before = psutil.Process(server.process.pid).memory_info().rss
        time.sleep(1.0)
        grown = psutil.Process(server.process.pid).memory_info().rss - rss_before
    wait_for(marker)
    produced = json.loads(marker.read_text())["produced"]
    print("yielded while the client did not read:", produced)
    # the window (16 replies) plus what the sockets between worker and client hold (each
    # event is 100 kB, so those hold a few dozen)
    assert produced < 150, produced
    print(f"server RSS grew by {grown / 1e6:.1f} MB")
    assert grown < 30e6  # unheld: ~1000 events of 100 kB queued in the server


def stream_message(text: str, request_id: str, shape: int = 1) -> bytes:
    """A ModelStreamInfer message for the streamer: its words come 0.1 s apart."""
    tensor = ModelInferRequestInferInputTensor(
        name="text", datatype="BYTES", shape=[shape],
        contents=InferTensorContents(bytes_contents=[text.encode()]),
    )  # fmt: skip
    return bytes(
        ModelInferRequest(
            model_name="streamer",
            id=request_id,
            inputs=[tensor],
            parameters={"delay": InferParameter(double_param=0.1)},
        )
    )


BAD_THIRD = {
    "truncated": (stream_message("delta", "t-3")[:-4], "malformed protobuf in ModelInferRequest"),
    "bad shape": (stream_message("delta", "t-3", shape=2), "shape [2] needs 2 elements"),
}
WORDS = [("t-1", b"alpha"), ("t-1", b"beta"), ("t-2", b"gamma")]


def stream_with_a_bad_third(server: Server, bad: str, triton: bool) -> tuple[list[Any], Any]:
    """Two inputs and a bad third, sent at once: the answers, and the error that ended the
    stream (None: OK)."""
    third, _expected = BAD_THIRD[bad]
    messages = [stream_message("alpha beta", "t-1"), stream_message("gamma", "t-2"), third]
    reply = ModelStreamInferResponse if triton else ModelInferResponse
    answers: list[Any] = []
    with grpc.insecure_channel(server.grpc_target) as channel:
        call = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            response_deserializer=reply.FromString,
        )
        try:
            answers.extend(call(iter(messages), timeout=30))
        except grpc.RpcError as error:
            return answers, error
    return answers, None


def words(answers: list[ModelInferResponse]) -> list[tuple[str, bytes]]:
    return [(answer.id, answer.raw_output_contents[0][4:]) for answer in answers]


@pytest.mark.parametrize("bad", list(BAD_THIRD))
def test_grpc_stream_in_ends_at_a_bad_message_after_the_answers_to_the_rest(
    server: Server, bad: str
) -> None:
    """The model's input ends at the bad message, every word the model streams for the
    first two arrives, then the stream ends with the error."""
    answers, error = stream_with_a_bad_third(server, bad, triton=False)
    assert words(answers) == WORDS
    assert error is not None and error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert BAD_THIRD[bad][1] in (error.details() or "")


@pytest.fixture(scope="module")
def triton_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The streamer behind a server answering ModelStreamInfer in Triton's shape."""
    store = tmp_path_factory.mktemp("stream-store-triton")
    shutil.copytree(MODELS / "streamer", store / "streamer")
    server = Server(
        tmp_path_factory.mktemp("stream-triton"), store, "streamer=streamer",
        properties={"oip_grpc_stream_shape": "triton"},
    )  # fmt: skip
    with running(server):
        yield server


@pytest.mark.parametrize("bad", list(BAD_THIRD))
def test_triton_shape_stream_in_ends_at_a_bad_message_after_the_answers_to_the_rest(
    triton_server: Server, bad: str
) -> None:
    """Triton's shape: a refused request is answered in-band, a message that cannot be read
    ends the stream with its status (as for a model answered request by request)."""
    answers, error = stream_with_a_bad_third(triton_server, bad, triton=True)
    assert words([answer.infer_response for answer in answers[:3]]) == WORDS
    if bad == "truncated":
        assert len(answers) == 3
        assert error is not None and error.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert BAD_THIRD[bad][1] in (error.details() or "")
    else:
        assert error is None and len(answers) == 4
        assert BAD_THIRD[bad][1] in answers[3].error_message


# -- MLServer's own clients (.venv-mlserver): gRPC stubs and converters, httpx_sse ----------


def test_grpc_unary_in_stream_out(server: Server) -> None:
    got = mlserver_client(server, "tokens")
    assert [r["token"] for r in got] == [["alpha"], ["beta"], ["gamma"]]
    assert {r["model"] for r in got} == {"streamer"}


def test_grpc_stream_in_stream_out(server: Server) -> None:
    """Every message of the gRPC stream is the next input of the one running generator."""
    got = mlserver_client(server, "tokens_in")
    assert [r["token"] for r in got] == [["alpha"], ["beta"], ["gamma"], ["delta"]]
    assert [r["id"] for r in got] == ["t-1", "t-1", "t-2", "t-3"]


def test_grpc_stream_in_to_a_model_without_predict_stream(server: Server) -> None:
    got = mlserver_client(server, "predict_each")
    # NumpyRequestCodec sends a 1-D array as shape [N, 1], and the answer keeps it
    assert [r["x"] for r in got] == [[[0.0]], [[2.5]], [[5.0]]]
    assert [r["id"] for r in got] == ["p-0", "p-1", "p-2"]


def test_a_cancelled_grpc_stream_stops_the_model(server: Server) -> None:
    marker = Path(server.workdir, "markers", "closed-grpc-cancel")
    got = mlserver_client(server, "cancel")
    assert [r["token"] for r in got] == [["tick0"], ["tick1"], ["tick2"]]
    assert wait_for(marker, timeout=5) < 1.0


def test_grpc_stream_in_unary_out(server: Server) -> None:
    got = mlserver_client(server, "collect")
    assert [r["token"] for r in got] == [["red green blue"]]


def test_grpc_error_mid_stream_follows_the_answers_so_far(server: Server) -> None:
    got = mlserver_client(server, "boom")
    assert [r["token"] for r in got["got"]] == [["one"], ["two"]]
    assert got["status"] == "StatusCode.INVALID_ARGUMENT"  # MLServer's InferenceError: 400
    assert "boom: the model failed mid-stream" in got["details"]


def test_a_grpc_deadline_stops_the_model(server: Server) -> None:
    marker = Path(server.workdir, "markers", "closed-grpc-deadline")
    got = mlserver_client(server, "deadline")
    assert got["status"] == "StatusCode.DEADLINE_EXCEEDED" and got["answers"] > 3, got
    assert wait_for(marker, timeout=5) < 1.0


def test_httpx_sse_and_requests_clients(server: Server) -> None:
    got = mlserver_client(server, "sse")
    assert got == {"sse": [["one"], ["two"], ["three"]], "generate": [[4]]}


def test_mlserver_types_posted_with_or_without_nulls_on_every_rest_route(
    server: Server,
) -> None:
    """MLServer's documented client posts ``request.dict()``: every unset optional field as
    ``null`` (``"id": null``, ``"parameters": {"content_type": "str", "headers": null}``).
    ``/infer``, ``/generate``, ``/infer_stream`` and ``/generate_stream`` take it, as MLServer
    does, and answer exactly as for the same request without the nulls."""
    got = mlserver_client(server, "nulls")
    assert set(got) == {"dict", "dict_exclude_none", "model_dump", "model_dump_nulls"}
    assert got["dict"]["nulls"] and got["dict"]["text_nulls"]  # the case this is about
    assert got["model_dump_nulls"]["nulls"] and not got["model_dump"]["nulls"]
    for way, seen in got.items():
        assert seen["infer"][0] == 200, (way, seen["infer"])
        answer = seen["infer"][1]
        assert answer["id"] == "n-1" and answer["x"] == [[2.5, 5.0, 7.5]], (way, answer)
        assert seen["generate"] == [200, {"id": "w-1", "model": "streamer", "count": [[2]]}], way
        tokens = [{"id": "w-1", "model": "streamer", "token": [w]} for w in ("one", "two")]
        assert seen["infer_stream"] == [200, *tokens], (way, seen["infer_stream"])
        assert seen["generate_stream"] == [200, *tokens], (way, seen["generate_stream"])


def test_sigterm_with_open_streams_closes_them_after_the_grace(tmp_path: Path) -> None:
    """A drain lets open streams run for shutdown_grace_seconds, then cancels them: the
    model's generators are closed (their finally runs), the client's stream ends and the
    server exits 0."""
    store = tmp_path / "store"
    shutil.copytree(MODELS / "streamer", store / "streamer")
    (tmp_path / "markers").mkdir()
    server = Server(
        tmp_path, store, "streamer=streamer",
        properties={"shutdown_grace_seconds": "2"},
        env={"TRIOSERVE_TEST_MARKERS": str(tmp_path / "markers")},
    )  # fmt: skip
    server.start()
    try:
        body = text_request("forever", "drained", delay=0.05)
        with httpx.stream("POST", f"{server.url}/v2/models/streamer/generate_stream",
                          json=body, timeout=30) as response:  # fmt: skip
            stream = events(response)
            assert next(stream)[1]["outputs"][0]["data"] == ["tick0"]
            began = time.monotonic()
            server.signal(signal.SIGTERM)
            rest = []
            # After the grace the connection is cut: the chunked body never ends properly.
            with pytest.raises(httpx.RemoteProtocolError):
                rest.extend(stream)
            ended = time.monotonic() - began
        assert rest and all(name == "message" for name, _ in rest)
        assert 1.5 < ended < 10, ended
        assert server.wait(timeout=30) == 0
        assert json.loads(Path(tmp_path, "markers", "closed-drained").read_text())["produced"] > 1
    finally:
        server.kill()
