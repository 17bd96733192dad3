"""The worker's frame loop, in-process over a trio memory stream (fast; no subprocess)."""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import NoReturn

import pytest
import trio
import trio.testing

from trioserve.core.frames import Frame, FrameDecoder, Kind, encode
from trioserve.core.messages import (
    BatchReply,
    LoadSpec,
    Param,
    WorkItem,
    decode_reply,
    encode_batch,
    encode_cancel,
    encode_load,
)
from trioserve.worker.loop import WorkerLoop
from trioserve.worker.torchserve import ts_shim

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "worker"


class Exited(Exception):
    def __init__(self, status: int, why: str) -> None:
        super().__init__(status, why)
        self.status = status
        self.why = why


def fake_exit(status: int, why: str) -> NoReturn:
    raise Exited(status, why)


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(sys, "path", list(sys.path))
    had_shim = ts_shim.installed()
    yield
    for name in ("fx_echo", "fx_stream", "fx_bad_init"):
        sys.modules.pop(name, None)
    if not had_shim:
        ts_shim.uninstall()


class Session:
    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder()
        self.frames: deque[Frame] = deque()
        self.status: int | None = None
        self.exited: Exited | None = None
        self.done = trio.Event()

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def recv(self) -> Frame:
        with trio.fail_after(10):
            while not self.frames:
                data = await self.stream.receive_some(1 << 16)
                assert data, "the worker closed the stream"
                self.frames.extend(self.decoder.feed(data))
        return self.frames.popleft()

    async def reply(self) -> BatchReply:
        frame = await self.recv()
        assert frame.kind is Kind.RESPONSE, frame
        return decode_reply(frame)

    async def load(self, handler: str) -> Frame:
        spec = LoadSpec("m", "1.0", str(FIXTURES), str(FIXTURES / handler), batch_size=4)
        await self.send(encode_load(spec))
        frame = await self.recv()
        assert frame.kind is Kind.LOAD_RESULT
        return frame

    async def finished(self) -> None:
        with trio.fail_after(10):
            await self.done.wait()


@asynccontextmanager
async def worker_session() -> AsyncIterator[Session]:
    client, server = trio.testing.memory_stream_pair()
    session = Session(client)

    async def run() -> None:
        try:
            session.status = await WorkerLoop(server, exit_fn=fake_exit).run()
        except* Exited as group:
            first = group.exceptions[0]
            assert isinstance(first, Exited)
            session.exited = first
        finally:
            session.done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        try:
            yield session
        finally:
            nursery.cancel_scope.cancel()


def batch(batch_id: int, mode: str | None = None, n: int = 1, **headers: str) -> bytes:
    hdrs = [("mode", mode)] if mode else []
    hdrs += list(headers.items())
    items = [
        WorkItem(f"b{batch_id}-r{i}", hdrs, [Param("body", b"%d" % i, "application/json")])
        for i in range(n)
    ]
    return encode_batch(batch_id, items)


async def test_load_batch_ping_shutdown() -> None:
    async with worker_session() as s:
        assert (await s.load("fx_echo.py")).meta == {"code": 200, "message": "loaded"}
        await s.send(batch(1, n=2))
        reply = await s.reply()
        assert (reply.batch_id, reply.code, reply.final, len(reply.replies)) == (1, 200, True, 2)
        metrics = await s.recv()
        assert metrics.kind is Kind.METRICS
        assert {m["name"] for m in metrics.meta["metrics"]} == {"EchoCount", "PredictionTime"}
        await s.send(encode(Kind.PING, {"n": 42}))
        pong = await s.recv()
        assert (pong.kind, pong.meta) == (Kind.PONG, {"n": 42})
        await s.send(encode(Kind.SHUTDOWN, {}))
        await s.finished()
        assert (s.status, s.exited) == (0, None)


async def test_batches_queue_in_order_and_ping_is_answered_while_busy() -> None:
    async with worker_session() as s:
        await s.load("fx_echo.py")
        await s.send(batch(1, "sleep", seconds="0.3"))
        await s.send(batch(2))
        await s.send(encode(Kind.PING, {"n": 1}))
        assert (await s.recv()).kind is Kind.PONG  # before the sleeping batch finishes
        first = await s.reply()
        assert (first.batch_id, bytes(first.replies[0].body)) == (1, b"slept")
        assert (await s.recv()).kind is Kind.METRICS
        assert (await s.reply()).batch_id == 2


async def test_cancel_is_seen_by_the_handler() -> None:
    async with worker_session() as s:
        await s.load("fx_stream.py")
        await s.send(batch(1, "cancel", n=2))
        started = await s.reply()
        assert not started.final
        await s.send(encode_cancel(["b1-r0", "unknown-id"]))
        final = await s.reply()
        assert final.final
        assert [bytes(r.body) for r in final.replies] == [b"cancelled", b"cancelled"]


async def test_batch_after_shutdown_is_refused_and_current_one_finishes() -> None:
    async with worker_session() as s:
        await s.load("fx_echo.py")
        await s.send(batch(1, "sleep", seconds="0.3"))
        await s.send(encode(Kind.SHUTDOWN, {}))
        await s.send(batch(2))
        refused = await s.reply()
        assert (refused.batch_id, refused.code, refused.message) == (
            2,
            503,
            "the worker is shutting down",
        )
        done = await s.reply()
        assert (done.batch_id, done.code) == (1, 200)
        await s.finished()
        assert s.status == 0


async def test_end_of_stream_exits_at_once() -> None:
    async with worker_session() as s:
        await s.load("fx_echo.py")
        await s.stream.aclose()
        await s.finished()
        assert s.exited is not None
        assert s.exited.status == 0


async def test_failed_load_ends_with_status_1() -> None:
    async with worker_session() as s:
        result = await s.load("fx_bad_init.py")
        assert result.meta["code"] == 500
        assert "RuntimeError: boom at load" in result.meta["message"]
        await s.finished()
        assert s.status == 1


async def test_batch_before_load_is_refused() -> None:
    async with worker_session() as s:
        await s.send(batch(7))
        reply = await s.reply()
        assert (reply.batch_id, reply.code) == (7, 503)
        assert "no model is loaded" in reply.message


async def test_malformed_stream_exits_with_status_1() -> None:
    async with worker_session() as s:
        await s.send(b"\x00\x00\x00\x08" + b"\xff" * 8)
        await s.finished()
        assert s.exited is not None
        assert s.exited.status == 1


async def test_worker_only_frames_are_ignored() -> None:
    async with worker_session() as s:
        await s.send(encode(Kind.PONG, {"n": 1}))
        await s.send(encode(Kind.PING, {"n": 2}))
        assert (await s.recv()).meta == {"n": 2}
