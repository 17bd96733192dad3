"""Ingress processes: the inference port's connections on every core.

One Python process spends one core, and the HTTP work of a request (reading and checking
it, the socket calls, the connection's tasks) costs more CPU than answering it. With
``ingress_processes`` set above 0, the server (the *hub*) opens the inference port's
listening sockets but accepts nothing on them itself: it starts that many ingress processes
(:mod:`trioserve.http.ingress_process`), which inherit the sockets and terminate the
connections. Each request an ingress process reads whole is sent to the hub over that
process's link (:mod:`trioserve.http.ingress_link`); the hub answers it with its own front
(:meth:`Front.dispatch`: the fast path, else the ASGI app), exactly as if the connection were
its own, and sends the answer's bytes back. So every route, token check, metric and model of
the hub serves every ingress process at once, the batchers still form batches across all of
them, and there is one request path.

The hub stands in for an ingress connection with a :class:`_Remote` per request: its
``send`` queues bytes on the link (pausing once ``WINDOW`` bytes are unacknowledged, so a
client that does not read holds no more than that in the ingress process), and a client that
goes away cancels the request's scope. An ingress process that dies takes its connections
with it (their clients see the connection close); its requests in the hub are cancelled and
the process is started again, after the same back-off as a worker. On shutdown every ingress
process is told to drain; the hub waits for them (``graceful_timeout`` and a little more)
before it stops answering.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from trioserve.core import errors
from trioserve.core.backoff import Backoff
from trioserve.core.http1 import HttpError, Request
from trioserve.core.ingress_frames import ACK, DATA, DRAIN, END, GONE, READY, REFUSE, REQUEST, Frame
from trioserve.http.front import Front
from trioserve.http.ingress_link import Link
from trioserve.http.ingress_process import IngressSettings
from trioserve.pythonpath import child_environment

log = logging.getLogger("trioserve.ingress")

WINDOW = 512 * 1024  # bytes of one answer sent ahead of the ingress's acknowledgement
DRAIN_SLACK = 5.0  # seconds past graceful_timeout before the hub stops waiting for a drain
REAP_TIMEOUT = 5.0  # seconds an ingress process gets to exit after its link closed


class _Remote:
    """One request of an ingress connection, as the hub's front answers it."""

    __slots__ = ("_acked", "_link", "_room", "_sent", "client", "gone", "number", "scope", "server")

    def __init__(self, link: Link, number: int, client: object, server: object) -> None:
        self._link = link
        self.number = number
        self.client = client if isinstance(client, tuple) else None
        self.server = server if isinstance(server, tuple) else None
        self.gone = trio.Event()
        self.scope = trio.CancelScope()
        self._sent = 0
        self._acked = 0
        self._room = trio.Event()

    async def send(self, data: bytes) -> None:
        if self.gone.is_set():
            raise trio.BrokenResourceError("the client went away")
        self._link.post((DATA, self.number, data), more=True)  # END or more DATA follows
        self._sent += len(data)
        while self._sent - self._acked > WINDOW and not self.gone.is_set():
            self._room = trio.Event()
            await self._room.wait()

    @property
    def sent(self) -> int:
        """Bytes of the answer sent so far."""
        return self._sent

    def acknowledged(self, written: int) -> None:
        self._acked = max(self._acked, written)
        self._room.set()

    def leave(self) -> None:
        """The client (or its whole ingress process) went away."""
        self.gone.set()
        self.scope.cancel()
        self._room.set()


class _Session:
    """The hub's side of one ingress process, for as long as its link is open."""

    def __init__(self, front: Front, sock: trio.socket.SocketType, index: int) -> None:
        self.front = front
        self.link = Link(sock, self.on_frame, f"ingress {index}")
        self.remotes: dict[int, _Remote] = {}
        self.ready = False
        self.settled = trio.Event()  # ready, or the link closed first
        self._nursery: trio.Nursery | None = None

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await self.link.run()
                for remote in list(self.remotes.values()):
                    remote.leave()
        finally:
            self.settled.set()

    def on_frame(self, frame: Frame) -> None:
        kind, number = frame[0], frame[1] if len(frame) > 1 else 0
        nursery = self._nursery
        assert nursery is not None
        if kind == REQUEST:
            _, _, method, target, version, headers, body, keep_alive, client, server = frame
            remote = self.remotes[number] = _Remote(self.link, number, client, server)
            request = Request(method, target, version, headers, body, keep_alive)
            nursery.start_soon(self._answer, remote, request)
        elif kind == REFUSE:
            _, _, status, message, path = frame
            remote = self.remotes[number] = _Remote(self.link, number, None, None)
            nursery.start_soon(self._refuse, remote, HttpError(status, message, path))
        elif kind in (GONE, ACK):
            known = self.remotes.get(number)
            if known is not None:
                if kind == GONE:
                    known.leave()
                else:
                    known.acknowledged(frame[2])
        elif kind == READY:
            self.ready = True
            self.settled.set()
        else:
            log.error("%s: unexpected frame kind %r", self.link.name, kind)

    async def _answer(self, remote: _Remote, request: Request) -> None:
        async def answer() -> bool:
            return await self.front.dispatch(remote, request, request.keep_alive)

        await self._run(remote, answer)

    async def _refuse(self, remote: _Remote, error: HttpError) -> None:
        async def answer() -> bool:
            await self.front.refuse(remote, error)
            return False

        await self._run(remote, answer)

    async def _run(self, remote: _Remote, answer: Callable[[], Awaitable[bool]]) -> None:
        keep = False
        try:
            with remote.scope:
                keep = await answer()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away while its answer was being sent
        except Exception as exc:
            log.exception("%s: unexpected error while answering a request", self.link.name)
            if remote.sent == 0 and not remote.gone.is_set():
                # Nothing of an answer went out yet: the client gets a 500 saying so.
                failure = self.front.error_body(errors.internal_error(exc), None)
                with contextlib.suppress(trio.BrokenResourceError):
                    await self.front.write_answer(remote, "GET", "1.1", failure, keep_alive=False)
        finally:
            del self.remotes[remote.number]
            if not remote.gone.is_set():
                self.link.post((END, remote.number, keep))


@dataclass
class Ingress:
    """Runs ``processes`` ingress processes on a front's listeners (an ``Acceptor``)."""

    processes: int
    log_level: str = "INFO"
    command: list[str] = field(
        default_factory=lambda: [sys.executable, "-m", "trioserve.http.ingress_process"]
    )
    _sessions: dict[int, _Session] = field(default_factory=dict)
    _pids: dict[int, int] = field(default_factory=dict)
    _draining: bool = False

    def pids(self) -> list[int]:
        """The ingress processes running now (for tests and diagnostics)."""
        return sorted(self._pids.values())

    async def accept(
        self,
        front: Front,
        listeners: list[trio.SocketListener],
        shutdown_trigger: Callable[[], Awaitable[None]],
        started: Callable[[], None],
    ) -> None:
        fds = [listener.socket.fileno() for listener in listeners]
        async with trio.open_nursery() as nursery:
            async with trio.open_nursery() as starting:
                for index in range(self.processes):
                    starting.start_soon(nursery.start, self._supervise, index, front, fds)
            started()
            await shutdown_trigger()
            self._draining = True
            front.draining = True
            for session in self._sessions.values():
                session.link.post((DRAIN,))
            for listener in listeners:
                await listener.aclose()  # the ingress processes hold their own copies
            nursery.cancel_scope.deadline = (
                trio.current_time() + front.settings.graceful_timeout + DRAIN_SLACK
            )

    async def _supervise(
        self,
        index: int,
        front: Front,
        fds: list[int],
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        backoff = Backoff()
        first = True
        while True:
            hub_end, ingress_end = socket.socketpair()
            settings = IngressSettings(
                index=index,
                link_fd=ingress_end.fileno(),
                listener_fds=fds,
                max_request_size=front.settings.max_request_size,
                graceful_timeout=front.settings.graceful_timeout,
                keep_alive_timeout=front.settings.keep_alive_timeout,
                read_timeout=front.settings.read_timeout,
                log_level=self.log_level,
            )
            try:
                process = await trio.lowlevel.open_process(
                    [*self.command, settings.to_json()],
                    pass_fds=(ingress_end.fileno(), *fds),
                    env=child_environment(),
                )
            finally:
                ingress_end.close()
            self._pids[index] = process.pid
            session = self._sessions[index] = _Session(
                front, trio.socket.from_stdlib_socket(hub_end), index
            )
            began = trio.current_time()
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(session.run)
                    if first:
                        await session.settled.wait()
                        if session.ready:
                            first = False
                            task_status.started()
            finally:
                del self._sessions[index]
                with trio.CancelScope(shield=True):
                    code = await _reap(process)
                self._pids.pop(index, None)
            if self._draining:
                return
            if first:
                raise RuntimeError(
                    f"ingress process {index} exited (code {code}) before it was ready"
                )
            backoff.record_uptime(trio.current_time() - began)
            delay = backoff.next_delay()
            log.error(
                "ingress process %d (pid %d) exited with code %s; its connections are lost; "
                "restarting it in %.0f s",
                index,
                process.pid,
                code,
                delay,
            )
            await trio.sleep(delay)


async def _reap(process: trio.Process) -> int | None:
    """Wait for a process whose link closed to exit; kill it if it does not."""
    with trio.move_on_after(REAP_TIMEOUT):
        return await process.wait()
    process.kill()
    return await process.wait()


__all__ = ["WINDOW", "Ingress"]
