"""Typed tensors in one pass of C (row-major, one element size of 1, 2, 4 or 8 bytes):
:func:`plan` and :func:`collate` stack or zero-pad N inputs into one batch, :func:`split`
cuts a batched output back into per-request views, :func:`aligned_buffer` allocates.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import TYPE_CHECKING, Any, NamedTuple

from trioserve.collate.native import (
    I64_MAX,
    U64_MAX,
    CollateError,
    buffers,
    byte_view,
    checked_int,
    checked_itemsize,
    ffi,
    lib,
    plain_bytes,
    sequence,
    writable,
)
from trioserve.core.frames import ALIGN

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = ["Collated", "Layout", "aligned_buffer", "collate", "plan", "split"]

_new = ffi.new
_NULL = ffi.NULL


class Layout(NamedTuple):
    """Where :func:`collate` puts a batch (from :func:`plan`)."""

    shape: tuple[int, ...]
    """``(N, *shape)`` when stacked; ``(N, max_len, *trailing)`` when padded."""
    nbytes: int
    """Size of the output: ``N * max_len * row_size``."""
    row_size: int
    """Bytes per row: itemsize times the product of the trailing dimensions."""
    lengths: tuple[int, ...] | None
    """The first dimensions when they differ (padded output), else ``None``."""


class Collated(NamedTuple):
    """A collated batch: ``buffer`` holds ``shape`` row-major, zero-padded."""

    buffer: memoryview
    """Writable, C-contiguous bytes (format ``B``), exactly the batch's size."""
    shape: tuple[int, ...]
    lengths: tuple[int, ...] | None
    """Per-input first dimensions when the batch is padded, else ``None``."""


def aligned_buffer(nbytes: int) -> memoryview:
    """A zeroed, writable buffer of ``nbytes`` whose first byte is 64-byte aligned in memory.

    The view keeps its storage (a :class:`bytearray`) alive.
    """
    nbytes = checked_int(nbytes, "nbytes", 0, I64_MAX)
    raw = bytearray(nbytes + ALIGN - 1)
    address = int(ffi.cast("uintptr_t", ffi.from_buffer(raw)))
    start = -address % ALIGN
    return memoryview(raw)[start : start + nbytes]


def _shapes(shapes: object, n: int) -> tuple[Any, int, int, list[tuple[int, ...]]]:
    """The shapes as a flat int64 array, how many it holds (n, or 1 when all are equal),
    their common rank, and the shapes as tuples."""
    seq = sequence(shapes, "shapes")
    if len(seq) != n:
        raise CollateError(f"got {n} inputs but {len(seq)} shapes")
    first = seq[0] if n else ()
    # The common case, all shapes equal: check one, cheaply.
    uniform = n and type(first) is tuple and seq.count(first) == n
    if uniform and all(type(dim) is int for dim in first):
        try:
            return ffi.new("int64_t[]", first), 1, len(first), [first] * n
        except OverflowError:
            raise CollateError(f"shape {first} has a dimension outside 64 bits") from None
    if n and set(map(type, seq)) == {tuple}:
        # Ragged (or equal but not the same tuple) shapes: still C-level loops only.
        tuples = list(seq)
        flat = list(chain.from_iterable(tuples))
        if len(set(map(len, tuples))) == 1 and set(map(type, flat)) <= {int}:
            try:
                return ffi.new("int64_t[]", flat), n, len(tuples[0]), tuples
            except OverflowError:
                pass  # found and named below
    return _shapes_slowly(seq)


def _shapes_slowly(seq: Sequence[Any]) -> tuple[Any, int, int, list[tuple[int, ...]]]:
    """_shapes for any sequence of sequences, naming the first bad shape."""
    tuples: list[tuple[int, ...]] = []
    flat: list[int] = []
    for i, shape in enumerate(seq):
        dims = shape if type(shape) is tuple else tuple(sequence(shape, f"shape {i}"))
        for dim in dims:
            if not isinstance(dim, int) or isinstance(dim, bool):
                raise TypeError(f"shape {i} has a dimension of type {type(dim).__name__}")
            if not -I64_MAX - 1 <= dim <= I64_MAX:
                raise CollateError(f"shape {i} {dims} has a dimension outside 64 bits")
        if tuples and len(dims) != len(tuples[0]):
            raise CollateError(
                f"input {i} has rank {len(dims)} but input 0 has rank {len(tuples[0])}"
            )
        tuples.append(dims)
        flat.extend(dims)
    return ffi.new("int64_t[]", flat), len(tuples), len(tuples[0]) if tuples else 0, tuples


def _collate_error(rc: int, bad: int, tuples: list[tuple[int, ...]], itemsize: int) -> Exception:
    if rc == lib.TS_E_EMPTY:
        return CollateError("nothing to collate: no inputs")
    if rc == lib.TS_E_ITEMSIZE:
        return CollateError(f"itemsize must be 1, 2, 4 or 8 bytes, not {itemsize}")
    if rc == lib.TS_E_OVERFLOW:
        return CollateError("the collated batch's size overflows 64 bits")
    if rc == lib.TS_E_SHAPE:
        shape = tuples[bad]
        if any(dim < 0 for dim in shape):
            return CollateError(f"input {bad} has a negative dimension: {shape}")
        return CollateError(
            f"input {bad} has shape {shape}: its trailing dimensions must equal input 0's "
            f"{tuples[0][1:]}"
        )
    return CollateError(f"collator error {rc} at input {bad}")


def _plan(
    shape_array: Any, count: int, ndim: int, itemsize: int, tuples: list[tuple[int, ...]]
) -> Any:
    result = ffi.new("ts_plan *")
    bad = ffi.new("uint64_t *")
    rc = lib.ts_collate_plan(shape_array, count, len(tuples), ndim, itemsize, result, bad)
    if rc != lib.TS_OK:
        raise _collate_error(rc, int(bad[0]), tuples, itemsize)
    return result


def _out_shape(n: int, max_rows: int, tuples: list[tuple[int, ...]]) -> tuple[int, ...]:
    if not tuples or not tuples[0]:
        return (n,)
    return (n, max_rows, *tuples[0][1:])


def plan(shapes: Sequence[Sequence[int]], itemsize: int) -> Layout:
    """Where :func:`collate` would put inputs of these shapes, without touching data.

    Raises:
        CollateError: no shapes, a negative dimension, different ranks or trailing
            dimensions, an itemsize other than 1, 2, 4 or 8, or a size over 64 bits.
    """
    itemsize = checked_itemsize(itemsize)
    shape_array, count, ndim, tuples = _shapes(shapes, len(sequence(shapes, "shapes")))
    result = _plan(shape_array, count, ndim, itemsize, tuples)
    lengths = tuple(t[0] for t in tuples) if result.ragged else None
    return Layout(
        _out_shape(len(tuples), int(result.max_rows), tuples),
        int(result.nbytes),
        int(result.row_bytes),
        lengths,
    )


def collate(
    inputs: Sequence[Buffer],
    shapes: Sequence[Sequence[int]],
    itemsize: int,
    out: Buffer | None = None,
) -> Collated:
    """Stack or pad N row-major inputs into one batch, in one pass without the GIL.

    Equal shapes give ``[N, *shape]``; first dimensions that differ (the trailing ones must
    match) give ``[N, max_len, *trailing]`` with zero padding, and the lengths.

    Args:
        inputs: N C-contiguous buffers, input ``i`` exactly ``prod(shapes[i]) * itemsize``
            bytes (any buffer: bytes, a slice of a bigger buffer, a NumPy array...).
        shapes: N shapes of one rank.
        itemsize: the element size: 1, 2, 4 or 8 bytes. Pad bytes are zero, which is 0 for
            every integer and IEEE float type.
        out: where to write (e.g. a reserved blob of a frame); a writable, C-contiguous
            buffer of at least :func:`plan`'s ``nbytes``, not overlapping an input. ``None``
            allocates a 64-byte-aligned buffer.

    Returns:
        The batch: ``buffer`` views ``out[:nbytes]`` (or the new buffer).

    Raises:
        CollateError: the shapes do not fit together (see :func:`plan`), an input's size does
            not match its shape, ``out`` is too short or overlaps an input.
    """
    itemsize = checked_itemsize(itemsize)
    inputs = sequence(inputs, "inputs")
    n = len(inputs)
    shape_array, count, ndim, tuples = _shapes(shapes, n)
    ptrs, lens, keep = buffers(inputs, "input")
    layout = _new("ts_plan *")
    bad = _new("uint64_t *")
    lengths = _new("int64_t[]", n) if count > 1 else _NULL  # one shape: not ragged
    out_len = 0
    args = (ptrs, lens, shape_array, count, n, ndim, itemsize)
    if out is None:
        # Inputs are checked before an output is allocated: bad shapes allocate nothing.
        rc = lib.ts_collate_check(*args, layout, bad)
        view = aligned_buffer(int(layout.nbytes) if rc == lib.TS_OK else 0)
    else:
        rc = lib.TS_OK
        view = out if plain_bytes(out) else byte_view(out, "out")
    if rc == lib.TS_OK:
        out_ptr = writable(view, "out")
        out_len = len(out_ptr)
        rc = lib.ts_collate(*args, out_ptr, out_len, lengths, layout, bad)
    if rc != lib.TS_OK:
        raise _collate_failure(rc, int(bad[0]), tuples, itemsize, keep, out_len, layout)
    return Collated(
        view[: layout.nbytes],
        _out_shape(n, int(layout.max_rows), tuples),
        tuple(ffi.unpack(lengths, n)) if layout.ragged else None,
    )


def _collate_failure(
    rc: int,
    i: int,
    tuples: list[tuple[int, ...]],
    itemsize: int,
    keep: list[Any],
    out_len: int,
    layout: Any,
) -> Exception:
    if rc == lib.TS_E_SIZE:
        need = itemsize
        for dim in tuples[i]:
            need *= dim
        return CollateError(
            f"input {i} has {len(keep[i])} bytes but shape {tuples[i]} of "
            f"{itemsize}-byte items needs {need}"
        )
    if rc == lib.TS_E_SHORT:
        return CollateError(f"out has {out_len} bytes but the batch needs {layout.nbytes}")
    if rc == lib.TS_E_OVERLAP:
        return CollateError(f"input {i} overlaps out")
    return _collate_error(rc, i, tuples, itemsize)


def split(
    buf: Buffer,
    lengths: Sequence[int],
    row_size: int,
    *,
    stride: int | None = None,
) -> list[memoryview]:
    """Cut a batched output into per-request views, without copying.

    Args:
        buf: the batch, C-contiguous.
        lengths: each request's first dimension (rows).
        row_size: bytes per row (itemsize times the product of the trailing dimensions).
        stride: ``None`` when the requests' rows follow each other (``[sum(lengths), ...]``);
            else the rows per request of a padded batch (``[N, stride, ...]``), request ``i``
            starting at row ``i * stride``.

    Returns:
        One view per request, ``lengths[i] * row_size`` bytes; writable when ``buf`` is.

    Raises:
        CollateError: a negative length, a length over the stride, a size over 64 bits, or
            lengths that do not cover ``buf`` exactly.
    """
    view = byte_view(buf, "buf")
    seq = sequence(lengths, "lengths")
    rows = [
        checked_int(length, f"length {i}", -I64_MAX - 1, I64_MAX) for i, length in enumerate(seq)
    ]
    row_size = checked_int(row_size, "row_size", 0, U64_MAX)
    stride_rows = -1 if stride is None else checked_int(stride, "stride", 0, I64_MAX)
    n = len(rows)
    offsets = ffi.new("uint64_t[]", n)
    sizes = ffi.new("uint64_t[]", n)
    bad = ffi.new("uint64_t *")
    rc = lib.ts_split(
        view.nbytes, ffi.new("int64_t[]", rows), n, row_size, stride_rows, offsets, sizes, bad
    )
    if rc != lib.TS_OK:
        i = int(bad[0])
        if rc == lib.TS_E_SHAPE:
            if rows[i] < 0:
                raise CollateError(f"length {i} is negative: {rows[i]}")
            raise CollateError(f"length {i} is {rows[i]}, more than the stride of {stride} rows")
        if rc == lib.TS_E_OVERFLOW:
            raise CollateError("the split's sizes overflow 64 bits")
        if rc == lib.TS_E_SHORT:
            raise CollateError(
                f"request {i} ({rows[i]} rows of {row_size} bytes) runs past the end of the "
                f"{view.nbytes}-byte buffer"
            )
        if rc == lib.TS_E_SIZE:
            covered = (sum(rows) if stride is None else n * stride) * row_size
            raise CollateError(
                f"the lengths cover {covered} bytes but the buffer has {view.nbytes}"
            )
        raise CollateError(f"collator error {rc} at length {i}")
    return [
        view[off : off + size]
        for off, size in zip(ffi.unpack(offsets, n), ffi.unpack(sizes, n), strict=True)
    ]
