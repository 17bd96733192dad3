"""The strict protobuf wire-format check (trioserve/core/protowire.py), sans-IO, on a
hand-written schema: every malformed class is refused with BAD_INPUT naming the problem,
well-formed input (unknown fields, packed and unpacked numbers, padded varints) passes."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trioserve.core import protowire
from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.protowire import (
    BYTES,
    FIXED32,
    FIXED64,
    MAX_DEPTH,
    MAX_UNKNOWN_FIELDS,
    MESSAGE,
    STRING,
    VARINT,
    FieldSpec,
    MessageSchema,
)

INNER = MessageSchema("Inner", {1: FieldSpec("name", STRING), 2: FieldSpec("blob", BYTES)})
OUTER = MessageSchema(
    "Outer",
    {
        1: FieldSpec("model_name", STRING),
        2: FieldSpec("count", VARINT),
        3: FieldSpec("shape", VARINT, repeated=True),
        4: FieldSpec("ratio", FIXED32),
        5: FieldSpec("inputs", MESSAGE, repeated=True, message=INNER),
        6: FieldSpec("values", FIXED32, repeated=True),
        7: FieldSpec("wide", FIXED64, repeated=True),
        8: FieldSpec("stamp", FIXED64),
    },
)


def varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def delimited(number: int, data: bytes) -> bytes:
    return tag(number, 2) + varint(len(data)) + data


def refused(data: bytes, schema: MessageSchema = OUTER) -> str:
    with pytest.raises(ServeError) as caught:
        protowire.check(data, schema)
    assert caught.value.kind is ErrorKind.BAD_INPUT
    assert caught.value.message.startswith(f"malformed protobuf in {schema.name}: ")
    return caught.value.message


def test_well_formed_messages_pass() -> None:
    inner = delimited(1, "naïve".encode()) + delimited(2, b"\xff\x00")
    data = b"".join(
        [
            delimited(1, b"resnet"),
            tag(2, 0) + varint(2**64 - 1),  # a 10-byte varint (a negative int64)
            delimited(3, varint(1) + varint(3) + varint(224) + varint(2**63)),  # packed
            tag(3, 0) + varint(5),  # and unpacked, in one message
            tag(4, 5) + b"\x00\x00\x80\x3f",
            delimited(5, inner),
            delimited(5, b""),
            delimited(6, b"\x00" * 8),
            tag(6, 5) + b"\x00" * 4,
            delimited(7, b"\x01" * 16),
            tag(8, 1) + b"\x00" * 8,
            tag(99, 0) + varint(7),  # unknown fields: only their framing matters
            delimited(100, b"\xff\xfe anything"),
            tag(101, 5) + b"abcd",
            tag(102, 1) + b"abcdefgh",
            tag(2**29 - 1, 0) + b"\x00",  # the highest field number
            b"\x90\x80\x00\x01",  # field 2's tag padded to three bytes (still valid)
        ]
    )
    protowire.check(data, OUTER)
    protowire.check(b"", OUTER)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(b"\x80", "the varint at byte 0 is cut off by the end of the message",
                     id="truncated-tag"),
        pytest.param(b"\x10\x96", "the varint at byte 1 is cut off", id="truncated-varint"),
        pytest.param(b"\x10" + b"\xff" * 10 + b"\x01", "the varint at byte 1 is longer than 10",
                     id="overlong-varint"),
        pytest.param(b"\x0a\x80\x80", "the varint at byte 1 is cut off", id="truncated-length"),
        pytest.param(b"\xf8\xff\xff\xff\x7f\x00", "the tag at byte 0 is over 32 bits",
                     id="tag-over-32-bits"),
        pytest.param(b"\x00\x01", "the tag at byte 0 has field number 0", id="field-zero"),
        pytest.param(b"\x0a\xff\xff\xff\xff\x0fabc",
                     "field 1 (model_name) at byte 0: length 4294967295 runs past the end of "
                     "the 9-byte message", id="4GiB-length-over-3-bytes"),
        pytest.param(b"\x0a\x05ab", "field 1 (model_name) at byte 0: length 5 runs past the end",
                     id="length-past-end"),
        pytest.param(b"\x0e", "field 1 (model_name) at byte 0 has wire type 6, which does not "
                     "exist", id="wire-type-6"),
        pytest.param(b"\x0f", "field 1 (model_name) at byte 0 has wire type 7, which does not "
                     "exist", id="wire-type-7"),
        pytest.param(tag(50, 7), "field 50 at byte 0 has wire type 7", id="unknown-wire-type-7"),
        pytest.param(tag(9, 3) + tag(9, 4), "field 9 at byte 0 has wire type 3 (a group)",
                     id="group-start"),
        pytest.param(tag(9, 4), "field 9 at byte 0 has wire type 4 (a group)", id="group-end"),
        pytest.param(tag(4, 5) + b"\x01\x02", "field 4 (ratio) at byte 0: its 4-byte value runs "
                     "past the end of the 3-byte message", id="truncated-fixed32"),
        pytest.param(tag(8, 1) + b"\x01" * 7, "field 8 (stamp) at byte 0: its 8-byte value",
                     id="truncated-fixed64"),
        pytest.param(tag(60, 5) + b"\x01", "field 60 at byte 0: its 4-byte value",
                     id="unknown-truncated-fixed32"),
        pytest.param(delimited(1, b"\xff\xfe"), "field 1 (model_name) at byte 0: the string is "
                     "not UTF-8 (invalid start byte at its byte 0)", id="invalid-utf8"),
        pytest.param(delimited(1, b"ok\xed\xa0\x80"), "the string is not UTF-8",
                     id="utf8-surrogate"),
        pytest.param(tag(1, 0) + b"\x05", "field 1 (model_name) at byte 0 has wire type 0 "
                     "(varint), but a string has wire type 2", id="string-as-varint"),
        pytest.param(tag(5, 5) + b"abcd", "field 5 (inputs) at byte 0 has wire type 5 (32-bit), "
                     "but a message has wire type 2", id="message-as-fixed32"),
        pytest.param(delimited(2, b"\x01"), "field 2 (count) at byte 0 has wire type 2 "
                     "(length-delimited), but a varint number has wire type 0", id="packed-single"),
        pytest.param(tag(3, 1) + b"\x00" * 8, "field 3 (shape) at byte 0 has wire type 1 (64-bit),"
                     " but a varint number has wire type 0 (or 2, packed)", id="repeated-mismatch"),
        pytest.param(delimited(3, b"\x01\x96"), "field 3 (shape) at byte 0: the last packed "
                     "varint is cut off", id="packed-truncated"),
        pytest.param(delimited(3, b"\xff" * 10 + b"\x01"), "field 3 (shape) at byte 0: a packed "
                     "varint is longer than 10 bytes", id="packed-overlong"),
        pytest.param(delimited(6, b"\x00" * 7), "field 6 (values) at byte 0: packed length 7 is "
                     "not a multiple of 4", id="packed-float"),
        pytest.param(delimited(7, b"\x00" * 12), "packed length 12 is not a multiple of 8",
                     id="packed-double"),
        pytest.param(delimited(5, delimited(1, b"\xc3")), "field 5 (inputs) at byte 0: field 1 "
                     "(name) at byte 2: the string is not UTF-8", id="nested-utf8"),
        pytest.param(delimited(1, b"x") + delimited(5, b"\x0f"), "field 5 (inputs) at byte 3: "
                     "field 1 (name) at byte 5 has wire type 7", id="nested-wire-type"),
        pytest.param(delimited(5, b"\x0a\x09abc"), "field 5 (inputs) at byte 0: field 1 (name) "
                     "at byte 2: length 9 runs past the end of the 5-byte message",
                     id="nested-length-past-its-end"),
    ],
)  # fmt: skip
def test_malformed_input_is_refused_naming_the_problem(data: bytes, expected: str) -> None:
    assert expected in refused(data)


def test_a_nested_length_may_not_reach_past_its_own_message() -> None:
    """The inner length fits the whole buffer but not the inner message."""
    inner = b"\x0a\x05ab"  # name: 5 bytes claimed, 2 there
    data = delimited(5, inner) + delimited(1, b"xyz")
    assert "field 5 (inputs) at byte 0: field 1 (name) at byte 2: length 5" in refused(data)


def test_random_bytes_are_refused() -> None:
    data = random.Random(27).randbytes(64)
    assert "malformed protobuf in Outer" in refused(data)


def test_nesting_is_bounded_and_the_path_is_shortened() -> None:
    node = MessageSchema("Node", {})
    node.fields[1] = FieldSpec("child", MESSAGE, message=node)
    data = b""
    for _ in range(MAX_DEPTH):
        data = delimited(1, data)
    protowire.check(data, node)  # MAX_DEPTH levels below the top: fine
    message = refused(delimited(1, data), node)
    assert message.endswith(f"messages are nested more than {MAX_DEPTH} deep")
    assert "more fields)" in message and len(message) < 300


def test_unknown_fields_are_bounded_over_the_whole_message() -> None:
    unknown = tag(77, 0) + b"\x01"
    protowire.check(unknown * MAX_UNKNOWN_FIELDS, OUTER)
    top = unknown * (MAX_UNKNOWN_FIELDS - 1)
    protowire.check(top + delimited(5, unknown), OUTER)
    with pytest.raises(ServeError) as caught:
        protowire.check(top + delimited(5, unknown * 2), OUTER)
    assert caught.value.kind is ErrorKind.BAD_INPUT
    at = len(top) + 2 + len(unknown)
    assert caught.value.message == (
        f"Outer carries more than {MAX_UNKNOWN_FIELDS} fields this server does not know "
        f"(field 77 at byte {at} is one too many); at most {MAX_UNKNOWN_FIELDS} are accepted"
    )


def random_message() -> st.SearchStrategy[bytes]:
    """Well-formed Outer messages, fields in any order and repeated."""
    inner = st.lists(
        st.one_of(
            st.text(max_size=8).map(lambda s: delimited(1, s.encode())),
            st.binary(max_size=8).map(lambda b: delimited(2, b)),
        ),
        max_size=3,
    ).map(b"".join)
    field = st.one_of(
        st.text(max_size=12).map(lambda s: delimited(1, s.encode())),
        st.integers(0, 2**64 - 1).map(lambda v: tag(2, 0) + varint(v)),
        st.lists(st.integers(0, 2**64 - 1), max_size=5).map(
            lambda vs: delimited(3, b"".join(map(varint, vs)))
        ),
        st.binary(min_size=4, max_size=4).map(lambda b: tag(4, 5) + b),
        inner.map(lambda b: delimited(5, b)),
        st.binary(max_size=5).map(lambda b: delimited(6, b * 4)),
        st.integers(9, 2**29 - 1).map(lambda n: delimited(n, b"opaque")),
    )
    return st.lists(field, max_size=8).map(b"".join)


@given(random_message())
def test_every_well_formed_message_passes(data: bytes) -> None:
    protowire.check(data, OUTER)


@given(random_message(), st.data())
def test_a_cut_message_is_refused_or_still_well_formed(data: bytes, draw: st.DataObject) -> None:
    """Cutting a message anywhere gives a shorter well-formed one or a clean refusal."""
    cut = draw.draw(st.integers(0, len(data)))
    error = refused_or_none(data[:cut])
    assert error is None or error.kind is ErrorKind.BAD_INPUT


@given(st.binary(max_size=200))
def test_arbitrary_bytes_pass_or_are_refused_cleanly(data: bytes) -> None:
    error = refused_or_none(data)
    if error is not None:
        assert error.kind is ErrorKind.BAD_INPUT
        assert error.message.startswith("malformed protobuf in Outer: ")


def refused_or_none(data: bytes) -> ServeError | None:
    try:
        protowire.check(data, OUTER)
    except ServeError as error:
        return error
    return None
