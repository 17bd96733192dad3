"""The HTTP server's started requests on a real socket: a fast path that starts a request
(``start``) and answers it later, from another task, as a worker's reply would come.

Covered: the answer written by whoever delivers it; requests in order when a client
pipelines; a client that leaves cancels what it started; a drain waits for the answer; an
idle connection after a started request closes quietly; a streamed answer and an answer too
big for the socket are finished by the connection's own task; a request the fast path does
not start takes the awaited path."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import trio

from trioserve.core.http1 import Request
from trioserve.http.bodies import Answer

from .fronts import connected, read_all


def post(path: str, body: bytes, *extra: bytes) -> bytes:
    head = b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n" % (path.encode(), len(body))
    return head + b"".join(extra) + b"\r\n" + body


class Started:
    """One started request: answered when the test says so."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.answer: Answer | None = None
        self.cancelled = False
        self.broken: Exception | None = None  # poll() raises it
        self._wake: Callable[[], object] | None = None

    def when_ready(self, wake: Callable[[], object]) -> None:
        self._wake = wake

    def poll(self) -> Answer | None:
        if self.broken is not None:
            raise self.broken
        return self.answer

    def cancel(self) -> None:
        self.cancelled = True

    def give(self, answer: Answer) -> None:
        self.answer = answer
        self._tell()

    def break_with(self, error: Exception) -> None:
        self.broken = error
        self._tell()

    def _tell(self) -> None:
        wake, self._wake = self._wake, None
        assert wake is not None, "nobody waits for the answer"
        wake()


class FakeFastPath:
    """Starts POSTs to /start (answers them when the test calls ``give``), answers POSTs to
    /now at once, and leaves the rest to the awaited path (which echoes)."""

    def __init__(self) -> None:
        self.started: list[Started] = []
        self.arrived = trio.Event()
        self.awaited = 0

    def start(self, request: Request) -> Answer | Started | None:
        if request.path == "/now":
            return Answer(201, [], b"now:" + request.body)
        if request.path != "/start":
            return None
        started = Started(request)
        self.started.append(started)
        self.arrived.set()
        return started

    async def __call__(self, request: Request) -> Answer | None:
        self.awaited += 1
        return Answer(200, [], b"awaited:" + request.body)

    async def next_started(self) -> Started:
        while not self.started or all(s.answer or s.cancelled or s.broken for s in self.started):
            self.arrived = trio.Event()
            await self.arrived.wait()
        return next(s for s in self.started if not (s.answer or s.cancelled or s.broken))


async def _read_answers(stream: trio.SocketStream, count: int) -> list[bytes]:
    """``count`` whole answers (each with a Content-Length)."""
    data = b""
    answers: list[bytes] = []
    while len(answers) < count:
        head_end = data.find(b"\r\n\r\n")
        if head_end >= 0:
            head = data[:head_end].lower()
            length = int(head.split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
            end = head_end + 4 + length
            if len(data) >= end:
                answers.append(data[:end])
                data = data[end:]
                continue
        chunk = await stream.receive_some(65536)
        assert chunk, f"closed after {len(answers)} answers"
        data += chunk
    return answers


async def test_a_started_request_is_answered_by_whoever_delivers_it() -> None:
    fast = FakeFastPath()
    async with connected(fast) as (_front, stream, _shutdown):
        with trio.fail_after(5):
            for round_ in range(3):
                await stream.send_all(post("/start", b"%d" % round_))
                started = await fast.next_started()
                assert started.request.body == b"%d" % round_
                started.give(Answer(200, [("x-round", str(round_))], b"done%d" % round_))
                (answer,) = await _read_answers(stream, 1)
                assert answer.startswith(b"HTTP/1.1 200")
                assert b"x-round: %d" % round_ in answer and answer.endswith(b"done%d" % round_)
            # answered at once by start(), and the awaited path for what it does not start
            await stream.send_all(post("/now", b"a") + post("/other", b"b"))
            now, other = await _read_answers(stream, 2)
        assert now.startswith(b"HTTP/1.1 201") and now.endswith(b"now:a")
        assert other.startswith(b"HTTP/1.1 200") and other.endswith(b"awaited:b")
        assert fast.awaited == 1


async def test_pipelined_requests_are_answered_in_order() -> None:
    fast = FakeFastPath()
    async with connected(fast) as (_front, stream, _shutdown):
        with trio.fail_after(5):
            await stream.send_all(
                post("/start", b"1") + post("/other", b"2") + post("/start", b"3")
            )
            first = await fast.next_started()
            await trio.sleep(0.05)
            # the second and third wait for the first: nothing else was started or awaited
            assert len(fast.started) == 1 and fast.awaited == 0
            first.give(Answer(200, [], b"one"))
            third = await fast.next_started()
            assert third.request.body == b"3" and fast.awaited == 1
            third.give(Answer(200, [], b"three"))
            answers = await _read_answers(stream, 3)
        assert [a.rsplit(b"\r\n\r\n", 1)[1] for a in answers] == [b"one", b"awaited:2", b"three"]


async def test_a_client_that_leaves_cancels_what_it_started() -> None:
    fast = FakeFastPath()
    async with connected(fast) as (front, stream, _shutdown):
        with trio.fail_after(5):
            await stream.send_all(post("/start", b"x"))
            started = await fast.next_started()
            await stream.aclose()
            while not started.cancelled:
                await trio.sleep(0.01)
            while front._connections:
                await trio.sleep(0.01)


async def test_a_drain_waits_for_a_started_answer_then_closes() -> None:
    fast = FakeFastPath()
    async with connected(fast, graceful_timeout=10) as (_front, stream, shutdown):
        with trio.fail_after(5):
            await stream.send_all(post("/start", b"x"))
            started = await fast.next_started()
            shutdown.set()
            await trio.sleep(0.1)
            assert not started.cancelled
            started.give(Answer(200, [], b"late"))
            data = await read_all(stream)  # the answer, then the end
        assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"late")
        assert b"connection: close" in data.lower()


async def test_idle_after_a_started_request_closes_quietly() -> None:
    fast = FakeFastPath()
    async with connected(fast, keep_alive_timeout=0.3) as (_front, stream, _shutdown):
        with trio.fail_after(5):
            await stream.send_all(post("/start", b"x"))
            started = await fast.next_started()
            await trio.sleep(0.5)  # longer than the keep-alive timeout: not idle, not cut
            started.give(Answer(200, [], b"slow"))
            began = trio.current_time()
            data = await read_all(stream)  # the answer, then EOF once idle too long
        assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"slow")
        assert b"408" not in data
        assert 0.2 <= trio.current_time() - began < 2.0


async def test_a_streamed_answer_is_finished_by_the_connection() -> None:
    fast = FakeFastPath()

    async def pieces() -> AsyncIterator[bytes]:
        for piece in (b"a", b"b", b"c"):
            await trio.sleep(0.01)
            yield piece

    async with connected(fast) as (_front, stream, _shutdown):
        with trio.fail_after(5):
            await stream.send_all(post("/start", b"x") + post("/now", b"next"))
            started = await fast.next_started()
            started.give(Answer(200, [], pieces()))
            data = b""
            while not data.endswith(b"now:next"):
                chunk = await stream.receive_some(65536)
                assert chunk
                data += chunk
        streamed, _, after = data.partition(b"0\r\n\r\n")
        assert b"transfer-encoding: chunked" in streamed.lower()
        assert streamed.endswith(b"1\r\na\r\n1\r\nb\r\n1\r\nc\r\n")
        assert after.startswith(b"HTTP/1.1 201")


async def test_an_answer_bigger_than_the_socket_takes_arrives_whole() -> None:
    fast = FakeFastPath()
    body = bytes(range(256)) * (32 << 10)  # 8 MiB
    async with connected(fast) as (_front, stream, _shutdown):
        with trio.fail_after(10):
            await stream.send_all(post("/start", b"x") + post("/now", b"after"))
            started = await fast.next_started()
            started.give(Answer(200, [], body))
            big, after = await _read_answers(stream, 2)
        assert big.endswith(body)
        assert after.endswith(b"now:after")


async def test_an_answer_that_fails_to_build_is_a_500_and_the_connection_closes() -> None:
    """poll() raising runs in the task that delivered the reply: that task goes on, and the
    client gets a 500 naming the error, then the end of the connection."""
    fast = FakeFastPath()
    async with connected(fast) as (_front, stream, _shutdown):
        with trio.fail_after(5):
            await stream.send_all(post("/start", b"x"))
            started = await fast.next_started()
            started.break_with(RuntimeError("the answer could not be built"))
            data = await read_all(stream)
        assert data.startswith(b"HTTP/1.1 500")
        assert b"the answer could not be built" in data
        assert b"connection: close" in data.lower()
        assert started.cancelled
