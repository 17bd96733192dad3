"""One worker: :class:`WorkerSupervisor`, a task that owns one worker process at a time.

The supervisor starts the process, loads the model (bounded by ``startup_timeout``), then
takes jobs from the model's queue, sends them as a BATCH frame and hands the RESPONSE frames
to its :class:`~trioserve.core.inflight.InFlight` book, which routes them to the jobs (the
running batch bounded by ``response_timeout``). When the process dies, hangs or breaks the
protocol, exactly the jobs that were sent to it fail with a clear error; jobs taken from the
queue but not yet sent, or sent behind the running batch and never started, go back to the
front of the queue. Then the process is restarted after a back-off. Nothing else is touched.

This module is the I/O half: the process, its frames, the timers and the tasks. Which batch
runs, which waits behind it and which job an answer belongs to is the book's business
(``core/inflight.py``, sans-IO).

The module stays whole (about 540 lines, continuous batching's steps included): it is one
class whose serving loop, frame reader and stop path share the state of one process
lifetime (the connection, the wake-up event, the failure, the claimed and assigned batches),
and the part that could stand alone, the bookkeeping, already does.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import trio

from trioserve.core import errors
from trioserve.core.backoff import Backoff
from trioserve.core.errors import ServeError
from trioserve.core.frames import Frame, FrameError, Kind, encode
from trioserve.core.inflight import InFlight
from trioserve.core.messages import (
    LoadSpec,
    WorkItem,
    decode_reply,
    encode_batch,
    encode_cancel,
    encode_load,
    encode_stream_ack,
    load_result_streams,
)
from trioserve.core.model_stats import ModelStats
from trioserve.runtime.batcher import Batcher
from trioserve.runtime.connection import WorkerConnection
from trioserve.runtime.jobs import Job, JobState
from trioserve.runtime.launcher import Launcher, WorkerProcess, describe_exit
from trioserve.runtime.parking import wait_until
from trioserve.runtime.sequence_batcher import SequenceBatcher

log = logging.getLogger("trioserve.runtime.supervisor")


class WorkerState(enum.Enum):
    STARTING = "STARTING"
    READY = "READY"
    BUSY = "BUSY"
    BACKOFF = "BACKOFF"
    STOPPING = "UNLOADING"
    STOPPED = "STOPPED"


def default_batch_frame(batch_id: int, jobs: list[Job]) -> bytes:
    return encode_batch(batch_id, [job.request.work_item() for job in jobs])


def _batch_recorder(stats: ModelStats) -> Callable[[int, float], None]:
    """``InFlight``'s ``on_batch_end``: the batch's size and run time into ``stats``."""

    def record(size: int, seconds: float) -> None:
        stats.batch_done(size, int(seconds * 1e9))

    return record


def step_frame(batch_id: int, resumed: list[Job], jobs: list[Job]) -> bytes:
    """A continuous-batching step: the requests that go on first, with their headers but no
    parameters (the handler keeps what it needs of them: TorchServe's "cached in backend"
    requests), then the new requests whole."""
    items = [WorkItem(job.request_id, job.request.headers, []) for job in resumed]
    items.extend(job.request.work_item() for job in jobs)
    return encode_batch(batch_id, items)


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    load: LoadSpec
    cwd: Path
    response_timeout: float
    startup_timeout: float
    stop_grace: float
    max_frame: int
    # The most requests one batch holds (ModelSettings.batch_capacity): with continuous
    # batching, each step of the running batch, the requests that go on counted.
    batch_capacity: int = 1
    on_metrics: Callable[[list[Any]], None] | None = None
    on_loaded: Callable[[str, float], None] | None = None  # (worker name, load ms)
    # Builds the BATCH frame for a batch of jobs (the model version adds collated tensors).
    frame_builder: Callable[[int, list[Job]], bytes | bytearray] = default_batch_frame
    # Send a full batch behind the running one (see BatchPolicy.worker_prefetch).
    prefetch: bool = False
    # Continuous batching (model-config ``continuousBatching``): each batch is one step of a
    # running batch; requests answered "more to come" go on in the next step.
    continuous: bool = False


class WorkerFailure(Exception):
    """The worker process failed; ``error`` is what its in-flight jobs get."""

    def __init__(self, error: ServeError, *, detail: str) -> None:
        super().__init__(detail)
        self.error = error
        self.detail = detail


class WorkerSupervisor:
    """Supervises one worker of a model version: its process, restarted as needed, and the
    batches the batcher assigns to it."""

    def __init__(
        self,
        worker_id: int,
        name: str,
        settings: WorkerSettings,
        batcher: Batcher | SequenceBatcher,
        launcher: Launcher,
        stats: ModelStats | None = None,
    ) -> None:
        """``stats``: the model version's statistics, told of each batch answered."""
        self.id = worker_id
        self.name = name
        self.settings = settings
        self._batcher = batcher
        self._inbox: list[Job] | None = None  # assigned by the batcher, not yet sent
        self._wake = trio.Event()  # set on every event _serve waits for
        self._launcher = launcher
        self.state = WorkerState.STARTING
        self.pid: int | None = None
        self.start_time = dt.datetime.now()
        self.last_error: str | None = None
        self.failures = 0
        self.restarts = 0
        self._stop_requested = False
        self._failure: WorkerFailure | None = None  # reported by the frame reader
        self._state_changed = trio.Event()
        # Frames for the process besides batches: CANCELs, a stream's inputs and acks.
        self._control_send, self._control_recv = trio.open_memory_channel[bytes](math.inf)
        # Acks not sent yet, by request id: the reads of a burst go out as one STREAM_ACK per
        # stream; an empty control frame marks where they go in the control frames' order.
        self._acks: dict[str, int] = {}
        # The batches sent to the process and not ended, and their jobs: the first batch
        # runs; one behind it (a full batch the process starts as soon as the running one
        # ends) has not started, so a failure requeues it.
        self._inflight: InFlight[Job] = InFlight(
            on_cancel=self._send_cancel,
            clock=trio.current_time,
            continuous=settings.continuous,
            on_batch_end=None if stats is None else _batch_recorder(stats),
        )
        self._reached_ready = False
        # Whether the model answers a stream with its own code, as its last load said (an
        # MLServer runtime's predict_stream); None: not known (runtime/triton.py reads it).
        self.streams: bool | None = None
        self._wake_backoff = trio.CancelScope()
        self._scope = trio.CancelScope()
        self._offered = False  # an offer to take a full batch behind the running one stands
        # While the serving task waits with the worker idle: its connection, for the batcher
        # and the frame reader to run the worker's batches directly (see _wait_idle).
        self._direct: WorkerConnection | None = None
        self._idle_scope: trio.CancelScope | None = None

    # -- observation -----------------------------------------------------------------

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested

    @property
    def gpu_id(self) -> int | None:
        """The GPU this worker's processes use (None: CPU)."""
        return self.settings.load.gpu_id

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
        self._wake.set()
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
        self._failure = None
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
                nursery.start_soon(self._send_controls, conn)
                nursery.start_soon(self._read_frames, conn, process)
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
                    if self._inflight.job_count:
                        self._inflight.fail_all(
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
        ending = getattr(process, "ending", None)  # a shared worker's own account of its end
        if isinstance(ending, str):
            return errors.worker_died(ending)
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
        self.streams = load_result_streams(frame)
        if code != 200:
            raise WorkerFailure(
                errors.worker_died(), detail=f"model load failed ({code}): {message}"
            )

    def _ack(self, job: Job) -> None:
        """The client read one more intermediate reply of a streamed job."""
        acks = self._acks
        if not acks:
            self._control_send.send_nowait(b"")
        acks[job.request_id] = acks.get(job.request_id, 0) + 1

    def _control_bytes(self, frame: bytes) -> bytes:
        """A control frame as written: the acks in place of their (empty) marker."""
        if frame:
            return frame
        acks, self._acks = self._acks, {}
        return b"".join(encode_stream_ack(request_id, n) for request_id, n in acks.items())

    def _send_cancel(self, request_id: str) -> None:
        self._control_send.send_nowait(encode_cancel([request_id]))

    async def _send_controls(self, conn: WorkerConnection) -> None:
        # A broken connection is noticed (and reported) by the serving loop.
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            async for frame in self._control_recv:
                # Every control frame waiting goes out in one write (a burst of reads acks
                # many streams at once: one system call instead of one per frame).
                frames = [self._control_bytes(frame)]
                while True:
                    try:
                        frames.append(self._control_bytes(self._control_recv.receive_nowait()))
                    except trio.WouldBlock:
                        break
                await conn.send(b"".join(frames))

    def assign(self, batch: list[Job]) -> None:
        """The batcher hands this worker a batch (it said it was idle, or offered to take a
        full batch behind the running one)."""
        self._inbox = batch
        conn = self._direct
        if conn is None or not self._may_send_now() or not self._send_now(conn):
            self._wake.set()

    def _may_send_now(self) -> bool:
        """Whether a batch may go out from the calling task: the serving task waits idle and
        nothing has happened that it must see first."""
        return (
            self._failure is None
            and not self._stop_requested
            and not self._inflight
            and not self._wake.is_set()
        )

    def _send_now(self, conn: WorkerConnection) -> bool:
        """Send the assigned batch from the calling task (the batcher's caller, or the frame
        reader as a batch ends) while the serving task waits idle, so that a batch costs it
        no wake-up. False when the serving task must see to it: nothing of the batch is
        wanted any more (it reports the worker idle again), or, the batch left assigned,
        the connection cannot take a frame without waiting or the frame could not be built
        (it builds it again in ``_send_batch``, where its error takes the path it always
        has)."""
        batch = self._claim()
        if not batch:
            return False
        batch_id = self._inflight.send(batch)
        try:
            frame = self.settings.frame_builder(batch_id, batch)
        except Exception:
            frame = None  # not raised here: this is the submitting task, not the worker's
        try:
            sent = frame is not None and conn.send_nowait(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            # The jobs wait in the queue for the restarted worker.
            self._batcher.requeue(self, self._inflight.unsend(batch_id))
            self._report(WorkerFailure(errors.worker_died(), detail=f"sending failed: {exc}"))
            return True
        if not sent:
            self._inflight.unsend(batch_id)
            self._inbox = batch
            return False
        self._offered = False
        self._set_state(WorkerState.BUSY)
        for job in batch:
            if job.request.streamed:
                job.stream_to(self._control_send.send_nowait, partial(self._ack, job))
        running = self._inflight.running
        scope = self._idle_scope
        if scope is not None and running is not None:
            scope.deadline = running.started + self.settings.response_timeout
        if conn.unsent:
            self._wake.set()  # the serving task writes the rest of the frame
        elif self._may_offer():
            # As the serving task does once a batch runs: a full batch may go behind it
            # (the batcher's task dispatches it; assigned behind, the serving task sends it).
            self._offered = True
            self._batcher.worker_prefetch(self)
        return True

    def _idle_after_batch(self) -> bool:
        """The frame reader saw a batch sent by :meth:`_send_now` end: report the worker
        idle from here (the next batch may go out at once), as the serving task would.
        False when the serving task must see the end itself."""
        if (
            self._direct is None
            or self._inbox is not None
            or self._inflight.has_continuing
            or not self._may_send_now()
        ):
            return False
        scope = self._idle_scope
        if scope is not None:
            scope.deadline = math.inf
        self._offered = False  # reporting idle withdraws the offer
        self._set_state(WorkerState.READY)
        self._batcher.worker_idle(self)
        return True

    def _return_unclaimed(self) -> None:
        """A batch assigned but never sent goes back to the batcher's queue."""
        if self._inbox is not None:
            batch, self._inbox = self._inbox, None
            self._batcher.requeue(self, batch)

    def _return_behind(self) -> None:
        """Batches sent behind the running one never started: they go back to the queue (the
        last of them was the batcher's last dispatch to this worker; there is at most one).
        The running batch's jobs stay in flight, to be failed."""
        for back in self._inflight.abandon():
            self._batcher.requeue(self, back)

    def _claim(self) -> list[Job]:
        """Take the assigned batch; jobs whose clients left since the dispatch are dropped."""
        batch, self._inbox = self._inbox or [], None
        return [job for job in batch if job.state is JobState.QUEUED]

    async def _sleep(self, deadline: float = math.inf) -> bool:
        """Wait for the next event (a batch assigned or finished, a failure, a stop request);
        False if ``deadline`` came first."""
        self._wake = trio.Event()
        return await wait_until(self._wake, deadline)

    # -- serving ---------------------------------------------------------------------

    async def _serve(self, conn: WorkerConnection, process: WorkerProcess) -> None:
        """Send batches as the batcher assigns them; the frame reader (:meth:`_read_frames`)
        routes the answers and reports the end of each batch and any failure. (The reader
        sends too, in one case: the full batch it is given when the running batch ends.)

        While a batch runs, a batching worker offers to take one full batch behind it and
        sends it at once, so the process starts it as soon as the running one ends. The
        running batch is bounded by ``response_timeout`` from the moment it starts.
        """
        self.failures = 0
        self._reached_ready = True
        timeout = self.settings.response_timeout
        self._offered = False
        while True:
            if self._failure is not None:
                raise self._failure
            if conn.unsent:
                await conn.flush()
            if self._inbox is not None:
                # Assigned while idle, behind the running batch, or just as it finished.
                await self._send_assigned(conn)
                continue
            if not self._inflight:
                if self._inflight.has_continuing:
                    await self._send_step(conn)
                    continue
                if self._stop_requested:
                    return
                self._offered = False  # reporting idle withdraws the offer
                self._set_state(WorkerState.READY)
                self._batcher.worker_idle(self)
                await self._wait_idle(conn)
                continue
            running = self._inflight.running
            assert running is not None
            if self._may_offer():
                self._batcher.worker_prefetch(self)
                self._offered = True
            ended = await self._sleep(running.started + timeout)
            if not ended and self._inflight.running is running:
                raise WorkerFailure(
                    errors.worker_died(
                        f"The request exceeded response_timeout ({timeout:g} s); "
                        "the worker was restarted."
                    ),
                    detail=f"a batch exceeded response_timeout ({timeout:g} s)",
                )

    async def _wait_idle(self, conn: WorkerConnection) -> None:
        """Wait, the worker idle, for the next thing only this task can do.

        Meanwhile the batcher's caller sends each batch assigned to the worker
        (:meth:`_send_now`) and the frame reader reports the worker idle again when it ends
        (:meth:`_idle_after_batch`), so at one request at a time a batch wakes no task of
        this supervisor but the frame reader. Such a batch sets this wait's deadline to its
        ``response_timeout``; this task wakes at that deadline, or when a batch cannot go out
        that way, a failure is reported, a stop is requested or the model runs continuous
        batches (whose steps this task sends)."""
        if self._inbox is not None or self._failure is not None or self._stop_requested:
            return
        self._wake = trio.Event()
        self._direct = None if self.settings.continuous else conn
        try:
            with trio.CancelScope() as scope:
                self._idle_scope = scope
                await self._wake.wait()
        finally:
            self._direct = None
            self._idle_scope = None

    def _may_offer(self) -> bool:
        """Whether to offer the batcher to take a full batch behind the running one."""
        return (
            self.settings.prefetch
            and not self._offered
            and len(self._inflight) == 1
            and not self._stop_requested
            and self._failure is None
        )

    async def _send_assigned(self, conn: WorkerConnection) -> None:
        """Send the batch the batcher assigned (what is still wanted of it)."""
        self._offered = False
        if self._stop_requested:
            self._return_unclaimed()
            return
        batch = self._claim()
        if not batch:
            if self._inflight:
                self._batcher.requeue(self, [])  # the offer was used up: renew it
            return  # idle: the serving loop reports it idle again
        if not self._inflight:
            self._set_state(WorkerState.BUSY)
        await self._send_batch(conn, batch)

    async def _send_step(self, conn: WorkerConnection) -> None:
        """Continuous batching: the last step answered some requests "more to come"; the next
        step carries them and, in the slots they leave of ``batch_capacity``, what the queue
        has now (nothing new once a stop is requested: the running streams are drained)."""
        resumed = self._inflight.take_continuing()
        self._batcher.park(resumed)
        room = self.settings.batch_capacity - len(resumed)
        if not self._stop_requested and room > 0:
            self._batcher.take_now(self, room)
        await self._send_batch(conn, self._claim(), resumed=resumed)

    async def _send_batch(
        self, conn: WorkerConnection, batch: list[Job], *, resumed: list[Job] | None = None
    ) -> None:
        # Listed before it is written: the reader may see its answer before send() returns.
        batch_id = self._inflight.send(batch, resumed=resumed or ())
        try:
            # A frame is never cut short by a stop request: only force_stop cancels here.
            if resumed is None:
                frame = self.settings.frame_builder(batch_id, batch)
            else:
                frame = step_frame(batch_id, resumed, batch)
            await conn.send(frame)
            for job in batch:
                if job.request.streamed:
                    job.stream_to(self._control_send.send_nowait, partial(self._ack, job))
        except BaseException:
            # Never reached the worker: give the new jobs back to the queue, in order (the
            # resumed ones stay in flight, to fail with the process).
            back = self._inflight.unsend(batch_id)
            if resumed is None or back:
                self._batcher.requeue(self, back)
            raise

    # -- the frame reader ------------------------------------------------------------

    async def _read_frames(self, conn: WorkerConnection, process: WorkerProcess) -> None:
        """Read every frame the worker sends while it serves: answers go to their jobs,
        metrics to the sink; EOF or a broken connection is reported to :meth:`_serve` as
        the failure of this process."""
        try:
            while True:
                frame = await conn.receive()
                if frame is None:
                    error = await self._died_error(process)
                    idle = "" if self._inflight else "the idle worker exited: "
                    self._report(WorkerFailure(error, detail=f"{idle}{error.message}"))
                    return
                if frame.kind is Kind.RESPONSE:
                    if self._inflight.reply(decode_reply(frame)) and not self._idle_after_batch():
                        self._wake.set()  # a batch ended
                    if self._may_offer():
                        # The running batch just ended and the one behind it runs now: a
                        # full batch queued goes out at once, from here, rather than after
                        # the serving loop and the batcher's task have each had their turn
                        # behind the answers' HTTP writes, so the process seldom waits.
                        self._offered = True
                        self._batcher.offer_behind_now(self)
                        if self._inbox is not None:
                            await self._send_assigned(conn)
                else:
                    self._other_frame(frame)
        except FrameError as exc:
            self._report(
                WorkerFailure(
                    errors.worker_died("The worker sent a malformed or oversized frame."),
                    detail=f"protocol error: {exc}",
                )
            )
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            error = await self._died_error(process)
            self._report(WorkerFailure(error, detail=f"connection lost ({exc}): {error}"))
        except Exception as exc:
            # A frame this side cannot handle (a bug, or a sink that raised): the process is
            # restarted and its jobs fail, rather than the error escaping into the nursery.
            log.exception("worker %s: handling its frames failed", self.name)
            self._report(
                WorkerFailure(
                    errors.worker_died("The server could not handle the worker's answer."),
                    detail=f"handling the worker's frames failed: {exc!r}",
                )
            )

    def _other_frame(self, frame: Frame) -> None:
        """A frame that is not an answer: metrics go to the sink, the rest is ignored."""
        if frame.kind is Kind.METRICS and self.settings.on_metrics is not None:
            records = frame.meta.get("metrics")
            if isinstance(records, list):
                self.settings.on_metrics(records)

    def _report(self, failure: WorkerFailure) -> None:
        if self._failure is None:
            self._failure = failure
        self._wake.set()

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
