"""Malformed protobuf over real HTTP/2 gRPC calls, and what streams answer before an error,
against a real server process (grpcio clients sending raw bytes).

Every rpc of the four services (TorchServe inference and management, the OIP
GRPCInferenceService, grpc.health.v1) refuses each class of malformed bytes with
INVALID_ARGUMENT naming the problem, without the server's memory growing or a worker
changing, and a normal call is answered right after. On ModelStreamInfer and
StreamPredictions2, two slow requests followed at once by a bad one get both their answers
before the stream ends with the error (both ModelStreamInfer shapes)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest

from trioserve._proto.grpc.health.v1 import HealthBase
from trioserve._proto.inference import (
    GrpcInferenceServiceBase,
    InferTensorContents,
    ModelInferRequest,
    ModelInferRequestInferInputTensor,
    ModelInferResponse,
    ModelStreamInferResponse,
)
from trioserve._proto.org.pytorch.serve.grpc.inference import (
    InferenceApIsServiceBase,
    PredictionResponse,
    PredictionsRequest,
)
from trioserve._proto.org.pytorch.serve.grpc.management import ManagementApIsServiceBase
from trioserve.core.protowire import STRING
from trioserve.grpc.decode import wire_schema

from .server import Server, running

pytestmark = pytest.mark.e2e

MODELS = "echo=echo.mar,oip=oip.mar,control=control.mar"
INFERENCE_BASES = (InferenceApIsServiceBase, GrpcInferenceServiceBase, HealthBase)


@pytest.fixture(scope="module")
def server(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running(Server(tmp_path_factory.mktemp("grpc-malformed"), store, MODELS)) as server:
        yield server


@pytest.fixture(scope="module")
def triton_server(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("grpc-malformed-triton")
    properties = {"oip_grpc_stream_shape": "triton"}
    with running(Server(workdir, store, MODELS, properties=properties)) as server:
        yield server


def raw_call(channel: grpc.Channel, path: str, cardinality: str) -> Callable[[bytes], Any]:
    """A call sending one message of raw bytes; it returns every answer (raw bytes)."""
    if cardinality == "UNARY_UNARY":
        unary = channel.unary_unary(path)
        return lambda data: [unary(data, timeout=30)]
    if cardinality == "UNARY_STREAM":
        server_streaming = channel.unary_stream(path)
        return lambda data: list(server_streaming(data, timeout=30))
    bidi = channel.stream_stream(path)
    return lambda data: list(bidi(iter([data]), timeout=30))


def malformed_cases(request_type: type[Any]) -> dict[str, tuple[bytes, str]]:
    """The classes of malformed bytes, each with what the refusal must say."""
    cases = {
        "random bytes": (random.Random(7).randbytes(48), ""),
        "truncated varint": (b"\xc0\x3e\x96", "field 1000 at byte 0: the varint at byte 2 is cut"),
        "4 GiB length over 3 bytes": (
            b"\x0a\xff\xff\xff\xff\x0fabc",
            "length 4294967295 runs past the end of the 9-byte message",
        ),
        "wire type 7": (b"\x0f", "at byte 0 has wire type 7, which does not exist"),
    }
    strings = [n for n, f in wire_schema(request_type).fields.items() if f.kind == STRING]
    if strings:
        tag = bytes([strings[0] << 3 | 2])
        cases["invalid UTF-8"] = (tag + b"\x02\xff\xfe", "the string is not UTF-8")
    return cases


def rss(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)


def test_every_rpc_refuses_malformed_bytes_and_the_server_is_unharmed(server: Server) -> None:
    assert server.process is not None
    workers = sorted(server.worker_pids())
    before = rss(server.process.pid)
    refused = 0
    targets = [(server.grpc_target, base) for base in INFERENCE_BASES]
    targets.append((server.grpc_management_target, ManagementApIsServiceBase))
    for target, base in targets:
        with grpc.insecure_channel(target) as channel:
            for path, route in base().__mapping__().items():
                call = raw_call(channel, path, route.cardinality.name)
                for name, (data, expected) in malformed_cases(route.request_type).items():
                    with pytest.raises(grpc.RpcError) as caught:
                        call(data)
                    error = caught.value
                    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT, (path, name)
                    details = error.details() or ""
                    prefix = f"malformed protobuf in {route.request_type.__name__}: "
                    assert details.startswith(prefix) and expected in details, (path, name)
                    refused += 1
    assert refused > 100
    grown = rss(server.process.pid) - before
    assert grown < 64 << 20, f"server RSS grew by {grown >> 20} MiB"
    assert sorted(server.worker_pids()) == workers  # every worker untouched
    # a normal call right after, on each port
    with grpc.insecure_channel(server.grpc_target) as channel:
        predict = channel.unary_unary(
            "/org.pytorch.serve.grpc.inference.InferenceAPIsService/Predictions",
            request_serializer=bytes,
            response_deserializer=PredictionResponse.FromString,
        )
        answer = predict(PredictionsRequest(model_name="echo", input={"data": b"hi"}), timeout=30)
        assert answer.prediction == b"hi"
        infer = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=bytes,
            response_deserializer=ModelInferResponse.FromString,
        )
        assert infer(infer_request("ok", name="x"), timeout=30).id == "ok"
    with grpc.insecure_channel(server.grpc_management_target) as channel:
        models = channel.unary_unary(
            "/org.pytorch.serve.grpc.management.ManagementAPIsService/ListModels"
        )
        assert b"echo" in models(b"", timeout=30)


def test_a_flood_of_unknown_fields_is_refused_at_once(server: Server) -> None:
    """1 MiB of three-byte fields no schema knows: betterproto2 alone spends over a minute
    on it (each one is appended to a bytes object); refused before it parses."""
    flood = b"\xc0\x3e\x00" * ((1 << 20) // 3)
    with grpc.insecure_channel(server.grpc_target) as channel:
        predict = raw_call(
            channel,
            "/org.pytorch.serve.grpc.inference.InferenceAPIsService/Predictions",
            "UNARY_UNARY",
        )
        with pytest.raises(grpc.RpcError) as caught:
            predict(flood)
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert caught.value.details() == (
            "PredictionsRequest carries more than 100 fields this server does not know "
            "(field 1000 at byte 300 is one too many); at most 100 are accepted"
        )
        assert predict(bytes(PredictionsRequest(model_name="echo", input={"data": b"ok"})))


# -- streams: the answers before the error ---------------------------------------------


def infer_request(request_id: str, shape: int = 2, name: str = "slow") -> ModelInferRequest:
    """An OIP request whose input (named ``slow``: the handler answers it late) holds two
    numbers; another ``shape`` makes it a bad request."""
    contents = InferTensorContents(fp32_contents=[1, 2])
    tensor = ModelInferRequestInferInputTensor(
        name=name, datatype="FP32", shape=[shape], contents=contents
    )
    return ModelInferRequest(model_name="oip", id=request_id, inputs=[tensor])


BAD = {
    "truncated": (
        bytes(infer_request("c"))[:-3],
        "malformed protobuf in ModelInferRequest: field 5 (inputs) at byte 8: length",
    ),
    "bad shape": (bytes(infer_request("c", shape=3)), "shape [3] needs 3 elements"),
}


def stream_infer(server: Server, third: bytes, triton: bool) -> tuple[list[Any], Any]:
    """ModelStreamInfer with two slow requests and ``third``, all sent at once; the answers
    and the error that ended the stream (None: OK)."""
    reply = ModelStreamInferResponse if triton else ModelInferResponse
    answers: list[Any] = []
    with grpc.insecure_channel(server.grpc_target) as channel:
        call = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            response_deserializer=reply.FromString,
        )
        messages = [bytes(infer_request("a")), bytes(infer_request("b")), third]
        try:
            for answer in call(iter(messages), timeout=30):
                answers.append(answer)
        except grpc.RpcError as error:
            return answers, error
    return answers, None


@pytest.mark.parametrize("bad", list(BAD))
def test_model_stream_infer_answers_the_requests_before_an_error(server: Server, bad: str) -> None:
    third, expected = BAD[bad]
    answers, error = stream_infer(server, third, triton=False)
    assert [a.id for a in answers] == ["a", "b"]
    assert error is not None and error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert expected in error.details()


@pytest.mark.parametrize("bad", list(BAD))
def test_triton_shape_answers_the_requests_before_an_error(triton_server: Server, bad: str) -> None:
    third, expected = BAD[bad]
    answers, error = stream_infer(triton_server, third, triton=True)
    assert [a.infer_response.id for a in answers[:2]] == ["a", "b"]
    assert not any(a.error_message for a in answers[:2])
    if bad == "truncated":  # a message that cannot be read ends the stream
        assert len(answers) == 2
        assert error is not None and error.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert expected in error.details()
    else:  # a refused request is answered in-band and the stream stays open
        assert error is None and len(answers) == 3
        assert expected in answers[2].error_message


def test_stream_predictions2_answers_the_requests_before_a_malformed_one(server: Server) -> None:
    sleep = {"data": b"sleep:0.25"}  # the control handler answers "slept"
    slow = [
        bytes(PredictionsRequest(model_name="control", input=sleep, sequence_id=sequence))
        for sequence in ("s1", "s2")
    ]
    answers: list[PredictionResponse] = []
    with grpc.insecure_channel(server.grpc_target) as channel:
        call = channel.stream_stream(
            "/org.pytorch.serve.grpc.inference.InferenceAPIsService/StreamPredictions2",
            response_deserializer=PredictionResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as caught:
            answers.extend(call(iter([*slow, b"\x0a\x05con"]), timeout=30))
    assert [(a.sequence_id, a.prediction) for a in answers] == [("s1", b"slept"), ("s2", b"slept")]
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == (
        "malformed protobuf in PredictionsRequest: field 1 (model_name) at byte 0: length 5 "
        "runs past the end of the 5-byte message"
    )
