"""Jobs (one accepted request each) and the bounded per-model job queue.

A job is owned by the adapter task that accepted it (an HTTP route, a gRPC method). The
adapter reads the job's replies; when it goes away (client disconnect, deadline) it calls
:meth:`Job.cancel`, which removes a queued job from its queue or asks the worker running it
to stop. A worker task delivers replies with :meth:`Job.deliver` and ends the job with
:meth:`Job.finish` or :meth:`Job.fail`. Every job ends exactly once.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import AsyncIterator, Callable

import trio

from trioserve.core.errors import ServeError
from trioserve.core.messages import Reply
from trioserve.core.request import InferenceRequest


class JobState(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    CANCELLED = "cancelled"


class Job:
    """One request travelling from an adapter to a worker and back."""

    __slots__ = (
        "_on_cancel",
        "_queue",
        "_recv",
        "_send",
        "enqueued_at",
        "request",
        "started_at",
        "state",
    )

    def __init__(self, request: InferenceRequest) -> None:
        self.request = request
        self.state = JobState.QUEUED
        self.enqueued_at = trio.current_time()
        self.started_at: float | None = None
        # Unbounded: a worker never blocks on a slow client; the stream for one job is
        # bounded by what its handler sends.
        self._send, self._recv = trio.open_memory_channel[tuple[Reply, bool] | ServeError](math.inf)
        self._queue: JobQueue | None = None
        self._on_cancel: Callable[[Job], None] | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    # -- worker side -------------------------------------------------------------------

    def start(self, on_cancel: Callable[[Job], None]) -> None:
        """A worker took the job; ``on_cancel`` tells that worker to stop it."""
        self.state = JobState.RUNNING
        self.started_at = trio.current_time()
        self._queue = None
        self._on_cancel = on_cancel

    def deliver(self, reply: Reply, *, final: bool) -> None:
        if self.state is not JobState.RUNNING:
            return
        try:
            self._send.send_nowait((reply, final))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        if final:
            self._end(JobState.DONE)

    def fail(self, error: ServeError) -> None:
        if self.state in (JobState.DONE, JobState.CANCELLED):
            return
        try:
            self._send.send_nowait(error)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        self._end(JobState.DONE)

    def _end(self, state: JobState) -> None:
        self.state = state
        self._on_cancel = None
        self._queue = None
        self._send.close()

    # -- adapter side ------------------------------------------------------------------

    async def replies(self) -> AsyncIterator[tuple[Reply, bool]]:
        """Each reply with its ``final`` flag; raises the job's error if it failed."""
        async for item in self._recv:
            if isinstance(item, ServeError):
                raise item
            yield item
            if item[1]:
                return

    def cancel(self) -> None:
        """The adapter no longer wants the answer. Safe to call in any state."""
        if self.state is JobState.QUEUED and self._queue is not None:
            self._queue.remove(self)
        elif self.state is JobState.RUNNING and self._on_cancel is not None:
            self._on_cancel(self)
        if self.state in (JobState.QUEUED, JobState.RUNNING):
            self._end(JobState.CANCELLED)
        self._recv.close()


class JobQueue:
    """A bounded FIFO of jobs that worker tasks wait on."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._jobs: deque[Job] = deque()
        self._lot = trio.lowlevel.ParkingLot()
        self._closed: ServeError | None = None

    def __len__(self) -> int:
        return len(self._jobs)

    @property
    def remaining_capacity(self) -> int:
        return max(0, self.capacity - len(self._jobs))

    def put(self, job: Job, full_error: Callable[[], ServeError]) -> None:
        if self._closed is not None:
            raise self._closed
        if len(self._jobs) >= self.capacity:
            raise full_error()
        job._queue = self
        self._jobs.append(job)
        self._lot.unpark()

    def put_front(self, job: Job) -> None:
        """Give back a job that was taken but never reached a worker."""
        job.state = JobState.QUEUED
        job._on_cancel = None
        job._queue = self
        self._jobs.appendleft(job)
        self._lot.unpark()

    def remove(self, job: Job) -> None:
        try:
            self._jobs.remove(job)
        except ValueError:
            pass

    async def get(self) -> Job:
        """Wait for the next job."""
        while not self._jobs:
            await self._lot.park()
        await trio.lowlevel.checkpoint_if_cancelled()
        return self._jobs.popleft()

    def get_nowait(self) -> Job | None:
        return self._jobs.popleft() if self._jobs else None

    def close(self, error: ServeError) -> None:
        """Refuse new jobs and fail every queued one with ``error``."""
        self._closed = error
        while self._jobs:
            self._jobs.popleft().fail(error)
