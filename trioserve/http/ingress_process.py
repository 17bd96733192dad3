"""An ingress process: the connections of the inference port, answered by the hub.

Started by the hub (:mod:`trioserve.http.ingress`) as ``python -m
trioserve.http.ingress_process SETTINGS``, with the inference port's listening sockets and
one end of a socket pair (the link) passed as open file descriptors. It accepts connections
on those sockets and runs the front's HTTP/1.1 connection handling (keep-alive, timeouts,
``100-continue``, reading ahead to notice a client that leaves, draining) as the server's own
front does; but instead of answering a request itself, it sends it to the hub and writes the
bytes of the answer the hub sends back. A client that goes away is reported to the hub,
which cancels the request's work. The process ignores SIGINT (a terminal's Ctrl-C reaches
the whole process group; the hub decides), drains when the hub says so, and exits when the
link closes: the hub is gone.
"""

from __future__ import annotations

import itertools
import json
import logging
import signal
import socket
import sys
from collections import deque
from dataclasses import dataclass

import trio

from trioserve.core.errors import ServeError
from trioserve.core.http1 import HttpError, Request
from trioserve.core.ingress_frames import (
    ACK,
    DATA,
    DRAIN,
    END,
    GONE,
    READY,
    REFUSE,
    REQUEST,
    Frame,
)
from trioserve.http.bodies import Answer
from trioserve.http.front import Connection, Front, FrontSettings
from trioserve.http.ingress_link import Link

log = logging.getLogger("trioserve.ingress")

# An answer's bytes written to the client are acknowledged to the hub every this many bytes,
# so that the hub stops sending to a client that does not read (see ingress.WINDOW).
ACK_EVERY = 128 * 1024


@dataclass(frozen=True)
class IngressSettings:
    """What the hub tells an ingress process, as JSON on its command line."""

    index: int  # which of the hub's ingress processes (for log lines)
    link_fd: int
    listener_fds: list[int]
    max_request_size: int
    graceful_timeout: float
    keep_alive_timeout: float
    read_timeout: float
    log_level: str = "INFO"

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> IngressSettings:
        return cls(**json.loads(text))


class _Pending:
    """The hub's frames for one request, as they arrive."""

    __slots__ = ("arrived", "frames")

    def __init__(self) -> None:
        self.frames: deque[Frame] = deque()
        self.arrived = trio.Event()


def _hub_answers(_error: ServeError, _path: str | None) -> Answer:
    raise AssertionError("an ingress process never answers a request itself")


class IngressFront(Front):
    """The front of an ingress process: it reads requests and writes the hub's answers."""

    def __init__(self, settings: FrontSettings) -> None:
        super().__init__(app=None, fast_path=None, settings=settings, error_body=_hub_answers)
        self.link: Link | None = None
        self.drain = trio.Event()  # the hub said: stop accepting, finish, exit
        self._numbers = itertools.count(1)
        self._pending: dict[int, _Pending] = {}

    def on_frame(self, frame: Frame) -> None:
        kind = frame[0]
        if kind in (DATA, END):
            pending = self._pending.get(frame[1])
            if pending is not None:  # else: the request's client went away
                pending.frames.append(frame)
                pending.arrived.set()
        elif kind == DRAIN:
            self.drain.set()
        else:
            log.error("unexpected frame from the hub: kind %r", kind)

    async def dispatch(self, connection: Connection, request: Request, keep_alive: bool) -> bool:
        frame = (
            REQUEST,
            next(self._numbers),
            request.method,
            request.target,
            request.http_version,
            request.headers,
            request.body,
            keep_alive,
            connection.client,
            connection.server,
        )
        return await self._forward(connection, frame)

    async def refuse(self, connection: Connection, error: HttpError) -> None:
        frame = (REFUSE, next(self._numbers), error.status, error.message, error.path)
        await self._forward(connection, frame)

    async def _forward(self, connection: Connection, frame: Frame) -> bool:
        """Send a request to the hub and write its answer; whether to keep the connection."""
        link = self.link
        assert link is not None
        number = frame[1]
        pending = self._pending[number] = _Pending()
        link.post(frame)
        ended = False
        written = acknowledged = 0
        try:
            while True:
                if not pending.frames:
                    await pending.arrived.wait()
                    pending.arrived = trio.Event()
                    continue
                item = pending.frames.popleft()
                if item[0] == END:
                    ended = True
                    return bool(item[2])
                data: bytes = item[2]
                await connection.send(data)
                written += len(data)
                if written - acknowledged >= ACK_EVERY:
                    link.post((ACK, number, written))
                    acknowledged = written
        finally:
            del self._pending[number]
            if not ended:
                link.post((GONE, number))


def _listener(fd: int) -> trio.SocketListener:
    return trio.SocketListener(trio.socket.from_stdlib_socket(socket.socket(fileno=fd)))


async def serve_ingress(settings: IngressSettings) -> None:
    """Serve the inherited listeners until the hub says drain (or goes away)."""
    front = IngressFront(
        FrontSettings(
            max_request_size=settings.max_request_size,
            graceful_timeout=settings.graceful_timeout,
            keep_alive_timeout=settings.keep_alive_timeout,
            read_timeout=settings.read_timeout,
        )
    )
    link_socket = trio.socket.from_stdlib_socket(socket.socket(fileno=settings.link_fd))
    link = front.link = Link(link_socket, front.on_frame, f"ingress {settings.index}")
    listeners = [_listener(fd) for fd in settings.listener_fds]

    async with trio.open_nursery() as nursery:

        async def run_link() -> None:
            await link.run()
            if not front.drain.is_set():
                log.error("the server closed the link: exiting")
            nursery.cancel_scope.cancel()

        nursery.start_soon(run_link)
        await front.accept_until(listeners, front.drain.wait, lambda: link.post((READY,)))
        nursery.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    settings = IngressSettings.from_json(args[0])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(
        level=settings.log_level,
        format=f"%(asctime)s ingress-{settings.index} %(levelname)s %(name)s: %(message)s",
    )
    trio.run(serve_ingress, settings)


if __name__ == "__main__":
    main()
