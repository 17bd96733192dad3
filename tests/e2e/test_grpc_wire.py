"""Wire compatibility: the stock grpcio client, with stubs compiled from proto/ at test time,
drives every rpc of a real trioserve process over real sockets."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2

from .grpc_fixtures import (
    GrpcioStubs,
    build_store,
    grpcio_stubs,
    markers,
    running_server,
    wait_until,
)
from .grpc_server import GrpcServer

pytestmark = pytest.mark.e2e

MODELS = "control=control.mar,gstream=gstream.mar,echo=echo.mar,multi-1.mar,multi-2.mar"


@pytest.fixture(scope="module")
def pb(tmp_path_factory: pytest.TempPathFactory) -> GrpcioStubs:
    return grpcio_stubs(tmp_path_factory.mktemp("grpcio_stubs"))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("grpc_store"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, store: Path) -> Iterator[GrpcServer]:
    workdir = tmp_path_factory.mktemp("grpc_wire") / "server"
    with running_server(workdir, store, MODELS, properties={"enable_model_api": "true"}) as started:
        yield started


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, store: Path) -> Iterator[GrpcServer]:
    """Token authorization on, model API off (the defaults), a small message limit."""
    workdir = tmp_path_factory.mktemp("grpc_wire_secured") / "server"
    with running_server(
        workdir, store, "echo=echo.mar", tokens=True, properties={"max_request_size": "1000"}
    ) as started:
        yield started


@pytest.fixture
def inference(server: GrpcServer, pb: GrpcioStubs) -> Iterator[object]:
    with grpc.insecure_channel(server.grpc_target) as channel:
        yield pb.inference_grpc.InferenceAPIsServiceStub(channel)


@pytest.fixture
def management(server: GrpcServer, pb: GrpcioStubs) -> Iterator[object]:
    with grpc.insecure_channel(server.grpc_management_target) as channel:
        yield pb.management_grpc.ManagementAPIsServiceStub(channel)


def request(pb: GrpcioStubs, model: str, data: bytes, **fields: object) -> object:
    return pb.inference.PredictionsRequest(model_name=model, input={"data": data}, **fields)


def rpc_error(call: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()  # type: ignore[operator]
    return info.value


def worker_pid(stub: object, pb: GrpcioStubs, model: str = "control") -> str:
    return stub.Predictions(request(pb, model, b"pid"), timeout=30).prediction.decode()  # type: ignore[attr-defined, no-any-return]


# -- inference ------------------------------------------------------------------------------


def test_ping_predictions_and_named_inputs(inference, pb: GrpcioStubs) -> None:  # type: ignore[no-untyped-def]
    health = inference.Ping(pb.empty.Empty(), timeout=30).health
    assert health == '{\n  "status": "Healthy"\n}'
    reply = inference.Predictions(request(pb, "control", b"hello"), timeout=30)
    assert reply.prediction == b"hello"
    assert not reply.HasField("sequence_id") and not reply.HasField("status")
    # each input key is one handler input; gRPC metadata is not forwarded as headers
    named = pb.inference.PredictionsRequest(
        model_name="control", model_version="1.0", input={"data": b"params", "extra": b"x"}
    )
    assert json.loads(inference.Predictions(named, timeout=30).prediction) == {
        "data": "params",
        "extra": "x",
    }
    seen = json.loads(
        inference.Predictions(
            request(pb, "control", b"headers"), metadata=[("x-trace", "t1")], timeout=30
        ).prediction
    )
    assert "x-trace" not in seen
    assert inference.Predictions(request(pb, "echo", b"\x00\xffbytes"), timeout=30).prediction == (
        b"\x00\xffbytes"
    )


def test_stream_predictions_one_message_per_reply(inference, pb: GrpcioStubs) -> None:  # type: ignore[no-untyped-def]
    arrivals = [
        (time.monotonic(), r.prediction)
        for r in inference.StreamPredictions(request(pb, "control", b"stream:3"), timeout=30)
    ]
    assert [p for _, p in arrivals] == [b"part0;", b"part1;", b"part2;", b"end"]
    assert arrivals[-1][0] - arrivals[0][0] > 0.3  # sent as produced, not buffered
    # a handler that does not stream: one message, then OK
    assert [r.prediction for r in inference.StreamPredictions(request(pb, "echo", b"x"))] == [b"x"]
    # unary Predictions on a streaming handler joins the parts, as HTTP's body does
    joined = inference.Predictions(request(pb, "control", b"stream:2"), timeout=30).prediction
    assert joined == b"part0;part1;end"


def test_unknown_model_version_and_missing_name(inference, pb: GrpcioStubs) -> None:  # type: ignore[no-untyped-def]
    error = rpc_error(lambda: inference.Predictions(request(pb, "nope", b"x"), timeout=30))
    assert (error.code(), error.details()) == (grpc.StatusCode.NOT_FOUND, "Model not found: nope")
    error = rpc_error(
        lambda: inference.Predictions(request(pb, "control", b"x", model_version="9.9"))
    )
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert error.details() == "Model version: 9.9 does not exist for model: control"
    error = rpc_error(lambda: list(inference.StreamPredictions(request(pb, "nope", b"x"))))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    error = rpc_error(lambda: inference.Predictions(request(pb, "", b"x"), timeout=30))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "Parameter model_name is required."


def test_handler_errors_map_and_the_worker_survives(inference, pb: GrpcioStubs) -> None:  # type: ignore[no-untyped-def]
    pid = worker_pid(inference, pb)
    error = rpc_error(lambda: inference.Predictions(request(pb, "control", b"raise"), timeout=30))
    assert (error.code(), error.details()) == (grpc.StatusCode.UNAVAILABLE, "Prediction failed")
    error = rpc_error(
        lambda: inference.Predictions(request(pb, "control", b"pexc:418"), timeout=30)
    )
    assert (error.code(), error.details()) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "custom failure",
    )
    # a per-request status set by the handler is not an RPC error (TorchServe ignores it)
    reply = inference.Predictions(request(pb, "control", b"status:299"), timeout=30)
    assert reply.prediction == b"custom status"
    assert worker_pid(inference, pb) == pid


def test_deadline_while_running_tells_the_handler_to_stop(  # type: ignore[no-untyped-def]
    server: GrpcServer, inference, pb: GrpcioStubs
) -> None:
    pid = worker_pid(inference, pb)
    before = markers(server, "cancelled")
    started = time.monotonic()
    error = rpc_error(
        lambda: inference.Predictions(request(pb, "control", b"sleep:1.5"), timeout=0.3)
    )
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 1.0
    assert wait_until(lambda: len(markers(server, "cancelled") - before) == 1)
    assert worker_pid(inference, pb) == pid


def test_deadline_while_queued_drops_the_job(  # type: ignore[no-untyped-def]
    server: GrpcServer, inference, pb: GrpcioStubs
) -> None:
    pid = worker_pid(inference, pb)
    before = markers(server, "started")
    busy = inference.Predictions.future(request(pb, "control", b"sleep:1.0"), timeout=30)
    assert wait_until(lambda: len(markers(server, "started") - before) == 1)
    # the only worker is busy: this one waits in the queue until its deadline passes
    error = rpc_error(lambda: inference.Predictions(request(pb, "control", b"crash"), timeout=0.3))
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert busy.result().prediction == b"slept"
    # "crash" never reached the worker: it is the same process
    time.sleep(0.2)
    assert worker_pid(inference, pb) == pid


def test_client_cancelling_a_stream_stops_the_handler(  # type: ignore[no-untyped-def]
    server: GrpcServer, inference, pb: GrpcioStubs
) -> None:
    pid = worker_pid(inference, pb, "gstream")
    before = markers(server, "stream-cancelled")
    call = inference.StreamPredictions(request(pb, "gstream", b"stream:50"), timeout=30)
    assert next(call).prediction == b"part0;"
    assert next(call).prediction == b"part1;"
    call.cancel()
    assert wait_until(lambda: len(markers(server, "stream-cancelled") - before) == 1)
    assert worker_pid(inference, pb, "gstream") == pid
    parts = [r.prediction for r in inference.StreamPredictions(request(pb, "gstream", b"stream:2"))]
    assert parts == [b"part0;", b"part1;", b"end"]


def test_stream_predictions2_answers_in_order_after_half_close(  # type: ignore[no-untyped-def]
    inference, pb: GrpcioStubs
) -> None:
    pid = worker_pid(inference, pb)
    requests = [
        request(pb, "control", b"sleep:0.2", sequence_id="seq-1"),
        request(pb, "control", b"no id"),  # in-band INVALID_ARGUMENT, the stream goes on
        request(pb, "nope", b"x", sequence_id="seq-1"),  # in-band NOT_FOUND
        request(pb, "control", b"raise", sequence_id="seq-1"),  # in-band UNAVAILABLE
        request(pb, "control", b"headers", sequence_id="seq-1"),
        request(pb, "control", b"sleep:0.2", sequence_id="seq-2"),
    ]
    # grpcio half-closes as soon as the iterator is exhausted, long before the answers exist
    responses = list(inference.StreamPredictions2(iter(requests), timeout=30))
    assert len(responses) == 6
    ok = [r for r in responses if not r.HasField("status")]
    assert [r.prediction for r in (responses[0], responses[5])] == [b"slept", b"slept"]
    assert [r.sequence_id for r in ok] == ["seq-1", "seq-1", "seq-2"]
    assert json.loads(responses[4].prediction)["ts_request_sequence_id"] == "seq-1"
    missing, unknown, failed = responses[1], responses[2], responses[3]
    assert not missing.HasField("sequence_id") and missing.prediction == b""
    assert (missing.status.code, missing.status.message) == (
        grpc.StatusCode.INVALID_ARGUMENT.value[0],
        "Parameter sequenceId is required.",
    )
    info = error_details_pb2.ErrorInfo()
    assert missing.status.details[0].Unpack(info)
    assert (info.reason, info.domain) == ("BadRequestException", "trioserve")
    assert unknown.sequence_id == "seq-1"
    assert unknown.status.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert unknown.status.message == "Model not found: nope"
    assert failed.status.code == grpc.StatusCode.UNAVAILABLE.value[0]
    assert worker_pid(inference, pb) == pid


def test_stream_predictions2_streaming_handler_and_empty_stream(  # type: ignore[no-untyped-def]
    inference, pb: GrpcioStubs
) -> None:
    responses = list(
        inference.StreamPredictions2(iter([request(pb, "gstream", b"stream:2", sequence_id="s")]))
    )
    assert [(r.prediction, r.sequence_id) for r in responses] == [
        (b"part0;", "s"),
        (b"part1;", "s"),
        (b"end", "s"),
    ]
    assert list(inference.StreamPredictions2(iter([]), timeout=30)) == []


def test_stream_predictions2_cancel_drops_running_and_queued_work(  # type: ignore[no-untyped-def]
    server: GrpcServer, inference, pb: GrpcioStubs
) -> None:
    pid = worker_pid(inference, pb)
    cancelled = markers(server, "cancelled")
    started = markers(server, "started")
    call = inference.StreamPredictions2(
        iter(
            [
                request(pb, "control", b"sleep:1.5", sequence_id="c"),
                request(pb, "control", b"crash", sequence_id="c"),  # queued behind it
            ]
        ),
        timeout=30,
    )
    assert wait_until(lambda: len(markers(server, "started") - started) == 1)
    call.cancel()
    error = rpc_error(lambda: list(call))
    assert error.code() == grpc.StatusCode.CANCELLED
    assert wait_until(lambda: len(markers(server, "cancelled") - cancelled) == 1)
    time.sleep(0.2)
    assert worker_pid(inference, pb) == pid


# -- management -----------------------------------------------------------------------------


def test_list_describe_and_set_default(management, pb: GrpcioStubs) -> None:  # type: ignore[no-untyped-def]
    m = pb.management
    listed = management.ListModels(m.ListModelsRequest(), timeout=30).msg
    body = json.loads(listed)
    assert listed == json.dumps(body, indent=2)  # pretty-printed like TorchServe's
    # an unset limit means 100 (TorchServe's gRPC lists nothing)
    assert sorted(x["modelName"] for x in body["models"]) == [
        "control",
        "echo",
        "gstream",
        "multi",
    ]
    page = json.loads(management.ListModels(m.ListModelsRequest(limit=1, next_page_token=1)).msg)
    assert page == {"nextPageToken": "2", "models": [page["models"][0]]}
    described = json.loads(
        management.DescribeModel(m.DescribeModelRequest(model_name="control")).msg
    )
    assert described[0]["modelName"] == "control" and described[0]["minWorkers"] == 1
    versions = json.loads(
        management.DescribeModel(
            m.DescribeModelRequest(model_name="multi", model_version="all")
        ).msg
    )
    assert sorted(v["modelVersion"] for v in versions) == ["1.0", "2.0"]
    answer = management.SetDefault(m.SetDefaultRequest(model_name="multi", model_version="2.0"))
    assert json.loads(answer.msg) == {
        "status": 'Default version successfully updated for model "multi" to "2.0"'
    }
    default = json.loads(management.DescribeModel(m.DescribeModelRequest(model_name="multi")).msg)
    assert default[0]["modelVersion"] == "2.0"


def test_management_errors(management, pb: GrpcioStubs) -> None:  # type: ignore[no-untyped-def]
    m = pb.management
    error = rpc_error(lambda: management.DescribeModel(m.DescribeModelRequest(model_name="nope")))
    assert (error.code(), error.details()) == (grpc.StatusCode.NOT_FOUND, "Model not found: nope")
    error = rpc_error(
        lambda: management.ScaleWorker(
            m.ScaleWorkerRequest(model_name="control", model_version="9.9")
        )
    )
    assert error.code() == grpc.StatusCode.NOT_FOUND
    error = rpc_error(
        lambda: management.SetDefault(m.SetDefaultRequest(model_name="multi", model_version="7"))
    )
    assert error.code() == grpc.StatusCode.NOT_FOUND
    error = rpc_error(lambda: management.UnregisterModel(m.UnregisterModelRequest(model_name="x")))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    error = rpc_error(lambda: management.RegisterModel(m.RegisterModelRequest()))
    assert (error.code(), error.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "Parameter url is required.",
    )
    error = rpc_error(
        lambda: management.ScaleWorker(
            m.ScaleWorkerRequest(model_name="control", min_worker=2, max_worker=1)
        )
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_register_scale_unregister(management, inference, pb: GrpcioStubs) -> None:  # type: ignore[no-untyped-def]
    m = pb.management
    answer = management.RegisterModel(
        m.RegisterModelRequest(
            url="echo.mar", model_name="echo2", initial_workers=1, synchronous=True
        ),
        timeout=60,
    )
    assert json.loads(answer.msg) == {
        "status": 'Model "echo2" Version: 1.0 registered with 1 initial workers'
    }
    assert inference.Predictions(request(pb, "echo2", b"hi"), timeout=30).prediction == b"hi"
    # registering the same name and version again is a conflict (TorchServe: UNKNOWN)
    error = rpc_error(
        lambda: management.RegisterModel(
            m.RegisterModelRequest(url="echo.mar", model_name="echo2"), timeout=60
        )
    )
    assert error.code() == grpc.StatusCode.ABORTED
    answer = management.ScaleWorker(
        m.ScaleWorkerRequest(model_name="echo2", min_worker=2, synchronous=True), timeout=60
    )
    assert json.loads(answer.msg) == {"status": "Workers scaled to 2 for model: echo2"}
    described = json.loads(management.DescribeModel(m.DescribeModelRequest(model_name="echo2")).msg)
    assert (described[0]["minWorkers"], described[0]["maxWorkers"]) == (2, 2)
    # asynchronous (the proto's default): 202 Processing on HTTP, the same text here
    answer = management.ScaleWorker(m.ScaleWorkerRequest(model_name="echo2", min_worker=1))
    assert json.loads(answer.msg) == {"status": "Processing worker updates..."}
    answer = management.UnregisterModel(m.UnregisterModelRequest(model_name="echo2"), timeout=60)
    assert json.loads(answer.msg) == {"status": 'Model "echo2" unregistered'}
    error = rpc_error(lambda: inference.Predictions(request(pb, "echo2", b"hi"), timeout=30))
    assert error.code() == grpc.StatusCode.NOT_FOUND


# -- tokens, model API, message size --------------------------------------------------------


def test_tokens_guard_both_services(secured: GrpcServer, pb: GrpcioStubs) -> None:
    inference_key = [("authorization", f"Bearer {secured.key('inference')}")]
    management_key = [("authorization", f"Bearer {secured.key('management')}")]
    empty = pb.empty.Empty()
    listing = pb.management.ListModelsRequest()
    with (
        grpc.insecure_channel(secured.grpc_target) as inference_channel,
        grpc.insecure_channel(secured.grpc_management_target) as management_channel,
    ):
        inference = pb.inference_grpc.InferenceAPIsServiceStub(inference_channel)
        management = pb.management_grpc.ManagementAPIsServiceStub(management_channel)
        for call in (
            lambda: inference.Ping(empty),
            lambda: inference.Ping(empty, metadata=[("authorization", "Bearer wrong")]),
            lambda: inference.Ping(empty, metadata=management_key),  # the other service's key
            lambda: inference.Predictions(request(pb, "echo", b"x")),
            lambda: list(inference.StreamPredictions(request(pb, "echo", b"x"))),
            lambda: list(inference.StreamPredictions2(iter([]))),
            lambda: management.ListModels(listing),
            lambda: management.ListModels(listing, metadata=inference_key),
        ):
            error = rpc_error(call)
            assert error.code() == grpc.StatusCode.UNAUTHENTICATED
            assert error.details() == (
                "Token Authorization failed. Token either incorrect, expired, or not provided "
                "correctly"
            )
        assert "Healthy" in inference.Ping(empty, metadata=inference_key).health
        reply = inference.Predictions(request(pb, "echo", b"ok"), metadata=inference_key)
        assert reply.prediction == b"ok"
        assert json.loads(management.ListModels(listing, metadata=management_key).msg)["models"]
        # the model API is off by default
        for call in (
            lambda: management.RegisterModel(
                pb.management.RegisterModelRequest(url="echo.mar"), metadata=management_key
            ),
            lambda: management.UnregisterModel(
                pb.management.UnregisterModelRequest(model_name="echo"), metadata=management_key
            ),
        ):
            error = rpc_error(call)
            assert (error.code(), error.details()) == (
                grpc.StatusCode.PERMISSION_DENIED,
                "Model API disabled",
            )


def test_oversized_message_is_resource_exhausted(secured: GrpcServer, pb: GrpcioStubs) -> None:
    key = [("authorization", f"Bearer {secured.key('inference')}")]
    pids = secured.worker_pids()
    with grpc.insecure_channel(secured.grpc_target) as channel:
        inference = pb.inference_grpc.InferenceAPIsServiceStub(channel)
        small = request(pb, "echo", b"x" * 900)
        assert inference.Predictions(small, metadata=key).prediction == b"x" * 900
        for size in (2_000, 8 * 1024 * 1024):  # the second is larger than the HTTP/2 window
            big = request(pb, "echo", b"x" * size)
            error = rpc_error(lambda big=big: inference.Predictions(big, metadata=key, timeout=30))
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            encoded = big.ByteSize()
            assert error.details() == (
                f"Received message larger than max_request_size ({encoded} vs. 1000 bytes)."
            )
            # the connection is still usable
            assert inference.Predictions(small, metadata=key).prediction == b"x" * 900
        error = rpc_error(
            lambda: list(
                inference.StreamPredictions2(
                    iter([request(pb, "echo", b"y" * 5000, sequence_id="s")]), metadata=key
                )
            )
        )
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert secured.worker_pids() == pids


KILLED_CLIENT = """
import asyncio, sys
import grpc
from trioserve._proto.org.pytorch.serve.grpc.inference import PredictionResponse, PredictionsRequest

SERVICE = "/org.pytorch.serve.grpc.inference.InferenceAPIsService/"

async def main(port):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        unary = channel.unary_unary(SERVICE + "Predictions", request_serializer=bytes,
                                    response_deserializer=PredictionResponse.parse)
        stream = channel.unary_stream(SERVICE + "StreamPredictions", request_serializer=bytes,
                                      response_deserializer=PredictionResponse.parse)
        async def unaries():
            while True:
                await unary(PredictionsRequest(model_name="echo", input={"data": b"x" * 1000}))
        async def streams():
            while True:
                request = PredictionsRequest(model_name="gstream", input={"data": b"stream:5"})
                async for _ in stream(request):
                    pass
        print("started", flush=True)
        await asyncio.gather(*[unaries() for _ in range(64)], *[streams() for _ in range(8)])

asyncio.run(main(int(sys.argv[1])))
"""


def test_clients_killed_mid_flight_leave_server_and_workers_intact(  # type: ignore[no-untyped-def]
    server: GrpcServer, inference, pb: GrpcioStubs
) -> None:
    pids = sorted(server.worker_pids())
    log_before = len(server.log)
    for _ in range(2):
        client = subprocess.Popen(
            [sys.executable, "-c", KILLED_CLIENT, str(server.grpc_inference_port)],
            stdout=subprocess.PIPE,
        )
        assert client.stdout is not None
        assert client.stdout.readline() == b"started\n"
        time.sleep(0.8)
        client.kill()
        client.wait(10)
        client.stdout.close()
    assert inference.Predictions(request(pb, "echo", b"alive"), timeout=30).prediction == b"alive"
    assert sorted(server.worker_pids()) == pids
    new_log = server.log[log_before:]
    assert " ERROR " not in new_log and "Traceback" not in new_log, new_log[-3000:]
