"""Trio as the guest of an asyncio loop (``asyncio_host.run``) and the gRPC bridge's
crossings on that one thread (``GuestPortal``)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import outcome
import pytest
import trio

from trioserve import asyncio_host
from trioserve.grpc.guest import GuestPortal, _Inbox, hosting_loop


def test_the_host_returns_mains_result_and_raises_its_error() -> None:
    async def main(x: int) -> int:
        await trio.lowlevel.checkpoint()
        return x + 1

    async def fails() -> None:
        await trio.lowlevel.checkpoint()
        raise KeyError("from main")

    assert asyncio_host.run(main, 41) == 42
    with pytest.raises(KeyError, match="from main"):
        asyncio_host.run(fails)


async def test_plain_trio_run_has_no_hosting_loop() -> None:
    assert hosting_loop() is None


def guest_test(body: Callable[[GuestPortal], Any]) -> None:
    """Run ``body(portal)`` in Trio as a guest, with a started GuestPortal."""

    async def main() -> None:
        loop = hosting_loop()
        assert loop is not None
        async with trio.open_nursery() as nursery:
            portal: GuestPortal = await nursery.start(GuestPortal(loop).run)
            await body(portal)
            nursery.cancel_scope.cancel()

    asyncio_host.run(main)


def test_both_sides_run_the_others_functions_on_one_thread() -> None:
    threads: dict[str, int] = {}

    async def in_trio(x: int) -> int:
        trio.lowlevel.current_task()  # fails outside Trio
        threads["trio"] = threading.get_ident()
        await trio.lowlevel.checkpoint()
        return x * 2

    async def fails_in_trio() -> None:
        raise KeyError("from trio")

    async def from_asyncio(portal: GuestPortal) -> int:
        threads["asyncio"] = threading.get_ident()
        doubled = await portal.run_trio(in_trio, 21)
        with pytest.raises(KeyError, match="from trio"):
            await portal.run_trio(fails_in_trio)
        return doubled

    async def body(portal: GuestPortal) -> None:
        assert await portal.run_aio(from_asyncio(portal)) == 42

    guest_test(body)
    assert threads["trio"] == threads["asyncio"] == threading.get_ident()


def test_a_coroutine_that_does_not_suspend_runs_inline_one_that_does_as_a_task() -> None:
    tasks: list[asyncio.Task[Any] | None] = []

    async def immediate() -> str:
        tasks.append(asyncio.current_task())
        return "now"

    async def suspends(future: asyncio.Future[str]) -> str:
        tasks.append(asyncio.current_task())
        return await future

    async def fails() -> None:
        raise ValueError("inline")

    async def body(portal: GuestPortal) -> None:
        assert await portal.run_aio(immediate()) == "now"
        with pytest.raises(ValueError, match="inline"):
            await portal.run_aio(fails())
        future = portal.loop.create_future()
        portal.loop.call_later(0.01, future.set_result, "later")
        assert await portal.run_aio(suspends(future)) == "later"

    guest_test(body)
    assert tasks[0] is None  # no task: run in the caller's Trio callback
    assert tasks[1] is None  # started inline too, then finished by a task the portal made


def test_cancelling_the_asyncio_caller_cancels_the_trio_task() -> None:
    events: list[str] = []

    async def runs_long(started: trio.Event) -> None:
        started.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            events.append("trio task cancelled")
            raise

    async def body(portal: GuestPortal) -> None:
        started = trio.Event()
        task = portal.loop.create_task(portal.run_trio(runs_long, started))
        await started.wait()
        task.cancel()
        while "trio task cancelled" not in events:
            await trio.sleep(0.01)
        await trio.sleep(0.01)
        assert task.cancelled()

    guest_test(body)


def test_a_trio_cancellation_cancels_the_suspended_coroutine() -> None:
    events: list[str] = []

    async def waits_forever() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            events.append("coroutine cancelled")
            raise

    async def body(portal: GuestPortal) -> None:
        with trio.move_on_after(0.05):
            await portal.run_aio(waits_forever())
        for _ in range(100):
            if events:
                break
            await trio.sleep(0.01)

    guest_test(body)
    assert events == ["coroutine cancelled"]


def test_started_work_settles_without_a_task_and_is_cancelled_with_its_caller() -> None:
    log: list[str] = []

    def start(x: int, settle: Callable[[outcome.Outcome[Any]], None]) -> Callable[[], None]:
        log.append(f"started {x}")
        trio.lowlevel.current_trio_token()  # in Trio
        if x == 1:
            settle(outcome.Value(x * 10))
        if x == 2:
            raise LookupError("refused")
        return lambda: log.append(f"cancelled {x}")

    async def body(portal: GuestPortal) -> None:
        assert await portal.run_aio(portal.start_trio(start, 1)) == 10
        with pytest.raises(LookupError, match="refused"):
            await portal.run_aio(portal.start_trio(start, 2))
        task = portal.loop.create_task(portal.start_trio(start, 3))
        while "started 3" not in log:
            await trio.sleep(0.01)
        task.cancel()
        while "cancelled 3" not in log:
            await trio.sleep(0.01)

    guest_test(body)
    assert log == ["started 1", "started 2", "started 3", "cancelled 3"]


def test_the_inbox_wakes_trio_once_per_burst_and_runs_calls_in_order() -> None:
    class Token:
        def __init__(self) -> None:
            self.wakes: list[Callable[[], None]] = []

        def run_sync_soon(self, fn: Callable[[], None]) -> None:
            self.wakes.append(fn)

    token = Token()
    inbox = _Inbox(token)  # type: ignore[arg-type]
    ran: list[int] = []
    for i in range(3):
        inbox.post(ran.append, i)
    assert len(token.wakes) == 1 and ran == []
    token.wakes.pop()()
    assert ran == [0, 1, 2]
    inbox.post(ran.append, 3)  # a new burst: a new wake-up
    assert len(token.wakes) == 1
    token.wakes.pop()()
    assert ran == [0, 1, 2, 3]
