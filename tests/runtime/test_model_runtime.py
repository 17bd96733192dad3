"""The trio runtime (jobs, worker supervisors, model versions) against fake workers."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pytest
import trio
import trio.testing

from trioserve.core.errors import ServeError
from trioserve.core.frames import Kind, encode
from trioserve.core.messages import BatchReply, LoadSpec, Param, Reply, WorkItem
from trioserve.core.model_settings import ModelSettings
from trioserve.core.request import InferenceRequest
from trioserve.http.errors import http_status
from trioserve.runtime.jobs import JobState
from trioserve.runtime.model import ModelVersion, PoolSettings
from trioserve.runtime.supervisor import WorkerSettings, WorkerState

from .fakes import Behaviour, FakeLauncher, FakeProcess, echo


def settings(
    workers: int = 1, queue: int = 10, batch_size: int = 1, delay_ms: int = 100
) -> ModelSettings:
    return ModelSettings(
        name="m",
        version="1.0",
        url="m.mar",
        handler="h.py",
        runtime="python",
        batch_size=batch_size,
        max_batch_delay=delay_ms,
        min_workers=workers,
        max_workers=workers,
        response_timeout=2,
        startup_timeout=2,
        job_queue_size=queue,
        loaded_at_startup=False,
    )


def pool(response_timeout: float = 2.0, startup_timeout: float = 2.0) -> PoolSettings:
    ids = itertools.count(9000)
    return PoolSettings(
        worker=WorkerSettings(
            load=LoadSpec("m", "1.0", "/nonexistent", "h.py"),
            cwd=Path("/"),
            response_timeout=response_timeout,
            startup_timeout=startup_timeout,
            stop_grace=0.5,
            max_frame=1 << 20,
        ),
        next_worker_id=lambda: next(ids),
    )


def req(text: str) -> InferenceRequest:
    return InferenceRequest("m", None, [Param("body", text.encode())])


async def result(model: ModelVersion, text: str) -> bytes:
    job = model.submit(req(text))
    chunks = [bytes(reply.body) async for reply, _final in job.replies()]
    return b"|".join(chunks)


async def start(
    nursery: trio.Nursery,
    launcher: FakeLauncher,
    workers: int = 1,
    *,
    model_settings: ModelSettings | None = None,
    pool_settings: PoolSettings | None = None,
    **pool_kw: float,
) -> ModelVersion:
    """A model version with ``workers`` fake workers, started and settled."""
    model = ModelVersion(
        model_settings or settings(workers), pool_settings or pool(**pool_kw), launcher
    )
    await nursery.start(model.run)
    await model.scale(workers, workers)
    await model.wait_settled()
    return model


async def test_request_round_trip_and_clean_stop() -> None:
    launcher = FakeLauncher()
    async with trio.open_nursery() as nursery:
        model = await start(nursery, launcher)
        assert model.ready_workers == 1
        assert await result(model, "hi") == b"hi"
        await model.stop(timeout=2)
        assert model.workers == []
        nursery.cancel_scope.cancel()
    assert launcher.processes[0].returncode == 0  # left through SHUTDOWN, not a signal
    assert launcher.processes[0].signals == []


async def test_streaming_replies_arrive_in_order() -> None:
    async def stream(proc: FakeProcess, batch_id: int, items: list[WorkItem]) -> None:
        rid = items[0].request_id
        for i in range(3):
            await proc.send_reply(BatchReply(batch_id, 200, "", [Reply(rid, b"p%d" % i)], False))
            await trio.sleep(0.01)
        await proc.send_reply(BatchReply(batch_id, 200, "", [Reply(rid, b"end")], True))

    async with trio.open_nursery() as nursery:
        model = await start(nursery, FakeLauncher(behaviour=stream))
        assert await result(model, "x") == b"p0|p1|p2|end"
        nursery.cancel_scope.cancel()


async def test_crash_fails_only_the_inflight_job_and_worker_restarts() -> None:
    crashed = trio.Event()

    async def crash_once(proc: FakeProcess, batch_id: int, items: list[WorkItem]) -> None:
        if not crashed.is_set():
            crashed.set()
            proc.exit(-9)
            return
        await proc.send_reply(
            BatchReply(batch_id, 200, "", [Reply(items[0].request_id, b"ok")], True)
        )

    launcher = FakeLauncher(behaviour=crash_once)
    async with trio.open_nursery() as nursery:
        model = await start(nursery, launcher)
        with pytest.raises(ServeError) as info:
            await result(model, "boom")
        assert http_status(info.value) == 507 and "SIGKILL" in info.value.message
        assert await result(model, "again") == b"ok"
        assert len(launcher.processes) == 2
        assert model.workers[0].restarts == 1
        nursery.cancel_scope.cancel()


async def test_response_timeout_kills_the_worker_and_fails_the_job() -> None:
    async def hang(proc: FakeProcess, batch_id: int, items: list[WorkItem]) -> None:
        await trio.sleep_forever()

    launcher = FakeLauncher(behaviour=hang)
    async with trio.open_nursery() as nursery:
        model = await start(nursery, launcher, response_timeout=0.3)
        with pytest.raises(ServeError) as info:
            await result(model, "slow")
        assert http_status(info.value) == 500
        assert "response_timeout" in info.value.message
        assert launcher.processes[0].signals == ["TERM"]
        nursery.cancel_scope.cancel()


async def test_startup_timeout_and_failed_loads_reject_requests_clearly() -> None:
    launcher = FakeLauncher(load_delay=10)
    async with trio.open_nursery() as nursery:
        model = await start(nursery, launcher, startup_timeout=0.2)
        assert model.ready_workers == 0
        worker = model.workers[0]
        assert worker.failures == 1
        assert worker.last_error is not None and "startup_timeout" in worker.last_error
        with pytest.raises(ServeError) as info:
            model.submit(req("x"))
        assert http_status(info.value) == 503 and "startup_timeout" in info.value.message
        nursery.cancel_scope.cancel()


async def test_cancel_while_queued_and_while_running() -> None:
    release = trio.Event()

    async def slow(proc: FakeProcess, batch_id: int, items: list[WorkItem]) -> None:
        await release.wait()
        await proc.send_reply(
            BatchReply(batch_id, 200, "", [Reply(items[0].request_id, b"done")], True)
        )

    launcher = FakeLauncher(behaviour=slow)
    async with trio.open_nursery() as nursery:
        model = await start(nursery, launcher)
        running = model.submit(req("a"))
        queued = model.submit(req("b"))
        await trio.testing.wait_all_tasks_blocked()
        assert running.state is JobState.RUNNING and queued.state is JobState.QUEUED
        queued.cancel()
        assert len(model.queue) == 0
        running.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert launcher.processes[0].cancelled == [running.request_id]
        release.set()
        # the worker is still healthy and serves the next request
        assert await result(model, "c") == b"done"
        assert launcher.batches == [[running.request_id], [launcher.batches[1][0]]]
        nursery.cancel_scope.cancel()


async def test_queue_full_is_a_503_naming_the_limit() -> None:
    async def hang(proc: FakeProcess, batch_id: int, items: list[WorkItem]) -> None:
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        model = await start(
            nursery, FakeLauncher(behaviour=hang), model_settings=settings(1, queue=2)
        )
        model.submit(req("1"))
        await trio.testing.wait_all_tasks_blocked()
        model.submit(req("2"))
        model.submit(req("3"))
        with pytest.raises(ServeError) as info:
            model.submit(req("4"))
        assert http_status(info.value) == 503 and "job_queue_size" in info.value.message
        assert info.value.retry_after is not None
        nursery.cancel_scope.cancel()


async def test_scale_down_drains_a_busy_worker_without_failing_its_job() -> None:
    release = trio.Event()

    async def slow(proc: FakeProcess, batch_id: int, items: list[WorkItem]) -> None:
        await release.wait()
        await proc.send_reply(
            BatchReply(batch_id, 200, "", [Reply(items[0].request_id, b"finished")], True)
        )

    launcher = FakeLauncher(behaviour=slow)
    async with trio.open_nursery() as nursery:
        model = await start(nursery, launcher, workers=2)
        job = model.submit(req("x"))
        await trio.testing.wait_all_tasks_blocked()
        busy = next(w for w in model.workers if w.state is WorkerState.BUSY)

        async def scale_down() -> None:
            await model.scale(0, 0)

        nursery.start_soon(scale_down)
        await trio.testing.wait_all_tasks_blocked()
        assert model.workers == [busy]  # the idle one went first
        release.set()
        replies = [bytes(r.body) async for r, _ in job.replies()]
        assert replies == [b"finished"]
        with trio.fail_after(2):
            while model.workers:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()


async def test_shutdown_fails_queued_jobs_clearly() -> None:
    async def hang(proc: FakeProcess, batch_id: int, items: list[WorkItem]) -> None:
        await trio.sleep_forever()

    launcher = FakeLauncher(behaviour=hang)
    errors: list[ServeError] = []

    async def client(model: ModelVersion) -> None:
        try:
            await result(model, "x")
        except ServeError as exc:
            errors.append(exc)

    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as nursery:
            model = await start(nursery, launcher)
            outer.start_soon(client, model)
            outer.start_soon(client, model)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    assert [http_status(e) for e in errors] == [503, 503]
    assert launcher.processes[0].returncode is not None


async def test_a_worker_dying_while_idle_is_restarted_before_any_job_reaches_it() -> None:
    launcher = FakeLauncher()
    async with trio.open_nursery() as nursery:
        model = await start(nursery, launcher)
        launcher.processes[0].exit(-9)
        with trio.fail_after(5):
            while len(launcher.processes) < 2 or not model.workers[0].serving:
                await trio.sleep(0.01)
        assert model.workers[0].last_error is not None
        assert "idle worker exited" in model.workers[0].last_error
        assert await result(model, "fine") == b"fine"
        assert launcher.batches == [[launcher.batches[0][0]]]  # only the new request ran
        nursery.cancel_scope.cancel()


async def test_metrics_frames_reach_the_sink_after_the_final_reply() -> None:
    async def with_metrics(proc: FakeProcess, batch_id: int, items: list[WorkItem]) -> None:
        await proc.send_reply(
            BatchReply(batch_id, 200, "", [Reply(items[0].request_id, b"ok")], True)
        )
        assert proc.stream is not None
        await proc.stream.send_all(encode(Kind.METRICS, {"metrics": [{"name": "X", "value": 1}]}))

    seen: list[list[object]] = []
    pool_settings = pool_with(on_metrics=seen.append)
    async with trio.open_nursery() as nursery:
        model = await start(
            nursery,
            FakeLauncher(behaviour=with_metrics),
            model_settings=settings(1),
            pool_settings=pool_settings,
        )
        assert await result(model, "a") == b"ok"
        with trio.fail_after(2):
            while not seen:
                await trio.sleep(0.01)
        assert seen == [[{"name": "X", "value": 1}]]
        nursery.cancel_scope.cancel()


async def test_batches_form_under_load_and_a_lone_request_does_not_wait() -> None:
    release = trio.Event()

    async def slow_echo(proc: FakeProcess, batch_id: int, items: list[WorkItem]) -> None:
        await release.wait()
        replies = [Reply(i.request_id, bytes(i.params[0].value)) for i in items]
        await proc.send_reply(BatchReply(batch_id, 200, "", replies, True))

    launcher = FakeLauncher(behaviour=slow_echo)
    async with trio.open_nursery() as nursery:
        model = await start(
            nursery, launcher, model_settings=settings(1, queue=20, batch_size=4, delay_ms=10_000)
        )
        results: list[bytes] = []

        async def client(i: int) -> None:
            results.append(await result(model, str(i)))

        for i in range(9):
            nursery.start_soon(client, i)
            await trio.testing.wait_all_tasks_blocked()
        release.set()
        with trio.fail_after(5):
            while len(results) < 9:
                await trio.sleep(0.01)
        # the first request went alone at once (10 s window notwithstanding), the rest
        # queued while the worker was busy and left as full batches, in order
        assert [len(b) for b in launcher.batches] == [1, 4, 4]
        assert sorted(results) == sorted(str(i).encode() for i in range(9))
        nursery.cancel_scope.cancel()


async def test_a_crash_mid_batch_fails_exactly_that_batch() -> None:
    gate = trio.Event()
    crashed = trio.Event()

    async def crash_first_batch(proc: FakeProcess, batch_id: int, items: list[WorkItem]) -> None:
        if not crashed.is_set():
            await gate.wait()
            crashed.set()
            proc.exit(-9)
            return
        replies = [Reply(i.request_id, b"ok") for i in items]
        await proc.send_reply(BatchReply(batch_id, 200, "", replies, True))

    launcher = FakeLauncher(behaviour=crash_first_batch)
    async with trio.open_nursery() as nursery:
        model = await start(
            nursery, launcher, model_settings=settings(1, batch_size=3, delay_ms=10_000)
        )
        outcomes: dict[str, object] = {}

        async def client(name: str) -> None:
            try:
                outcomes[name] = await result(model, name)
            except ServeError as exc:
                outcomes[name] = http_status(exc)

        for name in ("a", "b", "c", "d"):
            nursery.start_soon(client, name)
            await trio.testing.wait_all_tasks_blocked()
        # batch 1 = [a] (idle dispatch), then b, c, d queue behind it
        gate.set()
        with trio.fail_after(5):
            while len(outcomes) < 4:
                await trio.sleep(0.01)
        assert outcomes["a"] == 507
        assert [outcomes[n] for n in ("b", "c", "d")] == [b"ok", b"ok", b"ok"]
        assert [len(b) for b in launcher.batches] == [1, 3]
        nursery.cancel_scope.cancel()


def pool_with(**worker_fields: object) -> PoolSettings:
    """:func:`pool` with these WorkerSettings fields replaced."""
    base = pool()
    return dataclasses.replace(base, worker=dataclasses.replace(base.worker, **worker_fields))


def prefetching_pool() -> PoolSettings:
    return pool_with(prefetch=True)


def sequential(behaviour: Behaviour) -> Behaviour:
    """Batches one after the other, as a real worker runs them."""
    lock = trio.Lock()

    async def run(proc: FakeProcess, batch_id: int, items: list[WorkItem]) -> None:
        async with lock:
            await behaviour(proc, batch_id, items)

    return run


async def test_a_full_batch_waits_behind_the_running_one_on_the_worker() -> None:
    release = trio.Event()

    async def slow_echo(proc: FakeProcess, batch_id: int, items: list[WorkItem]) -> None:
        await release.wait()
        replies = [Reply(i.request_id, bytes(i.params[0].value)) for i in items]
        await proc.send_reply(BatchReply(batch_id, 200, "", replies, True))

    launcher = FakeLauncher(behaviour=sequential(slow_echo))
    async with trio.open_nursery() as nursery:
        model = await start(
            nursery,
            launcher,
            model_settings=settings(1, queue=20, batch_size=2, delay_ms=10_000),
            pool_settings=prefetching_pool(),
        )
        results: list[bytes] = []

        async def client(i: int) -> None:
            results.append(await result(model, str(i)))

        for i in range(6):
            nursery.start_soon(client, i)
            await trio.testing.wait_all_tasks_blocked()
        # [0] runs; [1, 2] is full and already sent behind it; [3, 4] and [5] wait here
        assert launcher.batches == [[*ids(launcher)[:1]], ids(launcher)[1:3]]
        assert len(model.queue) == 3
        release.set()
        with trio.fail_after(5):
            while len(results) < 6:
                await trio.sleep(0.01)
        assert [len(b) for b in launcher.batches] == [1, 2, 2, 1]
        assert sorted(results) == sorted(str(i).encode() for i in range(6))
        nursery.cancel_scope.cancel()


def ids(launcher: FakeLauncher) -> list[str]:
    return [rid for batch in launcher.batches for rid in batch]


async def test_a_crash_requeues_the_batch_behind_which_never_started() -> None:
    gate = trio.Event()
    crashed = trio.Event()
    ran: list[list[str]] = []

    async def crash_first_batch(proc: FakeProcess, batch_id: int, items: list[WorkItem]) -> None:
        if not crashed.is_set():
            await gate.wait()
            crashed.set()
            proc.exit(-9)
            return
        ran.append([bytes(i.params[0].value).decode() for i in items])
        replies = [Reply(i.request_id, b"ok") for i in items]
        await proc.send_reply(BatchReply(batch_id, 200, "", replies, True))

    launcher = FakeLauncher(behaviour=sequential(crash_first_batch))
    async with trio.open_nursery() as nursery:
        model = await start(
            nursery,
            launcher,
            model_settings=settings(1, batch_size=2, delay_ms=10_000),
            pool_settings=prefetching_pool(),
        )
        outcomes: dict[str, object] = {}

        async def client(name: str) -> None:
            try:
                outcomes[name] = await result(model, name)
            except ServeError as exc:
                outcomes[name] = http_status(exc)

        for name in ("a", "b", "c"):
            nursery.start_soon(client, name)
            await trio.testing.wait_all_tasks_blocked()
        assert [len(b) for b in launcher.batches] == [1, 2]  # [b, c] sent behind [a]
        gate.set()
        with trio.fail_after(5):
            while len(outcomes) < 3:
                await trio.sleep(0.01)
        # only the batch that was running fails; the one behind ran on the new worker
        assert outcomes == {"a": 507, "b": b"ok", "c": b"ok"}
        assert ran == [["b", "c"]]
        assert len(launcher.processes) == 2
        nursery.cancel_scope.cancel()


async def test_a_frame_the_server_cannot_handle_restarts_the_worker_not_the_server() -> None:
    async def metrics_first(proc: FakeProcess, batch_id: int, items: list[WorkItem]) -> None:
        assert proc.stream is not None
        await proc.stream.send_all(encode(Kind.METRICS, {"metrics": [{"name": "X"}]}))
        await echo(proc, batch_id, items)

    calls: list[object] = []

    def broken_sink(records: list[object]) -> None:
        calls.append(records)
        if len(calls) == 1:
            raise RuntimeError("the sink broke")

    pool_settings = pool_with(on_metrics=broken_sink)
    launcher = FakeLauncher(behaviour=metrics_first)
    async with trio.open_nursery() as nursery:
        model = await start(
            nursery, launcher, model_settings=settings(1), pool_settings=pool_settings
        )
        with pytest.raises(ServeError) as failed:
            await result(model, "a")
        assert http_status(failed.value) == 500
        assert "could not handle the worker's answer" in failed.value.message
        # The worker was restarted; the next request is served by the new process.
        assert await result(model, "b") == b"b"
        assert len(launcher.processes) == 2
        assert "handling the worker's frames failed" in (model.workers[0].last_error or "")
        nursery.cancel_scope.cancel()


async def test_the_batch_behind_gets_its_own_response_timeout_from_when_it_starts() -> None:
    # Each batch takes 0.3 s and runs after the one before it. The batch sent behind the
    # first one ends 0.6 s after it was sent but 0.3 s after it started: within a 0.5 s
    # response_timeout counted from its start, not from its send.
    async def slow_echo(proc: FakeProcess, batch_id: int, items: list[WorkItem]) -> None:
        await trio.sleep(0.3)
        await echo(proc, batch_id, items)

    launcher = FakeLauncher(behaviour=sequential(slow_echo))
    pool_settings = pool_with(prefetch=True, response_timeout=0.5)
    async with trio.open_nursery() as nursery:
        model = await start(
            nursery,
            launcher,
            model_settings=settings(1, queue=20, batch_size=2, delay_ms=10_000),
            pool_settings=pool_settings,
        )
        results: dict[int, bytes] = {}

        async def client(i: int) -> None:
            results[i] = await result(model, str(i))

        for i in range(3):
            nursery.start_soon(client, i)
            await trio.testing.wait_all_tasks_blocked()
        assert [len(b) for b in launcher.batches] == [1, 2]  # [1, 2] went behind [0]
        with trio.fail_after(5):
            while len(results) < 3:
                await trio.sleep(0.01)
        assert results == {0: b"0", 1: b"1", 2: b"2"}
        assert len(launcher.processes) == 1  # nothing timed out, nothing restarted
        nursery.cancel_scope.cancel()
