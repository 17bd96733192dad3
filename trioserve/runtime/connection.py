"""A framed connection to one worker process over a trio stream.

Over a socket (what the launcher gives) both directions skip trio's per-call checkpoints:
a send is one non-blocking write when the socket has room (it nearly always has: a batch
frame is small next to the socket buffer), and a receive reads at once when data is there,
waiting for the socket only when it is empty. trio's ``send_all`` and ``receive_some`` each
end with a pass through the scheduler; at one request at a time those passes were a visible
part of a request's latency. Any other stream (tests use memory streams) goes through the
ordinary trio calls.
"""

from __future__ import annotations

import errno
import os
from collections import deque

import trio

from trioserve.core.frames import Frame, FrameDecoder
from trioserve.sockio import send_eagerly, write_nowait

_READ_SIZE = 1 << 16
# Reads that found data at once, in a row, before the receiver lets other tasks run.
_READS_BEFORE_YIELD = 16


class WorkerConnection:
    """Sends and receives frames. Sends are serialised by a lock (several tasks send);
    exactly one task receives."""

    def __init__(self, stream: trio.abc.Stream, max_frame: int) -> None:
        self._stream = stream
        # Over a socket: the stream as a SocketStream, for the eager paths.
        self._socket_stream = stream if isinstance(stream, trio.SocketStream) else None
        self._socket = None if self._socket_stream is None else self._socket_stream.socket
        self._decoder = FrameDecoder(max_frame)
        self._ready: deque[Frame] = deque()
        self._send_lock = trio.Lock()
        self._eager_reads = 0
        # What send_nowait wrote only in part: it goes out before any other frame.
        self._unsent: memoryview | None = None

    @property
    def unsent(self) -> bool:
        """Whether a frame from :meth:`send_nowait` is still partly unwritten: a task must
        :meth:`flush` it (every :meth:`send` does first)."""
        return self._unsent is not None

    def send_nowait(self, data: bytes | bytearray) -> bool:
        """Write ``data`` without waiting, from any task: False (nothing written) when that
        cannot start now (not a socket, another task is sending, a frame is still partly
        unwritten). When the socket takes only part, the rest waits in :attr:`unsent`."""
        if self._socket_stream is None or self._unsent is not None or self._send_lock.locked():
            return False
        sent = write_nowait(self._fileno(), data, "sending to the worker")
        if sent < len(data):
            self._unsent = memoryview(data)[sent:]
        return True

    async def flush(self) -> None:
        """Write the rest of a frame :meth:`send_nowait` wrote in part (nothing if none)."""
        await self.send(b"")

    async def send(self, data: bytes | bytearray) -> None:
        lock = self._send_lock
        socket_stream = self._socket_stream
        if socket_stream is None:
            async with lock:
                await self._stream.send_all(data)
            return
        try:
            lock.acquire_nowait()
        except trio.WouldBlock:
            # Another task is sending: wait for it, frames never interleave.
            async with lock:
                await self._send_unsent(socket_stream)
                if data:
                    await self._stream.send_all(data)
            return
        try:
            await self._send_unsent(socket_stream)
            if data:
                await send_eagerly(socket_stream, self._fileno(), data, "sending to the worker")
        finally:
            lock.release()

    async def _send_unsent(self, socket_stream: trio.SocketStream) -> None:
        unsent = self._unsent
        if unsent is not None:
            await socket_stream.send_all(unsent)
            self._unsent = None

    async def receive(self) -> Frame | None:
        """The next frame, or None when the worker closed the connection.

        Raises :class:`trioserve.core.frames.FrameError` on a malformed frame.
        """
        while not self._ready:
            data = await self._read()
            if not data:
                return None
            self._ready.extend(self._decoder.feed(data))
        return self._ready.popleft()

    async def _read(self) -> bytes | bytearray:
        sock = self._socket
        if sock is None:
            return await self._stream.receive_some(_READ_SIZE)
        if self._eager_reads >= _READS_BEFORE_YIELD:
            # A worker that keeps the socket full must not keep this task from yielding.
            self._eager_reads = 0
            await trio.lowlevel.checkpoint()
        while True:
            fd = self._fileno()
            try:
                data = os.read(fd, _READ_SIZE)
            except BlockingIOError:
                self._eager_reads = 0
                await trio.lowlevel.wait_readable(sock)
                continue
            except OSError as exc:
                if exc.errno == errno.EBADF:
                    raise trio.ClosedResourceError("the worker connection was closed") from exc
                raise trio.BrokenResourceError(f"reading from the worker failed: {exc}") from exc
            self._eager_reads += 1
            return data

    def _fileno(self) -> int:
        assert self._socket is not None
        fd = self._socket.fileno()
        if fd < 0:
            raise trio.ClosedResourceError("the worker connection was closed")
        return fd

    async def aclose(self) -> None:
        await self._stream.aclose()
