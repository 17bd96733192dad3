"""Batches that go to an idle worker from the task that submitted them, and end in the frame
reader, without waking the worker's serving task or the batcher's task
(``WorkerSupervisor._send_now`` and ``_idle_after_batch``, ``Batcher._apply_now``).

The offer to take a full batch behind one sent this way is
``test_model_runtime.test_a_full_batch_waits_behind_the_running_one_on_the_worker`` (its
first request goes out directly)."""

from __future__ import annotations

import pytest
import trio

from trioserve.runtime.connection import WorkerConnection
from trioserve.runtime.jobs import JobState

from .fakes import FakeLauncher
from .test_model_runtime import req, result, start


class TaskSteps(trio.abc.Instrument):
    """Counts the steps of the tasks whose names end with one of ``names``."""

    def __init__(self, *names: str) -> None:
        self.names = names
        self.steps = dict.fromkeys(names, 0)

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        for name in self.names:
            if task.name.endswith(name):
                self.steps[name] += 1


async def test_one_request_at_a_time_wakes_neither_the_serving_task_nor_the_batcher() -> None:
    async with trio.open_nursery() as nursery:
        model = await start(nursery, FakeLauncher())
        assert await result(model, "warm") == b"warm"
        steps = TaskSteps("ModelVersion._run_worker", "DecisionLoop.run")
        trio.lowlevel.add_instrument(steps)
        try:
            for i in range(20):
                assert await result(model, str(i)) == str(i).encode()
        finally:
            trio.lowlevel.remove_instrument(steps)
        # Sent by the submitting task, ended by the frame reader: 0 steps, where a wake-up to
        # send each batch and one to see it end would be 40, and the batcher's 20 more.
        assert steps.steps == {"ModelVersion._run_worker": 0, "DecisionLoop.run": 0}
        assert model.workers[0].state.value == "READY"
        nursery.cancel_scope.cancel()


async def test_a_lone_request_is_written_to_the_idle_worker_before_submit_returns() -> None:
    async with trio.open_nursery() as nursery:
        model = await start(nursery, FakeLauncher())
        job = model.submit(req("now"))
        assert job.state is JobState.RUNNING  # in flight on the worker: the frame is written
        assert model.workers[0].state.value == "BUSY"
        chunks = [bytes(reply.body) async for reply, _final in job.replies()]
        assert chunks == [b"now"]
        nursery.cancel_scope.cancel()


async def test_a_frame_the_socket_takes_only_in_part_is_finished_by_the_serving_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    flushes = 0
    flush = WorkerConnection.flush

    async def counting_flush(self: WorkerConnection) -> None:
        nonlocal flushes
        flushes += 1
        await flush(self)

    monkeypatch.setattr(WorkerConnection, "flush", counting_flush)
    big = "x" * 900_000  # larger than a socket pair's buffer, smaller than max_frame
    async with trio.open_nursery() as nursery:
        model = await start(nursery, FakeLauncher())
        assert await result(model, big) == big.encode()
        assert flushes == 1
        # The connection is whole: the next frames arrive intact, in order.
        assert [await result(model, str(i)) for i in range(3)] == [b"0", b"1", b"2"]
        nursery.cancel_scope.cancel()
