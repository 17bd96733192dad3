"""The worker's end of its connection to the server: :class:`ServerConnection`.

Whole frames go out from two threads: trio's (PONG, LOAD_RESULT, early 400s) and, once the
model is loaded, the handler thread (each batch's answer, intermediate replies). Over a
socket both write straight to the non-blocking socket under one ``threading.Lock``, so frames
stay whole and apart and the handler thread never wakes trio's; over any other stream (the
in-memory streams of the tests) trio writes everything. Bytes come in through
:meth:`ServerConnection.receive`, into one reused buffer over a socket, and
:meth:`ServerConnection.read_frames` hands each frame on.

A connection that breaks or brings a malformed frame calls ``on_lost``: the primary
connection's ends the process (nothing would read its answers); an attached connection's
(:mod:`trioserve.worker.attached`) ends that connection only, and then returns.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import NoReturn

import trio

from trioserve.collate import aligned_buffer
from trioserve.core.frames import Frame, FrameDecoder, FrameError

log = logging.getLogger("trioserve.worker")

READ_SIZE = 1 << 20
# How often trio's thread retries the socket's write lock while the handler thread holds it
# (it holds it for one write, or while the server is not reading).
WRITE_LOCK_POLL = 0.0005


def exit_now(status: int, why: str) -> NoReturn:
    """End the process immediately, whatever threads are running (the primary connection's
    ``on_lost``)."""
    log.info("worker exiting (%d): %s", status, why)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to the non-blocking ``fd``, waiting (in this thread) for room."""
    view = memoryview(data)
    poller: select.poll | None = None
    while view.nbytes:
        try:
            sent = os.write(fd, view)
        except BlockingIOError:
            if poller is None:
                poller = select.poll()
                poller.register(fd, select.POLLOUT)
            poller.poll()
            continue
        view = view[sent:]


class ServerConnection:
    def __init__(self, stream: trio.abc.Stream, on_lost: Callable[[int, str], None]) -> None:
        self._stream = stream
        # Over a socket stream, its socket, for the fast paths of send() and receive().
        self._socket = stream.socket if isinstance(stream, trio.SocketStream) else None
        self._exit = on_lost  # (status, why); the primary's never returns
        self._send_lock = trio.StrictFIFOLock()
        # Over a socket, the handler thread writes batch answers itself: this lock keeps its
        # frames and trio's whole and apart.
        self._write_lock = threading.Lock()
        # The trio run the connection is used from (for send_from_thread over a plain
        # stream); set by the frame loop when it starts.
        self.token: trio.lowlevel.TrioToken | None = None

    def read_buffer(self) -> bytearray:
        """The buffer :meth:`receive` reads into, reused for every read (empty unless the
        stream is a socket)."""
        return bytearray(READ_SIZE if self._socket is not None else 0)

    # -- writing ------------------------------------------------------------------------------

    async def send(self, data: bytes) -> None:
        """Write one or more whole frames; frames never interleave.

        Over a socket, when no other write is under way, the frame is first written
        straight to the (non-blocking) socket: almost always all of it goes at once and the
        task does not pass through trio's scheduler. What the socket does not take at once
        is sent with the stream's ``send_all``, still holding the locks.
        """
        if self._send_lock.locked():
            await self._send_lock.acquire()
        else:
            self._send_lock.acquire_nowait()
        try:
            if self._socket is None:
                await self._send_all(data)
            else:
                await self._send_socket(self._socket.fileno(), data)
        finally:
            self._send_lock.release()

    async def _send_all(self, data: bytes | memoryview) -> None:
        try:
            await self._stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._exit(0, f"the server connection is gone ({type(exc).__name__})")

    async def _send_socket(self, fd: int, data: bytes) -> None:
        """Write ``data`` to the socket under the write lock shared with the handler thread."""
        lock = self._write_lock
        # A threading lock cannot wake a trio task, and waiting for it in a worker thread
        # could not be cancelled; it is held briefly, so poll (and stay cancellable).
        while not lock.acquire(blocking=False):  # noqa: ASYNC110
            await trio.sleep(WRITE_LOCK_POLL)
        try:
            try:
                sent = os.write(fd, data)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                self._exit(0, f"the server connection is gone ({type(exc).__name__})")
                return
            if sent < len(data):
                await self._send_all(memoryview(data)[sent:])
        finally:
            lock.release()

    def send_from_thread(self, data: bytes) -> None:
        """Blocking send for the handler thread; returns once the frame is written.

        Over a socket the thread writes it itself, under the write lock, without waking trio's
        thread; over any other stream trio writes it.
        """
        sock = self._socket
        if sock is None:
            trio.from_thread.run(self.send, data, trio_token=self.token)
            return
        try:
            with self._write_lock:
                write_all(sock.fileno(), data)
        except OSError as exc:
            self._exit(0, f"the server connection is gone ({type(exc).__name__})")

    # -- reading ------------------------------------------------------------------------------

    async def read_frames(self, dispatch: Callable[[Frame], Awaitable[None]]) -> None:
        """Await ``dispatch`` for each frame that comes in, in order, until the stream ends or
        breaks or a frame is malformed: then ``on_lost`` is called (and if it returns, this
        returns)."""
        # Frames land in 64-byte-aligned storage: the blobs (collated batch tensors among
        # them) are then aligned in memory, not only within the frame.
        decoder = FrameDecoder(allocate=aligned_buffer)
        buffer = self.read_buffer()
        receive = self.receive
        while True:
            try:
                data = await receive(buffer, wait_first=decoder.pending == 0)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self._exit(0, f"the server connection failed ({type(exc).__name__})")
                return
            if not data:
                self._exit(0, "the server closed the connection")
                return
            try:
                frames = decoder.feed(data)
            except FrameError as exc:
                self._exit(1, f"malformed frame from the server: {exc}")
                return
            for frame in frames:
                await dispatch(frame)

    async def receive(
        self, buffer: bytearray, *, wait_first: bool = False
    ) -> bytes | bytearray | memoryview:
        """The next bytes from the server (empty at end of stream).

        Over a socket they are read into ``buffer``, reused for every read, instead of into
        a fresh ``READ_SIZE`` bytes object each time (which costs a large allocation, page
        faults and a shrink per read); the decoder copies them out before the next read.
        With ``wait_first`` (the last read ended on a frame boundary, so the server is most
        likely waiting for an answer) it waits for the socket to be readable before reading,
        which saves the read that would fail with EAGAIN.
        """
        sock = self._socket
        if sock is None:
            return await self._stream.receive_some(READ_SIZE)
        if not wait_first:
            size = await sock.recv_into(buffer)
            return memoryview(buffer)[:size]
        while True:
            await trio.lowlevel.wait_readable(sock)
            try:
                size = os.readv(sock.fileno(), [buffer])
            except BlockingIOError:  # a spurious wake-up
                continue
            return memoryview(buffer)[:size]
