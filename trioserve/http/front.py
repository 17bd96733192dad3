"""trioserve's own HTTP/1.1 server on trio, for the inference port.

Hypercorn and Quart cost about a millisecond of CPU per request, more than a batched model
spends on one. This server parses requests with :mod:`trioserve.core.http1` and gives each
one first to a *fast path* (a plain ``async`` function; the inference API's answers
predictions with it) and otherwise to an ASGI application (the Quart app with every other
route, and predictions with form bodies). Either way the client sees the same API.

Each connection is one task plus a receiving task that reads ahead, so a client that leaves is
noticed while its request runs (its cancel scope is cancelled, or the app gets
``http.disconnect``). An https address wraps connections in TLS. Shutdown stops accepting, lets
requests in flight finish within ``graceful_timeout`` s and closes idle connections at once.
"""

from __future__ import annotations

import errno
import logging
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol, runtime_checkable

import trio

from trioserve.config import Address
from trioserve.core import errors
from trioserve.core.errors import ServeError
from trioserve.core.http1 import (
    LAST_CHUNK,
    HttpError,
    Request,
    chunk,
    no_body,
    response_head,
)
from trioserve.http.asgi import AsgiRequest, Lifespan
from trioserve.http.bodies import Answer, encode_headers
from trioserve.http.connection import FrontConnection
from trioserve.http.errors import protocol_error_answer
from trioserve.http.listeners import open_listeners, remove_socket_file

log = logging.getLogger("trioserve.http")

_ACCEPT_RETRY = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
_FRAMING = frozenset({b"content-length", b"transfer-encoding", b"connection"})


class Connection(Protocol):
    """What answering a request needs of its connection."""

    gone: trio.Event  # the client closed (or broke) its side
    client: Any  # (host, port), or None (a Unix socket)
    server: Any

    async def send(self, data: bytes) -> None: ...


Acceptor = Callable[
    ["Front", list[trio.SocketListener], Callable[[], Awaitable[None]], Callable[[], None]],
    Awaitable[None],
]
"""Who accepts connections on a front's listeners until the shutdown trigger fires (and
then drains them): ``(front, listeners, shutdown_trigger, started)``. The front's own
:meth:`Front.accept_until` by default."""


FastPath = Callable[[Request], Awaitable[Answer | None]]
"""Answers a request, or returns None to hand it to the ASGI app."""


class Begun(Protocol):
    """A request started by a fast path's ``start``, its answer to come."""

    def when_ready(self, wake: Callable[[], object]) -> None:
        """Call ``wake()`` once, in Trio, when :meth:`poll` may have the answer."""

    def poll(self) -> Answer | None:
        """The answer, or None while it is not known yet."""

    def cancel(self) -> None:
        """The answer is no longer wanted (the client left, the connection closed)."""


@runtime_checkable
class StartsRequests(Protocol):
    """A fast path that can also start some requests without a task waiting for their
    answer (:mod:`trioserve.http.connection` writes it when it comes)."""

    def start(self, request: Request) -> Answer | Begun | None:
        """The answer at once, the started request, or None: the request is for the
        awaited fast path (or the app)."""


ErrorBody = Callable[[ServeError, str | None], Answer]
"""The answer to a failure, given the request's path when it is known (a protocol served on
some paths, like the OIP's ``/v2``, answers its own error body there)."""


@dataclass
class FrontSettings:
    max_request_size: int
    graceful_timeout: float = 10.0
    keep_alive_timeout: float = 120.0  # an idle keep-alive connection is closed after this
    read_timeout: float = 60.0  # a started request must arrive whole within this
    backlog: int = 1024
    ssl_context: ssl.SSLContext | None = None  # an https:// address: TLS on every connection


@dataclass
class Front:
    """Serves one address: the fast path first, the ASGI app for everything else."""

    app: Any  # an ASGI 3 application
    fast_path: FastPath | None
    settings: FrontSettings
    error_body: ErrorBody
    on_response: Callable[[int], None] | None = None  # called for answers not from the app
    extra_headers: list[tuple[str, str]] = field(default_factory=list)  # same: CORS
    draining: bool = False
    _connections: set[FrontConnection] = field(default_factory=set)
    _starts: StartsRequests | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if isinstance(self.fast_path, StartsRequests):
            self._starts = self.fast_path

    # -- serving --------------------------------------------------------------------------

    async def serve(
        self,
        address: Address,
        *,
        shutdown_trigger: Callable[[], Awaitable[None]],
        accept: Acceptor | None = None,
        opened: tuple[list[trio.SocketListener], list[str]] | None = None,
        task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """``opened``: listeners opened already, with their URLs (several serving processes
        share them; each closes its own copies, and a Unix socket file is left to whoever
        opened it)."""
        if address.is_tls and self.settings.ssl_context is None:
            raise ValueError(f"{address.url()}: an https address needs a certificate and key")
        listeners, bound = opened or await open_listeners(address, self.settings.backlog)
        try:
            async with trio.open_nursery() as outer:
                lifespan = Lifespan(self.app)
                await outer.start(lifespan.run)
                acceptor = accept or Front.accept_until
                started = partial(task_status.started, bound)
                await acceptor(self, listeners, shutdown_trigger, started)
                await lifespan.shutdown()
        finally:
            for listener in listeners:
                with trio.CancelScope(shield=True):
                    await listener.aclose()
            if address.is_unix and address.path and opened is None:
                remove_socket_file(address.path)

    async def accept_until(
        self,
        listeners: list[trio.SocketListener],
        shutdown_trigger: Callable[[], Awaitable[None]],
        started: Callable[[], None],
    ) -> None:
        """Accept and serve connections until ``shutdown_trigger`` returns; then close the
        listeners, let requests in flight finish for up to ``graceful_timeout`` seconds and
        close idle connections at once."""
        async with trio.open_nursery() as outer:
            timer = trio.CancelScope()
            outer.start_soon(self._expire, timer)
            async with trio.open_nursery() as connections:
                async with trio.open_nursery() as acceptors:
                    for listener in listeners:
                        acceptors.start_soon(self._accept, listener, connections)
                    started()
                    await shutdown_trigger()
                    acceptors.cancel_scope.cancel()
                for listener in listeners:
                    await listener.aclose()
                self.draining = True
                for connection in list(self._connections):
                    connection.wake()  # idle ones close now
                connections.cancel_scope.deadline = (
                    trio.current_time() + self.settings.graceful_timeout
                )
            timer.cancel()

    async def _expire(self, scope: trio.CancelScope) -> None:
        """Wake each connection whose wait for a request has outlived its deadline (idle
        keep-alive or read timeout), checking a few times per shortest timeout; until
        ``scope`` is cancelled."""
        settings = self.settings
        tick = max(0.01, min(settings.keep_alive_timeout, settings.read_timeout) / 8)
        with scope:
            while True:
                await trio.sleep(tick)
                now = trio.current_time()
                for connection in list(self._connections):
                    if connection.deadline <= now:
                        connection.wake()

    async def _accept(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in _ACCEPT_RETRY:
                    raise
                log.error("accept failed (%s); retrying shortly", os.strerror(exc.errno))
                await trio.sleep(0.1)
                continue
            nursery.start_soon(self._connection, stream)

    async def _connection(self, stream: trio.SocketStream) -> None:
        connection = FrontConnection(self, stream)
        self._connections.add(connection)
        try:
            await connection.run()
        finally:
            self._connections.discard(connection)

    # -- requests -------------------------------------------------------------------------

    async def dispatch(self, connection: Connection, request: Request, keep_alive: bool) -> bool:
        """Answer one request; True if the connection may carry another."""
        answer: Answer | None = None
        if self.fast_path is not None:
            try:
                answer = await self.fast_path(request)
            except Exception as exc:
                log.exception("unexpected error while handling a request")
                answer = self.error_body(errors.internal_error(exc), request.path)
        if answer is None:
            return await AsgiRequest(self, connection, request, keep_alive).run()
        return await self.write_answer(
            connection, request.method, request.http_version, answer, keep_alive=keep_alive
        )

    def start(self, request: Request) -> Answer | Begun | None:
        """Start ``request`` without waiting for its answer, if the fast path can (None:
        answer it with :meth:`dispatch`)."""
        if self._starts is None:
            return None
        try:
            return self._starts.start(request)
        except Exception as exc:
            log.exception("unexpected error while handling a request")
            return self.error_body(errors.internal_error(exc), request.path)

    def encode_answer(self, method: str, answer: Answer, *, keep_alive: bool) -> tuple[bytes, bool]:
        """A whole-body answer as bytes for the wire, and whether the connection may carry
        another request after it."""
        assert isinstance(answer.body, bytes)
        keep = keep_alive and not answer.close and not self.draining
        try:
            headers = self._wire_headers(answer)
        except ValueError as exc:
            answer = self._refused(exc)
            headers, keep = encode_headers(answer.headers), False
        self._count(answer)
        body = answer.body
        assert isinstance(body, bytes)
        if no_body(answer.status, method):
            return response_head(answer.status, headers, length=0, keep_alive=keep), keep
        head = response_head(answer.status, headers, length=len(body), keep_alive=keep)
        return head + body, keep

    def _wire_headers(self, answer: Answer) -> list[tuple[bytes, bytes]]:
        """The answer's headers and the front's own (CORS) for the wire; ValueError for a
        header that could split the head."""
        extra, own = self.extra_headers, answer.headers
        return encode_headers(own + extra if extra else own)

    def _refused(self, exc: ValueError) -> Answer:
        """The 500 that replaces an answer whose headers cannot be sent."""
        log.error("refusing a response: %s", exc)
        return self.error_body(errors.internal_error(exc), None)

    def _count(self, answer: Answer) -> None:
        if self.on_response is not None and not answer.counted:
            self.on_response(answer.status)

    async def refuse(self, connection: Connection, error: HttpError) -> None:
        """Answer a request that could not be read; the connection closes after it."""
        if error.status == 413:
            answer = self.error_body(
                errors.request_too_large(self.settings.max_request_size), error.path
            )
        else:
            answer = protocol_error_answer(error.status, error.message)
        await self.write_answer(connection, "GET", "1.1", answer, keep_alive=False)

    async def write_answer(
        self,
        connection: Connection,
        method: str,
        http_version: str,
        answer: Answer,
        *,
        keep_alive: bool,
    ) -> bool:
        if isinstance(answer.body, bytes):
            data, keep = self.encode_answer(method, answer, keep_alive=keep_alive)
            await connection.send(data)
            return keep
        keep = keep_alive and not answer.close and not self.draining
        try:
            headers = self._wire_headers(answer)
        except ValueError as exc:
            await _close_body(answer.body)
            data, keep = self.encode_answer(method, self._refused(exc), keep_alive=False)
            await connection.send(data)
            return keep
        self._count(answer)
        status, body = answer.status, answer.body
        assert not isinstance(body, bytes)
        try:
            chunked = http_version == "1.1"
            keep = keep and chunked  # an HTTP/1.0 client reads the body until we close
            head = response_head(status, headers, length=None if chunked else -1, keep_alive=keep)
            await connection.send(head)
            async for piece in body:
                await connection.send(chunk(piece) if chunked else piece)
            if chunked:
                await connection.send(LAST_CHUNK)
        finally:
            await _close_body(body)
        return keep


async def _close_body(body: bytes | AsyncIterator[bytes]) -> None:
    aclose = getattr(body, "aclose", None)
    if aclose is not None:
        with trio.CancelScope(shield=True):
            await aclose()
