"""The frames between the server (the hub) and its ingress processes (sans-IO).

An ingress process terminates HTTP/1.1 connections: it accepts on the inference port's
listening sockets (inherited from the hub), reads and checks requests, and writes the
answers' bytes. The hub answers every request. One stream socket joins each ingress process
to the hub; on it, each write carries a *blob*: a 4-byte little-endian length, then a
``marshal``-encoded list of frames (tuples whose first item is one of the kinds below). A
blob carries every frame queued since the last write, so a busy link costs one system call
for many requests. Both ends are processes of the same server, started by the hub with the
same interpreter, so ``marshal`` (bytes, str, int, bool, None, tuple, list) is enough and
fast; nothing on this link comes from a client unparsed.

Ingress process -> hub, each naming the ingress's request number ``n``:

``(REQUEST, n, method, target, http_version, headers, body, keep_alive, client, server)``
    a complete request (headers: ``[(name, value), ...]`` as bytes, names lowercased)
``(REFUSE, n, status, message, path)``
    a request that could not be read (HTTP error ``status``): the hub answers it, and the
    connection then closes
``(GONE, n)``
    the client of request ``n`` went away before its answer ended
``(ACK, n, written)``
    ``written`` bytes of request ``n``'s answer have reached the client's socket
``(READY,)``
    the process accepts connections

Hub -> ingress process:

``(DATA, n, data)``  bytes of request ``n``'s answer, in order
``(END, n, keep_alive)``  the answer is complete; whether the connection carries another
``(DRAIN,)``  stop accepting, finish the requests in flight, exit
"""

from __future__ import annotations

import marshal
import struct
from typing import Any, Final

REQUEST: Final = 1
REFUSE: Final = 2
GONE: Final = 3
ACK: Final = 4
READY: Final = 5
DATA: Final = 6
END: Final = 7
DRAIN: Final = 8

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


__all__ = [
    "ACK",
    "DATA",
    "DRAIN",
    "END",
    "GONE",
    "MAX_BLOB",
    "READY",
    "REFUSE",
    "REQUEST",
    "Frame",
    "FrameError",
    "FrameReader",
    "encode",
]
