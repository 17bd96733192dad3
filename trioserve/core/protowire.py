"""A strict check of protobuf wire format, run before a lenient parser reads the bytes.

betterproto2, which decodes trioserve's gRPC messages, is lenient where the format is not: a
length that runs past the end, a tag cut off at the end and wire types 6 and 7 are accepted
(the rest is read as garbage field values), a truncated value varint or bad UTF-8 in a string
raises an exception of its own. :func:`check` walks the bytes first, in one pass, against
a :class:`MessageSchema` (which field numbers are strings, nested messages, packed numbers),
and refuses anything malformed with a :class:`~trioserve.core.errors.ServeError` of kind
BAD_INPUT whose message names the problem, the field and the byte offset, e.g.
``malformed protobuf in ModelInferRequest: field 1 (model_name) at byte 0: length
4294967295 runs past the end of the 3-byte message``.

What it refuses: a tag or varint cut off by the end of its message; a varint longer than 10
bytes; a tag over 32 bits or with field number 0; wire types 6 and 7 (they do not exist) and
3 and 4 (groups: proto3 cannot declare them, and the parser would read a group's insides as
fields of the message around it); a length or fixed-size value running past the end of its
message; for a field the schema knows, a wire type its type cannot have (a packed encoding
only for repeated numbers), a packed run whose length is not a whole number of values or
whose last varint is cut off, a string that is not UTF-8, and nested messages more than
:data:`MAX_DEPTH` deep. Fields the schema does not know are checked only for their framing,
as protobuf skips them, but more than :data:`MAX_UNKNOWN_FIELDS` of them are refused (the
parser's cost grows with their square). Valid input costs one pass over the tags (the
contents of bytes fields are skipped, packed numbers are checked by a regular expression).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from trioserve.core.errors import ErrorKind, ServeError

# What a field holds, as far as its wire format goes (the schema's ``kind``).
VARINT: Final = 0  # int32, int64, uint32, uint64, sint32, sint64, bool, enum
FIXED64: Final = 1  # double, fixed64, sfixed64
BYTES: Final = 2
FIXED32: Final = 5  # float, fixed32, sfixed32
STRING: Final = 6  # length-delimited, UTF-8
MESSAGE: Final = 7  # length-delimited, a nested message (a map's entries too)

# protobuf's own default recursion limit.
MAX_DEPTH: Final = 100
# Fields the schema does not know, in one message (nested ones included). betterproto2 keeps
# them by appending each to a bytes object, which costs the square of their number: a
# megabyte of three-byte unknown fields took it over a minute. A client that is merely newer
# than the server sends a few.
MAX_UNKNOWN_FIELDS: Final = 100

_WIRE_OF: Final = {VARINT: 0, FIXED64: 1, FIXED32: 5, BYTES: 2, STRING: 2, MESSAGE: 2}
_KIND_NAME: Final = {
    VARINT: "a varint number",
    FIXED64: "a 64-bit number",
    FIXED32: "a 32-bit number",
    BYTES: "a bytes field",
    STRING: "a string",
    MESSAGE: "a message",
}
_WIRE_NAME: Final = {0: "varint", 1: "64-bit", 2: "length-delimited", 5: "32-bit"}
# Ten bytes in a row with the continuation bit set: a varint longer than protobuf allows.
_OVERLONG: Final = re.compile(rb"[\x80-\xff]{10}")
# How many enclosing fields an error names at most (deeper ones are elided in the middle).
_PATH_SHOWN: Final = 5


class FieldSpec(NamedTuple):
    name: str
    kind: int  # one of VARINT, FIXED64, FIXED32, BYTES, STRING, MESSAGE
    repeated: bool = False
    message: MessageSchema | None = None  # the nested message's schema (kind MESSAGE)


@dataclass(eq=False, slots=True)
class MessageSchema:
    """One message type: its name (for error messages) and its fields by number. The dict
    may be filled after creation, so that a message can contain itself."""

    name: str
    fields: dict[int, FieldSpec] = field(default_factory=dict)


class _Malformed(Exception):
    """Raised while walking; the fields it was found in are added on the way out."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail
        self.within: list[str] = []  # the enclosing fields, innermost first

    def describe(self) -> str:
        path = self.within[::-1]
        if len(path) > _PATH_SHOWN:
            path = [*path[:2], f"({len(path) - 4} more fields)", *path[-2:]]
        return ": ".join([*path, self.detail])


class _TooManyUnknown(Exception):
    pass


def check(data: bytes, schema: MessageSchema) -> dict[int, int]:
    """Refuse ``data`` unless it is well-formed protobuf for ``schema`` with at most
    :data:`MAX_UNKNOWN_FIELDS` unknown fields (BAD_INPUT). Returns how many times each
    field number occurs in the top-level message, so that a caller can refuse a request of
    too many entries before a parser builds an object for each."""
    counts: dict[int, int] = {}
    try:
        _walk(data, 0, len(data), schema, 0, [MAX_UNKNOWN_FIELDS], counts)
    except _Malformed as error:
        raise ServeError(
            ErrorKind.BAD_INPUT, f"malformed protobuf in {schema.name}: {error.describe()}"
        ) from None
    except _TooManyUnknown as error:
        raise ServeError(
            ErrorKind.BAD_INPUT,
            f"{schema.name} carries more than {MAX_UNKNOWN_FIELDS} fields this server does not "
            f"know ({error}); at most {MAX_UNKNOWN_FIELDS} are accepted",
        ) from None
    return counts


def _label(number: int, spec: FieldSpec | None, at: int) -> str:
    name = "" if spec is None else f" ({spec.name})"
    return f"field {number}{name} at byte {at}"


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it."""
    start = pos
    value = 0
    shift = 0
    while pos < end:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift == 70:
            raise _Malformed(f"the varint at byte {start} is longer than 10 bytes")
    raise _Malformed(f"the varint at byte {start} is cut off by the end of the message")


def _labelled_varint(
    data: bytes, pos: int, end: int, number: int, spec: FieldSpec | None, at: int
) -> tuple[int, int]:
    """A field's varint (its value or length); an error names the field."""
    try:
        return _varint(data, pos, end)
    except _Malformed as error:
        error.within.append(_label(number, spec, at))
        raise


def _walk(
    data: bytes,
    start: int,
    end: int,
    schema: MessageSchema,
    depth: int,
    unknown: list[int],
    counts: dict[int, int] | None = None,
) -> None:
    """Check the message in ``data[start:end]``; offsets in errors count from ``data``'s
    start. ``unknown`` holds how many more unknown fields may come; ``counts``, when
    given, how many times each field number occurred (the top-level message's)."""
    fields = schema.fields
    pos = start
    while pos < end:
        at = pos
        tag = data[pos]
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = _varint(data, pos, end)
            if tag >> 32:
                raise _Malformed(f"the tag at byte {at} is over 32 bits")
        wire = tag & 7
        number = tag >> 3
        if number == 0:
            raise _Malformed(f"the tag at byte {at} has field number 0")
        if counts is not None:
            counts[number] = counts.get(number, 0) + 1
        spec = fields.get(number)
        if spec is None:
            unknown[0] -= 1
            if unknown[0] < 0:
                raise _TooManyUnknown(f"field {number} at byte {at} is one too many")
        if wire == 2:
            if pos < end and data[pos] < 0x80:
                length = data[pos]
                pos += 1
            else:
                length, pos = _labelled_varint(data, pos, end, number, spec, at)
            stop = pos + length
            if stop > end:
                raise _Malformed(
                    f"{_label(number, spec, at)}: length {length} runs past the end of the "
                    f"{end - start}-byte message"
                )
            if spec is not None:
                _check_delimited(data, pos, stop, number, spec, at, depth, unknown)
            pos = stop
        elif wire == 0:
            if spec is not None and spec.kind != VARINT:
                raise _Malformed(_mismatch(number, spec, at, wire))
            if pos < end and data[pos] < 0x80:
                pos += 1
            else:
                _value, pos = _labelled_varint(data, pos, end, number, spec, at)
        elif wire == 5 or wire == 1:
            if spec is not None and spec.kind != wire:
                raise _Malformed(_mismatch(number, spec, at, wire))
            size = 4 if wire == 5 else 8
            pos += size
            if pos > end:
                raise _Malformed(
                    f"{_label(number, spec, at)}: its {size}-byte value runs past the end of "
                    f"the {end - start}-byte message"
                )
        elif wire == 3 or wire == 4:
            raise _Malformed(
                f"{_label(number, spec, at)} has wire type {wire} (a group), which is not accepted"
            )
        else:
            raise _Malformed(
                f"{_label(number, spec, at)} has wire type {wire}, which does not exist"
            )


def _check_delimited(
    data: bytes,
    pos: int,
    stop: int,
    number: int,
    spec: FieldSpec,
    at: int,
    depth: int,
    unknown: list[int],
) -> None:
    """The contents of a known length-delimited field, ``data[pos:stop]``."""
    kind = spec.kind
    if kind == MESSAGE:
        assert spec.message is not None
        if depth >= MAX_DEPTH:
            raise _Malformed(f"messages are nested more than {MAX_DEPTH} deep")
        try:
            _walk(data, pos, stop, spec.message, depth + 1, unknown)
        except _Malformed as error:
            error.within.append(_label(number, spec, at))
            raise
    elif kind == STRING:
        try:
            str(data[pos:stop], "utf-8")
        except UnicodeDecodeError as error:
            raise _Malformed(
                f"{_label(number, spec, at)}: the string is not UTF-8 ({error.reason} at its "
                f"byte {error.start})"
            ) from None
    elif kind == BYTES:
        return
    elif not spec.repeated:
        raise _Malformed(_mismatch(number, spec, at, 2))
    elif kind == VARINT:
        if pos < stop and data[stop - 1] >= 0x80:
            raise _Malformed(
                f"{_label(number, spec, at)}: the last packed varint is cut off by the end of "
                "the field"
            )
        if _OVERLONG.search(data, pos, stop) is not None:
            raise _Malformed(f"{_label(number, spec, at)}: a packed varint is longer than 10 bytes")
    else:
        size = 4 if kind == FIXED32 else 8
        if (stop - pos) % size:
            raise _Malformed(
                f"{_label(number, spec, at)}: packed length {stop - pos} is not a multiple of "
                f"{size}"
            )


def _mismatch(number: int, spec: FieldSpec, at: int, wire: int) -> str:
    expected = _WIRE_OF[spec.kind]
    packed = " (or 2, packed)" if spec.repeated and spec.kind in (VARINT, FIXED32, FIXED64) else ""
    return (
        f"{_label(number, spec, at)} has wire type {wire} ({_WIRE_NAME[wire]}), but "
        f"{_KIND_NAME[spec.kind]} has wire type {expected}{packed}"
    )


__all__ = [
    "BYTES",
    "FIXED32",
    "FIXED64",
    "MAX_DEPTH",
    "MAX_UNKNOWN_FIELDS",
    "MESSAGE",
    "STRING",
    "VARINT",
    "FieldSpec",
    "MessageSchema",
    "check",
]
