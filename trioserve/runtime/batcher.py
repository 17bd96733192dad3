"""The batcher of one model version: a trio task driving the sans-IO BatchPolicy.

Adapters put jobs in; workers say when they are idle and receive batches in their inbox.
The policy (``core/batching.py``) decides what goes where and when; this module only feeds it
events and the clock, sleeps until its next wake-up or the next event, and carries out its
decisions. It is also the job queue of the model version: it answers for its length and
capacity, removes cancelled jobs, and fails queued jobs when the model goes away.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Sequence
from typing import Protocol

import trio

from trioserve.core import errors
from trioserve.core.batching import BatchPolicy, Dispatch, Expire, QueueFull
from trioserve.core.errors import ServeError
from trioserve.runtime.jobs import Job, JobState
from trioserve.runtime.parking import wait_until


class BatchTaker(Protocol):
    """A worker, as the batcher sees it (hashed by identity)."""

    def __hash__(self) -> int: ...

    def assign(self, batch: list[Job]) -> None:
        """Hand over a batch (the worker told the batcher it was idle)."""


class DecisionLoop(abc.ABC):
    """The trio task of a sans-IO queue policy: apply its decisions, sleep until its next
    wake-up or until something changes (``_changed`` is set), again."""

    _changed: trio.Event

    @abc.abstractmethod
    def _apply(self, now: float) -> None:
        """Carry out the policy's decisions due at ``now``."""

    @abc.abstractmethod
    def _next_wakeup(self, now: float) -> float | None:
        """When the policy next needs a pass without an event (None: not before one)."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            self._apply(trio.current_time())
            # The clock is read again: what a pass carried out may have told the policy of
            # later events (a worker failing as its batch is handed over gives the batch
            # back), and a policy refuses to be asked about a time before them.
            wakeup = self._next_wakeup(trio.current_time())
            await wait_until(self._changed, math.inf if wakeup is None else wakeup)
            self._changed = trio.Event()


class Batcher(DecisionLoop):
    def __init__(
        self,
        *,
        batch_size: int,
        max_delay: float,
        capacity: int,
        queue_timeout: float | None = None,
    ) -> None:
        """``queue_timeout``: the longest a request may wait in the queue, in seconds
        (``clientTimeoutInMills``); it then fails unrun, as one whose deadline passed."""
        self._policy: BatchPolicy[Job, BatchTaker] = BatchPolicy(
            batch_size=batch_size, max_delay=max_delay, capacity=capacity
        )
        self._queue_timeout = queue_timeout
        self._changed = trio.Event()
        self._closed: ServeError | None = None

    # -- the queue -------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return self._policy.capacity

    def __len__(self) -> int:
        return len(self._policy)

    @property
    def remaining_capacity(self) -> int:
        return max(0, self.capacity - len(self._policy))

    def put(self, job: Job, full_error: Callable[[], ServeError]) -> None:
        if self._closed is not None:
            raise self._closed
        now = trio.current_time()
        deadline = job.request.deadline
        if self._queue_timeout is not None:
            limit = now + self._queue_timeout
            deadline = limit if deadline is None else min(deadline, limit)
        try:
            self._policy.submit(job, now, deadline)
        except QueueFull:
            raise full_error() from None
        job.queued_in(self.remove)
        self._apply_now(now)

    def remove(self, job: Job) -> None:
        self._policy.cancel(job)

    def close(self, error: ServeError) -> None:
        """Refuse new jobs and fail every queued one with ``error``."""
        self._closed = error
        for job in self._policy.drain():
            job.fail(error)

    # -- workers ---------------------------------------------------------------------

    def worker_idle(self, worker: BatchTaker) -> None:
        self._policy.worker_idle(worker)
        if self._policy.has_work:
            self._apply_now(trio.current_time())

    def worker_prefetch(self, worker: BatchTaker) -> None:
        """The busy ``worker`` will take a full batch behind the one it runs."""
        self._policy.worker_prefetch(worker)
        self._wake_if_work()

    def offer_behind_now(self, worker: BatchTaker) -> None:
        """As :meth:`worker_prefetch`, but a full batch already queued is assigned before
        this returns, not when the batcher's task next runs.

        For the worker's frame reader, the moment the batch a worker was running ends: the
        full batch goes out in the same scheduler pass, ahead of the answers' HTTP writes.
        Only ever dispatches (or expires) what :meth:`run` would at its next pass; the task's
        own sleep is unaffected (dispatching only moves its next wake-up later).
        """
        self._policy.worker_prefetch(worker)
        if self._policy.has_work:
            self._apply(trio.current_time())

    def take_now(self, worker: BatchTaker, room: int) -> None:
        """Continuous batching: ``worker`` starts the next step of its running batch now, with
        ``room`` free slots; what is queued (up to ``room``) is assigned to it before this
        returns, without waiting for a window. The worker is busy afterwards."""
        items = self._policy.take(worker, room, trio.current_time())
        if items:
            worker.assign(items)

    def park(self, jobs: Sequence[Job]) -> None:
        """Continuous batching: ``jobs`` go on in the next step. Nothing to do for a stateless
        queue (see :meth:`SequenceBatcher.park`)."""

    def _wake_if_work(self) -> None:
        # With nothing queued, a worker's offer changes no decision: the task sleeps on
        # (one scheduler pass saved per offer; at one request at a time, two per request).
        if self._policy.has_work:
            self._changed.set()

    def _apply_now(self, now: float) -> None:
        """After a job or an idle worker came: what is due goes out from the caller's task,
        before this returns (a lone request reaches an idle worker without waiting for the
        batcher's task to run); the task is woken only when something stays queued, to
        sleep until that is due instead."""
        self._apply(now)
        if self._policy.has_work:
            self._changed.set()

    def worker_gone(self, worker: BatchTaker) -> None:
        self._policy.worker_gone(worker)
        self._changed.set()

    def requeue(self, worker: BatchTaker, jobs: Sequence[Job]) -> None:
        """Jobs dispatched to ``worker`` that never reached it go back to the queue."""
        wanted = [job for job in jobs if job.state is JobState.QUEUED]
        if self._closed is not None:
            for job in wanted:
                job.fail(self._closed)
            self._policy.requeue(worker, [])
            return
        self._policy.requeue(worker, wanted)
        for job in wanted:
            job.queued_in(self.remove)
        self._changed.set()

    # -- the task --------------------------------------------------------------------

    def _apply(self, now: float) -> None:
        for decision in self._policy.poll(now):
            if isinstance(decision, Expire):
                for job in decision.items:
                    job.fail(errors.deadline_passed())
            elif isinstance(decision, Dispatch):
                decision.worker.assign(list(decision.items))

    def _next_wakeup(self, now: float) -> float | None:
        return self._policy.next_wakeup(now)
