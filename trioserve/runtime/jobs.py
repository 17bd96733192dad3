"""Jobs: one accepted request each, from its adapter to a worker and back.

A job is owned by the adapter task that accepted it (an HTTP route, a gRPC method). The
adapter reads the job's replies; when it goes away (client disconnect, deadline) it calls
:meth:`Job.cancel`, which removes a queued job from its queue (the model version's batcher)
or asks the worker running it to stop. A worker task delivers replies with
:meth:`Job.deliver` and ends the job with the final reply or :meth:`Job.fail`. Every job
ends exactly once.
"""

from __future__ import annotations

import enum
import math
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
        "_recv",
        "_remove",
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
        self._remove: Callable[[Job], None] | None = None
        self._on_cancel: Callable[[Job], None] | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    # -- worker side -------------------------------------------------------------------

    def queued_in(self, remove: Callable[[Job], None]) -> None:
        """The job waits in a queue; ``remove`` takes it out if the adapter cancels it."""
        self.state = JobState.QUEUED
        self._on_cancel = None
        self._remove = remove

    def start(self, on_cancel: Callable[[Job], None]) -> None:
        """A worker took the job; ``on_cancel`` tells that worker to stop it."""
        self.state = JobState.RUNNING
        self.started_at = trio.current_time()
        self._remove = None
        self._on_cancel = on_cancel

    def unstart(self) -> None:
        """The job's batch never reached the worker: it is queued again (by the caller)."""
        self.state = JobState.QUEUED
        self.started_at = None
        self._on_cancel = None

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
        self._remove = None
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
        if self.state is JobState.QUEUED and self._remove is not None:
            self._remove(self)
        elif self.state is JobState.RUNNING and self._on_cancel is not None:
            self._on_cancel(self)
        if self.state in (JobState.QUEUED, JobState.RUNNING):
            self._end(JobState.CANCELLED)
        self._recv.close()
