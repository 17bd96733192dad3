"""Frames in one pass of C: :func:`pack` / :func:`pack_into` write one whole frame (the
format of :mod:`trioserve.core.frames`, byte for byte); :func:`unpack` /
:func:`unpack_frame` validate one and view its blobs without copying.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from trioserve.collate.native import (
    U64_MAX,
    CollateError,
    buffers,
    byte_view,
    checked_int,
    ffi,
    lib,
    readable,
    sequence,
    writable,
)
from trioserve.core.frames import FrameError, Kind

if TYPE_CHECKING:
    from typing_extensions import Buffer

    #: A payload to pack: bytes-like, or an int that reserves that many zero bytes.
    Payload = Buffer | int
    #: Frame metadata: a mapping (encoded as compact JSON) or the JSON bytes themselves.
    Meta = Mapping[str, Any] | Buffer | None

__all__ = ["UnpackedFrame", "frame_size", "pack", "pack_into", "unpack", "unpack_frame"]

PREFIX: Final = 12  # u32 length, u8 kind, u8 flags, u16 reserved, u32 metadata length
EMPTY_META: Final = b"{}"
_ENTRY = struct.Struct(">QQ")


class UnpackedFrame(NamedTuple):
    """A validated frame: views of its metadata and blobs, no copies."""

    kind: Kind
    flags: int
    meta: memoryview
    """The metadata bytes (JSON, not parsed here)."""
    blobs: list[memoryview]


def _meta_bytes(meta: Meta) -> bytes | Any:
    if meta is None:
        return EMPTY_META
    if isinstance(meta, Mapping):
        return json.dumps(meta, separators=(",", ":")).encode()
    return meta


def _blobs(payloads: Sequence[Payload]) -> tuple[Any, Any, int, list[Any]]:
    """Pointer and length arrays for the payloads (NULL for a reserved size), their count,
    and the cdata objects that keep them pinned."""
    payloads = sequence(payloads, "payloads")
    try:
        ptrs, lens, keep = buffers(payloads, "payload")
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
            sizes.append(checked_int(payload, f"reserved payload {i}", 0, U64_MAX))
        else:
            ptr = readable(payload, f"payload {i}")
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
    meta_ptr = readable(_meta_bytes(meta), "meta")
    size = ffi.new("uint64_t *")
    rc = lib.ts_frame_size(len(meta_ptr), lens, n, size)
    if rc != lib.TS_OK:
        raise _frame_size_error(rc, len(meta_ptr), 0)
    return ptrs, lens, n, keep, meta_ptr, int(size[0])


def _kind(kind: int) -> Kind:
    try:
        return Kind(checked_int(kind, "kind", 0, 255))
    except ValueError:
        raise CollateError(f"unknown frame kind {kind}") from None


def _pack(out: Buffer, prepared: tuple[Any, ...], kind: Kind, flags: int) -> int:
    ptrs, lens, n, _keep, meta_ptr, size = prepared
    out_ptr = writable(out, "out")
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
    checked_kind, flags = _kind(kind), checked_int(flags, "flags", 0, 255)
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
    checked_kind, flags = _kind(kind), checked_int(flags, "flags", 0, 255)
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
    ptr = readable(buf, "frame")
    view = byte_view(buf, "frame")
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
