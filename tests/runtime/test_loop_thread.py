"""The asyncio loop thread the gRPC bridge runs grpclib on, and its crossings into Trio."""

from __future__ import annotations

import asyncio
import threading

import pytest
import trio

from trioserve.grpc.loop_thread import THREAD_NAME, LoopThread


def _loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


async def test_each_side_runs_the_other_sides_functions_and_gets_results_and_errors() -> None:
    seen: dict[str, str] = {}

    async def in_trio(x: int) -> int:
        trio.lowlevel.current_task()  # fails outside Trio
        seen["trio"] = threading.current_thread().name
        await trio.lowlevel.checkpoint()
        return x * 2

    async def fails_in_trio() -> None:
        raise KeyError("from trio")

    async def from_asyncio(portal: LoopThread) -> int:
        seen["asyncio"] = threading.current_thread().name
        doubled = await portal.run_trio(in_trio, 21)
        with pytest.raises(KeyError, match="from trio"):
            await portal.run_trio(fails_in_trio)
        return doubled

    async with trio.open_nursery() as nursery:
        portal: LoopThread = await nursery.start(LoopThread().run)
        assert await portal.run_aio(from_asyncio(portal)) == 42

        async def fails_in_asyncio() -> None:
            asyncio.get_running_loop()
            raise ValueError("from asyncio")

        with pytest.raises(ValueError, match="from asyncio"):
            await portal.run_aio(fails_in_asyncio())
        portal.stop()
    assert seen == {"asyncio": THREAD_NAME, "trio": threading.current_thread().name}
    assert _loop_threads() == []  # joined when the nursery ended


async def test_cancelling_the_asyncio_caller_cancels_the_trio_task() -> None:
    started, finished = trio.Event(), trio.Event()
    outcome: list[str] = []

    async def runs_long() -> None:
        started.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            outcome.append("cancelled")
            raise
        finally:
            finished.set()

    async def caller(portal: LoopThread) -> str:
        task = asyncio.ensure_future(portal.run_trio(runs_long))
        while not started.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return "caller cancelled"
        return "not cancelled"

    async with trio.open_nursery() as nursery:
        portal: LoopThread = await nursery.start(LoopThread().run)
        assert await portal.run_aio(caller(portal)) == "caller cancelled"
        with trio.fail_after(5):
            await finished.wait()
        portal.stop()
    assert outcome == ["cancelled"]


async def test_a_trio_cancellation_cancels_the_coroutine_on_the_loop() -> None:
    cancelled = threading.Event()
    running = threading.Event()

    async def sleeps() -> None:
        running.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with trio.open_nursery() as nursery:
        portal: LoopThread = await nursery.start(LoopThread().run)
        with trio.move_on_after(0.2) as waited:
            await portal.run_aio(sleeps())
        assert waited.cancelled_caught
        assert running.is_set()
        assert await trio.to_thread.run_sync(cancelled.wait, 5)
        portal.stop()


async def test_an_outer_cancellation_waits_for_stop() -> None:
    """The bridge closes its servers through the loop after its nursery is cancelled, so the
    portal runs on until told to stop."""
    portal = LoopThread()
    async with trio.open_nursery() as nursery:
        await nursery.start(portal.run)
        nursery.cancel_scope.cancel()
        with trio.CancelScope(shield=True):
            assert await portal.run_aio(asyncio.sleep(0, "still here")) == "still here"
            portal.stop()
    assert portal.loop.is_closed()


async def test_a_call_from_the_loop_after_the_trio_side_stopped_is_refused() -> None:
    portal = LoopThread()
    async with trio.open_nursery() as nursery:
        await nursery.start(portal.run)
        loop = portal.loop
        portal.stop()
    assert loop.is_closed()

    async def nothing() -> None:
        pass

    def call_from_another_loop() -> None:
        other = asyncio.SelectorEventLoop()
        try:
            other.run_until_complete(portal.run_trio(nothing))
        finally:
            other.close()

    with pytest.raises(RuntimeError, match="the Trio side has stopped"):
        await trio.to_thread.run_sync(call_from_another_loop)
