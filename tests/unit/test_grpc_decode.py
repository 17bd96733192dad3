"""The strict request decoder (trioserve/grpc/decode.py) on the real generated messages:
valid messages of every request type round-trip, malformed bytes are INVALID_ARGUMENT
naming the problem (never the parser's own exception), and no other code of the gRPC
adapter parses request bytes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import betterproto2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trioserve._proto.grpc.health.v1 import HealthBase
from trioserve._proto.inference import (
    GrpcInferenceServiceBase,
    ModelInferRequest,
    ModelInferRequestInferInputTensor,
)
from trioserve._proto.org.pytorch.serve.grpc.inference import (
    InferenceApIsServiceBase,
    PredictionsRequest,
)
from trioserve._proto.org.pytorch.serve.grpc.management import ManagementApIsServiceBase
from trioserve.core import protowire
from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.protowire import MESSAGE, STRING, MessageSchema
from trioserve.grpc.decode import request_decoder, wire_schema

GRPC_PACKAGE = Path(__file__).resolve().parents[2] / "trioserve" / "grpc"
BASES = (InferenceApIsServiceBase, ManagementApIsServiceBase, GrpcInferenceServiceBase, HealthBase)
REQUEST_TYPES = sorted(
    {route.request_type for base in BASES for route in base().__mapping__().values()},
    key=lambda t: t.__name__,
)


def refusal(message_type: type[Any], data: bytes) -> str:
    with pytest.raises(ServeError) as caught:
        request_decoder(message_type)(data)
    assert caught.value.kind is ErrorKind.BAD_INPUT
    return caught.value.message


# -- the cases, on the messages they were sent as ------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(b"\x0a\xff\xff\xff\xff\x0fabc", "malformed protobuf in ModelInferRequest: "
                     "field 1 (model_name) at byte 0: length 4294967295 runs past the end of the "
                     "9-byte message", id="4GiB-length"),
        pytest.param(b"\x0a\x03abc\x0f", "field 1 (model_name) at byte 5 has wire type 7, which "
                     "does not exist", id="wire-type-7"),
        pytest.param(b"\x0a\x02\xff\xfe", "field 1 (model_name) at byte 0: the string is not "
                     "UTF-8", id="invalid-utf8"),
        pytest.param(b"\x0a\x03abc\x1a", "field 3 (id) at byte 5: the varint at byte 6 is cut off",
                     id="truncated-length"),
        pytest.param(b"\x2a\x04\x1a\x02\x01\x96", "field 5 (inputs) at byte 0: field 3 (shape) "
                     "at byte 2: the last packed varint is cut off", id="nested-packed"),
        pytest.param(bytes(range(200, 256)), "malformed protobuf in ModelInferRequest: ",
                     id="random-bytes"),
    ],
)  # fmt: skip
def test_malformed_model_infer_requests(data: bytes, expected: str) -> None:
    assert expected in refusal(ModelInferRequest, data)


def test_every_request_type_refuses_a_nonexistent_wire_type() -> None:
    for message_type in REQUEST_TYPES:
        message = refusal(message_type, b"\x0f")
        assert message.startswith(f"malformed protobuf in {message_type.__name__}: field 1")
        assert "wire type 7, which does not exist" in message


def test_a_valid_request_decodes_as_betterproto2_would() -> None:
    request = ModelInferRequest(
        model_name="m",
        id="1",
        inputs=[ModelInferRequestInferInputTensor(name="x", datatype="INT64", shape=[2, -1])],
        raw_input_contents=[b"\x00" * 16],
    )
    assert request_decoder(ModelInferRequest)(bytes(request)) == request
    prediction = PredictionsRequest(model_name="m", input={"data": b"\xff"}, sequence_id="s")
    assert request_decoder(PredictionsRequest)(bytes(prediction)) == prediction


def test_schemas_follow_the_generated_field_metadata() -> None:
    schema = wire_schema(ModelInferRequest)
    assert schema.name == "ModelInferRequest"
    assert schema.fields[1].kind == STRING
    inputs = schema.fields[5]
    assert inputs.kind == MESSAGE and inputs.repeated and inputs.message is not None
    assert inputs.message.fields[3].repeated  # shape: packed int64
    parameters = schema.fields[4].message  # map<string, InferParameter>: entries
    assert parameters is not None and parameters.fields[1].kind == STRING
    assert parameters.fields[2].message is not None
    assert parameters.fields[2].message.name == "InferParameter"
    for message_type in REQUEST_TYPES:  # every field type of every request maps to a kind
        wire_schema(message_type)


# -- property: any message of any request type round-trips; mutations fail cleanly ------

_SCALARS: dict[str, st.SearchStrategy[Any]] = {
    betterproto2.TYPE_STRING: st.text(max_size=10),
    betterproto2.TYPE_BYTES: st.binary(max_size=10),
    betterproto2.TYPE_BOOL: st.booleans(),
    betterproto2.TYPE_INT32: st.integers(-(2**31), 2**31 - 1),
    betterproto2.TYPE_SINT32: st.integers(-(2**31), 2**31 - 1),
    betterproto2.TYPE_SFIXED32: st.integers(-(2**31), 2**31 - 1),
    betterproto2.TYPE_INT64: st.integers(-(2**63), 2**63 - 1),
    betterproto2.TYPE_SINT64: st.integers(-(2**63), 2**63 - 1),
    betterproto2.TYPE_SFIXED64: st.integers(-(2**63), 2**63 - 1),
    betterproto2.TYPE_UINT32: st.integers(0, 2**32 - 1),
    betterproto2.TYPE_FIXED32: st.integers(0, 2**32 - 1),
    betterproto2.TYPE_UINT64: st.integers(0, 2**64 - 1),
    betterproto2.TYPE_FIXED64: st.integers(0, 2**64 - 1),
    betterproto2.TYPE_FLOAT: st.floats(width=32, allow_nan=False),
    betterproto2.TYPE_DOUBLE: st.floats(allow_nan=False),
}


def messages(message_type: type[Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Messages of a generated class, any field set or not (one member per oneof)."""
    meta = message_type._betterproto
    chosen: dict[str, st.SearchStrategy[Any]] = {}
    groups: dict[str, list[str]] = {}
    for name, field in meta.meta_by_field_name.items():
        if field.proto_type == betterproto2.TYPE_MAP:
            entry = meta.cls_by_field[name]._betterproto.meta_by_field_name
            value = _value(entry["value"], meta, f"{name}.value", depth)
            chosen[name] = st.dictionaries(_value(entry["key"], meta, "", depth), value, max_size=2)
        else:
            value = _value(field, meta, name, depth)
            chosen[name] = st.lists(value, max_size=3) if field.repeated else value
        if field.group is not None:
            groups.setdefault(field.group, []).append(name)
    for members in groups.values():
        for name in members:
            chosen.pop(name)
        chosen["_" + members[0]] = st.one_of(
            st.none(), *(st.tuples(st.just(n), _strategy_of(n, meta, depth)) for n in members)
        )

    def build(values: dict[str, Any]) -> Any:
        fields = {k: v for k, v in values.items() if not k.startswith("_")}
        for key, picked in values.items():
            if key.startswith("_") and picked is not None:
                fields[picked[0]] = picked[1]
        return message_type(**fields)

    return st.fixed_dictionaries(chosen).map(build)


def _strategy_of(name: str, meta: Any, depth: int) -> st.SearchStrategy[Any]:
    return _value(meta.meta_by_field_name[name], meta, name, depth)


def _value(field: Any, meta: Any, name: str, depth: int) -> st.SearchStrategy[Any]:
    if field.proto_type == betterproto2.TYPE_MESSAGE:
        return st.deferred(lambda: messages(meta.cls_by_field[name], depth + 1))
    if field.proto_type == betterproto2.TYPE_ENUM:
        return st.sampled_from(list(meta.cls_by_field[name]))
    return _SCALARS[field.proto_type]


@st.composite
def any_request(draw: st.DrawFn) -> Any:
    message_type = draw(st.sampled_from(REQUEST_TYPES))
    return draw(messages(message_type))


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(any_request())
def test_every_valid_request_round_trips(request: Any) -> None:
    data = bytes(request)
    decoded = request_decoder(type(request))(data)
    assert bytes(decoded) == data


@st.composite
def mutated(draw: st.DrawFn) -> tuple[type[Any], bytes]:
    request = draw(any_request())
    data = bytearray(bytes(request))
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.integers(0, len(data)))
        how = draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        if how == "flip" and where < len(data):
            data[where] ^= 1 << draw(st.integers(0, 7))
        elif how == "cut":
            del data[where:]
        elif how == "insert":
            data[where:where] = draw(st.binary(min_size=1, max_size=6))
        elif where < len(data):
            del data[where]
    return type(request), bytes(data)


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_bytes_decode_or_are_refused_by_the_check(case: tuple[type[Any], bytes]) -> None:
    """No exception but BAD_INPUT escapes, and the wire check is what refuses: whatever it
    lets through, betterproto2 parses."""
    message_type, data = case
    error = refused_by_check(data, wire_schema(message_type))
    if error is not None:
        assert error.kind is ErrorKind.BAD_INPUT
        assert error.message.startswith(f"malformed protobuf in {message_type.__name__}: ")
        return
    message_type.FromString(data)
    request_decoder(message_type)(data)


def refused_by_check(data: bytes, schema: MessageSchema) -> ServeError | None:
    try:
        protowire.check(data, schema)
    except ServeError as error:
        return error
    return None


# -- structure: one decode point ------------------------------------------------------


def test_only_the_decoder_parses_request_bytes() -> None:
    """Request bytes become messages in trioserve/grpc/decode.py only, and only the bridge's
    ``_recv`` reads them off a stream (through a decoder): a new service or rpc cannot
    bypass the strict check."""
    parsing = re.compile(r"\.(FromString|parse|recv_message)\(")
    reading = re.compile(r"\brecv_data\(")
    parsers: dict[str, list[str]] = {}
    readers: dict[str, int] = {}
    for path in sorted(GRPC_PACKAGE.glob("*.py")):
        text = path.read_text()
        found = parsing.findall(text)
        if found:
            parsers[path.name] = found
        if reading.search(text):
            readers[path.name] = len(reading.findall(text))
    assert parsers == {"decode.py": ["FromString"]}
    assert readers == {"bridge.py": 2}  # the length prefix, then the message
    bridge = (GRPC_PACKAGE / "bridge.py").read_text()
    assert "return decode(data)" in bridge
    assert "request_decoder(route.request_type, bridge.limits)" in bridge
