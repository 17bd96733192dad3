"""JSON tensor ``data``: flattening and the element checks of each datatype.

:func:`flatten` turns nested (natural shape) or flat ``data`` into one flat list.
:func:`encode_elements` checks every element against the datatype and packs the binary
form in the same pass; the checks run on the set of element types and on the packing
itself (both in C), and only when something is wrong does a Python loop look for the
first offending element to name it. Element numbers in messages are flat, row-major
indices.

Rules: BOOL takes JSON booleans only. Integer datatypes take integers in range; a float
with no fractional part (``2.0``) is accepted as that integer, a boolean is not. FP16,
FP32, FP64 and BF16 take numbers (integers or floats, not booleans); a finite value the
datatype cannot hold (it would round to infinity) is refused, while NaN and infinities
are kept. BYTES takes strings, UTF-8 encoded (and, from Python callers, ``bytes``).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Iterator, Sequence
from itertools import chain
from typing import Any

from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.oip.datatypes import Datatype
from trioserve.core.oip.packing import pack, pack_bytes

_NESTING = (list, tuple)
_NUMBER = frozenset({int, float})
_BYTES_ELEMENT = frozenset({str, bytes, bytearray})


def flatten(data: Any) -> tuple[list[Any], set[type]]:
    """``data`` as a flat list, with the set of its elements' types.

    Lists (and tuples, from Python callers) nest; anything else is an element, so a bare
    scalar is a one-element tensor. Only the element count is checked against the shape
    (by the caller), not how the nesting splits it.
    """
    if type(data) not in _NESTING:
        return [data], {type(data)}
    flat = data if type(data) is list else list(data)
    kinds = set(map(type, flat))
    while kinds & {list, tuple}:
        # Uniform nesting unwraps one level at a time in C; ragged nesting walks.
        flat = list(chain.from_iterable(flat)) if kinds <= {list, tuple} else list(_walk(flat))
        kinds = set(map(type, flat))
    return flat, kinds


def _walk(items: Sequence[Any]) -> Iterator[Any]:
    """The leaves of ragged nesting, depth-first, without recursion."""
    stack = [iter(items)]
    while stack:
        for item in stack[-1]:
            if type(item) in _NESTING:
                stack.append(iter(item))
                break
            yield item
        else:
            stack.pop()


def encode_elements(
    datatype: Datatype, flat: list[Any], kinds: set[type], where: str
) -> tuple[list[Any], bytes]:
    """Check ``flat`` (from :func:`flatten`) against ``datatype``: the elements as Python
    values of the datatype (ints for integer types, floats for FP types, the given values
    otherwise) and their binary form. ``where`` (``"input 'x': "``) starts any message.
    Raises ``ServeError(BAD_INPUT)`` naming the first offending element."""
    refuse = _Refuser(flat, datatype.name, where)
    if datatype.name == "BOOL":
        if kinds - {bool}:
            refuse.first(lambda v: type(v) is not bool, "a boolean")
        return flat, bytes(flat)
    if datatype.name == "BYTES":
        if not kinds <= _BYTES_ELEMENT:
            refuse.first(lambda v: type(v) not in _BYTES_ELEMENT, "a string")
        try:
            return flat, pack_bytes(flat)
        except UnicodeEncodeError:
            refuse.first(lambda v: not _encodes(v), "valid Unicode")
            raise
        except OverflowError as exc:
            raise ServeError(ErrorKind.BAD_INPUT, f"{where}{exc}") from None
    if datatype.int_range is not None:
        if kinds - {int}:
            if kinds - _NUMBER:
                refuse.first(lambda v: type(v) not in _NUMBER, "an integer")
            refuse.first(lambda v: type(v) is float and not _integral(v), "an integer")
            flat = [int(value) for value in flat]
        low, high = datatype.int_range
        if flat and (min(flat) < low or max(flat) > high):
            refuse.first(lambda v: not low <= v <= high, f"in range ({low}..{high})")
        return flat, pack(datatype, flat)
    if not kinds <= _NUMBER:
        refuse.first(lambda v: type(v) not in _NUMBER, "a number")
    try:
        raw = pack(datatype, flat)
    except (OverflowError, struct.error):
        refuse.first(lambda v: not _fits(datatype, v), "in range")
        raise  # not reached: an element failed to pack, so one is refused
    if int in kinds:
        flat = [float(value) for value in flat]
    return flat, raw


def _integral(value: float) -> bool:
    return math.isfinite(value) and value.is_integer()


def _encodes(value: str | bytes | bytearray) -> bool:
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return False
    return True


def _fits(datatype: Datatype, value: int | float) -> bool:
    try:
        pack(datatype, [value])
    except (OverflowError, struct.error):
        return False
    return True


class _Refuser:
    """Raises ``ServeError(BAD_INPUT)`` naming the first element that a test finds bad."""

    __slots__ = ("datatype", "flat", "where")

    def __init__(self, flat: list[Any], datatype: str, where: str) -> None:
        self.flat = flat
        self.datatype = datatype
        self.where = where

    def first(self, bad: Callable[[Any], bool], wanted: str) -> None:
        for index, value in enumerate(self.flat):
            if bad(value):
                raise ServeError(
                    ErrorKind.BAD_INPUT,
                    f"{self.where}data element {index} is {show(value)}, "
                    f"not {wanted} for {self.datatype}",
                )


def show(value: Any, limit: int = 40) -> str:
    """A value as a client would have written it in JSON, cut to ``limit`` characters."""
    if isinstance(value, bytes | bytearray):
        text = repr(bytes(value))
    else:
        try:
            text = json.dumps(value, allow_nan=True)
        except (TypeError, ValueError):
            text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
