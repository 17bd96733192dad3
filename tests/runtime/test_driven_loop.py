"""The default gRPC portal: grpclib's asyncio loop stepped by a Trio task, on Trio's thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import outcome
import pytest
import trio

from trioserve.grpc.driven import Corked, DrivenLoop, drivable


async def with_driven(body: Callable[[DrivenLoop], Awaitable[None]]) -> DrivenLoop:
    """Run ``body(portal)`` with a started DrivenLoop; returns the portal once it stopped."""
    async with trio.open_nursery() as nursery:
        portal: DrivenLoop = await nursery.start(DrivenLoop().run)
        with trio.fail_after(10):
            await body(portal)
        portal.stop()
    return portal


async def spawn(portal: DrivenLoop, coro: Any) -> asyncio.Task[Any]:
    """An asyncio task started from Trio the way Trio code must: through ``run_aio`` (which
    wakes the driver for it)."""

    async def create() -> asyncio.Task[Any]:
        return asyncio.ensure_future(coro)

    return await portal.run_aio(create())


async def cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()


def test_this_python_can_drive_the_loop() -> None:
    assert drivable()


async def test_both_sides_run_the_others_functions_on_trios_thread() -> None:
    threads: dict[str, int] = {}

    async def in_trio(x: int) -> int:
        trio.lowlevel.current_task()  # fails outside Trio
        threads["trio"] = threading.get_ident()
        await trio.lowlevel.checkpoint()
        return x * 2

    async def fails_in_trio() -> None:
        raise KeyError("from trio")

    async def from_asyncio(portal: DrivenLoop) -> int:
        asyncio.get_running_loop()  # fails outside asyncio
        threads["asyncio"] = threading.get_ident()
        await asyncio.sleep(0.01)  # a timer: the driver waits for it
        doubled = await portal.run_trio(in_trio, 21)
        with pytest.raises(KeyError, match="from trio"):
            await portal.run_trio(fails_in_trio)
        return doubled

    async def body(portal: DrivenLoop) -> None:
        assert await portal.run_aio(from_asyncio(portal)) == 42

    portal = await with_driven(body)
    assert threads["trio"] == threads["asyncio"] == threading.get_ident()
    assert portal.loop.is_closed()


async def test_a_coroutine_that_does_not_suspend_runs_inline_one_that_does_as_a_task() -> None:
    tasks: list[asyncio.Task[Any] | None] = []

    async def immediate() -> str:
        tasks.append(asyncio.current_task())
        return "now"

    async def suspends(future: asyncio.Future[str]) -> str:
        tasks.append(asyncio.current_task())
        return await future

    async def fails() -> None:
        raise ValueError("inline")

    async def body(portal: DrivenLoop) -> None:
        assert await portal.run_aio(immediate()) == "now"
        with pytest.raises(ValueError, match="inline"):
            await portal.run_aio(fails())
        future = portal.loop.create_future()
        portal.loop.call_later(0.01, future.set_result, "later")
        assert await portal.run_aio(suspends(future)) == "later"

    await with_driven(body)
    assert tasks == [None, None]  # both started inline; the second was finished by a task


async def test_cancelling_the_asyncio_caller_cancels_the_trio_task() -> None:
    events: list[str] = []

    async def runs_long(started: trio.Event) -> None:
        started.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            events.append("trio task cancelled")
            raise

    async def body(portal: DrivenLoop) -> None:
        started = trio.Event()
        task = await spawn(portal, portal.run_trio(runs_long, started))
        await started.wait()
        await portal.run_aio(cancel(task))
        while not task.done() or not events:
            await trio.sleep(0.01)
        assert task.cancelled()

    await with_driven(body)
    assert events == ["trio task cancelled"]


async def test_a_trio_cancellation_cancels_the_suspended_coroutine() -> None:
    events: list[str] = []

    async def waits_forever() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            events.append("coroutine cancelled")
            raise

    async def body(portal: DrivenLoop) -> None:
        with trio.move_on_after(0.05):
            await portal.run_aio(waits_forever())
        while not events:
            await trio.sleep(0.01)

    await with_driven(body)
    assert events == ["coroutine cancelled"]


async def test_started_work_runs_right_away_and_is_cancelled_with_its_caller() -> None:
    log: list[str] = []

    def start(x: int, settle: Callable[[outcome.Outcome[Any]], None]) -> Callable[[], None]:
        log.append(f"started {x}")
        trio.lowlevel.current_task()  # Trio code: inside the driver
        if x == 1:
            settle(outcome.Value(x * 10))
        if x == 2:
            raise LookupError("refused")
        return lambda: log.append(f"cancelled {x}")

    async def body(portal: DrivenLoop) -> None:
        assert await portal.run_aio(portal.start_trio(start, 1)) == 10
        with pytest.raises(LookupError, match="refused"):
            await portal.run_aio(portal.start_trio(start, 2))
        task = await spawn(portal, portal.start_trio(start, 3))
        while "started 3" not in log:
            await trio.sleep(0.01)
        await portal.run_aio(cancel(task))
        while "cancelled 3" not in log:
            await trio.sleep(0.01)

    await with_driven(body)
    assert log == ["started 1", "started 2", "started 3", "cancelled 3"]


async def test_a_settle_from_another_trio_task_wakes_the_parked_driver() -> None:
    """The reply comes from a Trio task while the loop has nothing to do: the driver waits
    on the selector and must be woken to resume the asyncio caller."""
    release = trio.Event()

    async def later() -> str:
        await release.wait()
        return "done"

    async def body(portal: DrivenLoop) -> None:
        task = await spawn(portal, portal.run_trio(later))
        await trio.sleep(0.05)  # the driver parks: nothing is ready on the loop
        release.set()
        while not task.done():
            await trio.sleep(0.01)
        assert task.result() == "done"

    await with_driven(body)


async def test_a_settle_wakes_the_driver_parked_until_a_timer_too() -> None:
    """With an asyncio timer due later, the driver waits for the selector or the timer (a
    cancel scope with a deadline); a reply from Trio must still wake it at once."""
    release = trio.Event()

    async def later() -> str:
        await release.wait()
        return "done"

    async def body(portal: DrivenLoop) -> None:
        timer = portal.loop.call_later(60, lambda: None)
        task = await spawn(portal, portal.run_trio(later))
        await trio.sleep(0.05)  # the driver parks until the timer or the selector
        with trio.fail_after(5):
            release.set()
            while not task.done():
                await trio.sleep(0.01)
        assert task.result() == "done"
        timer.cancel()

    await with_driven(body)


async def test_a_callback_from_another_thread_wakes_the_parked_driver() -> None:
    got: list[str] = []

    async def body(portal: DrivenLoop) -> None:
        def from_thread() -> None:
            portal.loop.call_soon_threadsafe(got.append, "called")

        await trio.sleep(0.05)
        await trio.to_thread.run_sync(from_thread)
        while not got:
            await trio.sleep(0.01)

    await with_driven(body)
    assert got == ["called"]


async def test_an_outer_cancellation_waits_for_stop() -> None:
    """The bridge closes its servers through the loop after its nursery is cancelled, so the
    portal runs on until told to stop."""
    portal = DrivenLoop()
    async with trio.open_nursery() as nursery:
        await nursery.start(portal.run)
        nursery.cancel_scope.cancel()
        with trio.CancelScope(shield=True):
            assert await portal.run_aio(sleeps_then("still here")) == "still here"
            portal.stop()
    assert portal.loop.is_closed()


async def sleeps_then(value: str) -> str:
    await asyncio.sleep(0.01)
    return value


async def test_works_with_trio_asyncio_imported() -> None:
    """trio-asyncio (which a client in the same process may use) patches how asyncio finds
    the running loop inside Trio; grpclib's calls of it must still find the driven loop."""
    import trio_asyncio  # type: ignore[import-untyped]  # noqa: F401  (patches asyncio)

    async def running_loop() -> asyncio.AbstractEventLoop:
        await asyncio.sleep(0)
        return asyncio.get_running_loop()

    async def body(portal: DrivenLoop) -> None:
        assert await portal.run_aio(running_loop()) is portal.loop

    await with_driven(body)


class FakeTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def get_write_buffer_size(self) -> int:
        return 0

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


async def test_writes_during_an_iteration_go_out_together_in_order() -> None:
    real = FakeTransport()

    async def body(portal: DrivenLoop) -> None:
        corked = portal.corked(real)

        async def three_frames() -> None:
            corked.write(b"headers;")
            corked.write(b"")  # nothing: no write of its own
            corked.writelines([b"message;", b"trailers"])
            assert real.writes == []  # held while the coroutine runs
            assert corked.get_write_buffer_size() == len(b"headers;message;trailers")

        await portal.run_aio(three_frames())
        assert real.writes == [b"headers;message;trailers"]  # one write, at the end

        def later() -> None:
            corked.write(b"a")
            corked.write(b"b")

        async def from_a_callback() -> None:
            asyncio.get_running_loop().call_soon(later)
            await asyncio.sleep(0.01)

        await portal.run_aio(from_a_callback())
        assert real.writes[1:] == [b"ab"]  # flushed at the end of the loop's iteration
        assert corked.get_extra_info("peername") == "info:peername"  # the rest passes through

        async def closes() -> None:
            corked.write(b"last")
            corked.close()

        await portal.run_aio(closes())
        assert real.writes[-1] == b"last" and real.closed  # written before the close

    await with_driven(body)


def test_an_aborted_transport_drops_what_waits() -> None:
    real = FakeTransport()
    dirty: list[Corked] = []
    corked = Corked(real, dirty)
    corked.write(b"never")
    assert dirty == [corked]
    corked.abort()
    corked.flush()
    assert real.writes == [] and real.aborted
