"""Parked: one task waiting for one wake-up, without a trio.Event."""

from __future__ import annotations

import math

import trio
import trio.testing

from trioserve.runtime.parking import Parked, wait_until


async def test_set_wakes_the_parked_task() -> None:
    woke: list[str] = []
    holder: list[Parked] = []

    async def waiter() -> None:
        parked = Parked()
        holder.append(parked)
        await parked.wait()
        woke.append("woke")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert woke == []
        holder[0].set()
        holder[0].set()  # a second set does nothing (the task is no longer parked on it)
    assert woke == ["woke"]


async def test_a_cancelled_wait_is_abandoned_and_a_later_set_does_nothing() -> None:
    holder: list[Parked] = []

    async def waiter() -> None:
        parked = Parked()
        holder.append(parked)
        await parked.wait()

    with trio.move_on_after(0.01) as scope:
        await waiter()
    assert scope.cancelled_caught
    holder[0].set()  # would reschedule a task that is not parked, were it not abandoned
    await trio.lowlevel.checkpoint()  # the run goes on: nothing was rescheduled


async def test_wait_until_says_whether_the_event_came_before_the_deadline() -> None:
    event = trio.Event()
    assert not await wait_until(event, trio.current_time() + 0.01)
    event.set()
    assert await wait_until(event, trio.current_time() + 0.01)
    assert await wait_until(event, math.inf)
