"""Sending on a trio socket without a pass through trio's scheduler when it has room.

``SocketStream.send_all`` ends with a checkpoint even when the kernel took every byte at
once; on the hot paths (an HTTP answer, a batch frame to a worker) that pass costs more than
the write. :func:`send_eagerly` writes once without waiting and leaves only what the socket
did not take to ``send_all``. The caller must be the only sender on the stream at the time
(its own lock, or a single sending task).
"""

from __future__ import annotations

import contextlib
import os
import socket

import trio


def write_nowait(fd: int, data: bytes | bytearray | memoryview, what: str) -> int:
    """One non-blocking write of ``data`` to ``fd``: how many bytes went (0 when the socket
    is full). Any other failure is a :class:`trio.BrokenResourceError` saying ``what``
    failed."""
    try:
        return os.write(fd, data)
    except BlockingIOError:
        return 0
    except OSError as exc:
        raise trio.BrokenResourceError(f"{what} failed: {exc}") from exc


async def send_eagerly(
    stream: trio.SocketStream, fd: int, data: bytes | bytearray, what: str
) -> None:
    """All of ``data`` on ``stream`` (whose socket is ``fd``): one write at once, the rest
    (if any) through ``send_all``."""
    sent = write_nowait(fd, data, what)
    if sent < len(data):
        await stream.send_all(memoryview(data)[sent:])


async def linger(sock: trio.socket.SocketType, fd: int, seconds: float = 2.0) -> None:
    """Before closing a connection refused mid-request: shut its sending side (the client
    reads the answer, then the end) and read what the client still sends, dropping it, for
    at most ``seconds`` or until the client closes. Closing with unread bytes would make the
    kernel reset the connection, which can destroy the answer before the client reads it."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
    with trio.move_on_after(seconds):
        while True:
            await trio.lowlevel.wait_readable(sock)
            try:
                if not os.read(fd, 65536):
                    return
            except BlockingIOError:
                continue
            except OSError:
                return
