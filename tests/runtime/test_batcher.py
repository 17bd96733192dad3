"""The batcher's trio side: what it assigns without its own task running."""

from __future__ import annotations

import pytest
import trio

from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.messages import Param
from trioserve.core.request import InferenceRequest
from trioserve.runtime.batcher import Batcher
from trioserve.runtime.jobs import Job


class Taker:
    def __init__(self) -> None:
        self.batches: list[list[Job]] = []

    def assign(self, batch: list[Job]) -> None:
        self.batches.append(batch)


def job(text: str) -> Job:
    return Job(InferenceRequest(model="m", version=None, params=[Param("body", text.encode())]))


def full() -> ServeError:
    return ServeError(ErrorKind.UNAVAILABLE, "full")


async def busy_worker(batcher: Batcher) -> Taker:
    """A worker running a one-job batch; the batcher's task is stopped again."""
    worker = Taker()
    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.run)
        batcher.worker_idle(worker)
        batcher.put(job("first"), full)
        with trio.fail_after(5):
            while not worker.batches:
                await trio.sleep(0.001)
        nursery.cancel_scope.cancel()
    worker.batches.clear()
    return worker


async def test_an_offer_behind_takes_a_full_batch_before_returning() -> None:
    batcher = Batcher(batch_size=2, max_delay=10.0, capacity=10)
    worker = await busy_worker(batcher)
    # The batcher's task is not running: the assignment happens inside the call.
    jobs = [job(str(i)) for i in range(3)]
    for item in jobs:
        batcher.put(item, full)
    batcher.offer_behind_now(worker)
    assert worker.batches == [jobs[:2]]
    assert len(batcher) == 1


async def test_an_offer_behind_leaves_a_partial_batch_queued_and_the_offer_standing() -> None:
    batcher = Batcher(batch_size=2, max_delay=10.0, capacity=10)
    worker = await busy_worker(batcher)
    first, second = job("a"), job("b")
    batcher.put(first, full)
    batcher.offer_behind_now(worker)
    assert worker.batches == []  # one item is not a full batch: it waits to grow
    assert len(batcher) == 1
    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.run)
        batcher.put(second, full)
        with trio.fail_after(5):
            while not worker.batches:
                await trio.sleep(0.001)
        # The standing offer took the batch once it was full, window or not.
        assert worker.batches == [[first, second]]
        nursery.cancel_scope.cancel()


async def test_a_request_queued_longer_than_the_queue_timeout_fails_unrun() -> None:
    # clientTimeoutInMills: TorchServe drops such requests silently; here the client is told.
    batcher = Batcher(batch_size=1, max_delay=0.0, capacity=10, queue_timeout=0.2)
    worker = await busy_worker(batcher)  # busy: nothing is dispatched
    waiting = job("late")
    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.run)
        batcher.put(waiting, full)
        started = trio.current_time()
        with trio.fail_after(5), pytest.raises(ServeError, match="clientTimeoutInMills") as info:
            await waiting.next_reply()
        assert info.value.kind is ErrorKind.TIMEOUT
        assert trio.current_time() - started >= 0.19
        nursery.cancel_scope.cancel()
    assert worker.batches == [] and len(batcher) == 0
