"""Hypothesis strategies and helpers shared by the tests of the C collator."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st

from trioserve._collate import ffi

#: For every property test here: no deadline, since sanitizer builds run several times slower.
native_settings = settings(deadline=None)

ITEMSIZES = (1, 2, 4, 8)
SENTINEL = 0xA5
U64 = (1 << 64) - 1
I64 = (1 << 63) - 1

#: Integers that break naive size arithmetic.
HUGE = st.sampled_from(
    [1 << 31, (1 << 32) - 1, 1 << 32, 1 << 40, 1 << 56, 1 << 62, I64, 1 << 63, U64, 1 << 64]
)


def exact(data: bytes | int) -> memoryview:
    """A writable buffer in an allocation of exactly its size (``bytes`` and ``bytearray``
    keep a spare NUL byte): under AddressSanitizer, one byte past its end is a redzone."""
    size = data if isinstance(data, int) else len(data)
    cdata = ffi.new("uint8_t[]", size)
    if not isinstance(data, int):
        ffi.memmove(cdata, data, size)
    return memoryview(ffi.buffer(cdata))  # the buffer keeps cdata alive


def embed(data: bytes, lead: int, tail: int, kind: str) -> Any:
    """``data`` as a buffer of the given kind, at offset ``lead`` of a bigger buffer."""
    if kind == "exact":
        return exact(data)
    if kind == "bytes" and lead == 0 and tail == 0:
        return bytes(data)
    if kind == "bytearray" and lead == 0 and tail == 0:
        return bytearray(data)
    storage = bytearray([SENTINEL]) * lead + bytearray(data) + bytearray([SENTINEL]) * tail
    view = memoryview(storage)[lead : lead + len(data)]
    return view.toreadonly() if kind == "readonly" else view


buffer_kinds = st.sampled_from(["bytes", "bytearray", "view", "readonly", "exact"])
offsets = st.integers(0, 9)


@st.composite
def embedded(draw: st.DrawFn, data: bytes) -> Any:
    return embed(data, draw(offsets), draw(offsets), draw(buffer_kinds))


@dataclass
class Batch:
    inputs: list[Any]
    shapes: list[tuple[int, ...]]
    itemsize: int
    raw: list[bytes]


@st.composite
def batches(draw: st.DrawFn, min_n: int = 1, max_n: int = 8) -> Batch:
    """A valid batch: equal shapes or ragged first dimensions, inputs at odd offsets."""
    itemsize = draw(st.sampled_from(ITEMSIZES))
    ndim = draw(st.integers(0, 3))
    n = draw(st.integers(min_n, max_n))
    trailing = tuple(
        draw(st.lists(st.integers(0, 4), min_size=max(ndim - 1, 0), max_size=max(ndim - 1, 0)))
    )
    if ndim == 0:
        shapes: list[tuple[int, ...]] = [()] * n
    elif draw(st.booleans()):
        shapes = [(draw(st.integers(0, 6)), *trailing) for _ in range(n)]
    else:
        first = draw(st.integers(0, 6))
        shapes = [(first, *trailing)] * n
    raw = [
        draw(st.binary(min_size=size, max_size=size))
        for size in (math.prod(s) * itemsize for s in shapes)
    ]
    inputs = [draw(embedded(data)) for data in raw]
    return Batch(inputs, shapes, itemsize, raw)


def expected_collation(batch: Batch) -> tuple[bytes, tuple[int, ...], tuple[int, ...] | None]:
    """An oracle independent of both implementations: build the batch row by row."""
    n = len(batch.shapes)
    first = batch.shapes[0]
    if not first:
        return b"".join(batch.raw), (n,), None
    max_rows = max(s[0] for s in batch.shapes)
    stride = max_rows * math.prod(first[1:]) * batch.itemsize
    out = b"".join(data + bytes(stride - len(data)) for data in batch.raw)
    ragged = any(s[0] != first[0] for s in batch.shapes)
    lengths = tuple(s[0] for s in batch.shapes) if ragged else None
    return out, (n, max_rows, *first[1:]), lengths


def outcome(fn: Any, *args: Any, **kwargs: Any) -> tuple[str, Any]:
    """("ok", result) or ("error", exception type name); anything but ValueError propagates."""
    try:
        return "ok", fn(*args, **kwargs)
    except ValueError as exc:
        return "error", type(exc).__name__
