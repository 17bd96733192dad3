"""The gRPC OIP adapter's message conversions (trioserve/grpc/oip_messages.py), the proto's field
numbers (spec §2.2) and the ``oip_grpc_stream_shape`` setting."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from trioserve._proto.inference import (
    InferParameter,
    InferTensorContents,
    ModelInferRequest,
    ModelInferRequestInferInputTensor,
    ModelStreamInferResponse,
)
from trioserve.config import CliOptions, ConfigError, load_config
from trioserve.core.errors import ErrorKind, ServeError
from trioserve.grpc.oip import OipRpcs, TritonStreamOipRpcs, oip_service
from trioserve.grpc.oip_messages import (
    infer_parameter,
    oip_error,
    parameters_of,
    request_inputs,
)

REPO = Path(__file__).resolve().parents[2]
F = descriptor_pb2.FieldDescriptorProto


def _input(name: str, datatype: str, shape: list[int], **contents: object) -> object:
    return ModelInferRequestInferInputTensor(
        name=name,
        datatype=datatype,
        shape=shape,
        contents=InferTensorContents(**contents) if contents else None,  # type: ignore[arg-type]
    )


def _request(*inputs: object, raw: list[bytes] | None = None) -> ModelInferRequest:
    return ModelInferRequest(
        model_name="m",
        inputs=list(inputs),  # type: ignore[arg-type]
        raw_input_contents=raw or [],
    )


def test_typed_and_raw_inputs_become_tensors() -> None:
    typed = request_inputs(
        _request(
            _input("a", "INT16", [2], int_contents=[-1, 300]),
            _input("b", "BYTES", [1], bytes_contents=[b"hi"]),
            _input("c", "UINT64", [1], uint64_contents=[2**64 - 1]),
            _input("e", "FP32", [0]),
        )
    )
    assert [t.to_list() for t in typed] == [[-1, 300], [b"hi"], [2**64 - 1], []]
    raw = request_inputs(
        _request(
            _input("h", "FP16", [2]),
            _input("w", "BYTES", [1]),
            raw=[struct.pack("<2e", 0.5, -1.0), struct.pack("<I", 2) + b"ok"],
        )
    )
    assert [t.to_list() for t in raw] == [[0.5, -1.0], [b"ok"]]


@pytest.mark.parametrize(
    ("message", "words"),
    [
        (_request(_input("a", "FP32", [1]), raw=[b"\0" * 4, b""]), "2 blobs"),
        (
            _request(_input("a", "FP32", [1], fp32_contents=[1.0]), raw=[b"\0" * 4]),
            "cannot both",
        ),
        (_request(_input("a", "FP32", [1], int_contents=[1])), "contents.fp32_contents"),
        (_request(_input("a", "FP16", [1], fp32_contents=[1.0])), "raw_input_contents"),
        (_request(_input("a", "INT8", [1], int_contents=[300])), "'a'"),
        (_request(_input("a", "FP32", [2], fp32_contents=[1.0])), "needs 2 elements"),
        (_request(_input("a", "FP99", [1])), "FP99"),
        (_request(_input("a", "BOOL", [0]), _input("a", "BOOL", [0])), "more than once"),
        (_request(_input("a", "INT32", [2]), raw=[b"\0" * 4]), "needs 8 bytes"),
    ],
)
def test_bad_inputs_are_bad_input(message: ModelInferRequest, words: str) -> None:
    with pytest.raises(ServeError) as caught:
        request_inputs(message)
    assert caught.value.kind is ErrorKind.BAD_INPUT
    assert words in caught.value.message


def test_parameters_both_ways() -> None:
    sent = {
        "b": InferParameter(bool_param=False),
        "i": InferParameter(int64_param=-3),
        "s": InferParameter(string_param="x"),
        "d": InferParameter(double_param=0.5),
        "u": InferParameter(uint64_param=2**64 - 1),
        "none": InferParameter(),
    }
    values = parameters_of(sent)
    assert values == {"b": False, "i": -3, "s": "x", "d": 0.5, "u": 2**64 - 1}
    assert parameters_of({k: infer_parameter(v) for k, v in values.items()}) == values
    assert infer_parameter(2**64 - 1).uint64_param == 2**64 - 1
    assert infer_parameter(True).bool_param is True


def test_a_handler_exception_is_internal_not_unavailable() -> None:
    failed = ServeError(ErrorKind.HANDLER_FAILED, "Prediction failed", code=503)
    assert oip_error(failed).code is None
    own = ServeError(ErrorKind.HANDLER_FAILED, "busy", code=503)
    assert oip_error(own) is own


def test_stream_shape_selects_the_service_and_its_reply_type() -> None:
    assert type(oip_service(None, "mlserver")) is OipRpcs  # type: ignore[arg-type]
    triton = oip_service(None, "triton")  # type: ignore[arg-type]
    assert type(triton) is TritonStreamOipRpcs
    mapping = triton.base().__mapping__()
    stream = mapping["/inference.GRPCInferenceService/ModelStreamInfer"]
    assert stream.reply_type is ModelStreamInferResponse
    with pytest.raises(ValueError, match="shape"):
        oip_service(None, "kserve")  # type: ignore[arg-type]


def test_stream_shape_setting(tmp_path: Path) -> None:
    assert load_config(CliOptions(), {}, tmp_path).oip_grpc_stream_shape == "mlserver"
    (tmp_path / "config.properties").write_text("oip_grpc_stream_shape=Triton\n")
    assert load_config(CliOptions(), {}, tmp_path).oip_grpc_stream_shape == "triton"
    (tmp_path / "config.properties").write_text("oip_grpc_stream_shape=kserve\n")
    with pytest.raises(ConfigError, match="oip_grpc_stream_shape"):
        load_config(CliOptions(), {}, tmp_path)


def test_proto_field_numbers(tmp_path: Path) -> None:
    """Spec §2.2: the numbers and types clients depend on, Triton's additions included."""
    out = tmp_path / "oip.pb"
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{REPO / 'proto'}",
         f"--descriptor_set_out={out}", "grpc_predict_v2.proto"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    (proto,) = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    assert proto.package == "inference"

    def fields(message: descriptor_pb2.DescriptorProto) -> list[tuple[str, int, int]]:
        return [(f.name, f.number, f.type) for f in message.field]

    messages = {m.name: m for m in proto.message_type}
    assert fields(messages["InferParameter"]) == [
        ("bool_param", 1, F.TYPE_BOOL),
        ("int64_param", 2, F.TYPE_INT64),
        ("string_param", 3, F.TYPE_STRING),
        ("double_param", 4, F.TYPE_DOUBLE),
        ("uint64_param", 5, F.TYPE_UINT64),
    ]
    assert [(n, i) for n, i, _t in fields(messages["InferTensorContents"])] == [
        ("bool_contents", 1), ("int_contents", 2), ("int64_contents", 3), ("uint_contents", 4),
        ("uint64_contents", 5), ("fp32_contents", 6), ("fp64_contents", 7),
        ("bytes_contents", 8),
    ]  # fmt: skip
    assert [(n, i) for n, i, _t in fields(messages["ModelInferRequest"])] == [
        ("model_name", 1), ("model_version", 2), ("id", 3), ("parameters", 4), ("inputs", 5),
        ("outputs", 6), ("raw_input_contents", 7),
    ]  # fmt: skip
    assert [(n, i) for n, i, _t in fields(messages["ModelInferResponse"])] == [
        ("model_name", 1), ("model_version", 2), ("id", 3), ("parameters", 4), ("outputs", 5),
        ("raw_output_contents", 6),
    ]  # fmt: skip
    assert [(n, i) for n, i, _t in fields(messages["ModelStreamInferResponse"])] == [
        ("error_message", 1), ("infer_response", 2),
    ]  # fmt: skip
    (service,) = proto.service
    assert service.name == "GRPCInferenceService"
    assert [(m.name, m.client_streaming, m.server_streaming) for m in service.method] == [
        ("ServerLive", False, False), ("ServerReady", False, False),
        ("ModelReady", False, False), ("ServerMetadata", False, False),
        ("ModelMetadata", False, False), ("ModelInfer", False, False),
        ("ModelStreamInfer", True, True), ("RepositoryIndex", False, False),
        ("RepositoryModelLoad", False, False), ("RepositoryModelUnload", False, False),
        ("ModelConfig", False, False), ("ModelStatistics", False, False),
    ]  # fmt: skip
    assert service.method[6].output_type == ".inference.ModelInferResponse"
    # the repository messages: Triton's and MLServer's numbers (spec §2.2)
    assert [(n, i) for n, i, _t in fields(messages["RepositoryIndexRequest"])] == [
        ("repository_name", 1), ("ready", 2),
    ]  # fmt: skip
    (model_index,) = messages["RepositoryIndexResponse"].nested_type
    assert [(n, i) for n, i, _t in fields(model_index)] == [
        ("name", 1), ("version", 2), ("state", 3), ("reason", 4),
    ]  # fmt: skip
    for name in ("RepositoryModelLoadRequest", "RepositoryModelUnloadRequest"):
        assert [(n, i) for n, i, _t in fields(messages[name])] == [
            ("repository_name", 1), ("model_name", 2), ("parameters", 3),
        ]  # fmt: skip
    assert fields(messages["ModelRepositoryParameter"]) == [
        ("bool_param", 1, F.TYPE_BOOL),
        ("int64_param", 2, F.TYPE_INT64),
        ("string_param", 3, F.TYPE_STRING),
        ("bytes_param", 4, F.TYPE_BYTES),
    ]
