"""A link between two processes of the server (the control process and one serving
process), as either end runs it.

:meth:`Link.post` queues a frame (:mod:`trioserve.core.link_frames`) and never waits; the
link's writing task sends everything queued in one blob the next time it runs, so frames
queued by many tasks in one pass of the scheduler cost one write. Frames read are handed, in
order, to the ``on_frame`` callback, which must not block. :meth:`Link.run` returns when
the other end closes the link (or it breaks); frames still queued then are dropped.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import trio

from trioserve.core.link_frames import Frame, FrameError, FrameReader, encode
from trioserve.sockio import write_nowait

log = logging.getLogger("trioserve.link")

_READ_SIZE = 256 * 1024


class Link:
    """Frames both ways over one connected stream socket."""

    __slots__ = (
        "_blocked",
        "_closed",
        "_fd",
        "_kick",
        "_kicked",
        "_on_frame",
        "_out",
        "_socket",
        "_stream",
        "name",
    )

    def __init__(
        self, sock: trio.socket.SocketType, on_frame: Callable[[Frame], None], name: str
    ) -> None:
        self._socket = sock
        self._fd = sock.fileno()
        self._stream = trio.SocketStream(sock)
        self._on_frame = on_frame
        self._out: list[Frame] = []
        self._blocked: memoryview | None = None  # written in part: the socket was full
        self._kick = trio.Event()
        self._kicked = False  # the writing task was woken and has not run yet
        self._closed = False
        self.name = name  # for log lines: which process is at the other end

    @property
    def closed(self) -> bool:
        return self._closed

    def post(self, frame: Frame, *, more: bool = False) -> None:
        """Queue ``frame`` for the other end (dropped once the link has closed).

        When no other task is ready to run, nothing else could join this write: the frames
        go at once, without waiting for the writing task's turn (a request's latency at low
        load). Otherwise the writing task sends everything queued by then in one blob.
        ``more``: the caller is about to post another frame; leave this one to that write,
        or to the writing task if none comes."""
        if self._closed:
            return
        self._out.append(frame)
        if self._blocked is not None:
            return  # the writing task sends these after the bytes waiting for room
        if not more and trio.lowlevel.current_statistics().tasks_runnable <= self._kicked:
            self._send_queued()  # the writing task, if woken, will find nothing to do
        elif not self._kicked:
            self._kicked = True
            self._kick.set()

    def _send_queued(self) -> None:
        frames, self._out = self._out, []
        data = encode(frames)
        try:
            sent = write_nowait(self._fd, data, f"{self.name}: link write")
        except trio.BrokenResourceError as exc:
            log.debug("%s", exc)  # the reading task sees the link close
            self._closed = True
            return
        if sent < len(data):
            self._blocked = memoryview(data)[sent:]
            self._kicked = True
            self._kick.set()

    async def run(self) -> None:
        """Read and write until the other end closes the link; then close it here."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write, nursery.cancel_scope)
                await self._read()
                nursery.cancel_scope.cancel()
        finally:
            self._closed = True
            self._out.clear()
            self._socket.close()

    async def _read(self) -> None:
        reader = FrameReader()
        sock, fd = self._socket, self._fd
        while True:
            try:
                await trio.lowlevel.wait_readable(sock)
            except trio.ClosedResourceError:
                return  # closed here: the link is over
            try:
                data = os.read(fd, _READ_SIZE)
            except BlockingIOError:
                continue
            except OSError as exc:
                log.debug("%s: link read failed: %s", self.name, exc)
                return
            if not data:
                return
            try:
                frames = reader.feed(data)
            except FrameError as exc:
                log.error("%s: closing the link: %s", self.name, exc)
                return
            for frame in frames:
                self._on_frame(frame)

    async def _write(self, scope: trio.CancelScope) -> None:
        try:
            while True:
                await self._kick.wait()
                self._kick = trio.Event()
                self._kicked = False
                while not self._closed and (self._blocked is not None or self._out):
                    blocked = self._blocked
                    if blocked is not None:
                        await self._stream.send_all(blocked)
                        self._blocked = None
                    if self._out:
                        self._send_queued()
        except (trio.BrokenResourceError, trio.ClosedResourceError, FrameError) as exc:
            log.debug("%s: link write failed: %s", self.name, exc)
            scope.cancel()


__all__ = ["Link"]
