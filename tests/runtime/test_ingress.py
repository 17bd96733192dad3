"""The hub's front with real ingress processes (no model workers: a fake fast path and a
tiny ASGI app answer in the hub)."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import psutil
import pytest
import trio

from trioserve.config import Address
from trioserve.core.errors import ServeError
from trioserve.http.bodies import Answer
from trioserve.http.errors import protocol_error_answer
from trioserve.http.front import Front, FrontSettings
from trioserve.http.ingress import WINDOW, Ingress

from .fakes import lifespan

pytestmark = pytest.mark.filterwarnings("error")


class Hub:
    """What the hub's fast path saw and did."""

    def __init__(self) -> None:
        self.cancelled = trio.Event()
        self.started = trio.Event()
        self.produced = 0
        self.statuses: list[int] = []


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        return await lifespan(receive, send)
    body = f"app {scope['method']} {scope['path']} client={scope['client'] is not None}"
    await send({"type": "http.response.start", "status": 201, "headers": []})
    await send({"type": "http.response.body", "body": body.encode()})


def _fast_path(hub: Hub) -> Any:
    async def answer(request: Any) -> Answer | None:
        if request.path == "/app":
            return None
        if request.path == "/sleep":
            hub.started.set()
            try:
                await trio.sleep_forever()
            finally:
                hub.cancelled.set()
        if request.path.startswith("/slow"):
            await trio.sleep(float(request.query))
        if request.path == "/big":
            return Answer(200, [], _chunks(hub, int(request.query)))
        body = b"hub %d: %s" % (os.getpid(), request.body)
        return Answer(200, [("content-type", "text/plain")], body)

    return answer


async def _chunks(hub: Hub, total: int) -> AsyncIterator[bytes]:
    piece = b"x" * 65536
    while hub.produced < total:
        hub.produced += len(piece)
        yield piece


def _error_body(error: ServeError, path: str | None) -> Answer:
    return protocol_error_answer(500, error.message)


class _BrokenFront(Front):
    """A front whose own dispatch fails on ``/broken`` (a bug outside the fast path)."""

    async def dispatch(self, connection: Any, request: Any, keep_alive: bool) -> bool:
        if request.path == "/broken":
            raise RuntimeError("a bug in the front")
        return await super().dispatch(connection, request, keep_alive)


async def _serving(
    nursery: trio.Nursery, shutdown: trio.Event, processes: int = 2, **settings: float
) -> tuple[Hub, Ingress, int]:
    hub = Hub()
    front = _BrokenFront(
        _app,
        _fast_path(hub),
        FrontSettings(1 << 16, **settings),
        _error_body,
        on_response=hub.statuses.append,
    )
    ingress = Ingress(processes)
    bound = await nursery.start(
        lambda task_status: front.serve(
            Address("http", "127.0.0.1", 0),
            shutdown_trigger=shutdown.wait,
            accept=ingress.accept,
            task_status=task_status,
        )
    )
    return hub, ingress, int(bound[0].rsplit(":", 1)[1])


async def _request(port: int, raw: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(raw)
        return await _read_all(stream)


async def _read_all(stream: trio.SocketStream) -> bytes:
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    return data


def _post(path: str, body: bytes = b"hi", close: bool = True) -> bytes:
    connection = b"Connection: close\r\n" if close else b""
    return b"POST %s HTTP/1.1\r\nHost: t\r\n%sContent-Length: %d\r\n\r\n%s" % (
        path.encode(),
        connection,
        len(body),
        body,
    )


def _owner(pids: list[int], stream: trio.SocketStream) -> int:
    """The ingress process holding the server side of ``stream``'s connection."""
    local = stream.socket.getsockname()
    for pid in pids:
        for conn in psutil.Process(pid).net_connections("tcp"):
            if conn.raddr and (conn.raddr.ip, conn.raddr.port) == local[:2]:
                return pid
    raise AssertionError("no ingress process holds the connection")


async def test_requests_on_every_ingress_process_are_answered_by_the_hub() -> None:
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        hub, ingress, port = await _serving(nursery, shutdown)
        assert len(ingress.pids()) == 2 and os.getpid() not in ingress.pids()
        owners = set()
        with trio.fail_after(20):
            for attempt in range(200):
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                async with stream:
                    for n in range(3):  # keep-alive: three requests on one connection
                        await stream.send_all(_post("/p", b"%d-%d" % (attempt, n), close=False))
                        data = await stream.receive_some(65536)
                        assert data.startswith(b"HTTP/1.1 200 ")
                        assert data.endswith(b"hub %d: %d-%d" % (os.getpid(), attempt, n))
                    owners.add(_owner(ingress.pids(), stream))
                if len(owners) == 2 and attempt >= 10:
                    break
        assert owners == set(ingress.pids())
        assert hub.statuses and set(hub.statuses) == {200}
        shutdown.set()


async def test_routes_the_fast_path_declines_reach_the_hubs_app() -> None:
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        _hub, _ingress, port = await _serving(nursery, shutdown)
        with trio.fail_after(10):
            data = await _request(port, _post("/app"))
        assert data.startswith(b"HTTP/1.1 201 ")
        assert data.endswith(b"app POST /app client=True")
        shutdown.set()


async def test_a_request_the_ingress_cannot_read_is_refused_by_the_hub() -> None:
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        hub, _ingress, port = await _serving(nursery, shutdown)
        with trio.fail_after(10):
            data = await _request(port, b"POST /p HTTP/1.1\r\nContent-Length: x\r\n\r\n")
            too_big = await _request(port, _post("/p", b"y" * (1 << 17)))
        assert data.startswith(b"HTTP/1.1 400 ") and b"connection: close" in data.lower()
        assert too_big.startswith(b"HTTP/1.1 500 ")  # this test's error body for a 413
        assert hub.statuses == [400, 500]  # counted where the answers were made: the hub
        shutdown.set()


async def test_an_unexpected_error_in_the_hub_is_answered_500() -> None:
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        _hub, _ingress, port = await _serving(nursery, shutdown)
        with trio.fail_after(10):
            data = await _request(port, _post("/broken"))
            after = await _request(port, _post("/p"))  # and the hub goes on serving
        assert data.startswith(b"HTTP/1.1 500 ") and b"a bug in the front" in data
        assert after.startswith(b"HTTP/1.1 200 ")
        shutdown.set()


async def test_a_client_that_leaves_cancels_its_request_in_the_hub() -> None:
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        hub, _ingress, port = await _serving(nursery, shutdown)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(_post("/sleep"))
        with trio.fail_after(10):
            await hub.started.wait()
            await stream.aclose()
            await hub.cancelled.wait()
        shutdown.set()


async def test_an_answer_to_a_client_that_does_not_read_is_held_back() -> None:
    shutdown = trio.Event()
    total = 256 * 1024 * 1024
    async with trio.open_nursery() as nursery:
        hub, _ingress, port = await _serving(nursery, shutdown)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /big?%d HTTP/1.1\r\nHost: t\r\n\r\n" % total)
        await trio.sleep(1.5)  # the client reads nothing meanwhile
        # What the ingress holds for a client that does not read is the window; the rest is
        # in the sockets' buffers (loopback's can be several MiB each way).
        assert WINDOW <= hub.produced < 64 * 1024 * 1024
        await stream.aclose()
        shutdown.set()


async def test_a_killed_ingress_process_loses_its_requests_and_is_restarted() -> None:
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        hub, ingress, port = await _serving(nursery, shutdown)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(_post("/sleep"))
        with trio.fail_after(15):
            await hub.started.wait()
            victim = _owner(ingress.pids(), stream)
            os.kill(victim, signal.SIGKILL)
            assert await _read_all(stream) == b""  # the connection closes, unanswered
            await stream.aclose()
            await hub.cancelled.wait()  # and its work in the hub is cancelled
            while len(ingress.pids()) < 2 or victim in ingress.pids():
                await trio.sleep(0.05)
            for _ in range(20):  # both processes answer again
                data = await _request(port, _post("/p"))
                assert data.startswith(b"HTTP/1.1 200 ")
        shutdown.set()


async def test_shutdown_drains_every_ingress_process() -> None:
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        _hub, ingress, port = await _serving(nursery, shutdown, graceful_timeout=5)
        pids = ingress.pids()
        answers: list[bytes] = []

        async def slow() -> None:
            answers.append(await _request(port, _post("/slow?0.8", close=False)))

        with trio.fail_after(20):
            async with trio.open_nursery() as clients:
                for _ in range(6):
                    clients.start_soon(slow)
                await trio.sleep(0.3)
                shutdown.set()
            for pid in pids:
                while psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie":
                    await trio.sleep(0.05)
        assert len(answers) == 6
        for data in answers:
            assert data.startswith(b"HTTP/1.1 200 ") and b"connection: close" in data.lower()
        with pytest.raises(OSError, match="connect"):
            await trio.open_tcp_stream("127.0.0.1", port)
