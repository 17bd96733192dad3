"""One worker: a supervisor task that owns one worker process at a time.

The supervisor starts the process, loads the model (bounded by ``startup_timeout``), then
takes jobs from the model's queue, sends them as a BATCH frame and routes the RESPONSE
frames back to the jobs (bounded by ``response_timeout``). When the process dies, hangs or
breaks the protocol, exactly the jobs that were sent to it fail with a clear error; jobs
taken from the queue but not yet sent go back to the front of the queue. Then the process
is restarted after a back-off. Nothing else is touched.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from trioserve.core import errors
from trioserve.core.backoff import Backoff
from trioserve.core.errors import ServeError
from trioserve.core.frames import Frame, FrameError, Kind, encode
from trioserve.core.messages import (
    LoadSpec,
    decode_reply,
    encode_batch,
    encode_cancel,
    encode_load,
)
from trioserve.runtime.batcher import Batcher
from trioserve.runtime.connection import WorkerConnection
from trioserve.runtime.jobs import Job, JobState
from trioserve.runtime.launcher import Launcher, WorkerProcess, describe_exit

log = logging.getLogger("trioserve.runtime.worker")


class WorkerState(enum.Enum):
    STARTING = "STARTING"
    READY = "READY"
    BUSY = "BUSY"
    BACKOFF = "BACKOFF"
    STOPPING = "UNLOADING"
    STOPPED = "STOPPED"


def default_batch_frame(batch_id: int, jobs: list[Job]) -> bytes:
    return encode_batch(batch_id, [job.request.work_item() for job in jobs])


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    load: LoadSpec
    cwd: Path
    response_timeout: float
    startup_timeout: float
    stop_grace: float
    max_frame: int
    batch_size: int = 1
    on_metrics: Callable[[list[Any]], None] | None = None
    on_loaded: Callable[[str, float], None] | None = None  # (worker name, load ms)
    # Builds the BATCH frame for a batch of jobs (the model version adds collated tensors).
    frame_builder: Callable[[int, list[Job]], bytes | bytearray] = default_batch_frame
    # Send a full batch behind the running one (see BatchPolicy.worker_prefetch).
    prefetch: bool = False


class WorkerFailure(Exception):
    """The worker process failed; ``error`` is what its in-flight jobs get."""

    def __init__(self, error: ServeError, *, detail: str) -> None:
        super().__init__(detail)
        self.error = error
        self.detail = detail


class Worker:
    def __init__(
        self,
        worker_id: int,
        name: str,
        settings: WorkerSettings,
        batcher: Batcher,
        launcher: Launcher,
    ) -> None:
        self.id = worker_id
        self.name = name
        self.settings = settings
        self._batcher = batcher
        self._inbox: list[Job] | None = None
        self._assigned = trio.Event()
        self._launcher = launcher
        self.state = WorkerState.STARTING
        self.pid: int | None = None
        self.start_time = dt.datetime.now()
        self.last_error: str | None = None
        self.failures = 0
        self.restarts = 0
        self._stop_requested = False
        self._idle_scope: trio.CancelScope | None = None
        self._inflight: dict[str, Job] = {}
        # A batch sent behind the one running (a full batch the worker starts as soon as it
        # finishes the current one); it has not started, so a failure requeues it.
        self._behind: tuple[int, list[Job]] | None = None  # (batch id, jobs)
        self._state_changed = trio.Event()
        self._cancel_send, self._cancel_recv = trio.open_memory_channel[str](math.inf)
        self._batch_id = 0
        self._reached_ready = False
        self._wake_backoff = trio.CancelScope()
        self._scope = trio.CancelScope()

    # -- observation -----------------------------------------------------------------

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested

    @property
    def serving(self) -> bool:
        return self.state in (WorkerState.READY, WorkerState.BUSY)

    def _set_state(self, state: WorkerState) -> None:
        self.state = state
        self._state_changed.set()
        self._state_changed = trio.Event()

    async def wait_settled(self) -> None:
        """Wait until the worker is serving, or has failed at least once since creation."""
        while not self.serving and self.failures == 0 and self.state is not WorkerState.STOPPED:
            await self._state_changed.wait()

    async def wait_state_change(self) -> None:
        """Wait for the next state change."""
        await self._state_changed.wait()

    # -- control ---------------------------------------------------------------------

    def request_stop(self) -> None:
        """Finish the batch in hand (if any), then stop the process and end :meth:`run`."""
        self._stop_requested = True
        if self._idle_scope is not None:
            self._idle_scope.cancel()
        if self.state is WorkerState.BACKOFF or self.state is WorkerState.STARTING:
            self._set_state(self.state)  # wake waiters
        self._wake_backoff.cancel()

    def force_stop(self) -> None:
        """Stop now: the process is killed and its jobs fail (after a drain ran out)."""
        self.request_stop()
        self._scope.cancel()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with self._scope:
            await self._run(task_status)

    async def _run(self, task_status: trio.TaskStatus[None]) -> None:
        backoff = Backoff()
        task_status.started()
        try:
            while not self._stop_requested:
                began = trio.current_time()
                self._reached_ready = False
                try:
                    await self._run_process()
                except WorkerFailure as failure:
                    # ``failures`` counts consecutive failed starts: a worker that crashes
                    # after serving is restarted, and requests keep queueing meanwhile.
                    self.failures = 0 if self._reached_ready else self.failures + 1
                    self.last_error = failure.detail
                    log.warning("worker %s failed: %s", self.name, failure.detail)
                if self._stop_requested:
                    break
                backoff.record_uptime(trio.current_time() - began)
                delay = backoff.next_delay()
                self._set_state(WorkerState.BACKOFF)
                if delay:
                    log.info("restarting worker %s in %.0f s", self.name, delay)
                self._wake_backoff = trio.CancelScope()
                with self._wake_backoff:
                    await trio.sleep(delay)
                self.restarts += 1
        finally:
            self._set_state(WorkerState.STOPPED)

    # -- one process lifetime --------------------------------------------------------

    async def _run_process(self) -> None:
        self._set_state(WorkerState.STARTING)
        self.pid = None
        conn: WorkerConnection | None = None
        process: WorkerProcess | None = None
        failure: WorkerFailure | None = None
        async with trio.open_nursery() as nursery:
            try:
                launched = await self._launcher.launch(self.name, self.settings.cwd, nursery)
                process = launched.process
                self.pid = process.pid
                self.start_time = dt.datetime.now()
                conn = WorkerConnection(launched.stream, self.settings.max_frame)
                load_began = trio.current_time()
                await self._load(conn, process)
                if self.settings.on_loaded is not None:
                    self.settings.on_loaded(self.name, (trio.current_time() - load_began) * 1000.0)
                nursery.start_soon(self._send_cancels, conn)
                await self._serve(conn, process)
            except WorkerFailure as exc:
                failure = exc
            except FrameError as exc:
                failure = WorkerFailure(
                    errors.worker_died("The worker sent a malformed or oversized frame."),
                    detail=f"protocol error: {exc}",
                )
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                error = await self._died_error(process)
                failure = WorkerFailure(error, detail=f"connection lost ({exc}): {error}")
            except OSError as exc:
                failure = WorkerFailure(
                    errors.worker_died(), detail=f"could not start the worker: {exc}"
                )
            finally:
                # This worker takes no more batches until it is serving again; the batch
                # behind the failed one never started: back to the queue with it.
                self._return_unclaimed()
                self._return_behind()
                self._batcher.worker_gone(self)
                # Stop the process while its output pumps still run, whatever happened.
                with trio.CancelScope(shield=True):
                    self._set_state(WorkerState.STOPPING)
                    if process is not None:
                        await self._stop_process(process, conn, graceful=failure is None)
                    if conn is not None:
                        await conn.aclose()
                    if self._inflight:
                        self._fail_inflight(
                            failure.error if failure is not None else errors.shutting_down()
                        )
                nursery.cancel_scope.cancel()
        if failure is not None:
            raise failure

    async def _died_error(self, process: WorkerProcess | None) -> ServeError:
        if process is None:
            return errors.worker_died()
        with trio.move_on_after(1):
            await process.wait()
        how = describe_exit(process.returncode)
        if process.returncode in (-9, 137):
            return errors.worker_killed_oom(f"The worker process was {how} (out of memory?).")
        return errors.worker_died(f"The worker process {how}.")

    async def _load(self, conn: WorkerConnection, process: WorkerProcess) -> None:
        timeout = self.settings.startup_timeout
        frame: Frame | None = None
        with trio.move_on_after(timeout) as scope:
            await conn.send(encode_load(self.settings.load))
            while True:
                frame = await conn.receive()
                if frame is None:
                    error = await self._died_error(process)
                    raise WorkerFailure(error, detail=f"model load failed: {error.message}")
                if frame.kind is Kind.LOAD_RESULT:
                    break
        if scope.cancelled_caught or frame is None:
            raise WorkerFailure(
                errors.worker_died(),
                detail=f"model load did not finish within startup_timeout ({timeout:g} s)",
            )
        code = frame.meta.get("code")
        message = str(frame.meta.get("message", ""))
        if code != 200:
            raise WorkerFailure(
                errors.worker_died(), detail=f"model load failed ({code}): {message}"
            )

    async def _send_cancels(self, conn: WorkerConnection) -> None:
        # A broken connection is noticed (and reported) by the serving loop.
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            async for request_id in self._cancel_recv:
                await conn.send(encode_cancel([request_id]))

    def _on_job_cancel(self, job: Job) -> None:
        self._inflight.pop(job.request_id, None)
        self._cancel_send.send_nowait(job.request_id)

    def assign(self, batch: list[Job]) -> None:
        """The batcher hands this (idle) worker a batch."""
        self._inbox = batch
        self._assigned.set()

    def _return_unclaimed(self) -> None:
        """A batch assigned but never taken goes back to the batcher's queue."""
        if self._inbox is not None:
            batch, self._inbox = self._inbox, None
            self._batcher.requeue(self, batch)

    def _return_behind(self) -> None:
        """The batch sent behind the running one never started: it goes back to the queue
        (it was the batcher's last dispatch to this worker)."""
        if self._behind is None:
            return
        (_batch_id, batch), self._behind = self._behind, None
        self._requeue_sent(batch)

    def _requeue_sent(self, batch: list[Job]) -> None:
        back = [job for job in batch if job.state is JobState.RUNNING]
        for job in back:
            self._inflight.pop(job.request_id, None)
            job.unstart()
        self._batcher.requeue(self, back)

    async def _take_batch(self, conn: WorkerConnection, process: WorkerProcess) -> list[Job]:
        """Tell the batcher this worker is idle and wait for a batch; meanwhile keep reading
        the worker (trailing METRICS frames, and EOF: a worker that dies while idle is
        restarted before any job reaches it)."""
        failure: list[WorkerFailure] = []
        self._idle_scope = trio.CancelScope()
        self._batcher.worker_idle(self)
        try:
            with self._idle_scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._watch_idle, conn, process, failure, nursery)
                    await self._assigned.wait()
                    nursery.cancel_scope.cancel()
        except BaseException:
            self._return_unclaimed()
            raise
        finally:
            self._idle_scope = None
        if failure or self._stop_requested:
            self._return_unclaimed()
            if failure:
                raise failure[0]
            return []
        batch, self._inbox = self._inbox or [], None
        self._assigned = trio.Event()
        # Jobs whose clients left between dispatch and now are dropped.
        return [job for job in batch if job.state is JobState.QUEUED]

    async def _watch_idle(
        self,
        conn: WorkerConnection,
        process: WorkerProcess,
        failure: list[WorkerFailure],
        nursery: trio.Nursery,
    ) -> None:
        try:
            while True:
                frame = await conn.receive()
                if frame is None:
                    error = await self._died_error(process)
                    failure.append(
                        WorkerFailure(error, detail=f"the idle worker exited: {error.message}")
                    )
                    break
                self._other_frame(frame)
        except (FrameError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            failure.append(
                WorkerFailure(errors.worker_died(), detail=f"the idle worker broke: {exc}")
            )
        nursery.cancel_scope.cancel()

    def _other_frame(self, frame: Frame) -> None:
        """A frame that is not an answer: metrics go to the sink, the rest is ignored."""
        if frame.kind is Kind.METRICS and self.settings.on_metrics is not None:
            records = frame.meta.get("metrics")
            if isinstance(records, list):
                self.settings.on_metrics(records)

    async def _serve(self, conn: WorkerConnection, process: WorkerProcess) -> None:
        self.failures = 0
        self._reached_ready = True
        current: tuple[int, list[Job]] | None = None  # sent, its replies not all in
        while True:
            if current is None:
                if self._stop_requested:
                    return
                self._set_state(WorkerState.READY)
                batch = await self._take_batch(conn, process)
                if not batch:
                    continue
                self._set_state(WorkerState.BUSY)
                current = (await self._send_batch(conn, batch), batch)
            current = await self._collect_and_prefetch(conn, process, *current)

    async def _send_batch(self, conn: WorkerConnection, batch: list[Job]) -> int:
        for job in batch:
            job.start(self._on_job_cancel)
            self._inflight[job.request_id] = job
        self._batch_id += 1
        try:
            await conn.send(self.settings.frame_builder(self._batch_id, batch))
        except BaseException:
            # Never reached the worker: give the jobs back to the queue, in order.
            self._requeue_sent(batch)
            raise
        return self._batch_id

    async def _collect_and_prefetch(
        self, conn: WorkerConnection, process: WorkerProcess, batch_id: int, batch: list[Job]
    ) -> tuple[int, list[Job]] | None:
        """Collect the replies of the running batch; meanwhile offer to take a full batch
        behind it and send that at once. Returns the batch behind, if one was sent."""
        if self._stop_requested or not self.settings.prefetch:
            await self._collect(conn, process, batch_id, batch)
            return None
        # Failures are carried out of the nursery, not raised in it: the callers catch
        # WorkerFailure and connection errors themselves, not exception groups.
        failures: list[Exception] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._prefetch, conn, failures)
            try:
                await self._collect(conn, process, batch_id, batch)
            except Exception as exc:
                failures.append(exc)
            nursery.cancel_scope.cancel()
        if failures:
            raise failures[0]
        # The running batch is done, so the one behind (if any) is running now. A batch
        # assigned just as the running one finished goes next all the same.
        behind, self._behind = self._behind, None
        if behind is None and self._inbox is not None:
            behind = await self._send_assigned(conn)
        if behind is None:
            self._batcher.worker_busy(self)  # withdraw the offer
        return behind

    async def _prefetch(self, conn: WorkerConnection, failures: list[Exception]) -> None:
        try:
            self._batcher.worker_prefetch(self)
            await self._assigned.wait()
            self._behind = await self._send_assigned(conn)
        except Exception as exc:
            failures.append(exc)

    async def _send_assigned(self, conn: WorkerConnection) -> tuple[int, list[Job]] | None:
        """Send the batch the batcher assigned behind the running one; None if every job
        of it was cancelled meanwhile."""
        batch, self._inbox = self._inbox or [], None
        self._assigned = trio.Event()
        batch = [job for job in batch if job.state is JobState.QUEUED]
        if not batch:
            self._batcher.requeue(self, [])
            return None
        # A frame is never cut short: the send finishes even if the collector is done.
        with trio.CancelScope(shield=True):
            batch_id = await self._send_batch(conn, batch)
        return batch_id, batch

    async def _collect(
        self, conn: WorkerConnection, process: WorkerProcess, batch_id: int, batch: list[Job]
    ) -> None:
        timeout = self.settings.response_timeout
        pending = {job.request_id for job in batch if job.request_id in self._inflight}
        with trio.move_on_after(timeout) as scope:
            while pending:
                frame = await conn.receive()
                if frame is None:
                    error = await self._died_error(process)
                    raise WorkerFailure(error, detail=error.message)
                if frame.kind is not Kind.RESPONSE:
                    self._other_frame(frame)
                    continue
                reply = decode_reply(frame)
                if reply.batch_id != batch_id:
                    continue
                if reply.code != 200:
                    self._fail_batch(pending, errors.prediction_failed(reply.code, reply.message))
                    return
                for item in reply.replies:
                    job = self._inflight.get(item.request_id)
                    if job is not None:
                        job.deliver(item, final=reply.final)
                    if reply.final:
                        self._inflight.pop(item.request_id, None)
                        pending.discard(item.request_id)
                if reply.final:
                    mismatch = errors.prediction_failed(503, "number of batch response mismatched")
                    self._fail_batch(pending, mismatch)
                    return
        if scope.cancelled_caught:
            raise WorkerFailure(
                errors.worker_died(
                    f"The request exceeded response_timeout ({timeout:g} s); "
                    "the worker was restarted."
                ),
                detail=f"a batch exceeded response_timeout ({timeout:g} s)",
            )

    def _fail_batch(self, request_ids: set[str], error: ServeError) -> None:
        for request_id in request_ids:
            job = self._inflight.pop(request_id, None)
            if job is not None:
                job.fail(error)

    def _fail_inflight(self, error: ServeError) -> None:
        jobs = list(self._inflight.values())
        self._inflight.clear()
        for job in jobs:
            job.fail(error)

    async def _stop_process(
        self, process: WorkerProcess, conn: WorkerConnection | None, *, graceful: bool
    ) -> None:
        grace = self.settings.stop_grace
        if process.returncode is None and graceful and conn is not None:
            with trio.move_on_after(grace):
                try:
                    await conn.send(encode(Kind.SHUTDOWN, {}))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                await process.wait()
        if process.returncode is None:
            process.terminate()
            with trio.move_on_after(grace):
                await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()
