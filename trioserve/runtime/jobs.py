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
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable

import trio

from trioserve.core.errors import ServeError
from trioserve.core.messages import Reply
from trioserve.core.request import InferenceRequest
from trioserve.runtime.parking import Parked


class _Wake:
    """A job's waiter that calls a function instead of waking a task."""

    __slots__ = ("set",)

    def __init__(self, wake: Callable[[], object]) -> None:
        self.set = wake


class JobState(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    CANCELLED = "cancelled"


class Job:
    """One request travelling from an adapter to a worker and back."""

    __slots__ = (
        "_closed",
        "_ended",
        "_input_sink",
        "_inputs",
        "_items",
        "_on_cancel",
        "_remove",
        "_waiter",
        "enqueued_at",
        "on_end",
        "on_read",
        "request",
        "started_at",
        "state",
    )

    def __init__(self, request: InferenceRequest) -> None:
        self.request = request
        self.state = JobState.QUEUED
        self.enqueued_at = trio.current_time()
        self.started_at: float | None = None
        # Replies not yet read. Unbounded: a worker never blocks on a slow client; what one
        # job holds is bounded by what its handler sends.
        self._items: deque[tuple[Reply, bool] | ServeError] = deque()
        # Set when an item arrives or the job ends.
        self._waiter: Parked | _Wake | None = None
        self._ended = False  # no more items will come
        self._closed = False  # the adapter is gone: items are dropped
        self._remove: Callable[[Job], None] | None = None
        self._on_cancel: Callable[[Job], None] | None = None
        # Told once when the job ends (answered, failed or cancelled), with its final reply
        # if it had one: a sequence's next request may go once this one has ended.
        self.on_end: Callable[[Job, Reply | None], None] | None = None
        # A streamed request: its further inputs (frames for its worker, held until the job
        # reached one) and, told each time the adapter reads an intermediate reply, the
        # worker's send window (see :meth:`stream_to`).
        self._inputs: list[bytes] = []
        self._input_sink: Callable[[bytes], None] | None = None
        self.on_read: Callable[[], None] | None = None

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

    def stream_to(self, sink: Callable[[bytes], None], on_read: Callable[[], None]) -> None:
        """The job's batch is on its worker: further inputs go to ``sink`` (those held so far
        first), and each intermediate reply the adapter reads is told to ``on_read``."""
        self._input_sink = sink
        self.on_read = on_read
        held, self._inputs = self._inputs, []
        for frame in held:
            sink(frame)

    def send_input(self, frame: bytes) -> None:
        """One more input of a streamed request (a STREAM_INPUT frame), in order."""
        if self._ended or self._closed:
            return
        if self._input_sink is None:
            self._inputs.append(frame)
        else:
            self._input_sink(frame)

    def unstart(self) -> None:
        """The job's batch never reached the worker: it is queued again (by the caller)."""
        self.state = JobState.QUEUED
        self.started_at = None
        self._on_cancel = None

    def deliver(self, reply: Reply, *, final: bool) -> None:
        if self.state is not JobState.RUNNING:
            return
        self._push((reply, final))
        if final:
            self._end(JobState.DONE, reply)

    def fail(self, error: ServeError) -> None:
        if self.state in (JobState.DONE, JobState.CANCELLED):
            return
        self._push(error)
        self._end(JobState.DONE)

    def _push(self, item: tuple[Reply, bool] | ServeError) -> None:
        if self._closed or self._ended:
            return
        self._items.append(item)
        self._wake()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.set()

    def _end(self, state: JobState, reply: Reply | None = None) -> None:
        self.state = state
        self._on_cancel = None
        self._input_sink = None
        self._inputs = []
        self._remove = None
        self._ended = True
        self._wake()
        on_end, self.on_end = self.on_end, None
        if on_end is not None:
            on_end(self, reply)

    # -- adapter side ------------------------------------------------------------------

    async def next_reply(self) -> tuple[Reply, bool]:
        """The next reply with its ``final`` flag; raises the job's error if it failed,
        ``trio.EndOfChannel`` after the final one and ``trio.ClosedResourceError`` once the
        adapter has cancelled the job."""
        while True:
            item = self.poll()
            if item is not None:
                return item
            waiter = self._waiter = Parked()
            await waiter.wait()

    def poll(self) -> tuple[Reply, bool] | None:
        """:meth:`next_reply` without waiting: None when no reply has arrived yet."""
        if self._closed:
            raise trio.ClosedResourceError("the job was cancelled")
        if not self._items:
            if self._ended:
                raise trio.EndOfChannel
            return None
        item = self._items.popleft()
        if isinstance(item, ServeError):
            raise item
        if not item[1] and self.on_read is not None:
            self.on_read()
        return item

    def replies(self) -> AsyncIterator[tuple[Reply, bool]]:
        """Each reply with its ``final`` flag; raises the job's error if it failed."""
        return each_reply(self.next_reply)

    def when_ready(self, wake: Callable[[], object]) -> None:
        """Call ``wake()`` (once, in Trio) when :meth:`poll` has something new to say: a
        reply, the end or the cancellation. For adapters that wait without a Trio task."""
        self._waiter = _Wake(wake)

    def cancel(self) -> None:
        """The adapter no longer wants the answer. Safe to call in any state."""
        if self.state is JobState.QUEUED and self._remove is not None:
            self._remove(self)
        elif self.state is JobState.RUNNING and self._on_cancel is not None:
            self._on_cancel(self)
        if self.state in (JobState.QUEUED, JobState.RUNNING):
            self._end(JobState.CANCELLED)
        self._closed = True
        self._items.clear()
        self._wake()


async def each_reply(
    next_reply: Callable[[], Awaitable[tuple[Reply, bool]]],
) -> AsyncIterator[tuple[Reply, bool]]:
    """Each reply ``next_reply`` gives, with its ``final`` flag, up to the final one."""
    while True:
        try:
            item = await next_reply()
        except trio.EndOfChannel:
            return
        yield item
        if item[1]:
            return
