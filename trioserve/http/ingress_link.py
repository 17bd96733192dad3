"""The link between the hub and one ingress process, as either end runs it.

:meth:`Link.post` queues a frame (:mod:`trioserve.core.ingress_frames`) and never waits; the
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

from trioserve.core.ingress_frames import Frame, FrameError, FrameReader, encode
from trioserve.sockio import write_nowait

log = logging.getLogger("trioserve.ingress")

_READ_SIZE = 256 * 1024


class Link:
    """Frames both ways over one connected stream socket."""

    __slots__ = ("_closed", "_kick", "_on_frame", "_out", "_socket", "_stream", "name")

    def __init__(
        self, sock: trio.socket.SocketType, on_frame: Callable[[Frame], None], name: str
    ) -> None:
        self._socket = sock
        self._stream = trio.SocketStream(sock)
        self._on_frame = on_frame
        self._out: list[Frame] = []
        self._kick = trio.Event()
        self._closed = False
        self.name = name  # for log lines: which ingress process

    @property
    def closed(self) -> bool:
        return self._closed

    def post(self, frame: Frame) -> None:
        """Queue ``frame`` for the other end (dropped once the link has closed)."""
        if self._closed:
            return
        if not self._out:
            self._kick.set()
        self._out.append(frame)

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
        sock, fd = self._socket, self._socket.fileno()
        while True:
            await trio.lowlevel.wait_readable(sock)
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
        fd = self._socket.fileno()
        try:
            while True:
                await self._kick.wait()
                self._kick = trio.Event()
                frames, self._out = self._out, []
                data = encode(frames)
                sent = write_nowait(fd, data, f"{self.name}: link write")
                if sent < len(data):
                    await self._stream.send_all(memoryview(data)[sent:])
        except (trio.BrokenResourceError, trio.ClosedResourceError, FrameError) as exc:
            log.debug("%s: link write failed: %s", self.name, exc)
            scope.cancel()


__all__ = ["Link"]
