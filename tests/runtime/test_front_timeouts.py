"""The inference port's HTTP server on a real socket: its idle keep-alive and read timeouts,
and a drain that does not wait for its timer."""

from __future__ import annotations

from typing import Any

import trio

from trioserve.http.bodies import Answer
from trioserve.http.front import Front

from .fronts import read_all, serve_front

REQUEST = b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nhi"


async def _echo(request: Any) -> Answer:
    return Answer(200, [("content-type", "text/plain")], request.body)


async def _serving(
    nursery: trio.Nursery, shutdown: trio.Event, **settings: float
) -> tuple[Front, int]:
    return await serve_front(nursery, shutdown, _echo, **settings)


async def test_an_idle_keep_alive_connection_is_closed_after_its_timeout() -> None:
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        _front, port = await _serving(nursery, shutdown, keep_alive_timeout=0.3)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(REQUEST)
        started = trio.current_time()
        with trio.fail_after(5):
            data = await read_all(stream)  # the answer, then EOF once idle too long
        waited = trio.current_time() - started
        assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"hi")
        assert 0.25 <= waited < 2.0
        await stream.aclose()
        shutdown.set()


async def test_a_request_that_does_not_arrive_in_time_is_408() -> None:
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        _front, port = await _serving(nursery, shutdown, read_timeout=0.3)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"POST /x HTTP/1.1\r\nHost: t\r\n")  # the head never ends
        started = trio.current_time()
        with trio.fail_after(5):
            data = await read_all(stream)
        assert data.startswith(b"HTTP/1.1 408")
        assert 0.25 <= trio.current_time() - started < 2.0
        # a connection that keeps its requests coming is not cut
        lively = await trio.open_tcp_stream("127.0.0.1", port)
        for _ in range(4):
            await lively.send_all(REQUEST)
            answer = await lively.receive_some(65536)
            assert answer.startswith(b"HTTP/1.1 200")
            await trio.sleep(0.1)
        await stream.aclose()
        await lively.aclose()
        shutdown.set()


async def test_shutdown_does_not_wait_for_the_timer_or_the_grace_period() -> None:
    shutdown = trio.Event()
    with trio.fail_after(3):
        async with trio.open_nursery() as nursery:
            _front, port = await _serving(
                nursery, shutdown, keep_alive_timeout=60, graceful_timeout=30
            )
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(REQUEST)
            assert (await stream.receive_some(65536)).startswith(b"HTTP/1.1 200")
            shutdown.set()  # the idle connection closes at once, and serve() returns
        assert await read_all(stream) == b""
        await stream.aclose()


async def test_a_refused_upload_gets_its_answer_not_a_reset() -> None:
    """A body over max_request_size is refused from its head, while the client is still
    sending it. The server then reads and drops what keeps coming before it closes (a
    lingering close): closing with unread bytes would reset the connection, and the reset
    destroys the 413 before the client reads it."""
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        _front, port = await _serving(nursery, shutdown)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        head = b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % (8 << 20)
        received: list[bytes] = []

        async def upload() -> None:
            await stream.send_all(head + b"x" * (8 << 20))

        async def read() -> None:
            received.append(await read_all(stream))

        with trio.fail_after(10):
            async with trio.open_nursery() as client:
                client.start_soon(upload)
                client.start_soon(read)
        await stream.aclose()
        # (this front's error body answers every refusal as a 500, with the reason)
        assert received[0].startswith(b"HTTP/1.1 "), received[0][:200]
        assert b"larger than max_request_size" in received[0]
        shutdown.set()
