"""Property: hostile protobuf messages to the gRPC request decoder and the OIP conversions
(issue 27's "Done when").

Valid ``ModelInferRequest`` messages are built with the generated betterproto2 classes from
the OIP's datatype table (typed contents or raw contents, matching or not, parameters of
every kind, requested outputs), serialized, then mutated: bytes flipped, cut, inserted,
deleted or spliced, invalid UTF-8 inserted, unknown fields appended, fields or the whole
message repeated up to the byte budget. Each is decoded (``trioserve/grpc/decode.py``: the
strict wire check, then betterproto2) and converted as the OIP service does
(``request_inputs``, ``requested_outputs``, ``parameters_of``); TorchServe's
``PredictionsRequest`` and the management requests are decoded only. Every one must end in a
value or a neutral bad-input error with a bounded message, within the memory bound of
``hostile.py``. test_grpc_decode.py checks that the wire check, not betterproto2, is what
refuses malformed bytes.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import betterproto2
from hypothesis import example, given
from hypothesis import strategies as st

from trioserve._proto.inference import (
    InferParameter,
    InferTensorContents,
    ModelInferRequest,
    ModelInferRequestInferInputTensor,
    ModelInferRequestInferRequestedOutputTensor,
)
from trioserve._proto.org.pytorch.serve.grpc import management
from trioserve._proto.org.pytorch.serve.grpc.inference import PredictionsRequest
from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.limits import RequestLimits
from trioserve.core.oip.datatypes import DATATYPES
from trioserve.core.oip.tensor import Tensor
from trioserve.grpc.decode import request_decoder
from trioserve.grpc.oip_messages import (
    CONTENTS_FIELDS,
    parameters_of,
    request_inputs,
    requested_outputs,
)

from .hostile import BUDGET, HOSTILE, bound, measure, mutated_bytes, parsed, repeats
from .test_protowire import varint

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
CONTENTS: dict[str, st.SearchStrategy[Any]] = {
    "bool_contents": st.booleans(),
    "int_contents": INT32,
    "int64_contents": INT64,
    "uint_contents": st.integers(0, 2**32 - 1),
    "uint64_contents": st.integers(0, 2**64 - 1),
    "fp32_contents": st.floats(width=32),
    "fp64_contents": st.floats(),
    "bytes_contents": st.binary(max_size=6),
}
PARAMETER = st.one_of(
    st.builds(InferParameter),
    st.builds(InferParameter, bool_param=st.booleans()),
    st.builds(InferParameter, int64_param=INT64),
    st.builds(InferParameter, string_param=st.text(max_size=5)),
    st.builds(InferParameter, double_param=st.floats()),
    st.builds(InferParameter, uint64_param=st.integers(0, 2**64 - 1)),
)
PARAMETERS = st.dictionaries(st.text(max_size=5), PARAMETER, max_size=3)
DATATYPE_NAMES = st.one_of(*[st.sampled_from(list(DATATYPES))] * 4, st.text(max_size=5))


@st.composite
def input_tensors(draw: st.DrawFn, raw: bool) -> tuple[ModelInferRequestInferInputTensor, bytes]:
    """One input with typed contents, or (``raw``) its bytes for ``raw_input_contents``."""
    datatype = draw(DATATYPE_NAMES)
    shape = draw(st.lists(st.integers(0, 3), max_size=3) | st.lists(INT64, max_size=3))
    count = math.prod(shape) if all(0 <= dim <= 3 for dim in shape) else 0
    info = DATATYPES.get(datatype)
    if info is not None and info.contents_field is not None and draw(st.integers(0, 3)):
        field = info.contents_field
    else:
        field = draw(st.sampled_from(CONTENTS_FIELDS))
    values = draw(
        st.lists(CONTENTS[field], min_size=count, max_size=count)
        | st.lists(CONTENTS[field], max_size=4)
    )
    if values and len(values) == count and draw(st.integers(0, 15)) == 0:  # large
        size = len(bytes(InferTensorContents(**{field: values})))
        copies = draw(repeats(size, budget=BUDGET // 2))
        shape, values = [copies, *shape], values * copies
    tensor = ModelInferRequestInferInputTensor(
        name=draw(st.text(max_size=6)),
        datatype=datatype,
        shape=shape,
        parameters=draw(PARAMETERS),
    )
    if not raw:
        if draw(st.integers(0, 5)):
            tensor.contents = InferTensorContents(**{field: values})
        return tensor, b""
    try:
        blob = Tensor.from_values("x", datatype, shape, values).raw.tobytes()
    except ServeError:
        blob = draw(st.binary(max_size=16))
    return tensor, blob


@st.composite
def infer_requests(draw: st.DrawFn) -> ModelInferRequest:
    raw = draw(st.booleans())
    items = draw(st.lists(input_tensors(raw), max_size=4))
    blobs = [blob for _, blob in items]
    if raw and draw(st.integers(0, 5)) == 0:
        blobs = blobs[1:]  # one blob short
    outputs = st.builds(
        ModelInferRequestInferRequestedOutputTensor, name=st.text(max_size=4), parameters=PARAMETERS
    )
    return ModelInferRequest(
        model_name=draw(st.text(max_size=4)),
        model_version=draw(st.sampled_from(["", "1"])),
        id=draw(st.text(max_size=4)),
        parameters=draw(PARAMETERS),
        inputs=[tensor for tensor, _ in items],
        outputs=draw(st.lists(outputs, max_size=3)),
        raw_input_contents=blobs if raw else [],
    )


# -- protobuf-level mutations -----------------------------------------------------------------


@st.composite
def unknown_fields(draw: st.DrawFn) -> bytes:
    """A well-framed field of a number no request message declares, any wire type."""
    number = draw(st.integers(20, 2**29 - 1))
    wire = draw(st.sampled_from([0, 1, 2, 5]))
    payload = {
        0: varint(draw(st.integers(0, 2**64 - 1))),
        1: draw(st.binary(min_size=8, max_size=8)),
        5: draw(st.binary(min_size=4, max_size=4)),
    }.get(wire)
    if payload is None:
        data = draw(st.binary(max_size=12))
        payload = varint(len(data)) + data
    return varint(number << 3 | wire) + payload


@st.composite
def mutated_messages(draw: st.DrawFn, message: betterproto2.Message, budget: int = BUDGET) -> bytes:
    """``message``'s bytes with appended unknown fields, a part repeated (a field of its own,
    or the whole message: protobuf merges concatenated messages) and byte-level changes."""
    data = bytes(message)
    how = draw(st.sampled_from(["none", "unknown", "repeat", "grow"]))
    if how == "unknown":
        data += b"".join(draw(st.lists(unknown_fields(), min_size=1, max_size=4)))
    elif how == "repeat" and data:
        start = draw(st.integers(0, len(data) - 1))
        piece = data[start : start + draw(st.integers(1, 32))]
        data += piece * draw(st.integers(1, 4))
    elif how == "grow" and data:  # huge counts: the whole message again and again
        data *= draw(repeats(len(data), budget=budget))
    return draw(mutated_bytes(data))


def infer(body: bytes, limits: RequestLimits | None = None) -> Any:
    """What the OIP service does with a ModelInferRequest's bytes (grpc/oip.py ``_accept``)."""
    limits = limits or RequestLimits()
    message = request_decoder(ModelInferRequest, limits)(body)
    inputs = request_inputs(message, limits)
    return inputs, requested_outputs(message, limits), parameters_of(message.parameters)


# The named cases: a length of 4 GiB over 3 bytes, wire type 7, a varint cut off,
# a string that is not UTF-8; a field nested 100,000 deep (as an unknown field: no request
# message nests itself); a 1 MiB input name; a map entry without its value.


def nested(depth: int) -> bytes:
    """Field 31 (length-delimited) holding field 31 ... ``depth`` deep, the innermost empty."""
    headers, length = [], 0
    for _ in range(depth):
        header = b"\xfa\x01" + varint(length)
        headers.append(header)
        length += len(header)
    return b"".join(reversed(headers))


DEEP = nested(100_000)
MEBI_NAME = bytes(
    ModelInferRequest(
        inputs=[ModelInferRequestInferInputTensor(name="n" * 2**20, datatype="?", shape=[1])]
    )
)


# Half the budget: 2049 inputs of ~30 bytes (the limit, and beyond) fit in a quarter, and
# betterproto2 spends ~1 us a field (~5 under tracemalloc) on what the budget lets through.
@HOSTILE
@given(infer_requests().flatmap(lambda message: mutated_messages(message, BUDGET // 2)))
@example(b"\x0a\xff\xff\xff\xff\x0fabc")
@example(b"\x0a\x03abc\x0f")
@example(b"\x0a\x03abc\x1a")
@example(b"\x2a\x03\x1a\x01\x96")
@example(b"\x0a\x02\xff\xfe")
@example(DEEP)
@example(MEBI_NAME)
@example(b"\x22\x03\x0a\x01k")
@example(b"\x2a\x02\x2a\x00" * 20_000)
def test_model_infer_requests_decode_or_are_refused_within_the_bound(body: bytes) -> None:
    parsed(infer, body)


OTHER_TYPES = [PredictionsRequest] + [
    getattr(management, name)
    for name in sorted(dir(management))
    if name.endswith("Request") and isinstance(getattr(management, name), type)
]


@st.composite
def other_requests(draw: st.DrawFn) -> tuple[type[Any], bytes]:
    message_type = draw(st.sampled_from(OTHER_TYPES))
    if message_type is PredictionsRequest:
        message: Any = PredictionsRequest(
            model_name=draw(st.text(max_size=4)),
            input=draw(st.dictionaries(st.text(max_size=4), st.binary(max_size=8), max_size=3)),
            sequence_id=draw(st.none() | st.text(max_size=4)),
        )
    else:
        values = {
            betterproto2.TYPE_STRING: st.text(max_size=6),
            betterproto2.TYPE_BOOL: st.booleans(),
            betterproto2.TYPE_INT32: INT32,
        }
        fields = message_type._betterproto.meta_by_field_name.items()
        message = message_type(**{name: draw(values[f.proto_type]) for name, f in fields})
    # A smaller budget: these messages hold scalars and a map, whose copies replace each
    # other (memory stays flat), while betterproto2 spends ~1 us on each (seconds per MB).
    return message_type, draw(mutated_messages(message, BUDGET // 8))


@HOSTILE
@given(other_requests())
@example((PredictionsRequest, b"\x1a\x00" * 100_000))
@example((PredictionsRequest, b"\x0a\x02\xff\xfe"))
@example((management.RegisterModelRequest, b"\x2a\xff\xff\xff\xff\x0fabc"))
def test_other_requests_decode_or_are_refused_within_the_bound(
    case: tuple[type[Any], bytes],
) -> None:
    message_type, body = case
    parsed(request_decoder(message_type), body)


# -- the bound is a real one ----------------------------------------------------------------


def test_the_bound_fails_for_a_message_the_limits_would_refuse() -> None:
    """12,000 one-element inputs (0.3 MB) build ~70 times their size once
    max_request_inputs is raised to let them through: over the bound. Under the default
    limit the decoder counts them on the wire and refuses them before they are parsed."""
    one = bytes(
        ModelInferRequest(
            inputs=[
                ModelInferRequestInferInputTensor(
                    name="i00000",
                    datatype="INT32",
                    shape=[1],
                    contents=InferTensorContents(int_contents=[1]),
                )
            ]
        )
    )
    body = b"".join(one.replace(b"i00000", b"i%05d" % i) for i in range(12_000))
    (inputs, _, _), peak = measure(
        partial(infer, limits=RequestLimits(max_request_inputs=10**6)), body
    )
    assert len(inputs) == 12_000
    assert peak > bound(len(body))
    refused, peak = measure(infer, body)
    assert refused.kind is ErrorKind.TOO_LARGE
    assert "(inputs) has more than 2048 entries" in refused.message
    assert peak < len(body)


def test_empty_inputs_beyond_the_limit_are_refused_before_they_are_parsed() -> None:
    """An empty input is two bytes on the wire and ~250 in betterproto2, one holding an
    empty contents message four and ~850: up to ~210 times the message, built before the
    inputs could be counted."""
    for body in (b"\x2a\x00" * 20_000, b"\x2a\x02\x2a\x00" * 20_000, b"\x32\x00" * 20_000):
        refused, peak = measure(infer, body)
        assert refused.kind is ErrorKind.TOO_LARGE
        assert peak < len(body)


def test_a_parameter_without_its_value_holds_nothing() -> None:
    """A map entry of only its key is valid protobuf (the value is the default message);
    betterproto2 gives None for it, which ``parameters_of`` took for a message
    (AttributeError: an INTERNAL error instead of an answer)."""
    inputs, _outputs, parameters = parsed(infer, b"\x22\x03\x0a\x01k")
    assert (inputs, parameters) == ([], {})
    tensor = ModelInferRequestInferInputTensor(
        name="x", datatype="BOOL", shape=[1], contents=InferTensorContents(bool_contents=[True])
    )
    inner = bytes(tensor) + b"\x22\x03\x0a\x01k"  # the input's own parameters: {"k": -}
    (parsed_input,), _, _ = parsed(infer, b"\x2a" + varint(len(inner)) + inner)
    assert parsed_input.parameters == {}
