"""Pure-Python reference of :mod:`trioserve.collate`: same functions, signatures and errors.

Written for clarity, not speed, and sharing no arithmetic with the C code: Python's integers
do not overflow, so every limit of the C code (64-bit sizes and dimensions, the frame
format's 32-bit fields) is spelled out here as an explicit comparison. The tests check the C
collator against it on random and hostile inputs; the benchmark uses it as the slow path.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from trioserve._collate import ffi as _ffi  # only to read buffer addresses (overlap checks)
from trioserve.collate import Collated, CollateError, Layout, UnpackedFrame, aligned_buffer
from trioserve.core.frames import ALIGN, FrameError, Kind

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from trioserve.collate import Meta, Payload

__all__ = ["collate", "frame_size", "pack", "pack_into", "plan", "split", "unpack", "unpack_frame"]

U32: Final = (1 << 32) - 1
I64_MIN: Final = -(1 << 63)
I64_MAX: Final = (1 << 63) - 1
U64: Final = (1 << 64) - 1
_PREFIX = struct.Struct(">IBBHI")
_COUNT = struct.Struct(">I")
_ENTRY = struct.Struct(">QQ")


def _int(value: object, what: str, low: int, high: int) -> int:
    if type(value) is bool or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if value < low or value > high:
        raise CollateError(f"{what} is {value}, outside [{low}, {high}]")
    return value


def _seq(items: object, what: str) -> Sequence[Any]:
    if isinstance(items, bytes | bytearray | memoryview | str) or not isinstance(items, Sequence):
        raise TypeError(f"{what} must be a sequence, not {type(items).__name__}")
    return items


def _view(obj: object, what: str) -> memoryview:
    try:
        view = memoryview(obj)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{what} must be a bytes-like object, not {type(obj).__name__}") from None
    if not view.c_contiguous:
        raise ValueError(f"{what} must be a C-contiguous buffer")
    return view.cast("B")


def _writable(obj: object, what: str) -> memoryview:
    view = _view(obj, what)
    if view.readonly:
        raise ValueError(f"{what} must be a writable, C-contiguous buffer")
    return view


def _round_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _overlap(a: memoryview, b: memoryview) -> bool:
    """Do two byte views share memory? (Found through the buffers' addresses.)"""
    if a.nbytes == 0 or b.nbytes == 0:
        return False
    a0 = int(_ffi.cast("uintptr_t", _ffi.from_buffer(a)))
    b0 = int(_ffi.cast("uintptr_t", _ffi.from_buffer(b)))
    return a0 < b0 + b.nbytes and b0 < a0 + a.nbytes


# ---- frames ------------------------------------------------------------------------------


def _meta(meta: Meta) -> memoryview:
    if meta is None:
        return memoryview(b"{}")
    if isinstance(meta, Mapping):
        return memoryview(json.dumps(meta, separators=(",", ":")).encode())
    return _view(meta, "meta")


def _payloads(payloads: Sequence[Payload]) -> list[memoryview | int]:
    result: list[memoryview | int] = []
    for i, payload in enumerate(_seq(payloads, "payloads")):
        if isinstance(payload, int) and type(payload) is not bool:
            result.append(_int(payload, f"reserved payload {i}", 0, U64))
        else:
            result.append(_view(payload, f"payload {i}"))
    return result


def _length(item: memoryview | int) -> int:
    return item if isinstance(item, int) else item.nbytes


def _layout(meta_len: int, items: list[memoryview | int]) -> tuple[list[int], int]:
    """Blob offsets and total size, with the format's limits as explicit checks."""
    if meta_len > U32 or len(items) > U32:
        raise FrameError("the frame would exceed the format's limits")
    head = _PREFIX.size + meta_len + _COUNT.size + _ENTRY.size * len(items)
    offsets: list[int] = []
    end = head
    for item in items:
        offsets.append(_round_up(end))
        end = offsets[-1] + _length(item)
        if end > U64:
            raise FrameError("the frame would exceed the format's limits")
    if end - 4 > U32:
        raise FrameError("the frame would exceed the format's limits")
    return offsets, end


def frame_size(payloads: Sequence[Payload], meta: Meta = None) -> int:
    return _layout(_meta(meta).nbytes, _payloads(payloads))[1]


def pack_into(
    out: Buffer,
    payloads: Sequence[Payload],
    meta: Meta = None,
    *,
    kind: int = Kind.BATCH,
    flags: int = 0,
) -> int:
    try:
        kind = Kind(_int(kind, "kind", 0, 255))
    except ValueError:
        raise CollateError(f"unknown frame kind {kind}") from None
    flags = _int(flags, "flags", 0, 255)
    items = _payloads(payloads)
    meta_view = _meta(meta)
    target = _writable(out, "out")
    offsets, size = _layout(meta_view.nbytes, items)
    if target.nbytes < size:
        raise CollateError(f"out has {target.nbytes} bytes but the frame needs {size}")
    target = target[:size]
    for i, item in enumerate([meta_view, *items]):
        if isinstance(item, memoryview) and _overlap(target, item):
            raise CollateError(f"out overlaps payload {i - 1} or the metadata")
    target[: _PREFIX.size] = _PREFIX.pack(size - 4, kind, flags, 0, meta_view.nbytes)
    pos = _PREFIX.size
    target[pos : pos + meta_view.nbytes] = meta_view
    pos += meta_view.nbytes
    target[pos : pos + 4] = _COUNT.pack(len(items))
    pos += 4
    for off, item in zip(offsets, items, strict=True):
        target[pos : pos + _ENTRY.size] = _ENTRY.pack(off, _length(item))
        pos += _ENTRY.size
    for off, item in zip(offsets, items, strict=True):
        target[pos:off] = bytes(off - pos)
        end = off + _length(item)
        target[off:end] = bytes(item) if isinstance(item, int) else item
        pos = end
    return size


def pack(
    payloads: Sequence[Payload],
    meta: Meta = None,
    *,
    kind: int = Kind.BATCH,
    flags: int = 0,
) -> bytearray:
    out = bytearray(frame_size(payloads, meta))
    pack_into(out, payloads, meta, kind=kind, flags=flags)
    return out


def unpack_frame(buf: Buffer) -> UnpackedFrame:
    view = _view(buf, "frame")
    size = view.nbytes
    if size < _PREFIX.size + _COUNT.size:
        raise FrameError(f"frame of {size} bytes is shorter than the fixed header")
    length, kind_no, flags, _reserved, meta_len = _PREFIX.unpack_from(view)
    if length + 4 != size:
        raise FrameError(f"frame length field says {length + 4} bytes, got {size}")
    meta_end = _PREFIX.size + meta_len
    if meta_end + _COUNT.size > size:
        raise FrameError(f"metadata length {meta_len} runs past the end of the frame")
    (count,) = _COUNT.unpack_from(view, meta_end)
    table = meta_end + _COUNT.size
    if table + count * _ENTRY.size > size:
        raise FrameError(f"blob count {count} does not fit in the frame")
    data_start = table + count * _ENTRY.size
    blobs: list[memoryview] = []
    for i in range(count):
        off, n = _ENTRY.unpack_from(view, table + i * _ENTRY.size)
        if not data_start <= off <= off + n <= size:
            raise FrameError(f"blob {i} (offset {off}, length {n}) is outside the frame")
        blobs.append(view[off : off + n])
    try:
        kind = Kind(kind_no)
    except ValueError:
        raise FrameError(f"unknown frame kind {kind_no}") from None
    return UnpackedFrame(kind, flags, view[_PREFIX.size : meta_end], blobs)


def unpack(buf: Buffer) -> list[memoryview]:
    return unpack_frame(buf).blobs


# ---- typed tensors -----------------------------------------------------------------------


def _shapes(shapes: object, n: int) -> list[tuple[int, ...]]:
    seq = _seq(shapes, "shapes")
    if len(seq) != n:
        raise CollateError(f"got {n} inputs but {len(seq)} shapes")
    result: list[tuple[int, ...]] = []
    for i, shape in enumerate(seq):
        dims = tuple(_seq(shape, f"shape {i}"))
        for dim in dims:
            if type(dim) is bool or not isinstance(dim, int):
                raise TypeError(f"shape {i} has a dimension of type {type(dim).__name__}")
            if not I64_MIN <= dim <= I64_MAX:
                raise CollateError(f"shape {i} {dims} has a dimension outside 64 bits")
        if result and len(dims) != len(result[0]):
            raise CollateError(f"input {i} has rank {len(dims)} but input 0 has rank")
        result.append(dims)
    return result


def _plan(shapes: list[tuple[int, ...]], itemsize: int) -> Layout:
    if type(itemsize) is bool or not isinstance(itemsize, int):
        raise TypeError("itemsize must be an int")
    if itemsize not in (1, 2, 4, 8):
        raise CollateError(f"itemsize must be 1, 2, 4 or 8 bytes, not {itemsize}")
    if not shapes:
        raise CollateError("nothing to collate: no inputs")
    first = shapes[0]
    for i, shape in enumerate(shapes):
        if any(dim < 0 for dim in shape) or shape[1:] != first[1:]:
            raise CollateError(f"input {i} has shape {shape}, which does not fit input 0's")
    row_size = itemsize
    for dim in first[1:]:
        row_size *= dim
    out_shape: tuple[int, ...]
    if not first:
        max_rows, ragged, out_shape = 1, False, (len(shapes),)
    else:
        max_rows = max(shape[0] for shape in shapes)
        ragged = any(shape[0] != first[0] for shape in shapes)
        out_shape = (len(shapes), max_rows, *first[1:])
    nbytes = len(shapes) * max_rows * row_size
    if nbytes > U64:
        raise CollateError("the collated batch's size overflows 64 bits")
    lengths = tuple(shape[0] for shape in shapes) if ragged else None
    return Layout(out_shape, nbytes, row_size, lengths)


def plan(shapes: Sequence[Sequence[int]], itemsize: int) -> Layout:
    return _plan(_shapes(shapes, len(_seq(shapes, "shapes"))), itemsize)


def collate(
    inputs: Sequence[Buffer],
    shapes: Sequence[Sequence[int]],
    itemsize: int,
    out: Buffer | None = None,
) -> Collated:
    inputs = _seq(inputs, "inputs")
    tuples = _shapes(shapes, len(inputs))
    layout = _plan(tuples, itemsize)
    views = [_view(item, f"input {i}") for i, item in enumerate(inputs)]
    for i, (view, shape) in enumerate(zip(views, tuples, strict=True)):
        rows = shape[0] if shape else 1
        if view.nbytes != rows * layout.row_size:
            raise CollateError(f"input {i} has {view.nbytes} bytes, not what shape {shape} needs")
    target = aligned_buffer(layout.nbytes) if out is None else _writable(out, "out")
    if target.nbytes < layout.nbytes:
        raise CollateError(f"out has {target.nbytes} bytes but the batch needs {layout.nbytes}")
    target = target[: layout.nbytes]
    for i, view in enumerate(views):
        if _overlap(target, view):
            raise CollateError(f"input {i} overlaps out")
    stride = layout.nbytes // len(views) if views else 0
    for i, view in enumerate(views):
        start = i * stride
        target[start : start + view.nbytes] = view
        target[start + view.nbytes : start + stride] = bytes(stride - view.nbytes)
    return Collated(target, layout.shape, layout.lengths)


def split(
    buf: Buffer,
    lengths: Sequence[int],
    row_size: int,
    *,
    stride: int | None = None,
) -> list[memoryview]:
    view = _view(buf, "buf")
    seq = _seq(lengths, "lengths")
    rows = [_int(n, f"length {i}", I64_MIN, I64_MAX) for i, n in enumerate(seq)]
    row_size = _int(row_size, "row_size", 0, U64)
    if stride is not None:
        stride = _int(stride, "stride", 0, I64_MAX)
    ranges: list[tuple[int, int]] = []
    pos = 0
    for i, n in enumerate(rows):
        if n < 0 or (stride is not None and n > stride):
            raise CollateError(f"length {i} is {n}: negative or more than the stride")
        start = pos if stride is None else i * stride * row_size
        end = start + n * row_size
        if n * row_size > U64 or end > U64:
            raise CollateError("the split's sizes overflow 64 bits")
        if end > view.nbytes:
            raise CollateError(f"request {i} runs past the end of the buffer")
        ranges.append((start, end))
        pos = end
    total = pos if stride is None else len(rows) * stride * row_size
    if stride is not None and stride * row_size > U64:
        raise CollateError("the split's sizes overflow 64 bits")
    if total != view.nbytes:
        raise CollateError(f"the lengths cover {total} bytes but the buffer has {view.nbytes}")
    return [view[start:end] for start, end in ranges]
