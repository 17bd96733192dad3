"""The HTTP front on a real socket for runtime tests: an app that only answers the ASGI
lifespan, a plain 500 error body, serving on a free port (with a client connected),
reading until the server closes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from trioserve.config import Address
from trioserve.core.errors import ServeError
from trioserve.http.bodies import Answer
from trioserve.http.errors import protocol_error_answer
from trioserve.http.front import FastPath, Front, FrontSettings

from .fakes import lifespan


async def lifespan_only(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "lifespan"
    await lifespan(receive, send)


def error_body(error: ServeError, path: str | None) -> Answer:
    return protocol_error_answer(500, error.message)


async def serve_front(
    nursery: trio.Nursery, shutdown: trio.Event, fast_path: FastPath, **settings: float
) -> tuple[Front, int]:
    """A front with ``fast_path`` on 127.0.0.1 until ``shutdown``: the front and its port."""
    front = Front(lifespan_only, fast_path, FrontSettings(1 << 20, **settings), error_body)
    bound = await nursery.start(
        lambda task_status: front.serve(
            Address("http", "127.0.0.1", 0), shutdown_trigger=shutdown.wait, task_status=task_status
        )
    )
    return front, int(bound[0].rsplit(":", 1)[1])


@asynccontextmanager
async def connected(
    fast_path: FastPath, **settings: float
) -> AsyncIterator[tuple[Front, trio.SocketStream, trio.Event]]:
    """A front with ``fast_path`` (see :func:`serve_front`) and one client connection to it:
    the front, the connection and the front's shutdown event. On leaving, the connection is
    closed and the front shut down."""
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        front, port = await serve_front(nursery, shutdown, fast_path, **settings)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        try:
            yield front, stream, shutdown
        finally:
            await stream.aclose()
            shutdown.set()


async def read_all(stream: trio.SocketStream) -> bytes:
    """Everything the server sends until it closes."""
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    return data
