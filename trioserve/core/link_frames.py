"""The framing of a link between two processes of one server (sans-IO).

A link is one stream socket between the control process and a serving process it started
(``docs/design.md``, "Serving processes"). Each write carries a *blob*: a 4-byte
little-endian length, then a ``marshal``-encoded list of frames (non-empty tuples whose first
item says what the frame is; the kinds are the link's user's business, see
:mod:`trioserve.core.serving_frames`). A blob carries every frame queued since the last
write, so a busy link costs one system call for many messages. Both ends are processes of
the same server, started with the same interpreter, so ``marshal`` (bytes, str, int, float,
bool, None, tuple, list, dict) is enough and fast; nothing on a link comes from a client
unparsed.
"""

from __future__ import annotations

import marshal
import struct
from typing import Any, Final

Frame = tuple[Any, ...]

_LENGTH: Final = struct.Struct("<I")
MAX_BLOB: Final = 1 << 31  # a blob's length must fit the 4-byte prefix's signed range


class FrameError(Exception):
    """The link carried something that is not a blob of frames: the link must close."""


def encode(frames: list[Frame]) -> bytes:
    """One blob carrying ``frames``."""
    blob = marshal.dumps(frames)
    if len(blob) >= MAX_BLOB:
        raise FrameError(f"a blob of {len(blob)} bytes is too large for the link")
    return _LENGTH.pack(len(blob)) + blob


class FrameReader:
    """Turns the bytes read from a link into frames."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete blob held back."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[Frame]:
        """Every frame completed by ``data``, in order."""
        buffer = self._buffer
        buffer += data
        frames: list[Frame] = []
        at = 0
        size = len(buffer)
        while size - at >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(buffer, at)
            if length >= MAX_BLOB:
                raise FrameError(f"a blob length of {length} bytes")
            end = at + _LENGTH.size + length
            if end > size:
                break
            with memoryview(buffer) as view:
                try:
                    decoded = marshal.loads(view[at + _LENGTH.size : end])
                except (EOFError, ValueError, TypeError) as exc:
                    raise FrameError(f"an undecodable blob: {exc}") from None
            if not isinstance(decoded, list) or not all(
                isinstance(frame, tuple) and frame for frame in decoded
            ):
                raise FrameError("a blob that is not a list of frames")
            frames.extend(decoded)
            at = end
        del buffer[:at]
        return frames


__all__ = ["MAX_BLOB", "Frame", "FrameError", "FrameReader", "encode"]
