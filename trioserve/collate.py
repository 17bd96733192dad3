"""Batches in one pass of C: frames, collated tensors and per-request slices.

This module is the safe surface of the private cffi extension ``trioserve._collate`` (built
from ``native/``). It checks the Python side of every argument (types, contiguity,
writability, integer ranges), owns every buffer it allocates, and turns the C code's error
codes into exceptions; the C code checks every size and bound again, with overflow-checked
arithmetic, and runs without the GIL. ``trioserve.collate_ref`` is a pure-Python
implementation of the same functions, used by the tests as the reference.

Frames (the format of :mod:`trioserve.core.frames`, byte for byte):

- :func:`pack` / :func:`pack_into` write one whole frame: metadata plus blobs, each blob on
  a 64-byte boundary of the frame; an ``int`` in place of a payload reserves that many zero
  bytes, to be filled in place (e.g. by :func:`collate`) through :func:`unpack`'s views.
- :func:`unpack` / :func:`unpack_frame` validate a frame and return views of its blobs,
  without copying.

Typed tensors (row-major, one element size of 1, 2, 4 or 8 bytes):

- :func:`collate` stacks N inputs of equal shape into ``[N, *shape]``, or, when their first
  dimensions differ, pads them with zero bytes into ``[N, max_len, *trailing]`` and reports
  the lengths; it writes into the caller's buffer (or one it allocates, 64-byte aligned), so
  ``torch.frombuffer(result.buffer, dtype=...).view(result.shape)`` copies nothing more.
- :func:`split` cuts a batched output back into per-request views.

Errors (all checked before anything is written):

- :class:`CollateError` (a :class:`ValueError`): sizes, shapes, lengths or buffers that do not
  fit together, or a size that overflows 64 bits. The caller's bug.
- :class:`~trioserve.core.frames.FrameError` (a :class:`ValueError`): a malformed frame given
  to :func:`unpack`, or a frame too large for the format. The sender's bug.
- :class:`TypeError`: an argument of the wrong type (e.g. a payload that is not a buffer).
- :class:`ValueError`: a buffer that is not C-contiguous, or not writable where it must be.
"""

from __future__ import annotations

import json
import struct
from array import array
from collections.abc import Mapping, Sequence
from itertools import chain
from typing import TYPE_CHECKING, Any, Final, NamedTuple, TypeGuard

from trioserve.core.frames import ALIGN, FrameError, Kind

try:
    from trioserve._collate import ffi, lib
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "trioserve's C collator (trioserve._collate) is not built: reinstall trioserve with "
        "`pip install -e .` (it needs a C compiler) or run `python native/build_collate.py`"
    ) from exc

if TYPE_CHECKING:
    from typing_extensions import Buffer

    #: A payload to pack: bytes-like, or an int that reserves that many zero bytes.
    Payload = Buffer | int
    #: Frame metadata: a mapping (encoded as compact JSON) or the JSON bytes themselves.
    Meta = Mapping[str, Any] | Buffer | None

__all__ = [
    "ALIGN",
    "CollateError",
    "Collated",
    "Layout",
    "UnpackedFrame",
    "aligned_buffer",
    "collate",
    "frame_size",
    "pack",
    "pack_into",
    "plan",
    "split",
    "unpack",
    "unpack_frame",
]

if lib.TS_ALIGN != ALIGN:  # pragma: no cover - a build from mismatched sources
    raise ImportError(f"trioserve._collate aligns to {lib.TS_ALIGN}, frames to {ALIGN}")

_from_buffer = ffi.from_buffer
_new = ffi.new
_NULL = ffi.NULL

ITEMSIZES: Final = (1, 2, 4, 8)
I64_MAX: Final = (1 << 63) - 1
U64_MAX: Final = (1 << 64) - 1
PREFIX: Final = 12  # u32 length, u8 kind, u8 flags, u16 reserved, u32 metadata length
EMPTY_META: Final = b"{}"
_ENTRY = struct.Struct(">QQ")


class CollateError(ValueError):
    """Arguments whose sizes, shapes or lengths do not fit together, or overflow."""


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


class UnpackedFrame(NamedTuple):
    """A validated frame: views of its metadata and blobs, no copies."""

    kind: Kind
    flags: int
    meta: memoryview
    """The metadata bytes (JSON, not parsed here)."""
    blobs: list[memoryview]


# ---- argument helpers --------------------------------------------------------------------


def _readable(obj: object, what: str) -> Any:
    try:
        return ffi.from_buffer(obj)
    except TypeError:
        raise TypeError(f"{what} must be a bytes-like object, not {type(obj).__name__}") from None
    except (BufferError, ValueError) as exc:
        raise ValueError(f"{what} must be a C-contiguous buffer ({exc})") from None


def _buffers(items: Sequence[Any], what: str) -> tuple[Any, Any, list[Any]]:
    """Parallel pointer and length arrays for buffers, and the cdata objects that pin them.

    The hot path of every batch call, so it is kept to C-level loops (``map``); only on a
    failure does it look for the culprit, to name it.
    """
    try:
        keep = list(map(_from_buffer, items))
    except (TypeError, BufferError, ValueError):
        for i, item in enumerate(items):
            _readable(item, f"{what} {i}")
        raise  # pragma: no cover - _readable raised for the culprit
    # One array.array filled from a list, then viewed in place: cheaper than ffi.new
    # converting each int, or array.array pulling from an iterator.
    lens = _from_buffer("uint64_t[]", array("Q", list(map(len, keep))))
    return _new("void *[]", keep), lens, keep


def _writable(obj: object, what: str) -> Any:
    try:
        return ffi.from_buffer(obj, require_writable=True)
    except TypeError:
        raise TypeError(f"{what} must be a bytes-like object, not {type(obj).__name__}") from None
    except (BufferError, ValueError) as exc:
        raise ValueError(f"{what} must be a writable, C-contiguous buffer ({exc})") from None


def _byte_view(obj: Buffer, what: str) -> memoryview:
    try:
        view = memoryview(obj)
    except TypeError:
        raise TypeError(f"{what} must be a bytes-like object, not {type(obj).__name__}") from None
    if not view.c_contiguous:
        raise ValueError(f"{what} must be a C-contiguous buffer")
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _plain_bytes(obj: object) -> TypeGuard[memoryview]:
    """A memoryview :func:`_byte_view` would return as it is (the common ``out``)."""
    return type(obj) is memoryview and obj.format == "B" and obj.ndim == 1 and obj.c_contiguous


def _int(value: object, what: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise CollateError(f"{what} is {value}, outside [{low}, {high}]")
    return value


def _sequence(items: object, what: str) -> Sequence[Any]:
    if type(items) is list or type(items) is tuple:
        return items  # the common case, without the ABC check
    if isinstance(items, bytes | bytearray | memoryview | str) or not isinstance(items, Sequence):
        raise TypeError(f"{what} must be a sequence (a list or tuple), not {type(items).__name__}")
    return items


def _itemsize(itemsize: object) -> int:
    if type(itemsize) is int and itemsize in ITEMSIZES:
        return itemsize
    if not isinstance(itemsize, int) or isinstance(itemsize, bool):
        raise TypeError(f"itemsize must be an int, not {type(itemsize).__name__}")
    if itemsize not in ITEMSIZES:
        raise CollateError(f"itemsize must be 1, 2, 4 or 8 bytes, not {itemsize}")
    return itemsize


def _meta_bytes(meta: Meta) -> bytes | Any:
    if meta is None:
        return EMPTY_META
    if isinstance(meta, Mapping):
        return json.dumps(meta, separators=(",", ":")).encode()
    return meta


# ---- frames ------------------------------------------------------------------------------


def _blobs(payloads: Sequence[Payload]) -> tuple[Any, Any, int, list[Any]]:
    """Pointer and length arrays for the payloads (NULL for a reserved size), their count,
    and the cdata objects that keep them pinned."""
    payloads = _sequence(payloads, "payloads")
    try:
        ptrs, lens, keep = _buffers(payloads, "payload")
    except TypeError:
        pass  # reserved sizes among the payloads, or a payload of the wrong type
    else:
        return ptrs, lens, len(keep), keep
    keep = []
    pointers: list[Any] = []
    sizes: list[int] = []
    for i, payload in enumerate(payloads):
        if isinstance(payload, int) and not isinstance(payload, bool):
            pointers.append(ffi.NULL)
            sizes.append(_int(payload, f"reserved payload {i}", 0, U64_MAX))
        else:
            ptr = _readable(payload, f"payload {i}")
            keep.append(ptr)
            pointers.append(ptr)
            sizes.append(len(ptr))
    return ffi.new("void *[]", pointers), ffi.new("uint64_t[]", sizes), len(sizes), keep


def _frame_size_error(rc: int, meta_len: int, bad: int) -> ValueError:
    if rc in (lib.TS_E_LIMIT, lib.TS_E_OVERFLOW):
        return FrameError(
            "the frame would exceed the format's limits (metadata, blob count and frame "
            f"length are 32-bit fields; metadata is {meta_len} bytes)"
        )
    return CollateError(f"cannot lay out the frame (collator error {rc}, payload {bad})")


def _prepare(payloads: Sequence[Payload], meta: Meta) -> tuple[Any, ...]:
    """Everything ts_frame_pack needs but the output, and the frame's size."""
    ptrs, lens, n, keep = _blobs(payloads)
    meta_ptr = _readable(_meta_bytes(meta), "meta")
    size = ffi.new("uint64_t *")
    rc = lib.ts_frame_size(len(meta_ptr), lens, n, size)
    if rc != lib.TS_OK:
        raise _frame_size_error(rc, len(meta_ptr), 0)
    return ptrs, lens, n, keep, meta_ptr, int(size[0])


def _kind(kind: int) -> Kind:
    try:
        return Kind(_int(kind, "kind", 0, 255))
    except ValueError:
        raise CollateError(f"unknown frame kind {kind}") from None


def _pack(out: Buffer, prepared: tuple[Any, ...], kind: Kind, flags: int) -> int:
    ptrs, lens, n, _keep, meta_ptr, size = prepared
    out_ptr = _writable(out, "out")
    written = ffi.new("uint64_t *")
    bad = ffi.new("uint64_t *")
    rc = lib.ts_frame_pack(
        kind, flags, meta_ptr, len(meta_ptr), ptrs, lens, n, out_ptr, len(out_ptr), written, bad
    )
    if rc == lib.TS_OK:
        return int(written[0])
    if rc == lib.TS_E_SHORT:
        raise CollateError(f"out has {len(out_ptr)} bytes but the frame needs {size}")
    if rc == lib.TS_E_OVERLAP:
        raise CollateError(f"out overlaps payload {bad[0]} or the metadata")
    raise _frame_size_error(rc, len(meta_ptr), int(bad[0]))


def frame_size(payloads: Sequence[Payload], meta: Meta = None) -> int:
    """The size in bytes of the frame :func:`pack` makes of these payloads and metadata."""
    return int(_prepare(payloads, meta)[-1])


def pack_into(
    out: Buffer,
    payloads: Sequence[Payload],
    meta: Meta = None,
    *,
    kind: int = Kind.BATCH,
    flags: int = 0,
) -> int:
    """Write one frame into ``out[:size]`` and return ``size``.

    Args:
        out: a writable, C-contiguous buffer of at least :func:`frame_size` bytes; it must not
            overlap a payload or the metadata.
        payloads: the blobs, in order; an ``int`` reserves that many zero bytes.
        meta: a JSON-able mapping (encoded as :func:`trioserve.core.frames.encode` does) or
            the UTF-8 JSON bytes; ``None`` means ``{}``.
        kind: a :class:`~trioserve.core.frames.Kind`.
        flags: the frame's flag byte.

    Raises:
        CollateError: ``out`` is too short or overlaps an input.
        FrameError: the frame would exceed the format's 32-bit fields.
    """
    checked_kind, flags = _kind(kind), _int(flags, "flags", 0, 255)
    return _pack(out, _prepare(payloads, meta), checked_kind, flags)


def pack(
    payloads: Sequence[Payload],
    meta: Meta = None,
    *,
    kind: int = Kind.BATCH,
    flags: int = 0,
) -> bytearray:
    """One frame holding ``payloads`` (each at a 64-byte boundary) and ``meta``.

    The result equals ``trioserve.core.frames.encode(kind, meta, payloads, flags=flags)``
    byte for byte, built in one C pass without the GIL. See :func:`pack_into`.
    """
    checked_kind, flags = _kind(kind), _int(flags, "flags", 0, 255)
    prepared = _prepare(payloads, meta)
    out = bytearray(prepared[-1])
    _pack(out, prepared, checked_kind, flags)
    return out


def _frame_error(rc: int, view: memoryview, info: Any, bad: int) -> FrameError:
    size = view.nbytes
    if rc == lib.TS_E_SHORT:
        return FrameError(f"frame of {size} bytes is shorter than the fixed header")
    if rc == lib.TS_E_LENGTH:
        length = int.from_bytes(view[:4], "big") + 4
        return FrameError(f"frame length field says {length} bytes, got {size}")
    if rc == lib.TS_E_META:
        meta_len = int.from_bytes(view[8:12], "big")
        return FrameError(f"metadata length {meta_len} runs past the end of the frame")
    if rc == lib.TS_E_COUNT:
        meta_len = int.from_bytes(view[8:12], "big")
        count = int.from_bytes(view[PREFIX + meta_len : PREFIX + meta_len + 4], "big")
        return FrameError(f"blob count {count} does not fit in the frame")
    if rc == lib.TS_E_BLOB:
        entry = PREFIX + int(info.meta_length) + 4 + bad * _ENTRY.size
        off, n = _ENTRY.unpack_from(view, entry)
        return FrameError(f"blob {bad} (offset {off}, length {n}) is outside the frame")
    return FrameError(f"malformed frame (collator error {rc})")


def unpack_frame(buf: Buffer) -> UnpackedFrame:
    """Validate a whole frame (length prefix included) and view its parts without copying.

    Accepts exactly the frames :func:`trioserve.core.frames.decode` accepts, except that the
    metadata is returned as bytes, not parsed. The views are writable when ``buf`` is.

    Raises:
        FrameError: the frame is malformed: a length, count, offset or kind that does not fit.
    """
    ptr = _readable(buf, "frame")
    view = _byte_view(buf, "frame")
    info = ffi.new("ts_frame_info *")
    rc = lib.ts_frame_parse(ptr, len(ptr), info)
    if rc != lib.TS_OK:
        raise _frame_error(rc, view, info, 0)
    n = int(info.count)  # at most size / 16: the frame itself bounds these arrays
    offsets = ffi.new("uint64_t[]", n)
    lengths = ffi.new("uint64_t[]", n)
    bad = ffi.new("uint64_t *")
    rc = lib.ts_frame_blobs(ptr, len(ptr), offsets, lengths, n, bad)
    if rc != lib.TS_OK:
        raise _frame_error(rc, view, info, int(bad[0]))
    try:
        kind = Kind(info.kind)
    except ValueError:
        raise FrameError(f"unknown frame kind {info.kind}") from None
    meta_end = PREFIX + int(info.meta_length)
    blobs = [
        view[off : off + length]
        for off, length in zip(ffi.unpack(offsets, n), ffi.unpack(lengths, n), strict=True)
    ]
    return UnpackedFrame(kind, int(info.flags), view[PREFIX:meta_end], blobs)


def unpack(buf: Buffer) -> list[memoryview]:
    """The blobs of a frame, as views of ``buf`` (see :func:`unpack_frame`)."""
    return unpack_frame(buf).blobs


# ---- typed tensors -----------------------------------------------------------------------


def aligned_buffer(nbytes: int) -> memoryview:
    """A zeroed, writable buffer of ``nbytes`` whose first byte is 64-byte aligned in memory.

    The view keeps its storage (a :class:`bytearray`) alive.
    """
    nbytes = _int(nbytes, "nbytes", 0, I64_MAX)
    raw = bytearray(nbytes + ALIGN - 1)
    address = int(ffi.cast("uintptr_t", ffi.from_buffer(raw)))
    start = -address % ALIGN
    return memoryview(raw)[start : start + nbytes]


def _shapes(shapes: object, n: int) -> tuple[Any, int, int, list[tuple[int, ...]]]:
    """The shapes as a flat int64 array, how many it holds (n, or 1 when all are equal),
    their common rank, and the shapes as tuples."""
    seq = _sequence(shapes, "shapes")
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
        dims = shape if type(shape) is tuple else tuple(_sequence(shape, f"shape {i}"))
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
    itemsize = _itemsize(itemsize)
    shape_array, count, ndim, tuples = _shapes(shapes, len(_sequence(shapes, "shapes")))
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
    itemsize = _itemsize(itemsize)
    inputs = _sequence(inputs, "inputs")
    n = len(inputs)
    shape_array, count, ndim, tuples = _shapes(shapes, n)
    ptrs, lens, keep = _buffers(inputs, "input")
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
        view = out if _plain_bytes(out) else _byte_view(out, "out")
    if rc == lib.TS_OK:
        out_ptr = _writable(view, "out")
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
    view = _byte_view(buf, "buf")
    seq = _sequence(lengths, "lengths")
    rows = [_int(length, f"length {i}", -I64_MAX - 1, I64_MAX) for i, length in enumerate(seq)]
    row_size = _int(row_size, "row_size", 0, U64_MAX)
    stride_rows = -1 if stride is None else _int(stride, "stride", 0, I64_MAX)
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
