"""A worker over a real Unix socket pair, driven frame by frame (for the worker's tests)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NoReturn

import trio

from trioserve.core.frames import Frame, FrameDecoder
from trioserve.worker.loop import WorkerLoop


@dataclass
class SocketWorker:
    worker: WorkerLoop
    stream: trio.SocketStream  # the worker's end
    peer: trio.SocketStream  # the server's end, this test's
    decoder: FrameDecoder = field(default_factory=FrameDecoder)
    pending: list[Frame] = field(default_factory=list)

    async def next_frame(self) -> Frame:
        while not self.pending:
            self.pending.extend(self.decoder.feed(await self.peer.receive_some(1 << 16)))
        return self.pending.pop(0)

    async def aclose(self) -> None:
        await self.peer.aclose()
        await self.stream.aclose()


def socket_worker(
    exit_fn: Callable[[int, str], NoReturn], *, send_buffer: int | None = None
) -> SocketWorker:
    """A WorkerLoop on one end of a socket pair (``send_buffer``: its SO_SNDBUF, to force short
    writes), the other end for the test."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    if send_buffer is not None:
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
    peer = trio.SocketStream(trio.socket.from_stdlib_socket(theirs))
    return SocketWorker(WorkerLoop(stream, exit_fn=exit_fn, parent_pid=os.getppid()), stream, peer)
