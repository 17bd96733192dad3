"""The stateful queue against fake workers: the dataplane opens sequences, requests of one
sequence run in order on one worker, the end header closes, shutdown fails what is queued."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import trio
import trio.testing

from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.messages import BatchReply, LoadSpec, Param, Reply, WorkItem
from trioserve.core.model_settings import ModelSettings, SequenceSettings
from trioserve.core.request import InferenceRequest
from trioserve.runtime.dataplane import Dataplane
from trioserve.runtime.jobs import Job
from trioserve.runtime.model import ModelVersion, PoolSettings
from trioserve.runtime.sequence_batcher import SequenceBatcher
from trioserve.runtime.supervisor import WorkerSettings

from .fakes import FakeLauncher, FakeProcess, OneModelManager

SEEN: list[tuple[int | None, str, str]] = []  # (fake pid, sequence id, body), in run order


async def answer(proc: FakeProcess, batch_id: int, items: list[WorkItem]) -> None:
    replies = []
    for item in items:
        headers = dict(item.headers)
        body = bytes(item.params[0].value).decode()
        SEEN.append((proc.pid, headers["ts_request_sequence_id"], body))
        end = {"ts_request_sequence_end": headers["ts_request_sequence_id"]} if body == "0" else {}
        start = headers.get("ts_request_sequence_start", "")
        replies.append(Reply(item.request_id, f"{body}{start}".encode(), headers=end))
    await trio.sleep(0.01)
    await proc.send_reply(BatchReply(batch_id, 200, "", replies, True))


def stateful_model(launcher: FakeLauncher, **sequence: int) -> ModelVersion:
    settings = ModelSettings(
        name="m", version="1.0", url="m.mar", handler="h.py", runtime="python",
        batch_size=2, max_batch_delay=100, min_workers=2, max_workers=2,
        response_timeout=30, startup_timeout=5, job_queue_size=10, loaded_at_startup=False,
        sequence=SequenceSettings(
            max_idle_msec=sequence.get("idle", 0), timeout_msec=0,
            max_queue=sequence.get("queue", 10), max_sequences=sequence.get("sequences", 4),
        ),
    )  # fmt: skip
    ids = itertools.count(9000)
    pool = PoolSettings(
        worker=WorkerSettings(
            load=LoadSpec("m", "1.0", "/nonexistent", "h.py"), cwd=Path("/"),
            response_timeout=30, startup_timeout=5, stop_grace=0.5, max_frame=1 << 20,
        ),
        next_worker_id=lambda: next(ids),
    )  # fmt: skip
    return ModelVersion(settings, pool, launcher)


async def started(nursery: trio.Nursery, **sequence: int) -> tuple[Dataplane, ModelVersion]:
    SEEN.clear()
    model = stateful_model(FakeLauncher(behaviour=answer), **sequence)
    await nursery.start(model.run)
    await model.scale(2, 2)
    await model.wait_settled()
    return Dataplane(OneModelManager(model)), model  # type: ignore[arg-type]


async def send(dataplane: Dataplane, body: str, sequence_id: str | None = None) -> tuple[str, str]:
    request = InferenceRequest("m", None, [Param("data", body.encode())], sequence_id=sequence_id)
    async with dataplane.submit(request) as call:
        reply, _final = await call.next_reply()
    assert call.sequence_id is not None
    return call.sequence_id, bytes(reply.body).decode()


async def test_sequences_run_in_order_on_one_worker_each() -> None:
    async with trio.open_nursery() as nursery:
        dataplane, _model = await started(nursery)
        opened = [await send(dataplane, "first") for _ in range(3)]
        assert all(body == "firsttrue" for _id, body in opened)  # the start header, once

        async def rest(sequence_id: str) -> None:
            for n in range(5):
                assert (await send(dataplane, str(n + 1), sequence_id))[1] == str(n + 1)

        async with trio.open_nursery() as clients:
            for sequence_id, _body in opened:
                clients.start_soon(rest, sequence_id)
        for sequence_id, _body in opened:
            runs = [(pid, body) for pid, sid, body in SEEN if sid == sequence_id]
            assert [body for _pid, body in runs] == ["first", "1", "2", "3", "4", "5"]
            assert len({pid for pid, _body in runs}) == 1
        nursery.cancel_scope.cancel()


async def test_the_end_header_closes_and_a_closed_id_is_refused() -> None:
    async with trio.open_nursery() as nursery:
        dataplane, model = await started(nursery, sequences=1)
        sequence_id, _ = await send(dataplane, "1")
        with pytest.raises(ServeError) as full:
            await send(dataplane, "1")  # a second sequence: over maxNumSequence
        assert full.value.kind is ErrorKind.UNAVAILABLE and "maxNumSequence" in full.value.message
        await send(dataplane, "0", sequence_id)  # the handler ends it
        with pytest.raises(ServeError) as closed:
            await send(dataplane, "2", sequence_id)
        assert closed.value.kind is ErrorKind.BAD_INPUT and sequence_id in closed.value.message
        assert (await send(dataplane, "3"))[1] == "3true"  # the slot is free again
        assert model.queue.remaining_capacity == 10
        nursery.cancel_scope.cancel()


async def test_an_idle_sequence_expires() -> None:
    async with trio.open_nursery() as nursery:
        dataplane, _model = await started(nursery, idle=200)
        sequence_id, _ = await send(dataplane, "1")
        await trio.sleep(0.4)
        with pytest.raises(ServeError) as late:
            await send(dataplane, "2", sequence_id)
        assert "idle" in late.value.message
        nursery.cancel_scope.cancel()


async def test_a_bookkeeping_fault_closes_the_sequence_and_fails_what_it_queued(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with trio.open_nursery() as nursery:
        dataplane, model = await started(nursery)
        sequence_id, _ = await send(dataplane, "first")

        def broken(*_args: object) -> None:
            raise ValueError("a bug in the policy")

        monkeypatch.setattr(model.queue._policy, "done", broken)  # type: ignore[union-attr]
        running = dataplane.submit(
            InferenceRequest("m", None, [Param("data", b"1")], sequence_id=sequence_id)
        )
        queued = dataplane.submit(
            InferenceRequest("m", None, [Param("data", b"2")], sequence_id=sequence_id)
        )
        async with running, queued:
            reply, _final = await running.next_reply()
            assert bytes(reply.body) == b"1"
            with trio.fail_after(5), pytest.raises(ServeError) as failed:
                await queued.next_reply()  # answered with an error, not left waiting
        assert failed.value.kind is ErrorKind.BAD_INPUT and sequence_id in failed.value.message
        assert model.queue.remaining_capacity == model.queue.capacity
        nursery.cancel_scope.cancel()


class _GoneOnSend:
    """A worker that is found gone while its batch is being handed over (as when a frame
    written to a killed worker breaks): the clock moves on meanwhile, and the batch is given
    back to the queue from inside ``assign``."""

    def __init__(self, clock: trio.testing.MockClock) -> None:
        self.clock = clock
        self.queue: SequenceBatcher | None = None
        self.batches: list[list[Job]] = []

    def assign(self, batch: list[Job]) -> None:
        assert self.queue is not None
        self.batches.append(batch)
        self.clock.jump(0.5)
        self.queue.requeue(self, batch)


def test_a_batch_given_back_while_it_is_handed_over_leaves_the_queue_running() -> None:
    """The queue's task asks the policy for its next wake-up after carrying out a pass. A
    worker that fails inside the pass (its batch given back at a later time) must not make
    that question go back in time: the queue's task (and with it the model) once died of
    "time went backwards" when a request was written to a worker just killed."""
    clock = trio.testing.MockClock()

    async def main() -> None:
        queue = SequenceBatcher(
            SequenceSettings(max_idle_msec=0, timeout_msec=0, max_queue=4, max_sequences=4),
            batch_size=2,
            id_header="ts_request_sequence_id",
            end_header="ts_request_sequence_end",
        )
        worker = _GoneOnSend(clock)
        worker.queue = queue
        async with trio.open_nursery() as nursery:
            await nursery.start(queue.run)
            sequence_id, _opened = queue.open(None)
            job = Job(InferenceRequest("m", None, [Param("data", b"1")], sequence_id=sequence_id))
            queue.put(job, lambda: ServeError(ErrorKind.UNAVAILABLE, "full"))
            queue.worker_idle(worker)
            await trio.testing.wait_all_tasks_blocked()
            assert worker.batches == [[job]]
            with pytest.raises(ServeError) as failed:
                await job.next_reply()
            assert failed.value.kind is ErrorKind.WORKER_FAILED
            nursery.cancel_scope.cancel()

    trio.run(main, clock=clock)
