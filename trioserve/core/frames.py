"""The frame format spoken between the server and its worker subprocesses.

A frame is::

    u32  length of everything after this field (big-endian)
    u8   kind (:class:`Kind`)
    u8   flags (bit 0: FINAL, on RESPONSE frames)
    u16  reserved, zero
    u32  length M of the metadata
    M    metadata: one UTF-8 JSON object
    u32  blob count K
    K x  (u64 offset, u64 length) of each blob, offsets counted from the start of the frame
    ...  zero padding, then the blobs, each starting on a 64-byte boundary of the frame

The metadata carries small structured fields (ids, headers, names, content types); the
blobs carry payload bytes untouched, so request bodies and tensors cross the socket without
being re-encoded and the worker can view them without copying. A frame can carry a whole
batch. Every length and offset is checked against the frame's bounds on decode; a
malformed frame raises :class:`FrameError` and never reads out of bounds.

This module is sans-IO: :func:`encode` returns bytes and :class:`FrameDecoder` is fed bytes.
"""

from __future__ import annotations

import enum
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

ALIGN: Final = 64
FLAG_FINAL: Final = 0x01
DEFAULT_MAX_FRAME: Final = 1 << 30

_PREFIX = struct.Struct(">IBBHI")  # length, kind, flags, reserved, meta length
_COUNT = struct.Struct(">I")
_ENTRY = struct.Struct(">QQ")
_PAD = bytes(ALIGN)


class Kind(enum.IntEnum):
    LOAD = 1  # server -> worker: load the model (meta: load spec)
    LOAD_RESULT = 2  # worker -> server: {code, message[, streams]}
    BATCH = 3  # server -> worker: a batch of requests
    RESPONSE = 4  # worker -> server: per-request answers (FINAL flag on the last)
    CANCEL = 5  # server -> worker: {ids: [...]} the handler should stop
    PING = 6  # server -> worker: heartbeat request {n}
    PONG = 7  # worker -> server: heartbeat answer {n}
    SHUTDOWN = 8  # server -> worker: finish and exit
    METRICS = 9  # worker -> server: handler metrics {metrics: [...]}
    STREAM_INPUT = 10  # server -> worker: the next input of a streamed request {id, end}
    STREAM_ACK = 11  # server -> worker: {id, n} n more intermediate replies were read


class FrameError(ValueError):
    """A frame that does not follow the format."""


@dataclass(slots=True)
class Frame:
    kind: Kind
    meta: dict[str, Any]
    blobs: list[memoryview] = field(default_factory=list)
    flags: int = 0

    @property
    def final(self) -> bool:
        return bool(self.flags & FLAG_FINAL)


def _align(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


def encode(
    kind: Kind,
    meta: dict[str, Any],
    blobs: list[bytes | bytearray | memoryview] | None = None,
    *,
    flags: int = 0,
) -> bytes:
    """Encode one frame."""
    blobs = blobs or []
    meta_bytes = json.dumps(meta, separators=(",", ":")).encode()
    head_len = _PREFIX.size + len(meta_bytes) + _COUNT.size + _ENTRY.size * len(blobs)
    offsets: list[tuple[int, int]] = []
    pos = _align(head_len) if blobs else head_len
    for blob in blobs:
        n = memoryview(blob).nbytes
        offsets.append((pos, n))
        pos = _align(pos + n)
    total = offsets[-1][0] + offsets[-1][1] if blobs else head_len
    parts: list[bytes | bytearray | memoryview] = [
        _PREFIX.pack(total - 4, int(kind), flags, 0, len(meta_bytes)),
        meta_bytes,
        _COUNT.pack(len(blobs)),
    ]
    parts.extend(_ENTRY.pack(off, n) for off, n in offsets)
    cursor = head_len
    for (off, n), blob in zip(offsets, blobs, strict=True):
        parts.append(_PAD[: off - cursor])
        parts.append(blob)
        cursor = off + n
    return b"".join(parts)


def decode(buf: bytes | bytearray | memoryview) -> Frame:
    """Decode one complete frame (including its length prefix)."""
    view = memoryview(buf).cast("B")
    size = view.nbytes
    if size < _PREFIX.size + _COUNT.size:
        raise FrameError(f"frame of {size} bytes is shorter than the fixed header")
    length, kind_no, flags, _reserved, meta_len = _PREFIX.unpack_from(view, 0)
    if length + 4 != size:
        raise FrameError(f"frame length field says {length + 4} bytes, got {size}")
    try:
        kind = Kind(kind_no)
    except ValueError:
        raise FrameError(f"unknown frame kind {kind_no}") from None
    meta_end = _PREFIX.size + meta_len
    if meta_end + _COUNT.size > size:
        raise FrameError(f"metadata length {meta_len} runs past the end of the frame")
    try:
        meta = json.loads(bytes(view[_PREFIX.size : meta_end]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FrameError(f"metadata is not JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise FrameError("metadata is not a JSON object")
    (count,) = _COUNT.unpack_from(view, meta_end)
    table = meta_end + _COUNT.size
    if count > (size - table) // _ENTRY.size:
        raise FrameError(f"blob count {count} does not fit in the frame")
    blobs: list[memoryview] = []
    data_start = table + count * _ENTRY.size
    for i in range(count):
        off, n = _ENTRY.unpack_from(view, table + i * _ENTRY.size)
        if off < data_start or off > size or n > size - off:
            raise FrameError(f"blob {i} (offset {off}, length {n}) is outside the frame")
        blobs.append(view[off : off + n])
    return Frame(kind, meta, blobs, flags)


class FrameDecoder:
    """Incremental decoder: feed bytes, take whole frames.

    Each frame is copied once, into a writable buffer of exactly its size from
    ``allocate`` (a zeroed ``bytearray`` by default), so its blobs can outlive later reads
    and be wrapped without copying (``torch.frombuffer`` needs a writable buffer). Blobs
    sit on 64-byte boundaries of the frame; they are 64-byte aligned in memory too when
    ``allocate`` returns aligned storage (the worker passes
    :func:`trioserve.collate.aligned_buffer`). The size limit is checked on the length
    prefix, before any of the frame is buffered.
    """

    def __init__(
        self,
        max_frame: int = DEFAULT_MAX_FRAME,
        allocate: Callable[[int], bytearray | memoryview] = bytearray,
    ) -> None:
        self._head = bytearray()
        self._frame: bytearray | memoryview | None = None
        self._fill = 0
        self._max = max_frame
        self._allocate = allocate

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        frames: list[Frame] = []
        view = memoryview(data).cast("B")
        while view.nbytes:
            if self._frame is None:
                need = 4 - len(self._head)
                self._head += view[:need]
                view = view[need:]
                if len(self._head) < 4:
                    break
                (length,) = struct.unpack_from(">I", self._head, 0)
                if length + 4 > self._max:
                    raise FrameError(
                        f"frame of {length + 4} bytes exceeds the limit of {self._max} bytes"
                    )
                self._frame = self._allocate(length + 4)
                self._frame[:4] = self._head
                self._fill = 4
                self._head = bytearray()
            take = min(view.nbytes, len(self._frame) - self._fill)
            self._frame[self._fill : self._fill + take] = view[:take]
            self._fill += take
            view = view[take:]
            if self._fill == len(self._frame):
                frames.append(decode(self._frame))
                self._frame = None
        return frames

    @property
    def pending(self) -> int:
        """Bytes received that do not yet form a whole frame."""
        return len(self._head) + (self._fill if self._frame is not None else 0)
