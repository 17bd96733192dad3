"""Continuous batching against fake workers: a batch is a step of a running batch, requests
answered "more to come" go on in the next step (without their parameters), new requests
fill the free slots at once, a client leaving takes its request out, stopping drains."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import trio

from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.messages import BatchReply, LoadSpec, Param, Reply, WorkItem
from trioserve.core.model_settings import ModelSettings, SequenceSettings
from trioserve.core.request import InferenceRequest
from trioserve.runtime.dataplane import Call, Dataplane
from trioserve.runtime.model import ModelVersion, PoolSettings
from trioserve.runtime.supervisor import WorkerSettings

from .fakes import FakeLauncher, FakeProcess, OneModelManager


class Stepper:
    """A fake continuous-batching worker. A new request's body is how many answers it wants;
    each step answers every request of the batch with its step number, "more to come"
    (``ts_stream_next: true``) until its last. It records every step's (request id, whether
    it came with parameters)."""

    def __init__(self, step_seconds: float = 0.02) -> None:
        self.left: dict[str, int] = {}
        self.done: dict[str, int] = {}
        self.steps: list[list[tuple[str, bool]]] = []
        self.step_seconds = step_seconds
        self.crash_at_step: int | None = None
        self.proc: FakeProcess | None = None  # the last worker that ran a step

    async def __call__(self, proc: FakeProcess, batch_id: int, items: list[WorkItem]) -> None:
        self.proc = proc
        self.steps.append([(item.request_id, bool(item.params)) for item in items])
        if self.crash_at_step == len(self.steps):
            proc.exit(-9)
            return
        await trio.sleep(self.step_seconds)
        replies = []
        for item in items:
            if item.params:
                self.left[item.request_id] = int(bytes(item.params[0].value))
            self.left[item.request_id] -= 1
            self.done[item.request_id] = self.done.get(item.request_id, 0) + 1
            more = self.left[item.request_id] > 0
            headers = {"ts_stream_next": "true" if more else "false", "x-seq": dict(
                item.headers).get("ts_request_sequence_id", "")}  # fmt: skip
            body = str(self.done[item.request_id]).encode()
            replies.append(Reply(item.request_id, body, headers=headers))
        await proc.send_reply(BatchReply(batch_id, 200, "", replies, True))

    def steps_of(self, request_id: str) -> list[int]:
        return [n for n, step in enumerate(self.steps) if any(r == request_id for r, _ in step)]


def model(
    launcher: FakeLauncher, *, batch_size: int = 4, workers: int = 1, stateful: bool = False
) -> ModelVersion:
    sequence = SequenceSettings(max_idle_msec=300, timeout_msec=0, max_queue=10, max_sequences=8)
    settings = ModelSettings(
        name="m", version="1.0", url="m.mar", handler="h.py", runtime="python",
        batch_size=batch_size, max_batch_delay=10_000, min_workers=workers,
        max_workers=workers, response_timeout=30, startup_timeout=5, job_queue_size=20,
        loaded_at_startup=False, sequence=sequence if stateful else None,
        continuous_batching=True,
    )  # fmt: skip
    ids = itertools.count(9000)
    pool = PoolSettings(
        worker=WorkerSettings(
            load=LoadSpec("m", "1.0", "/nonexistent", "h.py"), cwd=Path("/"),
            response_timeout=30, startup_timeout=5, stop_grace=0.5, max_frame=1 << 20,
            batch_capacity=settings.batch_capacity, continuous=True,
        ),
        next_worker_id=lambda: next(ids),
    )  # fmt: skip
    return ModelVersion(settings, pool, launcher)


async def started(
    nursery: trio.Nursery, stepper: Stepper, **kwargs: int | bool
) -> tuple[Dataplane, ModelVersion]:
    version = model(FakeLauncher(behaviour=stepper), **kwargs)  # type: ignore[arg-type]
    await nursery.start(version.run)
    await version.scale(version.min_workers, version.max_workers)
    await version.wait_settled()
    return Dataplane(OneModelManager(version)), version  # type: ignore[arg-type]


def submit(dataplane: Dataplane, steps: int, sequence_id: str | None = None) -> Call:
    request = InferenceRequest("m", None, [Param("data", str(steps).encode())])
    request.sequence_id = sequence_id
    return dataplane.submit(request)


async def answers(call: Call) -> list[tuple[str, bool, dict[str, str]]]:
    async with call:
        return [(bytes(r.body).decode(), final, r.headers) async for r, final in call.replies()]


async def test_a_request_answered_more_to_come_goes_on_in_the_next_step() -> None:
    stepper = Stepper()
    async with trio.open_nursery() as nursery:
        dataplane, _ = await started(nursery, stepper)
        call = submit(dataplane, 3)
        got = await answers(call)
        assert [a[:2] for a in got] == [("1", False), ("2", False), ("3", True)]
        assert all("ts_stream_next" not in headers for _, _, headers in got)
        # Three steps of one request: its parameters only in the first.
        rid = call.request_id
        assert stepper.steps == [[(rid, True)], [(rid, False)], [(rid, False)]]
        nursery.cancel_scope.cancel()


async def test_new_requests_join_the_running_batch_without_waiting_for_the_window() -> None:
    stepper = Stepper()
    async with trio.open_nursery() as nursery:
        dataplane, _ = await started(nursery, stepper)  # maxBatchDelay 10 s
        with trio.fail_after(2):
            first = submit(dataplane, 5)
            async with first:
                await first.next_reply()
                second = submit(dataplane, 1)
                assert [a[:2] for a in await answers(second)] == [("1", True)]
                rest = [bytes(r.body).decode() async for r, _final in first.replies()]
        assert rest == ["2", "3", "4", "5"]
        joined = stepper.steps_of(second.request_id)
        assert len(joined) == 1
        assert sorted(stepper.steps[joined[0]]) == sorted(
            [(first.request_id, False), (second.request_id, True)]
        )
        nursery.cancel_scope.cancel()


async def test_a_step_never_exceeds_the_batch_size() -> None:
    stepper = Stepper()
    async with trio.open_nursery() as nursery:
        dataplane, _ = await started(nursery, stepper, batch_size=2)
        calls = [submit(dataplane, 3) for _ in range(5)]
        async with trio.open_nursery() as clients:
            for call in calls:
                clients.start_soon(answers, call)
        assert max(len(step) for step in stepper.steps) == 2
        assert all(len(stepper.steps_of(call.request_id)) == 3 for call in calls)
        # Arrival order holds: each request started no later than those after it.
        firsts = [stepper.steps_of(call.request_id)[0] for call in calls]
        assert firsts == sorted(firsts)
        nursery.cancel_scope.cancel()


async def test_a_client_leaving_takes_its_request_out_of_the_running_batch() -> None:
    stepper = Stepper(step_seconds=0.05)
    async with trio.open_nursery() as nursery:
        dataplane, _ = await started(nursery, stepper)
        leaving, staying = submit(dataplane, 50), submit(dataplane, 6)
        async with leaving:
            await leaving.next_reply()
        # Gone from the steps after the next at the latest (that one may be in flight).
        assert [a[0] for a in await answers(staying)] == ["1", "2", "3", "4", "5", "6"]
        assert len(stepper.steps_of(leaving.request_id)) <= 3
        assert stepper.proc is not None and leaving.request_id in stepper.proc.cancelled
        nursery.cancel_scope.cancel()


async def test_a_worker_crash_mid_stream_fails_the_running_batch() -> None:
    stepper = Stepper()
    stepper.crash_at_step = 2
    async with trio.open_nursery() as nursery:
        dataplane, _ = await started(nursery, stepper)
        call = submit(dataplane, 3)
        async with call:
            first, final = await call.next_reply()
            assert (bytes(first.body), final) == (b"1", False)
            with pytest.raises(ServeError) as failed:
                await call.next_reply()
        assert failed.value.kind in (ErrorKind.WORKER_FAILED, ErrorKind.OUT_OF_MEMORY)
        nursery.cancel_scope.cancel()


async def test_stopping_a_worker_drains_its_running_streams_and_takes_nothing_new() -> None:
    stepper = Stepper()
    async with trio.open_nursery() as nursery:
        dataplane, version = await started(nursery, stepper)
        running = submit(dataplane, 4)
        async with running:
            await running.next_reply()
            waiting = submit(dataplane, 1)
            version.workers[0].request_stop()
            rest = [bytes(r.body).decode() async for r, _final in running.replies()]
        assert rest == ["2", "3", "4"]
        assert stepper.steps_of(waiting.request_id) == []  # left in the queue
        waiting.cancel()
        nursery.cancel_scope.cancel()


async def test_a_parked_sequence_sends_its_next_request_into_the_running_batch() -> None:
    stepper = Stepper()
    async with trio.open_nursery() as nursery:
        dataplane, _ = await started(nursery, stepper, stateful=True, workers=2)
        streaming = submit(dataplane, 4)
        async with streaming:
            await streaming.next_reply()
            assert streaming.sequence_id is not None
            following = submit(dataplane, 1, streaming.sequence_id)
            assert [a[:2] for a in await answers(following)] == [("1", True)]
            rest = [bytes(r.body).decode() async for r, _final in streaming.replies()]
        assert rest == ["2", "3", "4"]
        step = stepper.steps[stepper.steps_of(following.request_id)[0]]
        assert (streaming.request_id, False) in step  # same worker, same running batch
        # Not idle while it streamed (idle limit 300 ms): the sequence is still open.
        await trio.sleep(0.1)
        again = submit(dataplane, 1, streaming.sequence_id)
        assert [a[:2] for a in await answers(again)] == [("1", True)]
        nursery.cancel_scope.cancel()


async def test_with_batch_size_1_a_sequences_next_request_joins_its_running_stream() -> None:
    # TorchServe's example test config: batchSize 1, two workers. A step holds up to twice
    # batchSize requests, so the sequence's next request (the example's -1 cancel) runs
    # beside its stream instead of waiting for the stream's end.
    stepper = Stepper()
    async with trio.open_nursery() as nursery:
        dataplane, _ = await started(nursery, stepper, stateful=True, workers=2, batch_size=1)
        streaming = submit(dataplane, 20)
        async with streaming:
            await streaming.next_reply()
            assert streaming.sequence_id is not None
            following = submit(dataplane, 1, streaming.sequence_id)
            with trio.fail_after(5):
                assert [a[:2] for a in await answers(following)] == [("1", True)]
            # Answered while the stream still ran: it has answers left to give.
            rest = [bytes(r.body).decode() async for r, _final in streaming.replies()]
        assert rest == [str(n) for n in range(2, 21)]
        [joined] = stepper.steps_of(following.request_id)
        assert sorted(stepper.steps[joined]) == sorted(
            [(streaming.request_id, False), (following.request_id, True)]
        )
        assert joined < stepper.steps_of(streaming.request_id)[-1]
        nursery.cancel_scope.cancel()


async def test_a_sequence_step_holds_twice_the_batch_size_and_a_plain_one_the_batch_size() -> None:
    for stateful, most in ((True, 2), (False, 1)):
        stepper = Stepper()
        async with trio.open_nursery() as nursery:
            dataplane, _ = await started(nursery, stepper, stateful=stateful, batch_size=1)
            calls = [submit(dataplane, 3) for _ in range(4)]
            async with trio.open_nursery() as clients:
                for call in calls:
                    clients.start_soon(answers, call)
            assert max(len(step) for step in stepper.steps) == most
            assert all(len(stepper.steps_of(call.request_id)) == 3 for call in calls)
            nursery.cancel_scope.cancel()
