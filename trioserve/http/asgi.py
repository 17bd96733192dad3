"""Running a request through an ASGI application, for the HTTP front.

:class:`AsgiRequest` hands one parsed request to the app (the Quart app of the inference
port) and writes what the app sends back on the front's connection, chunked when the app
streams; :class:`Lifespan` runs the app's ASGI lifespan protocol around serving.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import trio

from trioserve.core import errors
from trioserve.core.http1 import LAST_CHUNK, Request, chunk, no_body, response_head

if TYPE_CHECKING:
    from trioserve.http.front import Connection, Front

log = logging.getLogger("trioserve.http")


class AsgiRequest:
    """One request run through the ASGI app."""

    def __init__(
        self, front: Front, connection: Connection, request: Request, keep_alive: bool
    ) -> None:
        self.front = front
        self.connection = connection
        self.request = request
        self.keep = keep_alive and not front.draining
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.length: int | None = None
        self.chunked = False
        self.started = False  # the head is on the wire
        self.finished = False
        self.body_read = False

    def scope(self) -> dict[str, Any]:
        request, connection = self.request, self.connection
        path = request.path
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": request.http_version,
            "method": request.method,
            "scheme": "http",
            "path": unquote(path),
            "raw_path": path.encode("ascii"),
            "query_string": request.query.encode("ascii"),
            "root_path": "",
            "headers": request.headers,
            "client": connection.client,
            "server": connection.server,
            "extensions": {},
        }

    async def run(self) -> bool:
        try:
            await self.front.app(self.scope(), self.receive, self.send)
        except Exception as exc:
            log.exception("unexpected error in the ASGI application")
            if not self.status:
                answer = self.front.error_body(errors.internal_error(exc), self.request.path)
                return await self.front.write_answer(
                    self.connection, "GET", "1.1", answer, keep_alive=False
                )
            return False
        if not self.status:
            answer = self.front.error_body(
                errors.internal_error(RuntimeError("the application sent no response")),
                self.request.path,
            )
            return await self.front.write_answer(
                self.connection, "GET", "1.1", answer, keep_alive=False
            )
        return self.keep and self.finished

    async def receive(self) -> dict[str, Any]:
        if not self.body_read:
            self.body_read = True
            return {"type": "http.request", "body": self.request.body, "more_body": False}
        await self.connection.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self.status:
                raise RuntimeError("http.response.start sent twice")
            self.status = int(message["status"])
            for name, value in message.get("headers", ()):
                name = bytes(name).lower()
                value = bytes(value)
                if name == b"content-length":
                    self.length = int(value)
                elif name == b"connection":
                    if b"close" in value.lower():
                        self.keep = False
                elif name != b"transfer-encoding":
                    self.headers.append((name, value))
        elif kind == "http.response.body":
            if not self.status or self.finished:
                raise RuntimeError("http.response.body out of order")
            await self._body(bytes(message.get("body", b"")), bool(message.get("more_body")))

    async def _body(self, body: bytes, more: bool) -> None:
        send = self.connection.send
        skip = no_body(self.status, self.request.method)
        if not self.started:
            self.started = True
            if not more and self.length is None:
                self.length = 0 if skip else len(body)
            if self.length is None:
                self.chunked = self.request.http_version == "1.1"
                self.keep = self.keep and self.chunked
            framing = self.length if self.length is not None else (None if self.chunked else -1)
            head = response_head(self.status, self.headers, length=framing, keep_alive=self.keep)
            await send(head if skip else head + (chunk(body) if self.chunked else body))
        elif not skip and body:
            await send(chunk(body) if self.chunked else body)
        if not more:
            self.finished = True
            if self.chunked and not skip:
                await send(LAST_CHUNK)


class Lifespan:
    """The ASGI lifespan protocol: startup before serving, shutdown after."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._events: trio.MemorySendChannel[dict[str, Any]] | None = None
        self._started = trio.Event()
        self._stopped = trio.Event()
        self._failure: str | None = None

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        send_channel, receive_channel = trio.open_memory_channel[dict[str, Any]](2)
        self._events = send_channel
        await send_channel.send({"type": "lifespan.startup"})

        async def receive() -> dict[str, Any]:
            return await receive_channel.receive()

        async def send(message: dict[str, Any]) -> None:
            kind = message["type"]
            if kind == "lifespan.startup.complete":
                self._started.set()
            elif kind == "lifespan.startup.failed":
                self._failure = str(message.get("message", ""))
                self._started.set()
            elif kind == "lifespan.shutdown.complete":
                self._stopped.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._call, receive, send)
            await self._started.wait()
            if self._failure is not None:
                raise RuntimeError(f"the application failed to start: {self._failure}")
            task_status.started()

    async def _call(self, receive: Any, send: Any) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.3"}}
        try:
            await self.app(scope, receive, send)
        finally:
            self._started.set()
            self._stopped.set()

    async def shutdown(self) -> None:
        assert self._events is not None, "shutdown before run"
        await self._events.send({"type": "lifespan.shutdown"})
        await self._stopped.wait()
