"""The queue of a stateful model version: sequence batching on a trio task.

:class:`SequenceBatcher` is what :class:`~trioserve.runtime.batcher.Batcher` is for stateless
models, with the same face to the worker supervisors (``worker_idle``, ``worker_gone``,
``requeue``...), driving the sans-IO :class:`~trioserve.core.sequences.SequencePolicy`: each
sequence keeps its own FIFO, is pinned to one worker for its life, has at most one request
in flight, and a batch takes at most one request per sequence. The dataplane opens or joins
a sequence with :meth:`SequenceBatcher.open` before it queues a request with :meth:`put`.

A request's end (its final answer, its failure, its cancellation) lets its sequence's next
request go, and so does, with continuous batching, a step that answered it "more to come"
(:meth:`SequenceBatcher.park`: the request stays in the worker's running batch, and the
sequence's next request may join that batch at the next step,
:meth:`SequenceBatcher.take_now`); a final answer that carries the sequence-end header
(``ts_request_sequence_end: <id>[;<id>...]``) closes those sequences. Idle and lifetime
limits are trio deadlines: the task wakes at the policy's next expiry. Requests of a closed
sequence still queued fail with a message naming the sequence and why it closed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

import trio

from trioserve.core import errors
from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.messages import Reply
from trioserve.core.model_settings import SequenceSettings
from trioserve.core.sequence_decisions import (
    CloseReason,
    Dispatch,
    Expired,
    SequenceClosed,
    SequenceQueueFull,
    TooManySequences,
)
from trioserve.core.sequences import SequencePolicy
from trioserve.runtime.batcher import DecisionLoop
from trioserve.runtime.jobs import Job, JobState

log = logging.getLogger("trioserve.runtime.sequence_batcher")

_EXPIRY_KINDS = {
    CloseReason.ENDED: ErrorKind.BAD_INPUT,
    CloseReason.IDLE: ErrorKind.TIMEOUT,
    CloseReason.LIFETIME: ErrorKind.TIMEOUT,
    CloseReason.WORKER_FAILED: ErrorKind.WORKER_FAILED,
}


class SequenceTaker(Protocol):
    def __hash__(self) -> int: ...

    def assign(self, batch: list[Job]) -> None: ...


def sequence_closed(error: SequenceClosed) -> ServeError:
    return ServeError(ErrorKind.BAD_INPUT, str(error), reason="SequenceClosedException")


class SequenceBatcher(DecisionLoop):
    """``batch_size`` is the most requests one batch (one step) holds: the model version's
    ``ModelSettings.batch_capacity``, twice ``batchSize`` with continuous batching."""

    def __init__(
        self,
        settings: SequenceSettings,
        *,
        batch_size: int,
        id_header: str,
        end_header: str,
    ) -> None:
        self._policy: SequencePolicy[Job, SequenceTaker] = SequencePolicy(
            batch_size=batch_size,
            max_sequences=settings.max_sequences,
            max_queue_per_sequence=settings.max_queue,
            idle_timeout=settings.max_idle_msec / 1000 if settings.max_idle_msec else None,
            lifetime=settings.timeout_msec / 1000 if settings.timeout_msec else None,
            id_header=id_header,
        )
        self.settings = settings
        self._end_header = end_header.lower()
        self._changed = trio.Event()
        self._closed: ServeError | None = None
        self._queued = 0
        # Continuous batching: dispatched jobs answered "more to come" that have not ended.
        self._parked: set[Job] = set()

    # -- what describe shows ---------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return self.settings.max_sequences * self.settings.max_queue

    def __len__(self) -> int:
        return self._queued

    @property
    def remaining_capacity(self) -> int:
        return max(0, self.capacity - self._queued)

    @property
    def open_sequences(self) -> int:
        return self._policy.open_count

    # -- sequences and requests ------------------------------------------------------------

    def open(self, sequence_id: str | None) -> tuple[str, bool]:
        """Join the open sequence ``sequence_id``, or open one (a new id for ``None``):
        ``(id, True)`` when it was opened now."""
        if self._closed is not None:
            raise self._closed
        try:
            opened = self._policy.open(sequence_id, trio.current_time())
        except SequenceClosed as error:
            raise sequence_closed(error) from None
        except TooManySequences as error:
            raise ServeError(ErrorKind.UNAVAILABLE, str(error), retry_after=1) from None
        self._changed.set()  # a new sequence's idle clock runs from now
        return opened

    def put(self, job: Job, full_error: Callable[[], ServeError]) -> None:
        """Queue ``job`` in its sequence (``job.request.sequence_id``, opened already)."""
        if self._closed is not None:
            raise self._closed
        sequence_id = job.request.sequence_id
        assert sequence_id is not None, "open the sequence first"
        try:
            self._policy.submit(sequence_id, job, trio.current_time())
        except SequenceClosed as error:
            raise sequence_closed(error) from None
        except SequenceQueueFull as error:
            raise ServeError(ErrorKind.UNAVAILABLE, str(error), retry_after=1) from None
        self._queued += 1
        job.queued_in(self.remove)
        self._changed.set()

    def remove(self, job: Job) -> None:
        if self._policy.cancel(job, trio.current_time()):
            self._queued -= 1
            self._changed.set()

    def close(self, error: ServeError) -> None:
        """Refuse new requests and fail every queued one with ``error``."""
        self._closed = error
        for sequence_id in self._policy.open_ids():
            for job in self._policy.end(sequence_id, trio.current_time()):
                self._queued -= 1
                job.fail(error)

    # -- workers -----------------------------------------------------------------------------

    def worker_idle(self, worker: SequenceTaker) -> None:
        self._policy.worker_idle(worker, trio.current_time())
        self._changed.set()

    def worker_prefetch(self, worker: SequenceTaker) -> None:
        """Sequence batching sends nothing behind a running batch (a sequence's next request
        waits for the answer to its previous one)."""

    def offer_behind_now(self, worker: SequenceTaker) -> None:
        """See :meth:`worker_prefetch`."""

    def take_now(self, worker: SequenceTaker, room: int) -> None:
        """Continuous batching: ``worker`` starts the next step of its running batch now, with
        ``room`` free slots; the ready heads of its sequences (up to ``room``) are assigned
        to it before this returns. The worker is busy afterwards."""
        decision = self._policy.take(worker, room, trio.current_time())
        if decision is not None:
            self._send(decision)
        self._changed.set()  # expiries found meanwhile are the task's

    def park(self, jobs: Sequence[Job]) -> None:
        """Continuous batching: ``jobs`` were answered "more to come" and go on in their
        worker's next step; each one's sequence may send its next request now."""
        for job in jobs:
            if job in self._parked or job.state is not JobState.RUNNING:
                continue
            sequence_id = job.request.sequence_id
            assert sequence_id is not None
            self._parked.add(job)
            try:
                # The clock read for each: a failed one is closed at a later time.
                self._policy.park(sequence_id, trio.current_time())
            except Exception:
                self._bookkeeping_failed(job)
        self._changed.set()

    def worker_gone(self, worker: SequenceTaker) -> None:
        for expired in self._policy.worker_gone(worker, trio.current_time()):
            self._fail_expired(expired)
        self._changed.set()

    def requeue(self, worker: SequenceTaker, jobs: Sequence[Job]) -> None:
        """Requests dispatched to ``worker`` that never reached it. Their sequences are
        pinned to that worker, which is stopping or gone: they fail (their sequence's next
        request may go), instead of running out of order elsewhere; and their sequences close
        now, before a client told of the failure can send the next request of one."""
        if not jobs:
            return
        for expired in self._policy.worker_gone(worker, trio.current_time()):
            self._fail_expired(expired)
        for job in jobs:
            if job.state is JobState.QUEUED:
                job.fail(errors.worker_died("The worker stopped before this request reached it."))
        self._changed.set()

    # -- the task ----------------------------------------------------------------------------

    def _fail_expired(self, expired: Expired[Job]) -> None:
        kind = _EXPIRY_KINDS[expired.reason]
        for job in expired.items:
            self._queued -= 1
            job.fail(ServeError(kind, expired.message, reason="SequenceClosedException"))

    def _ended(self, job: Job, reply: Reply | None) -> None:
        """A dispatched request ended: its sequence's next may go; an end header closes.

        Called from whatever ended the job (a worker's frame reader, a client leaving), so
        it never raises into it: a bookkeeping error is logged and closes the sequence."""
        try:
            self._record_end(job, reply)
        except Exception:
            self._bookkeeping_failed(job)
        self._changed.set()

    def _bookkeeping_failed(self, job: Job) -> None:
        """The policy refused an event of ``job`` (a bug): log it and close the sequence, so
        that its queued requests fail saying it closed and its next ones are refused, rather
        than run out of order. Never raises into the caller (a frame reader, a client)."""
        log.exception("sequence bookkeeping failed for request %s", job.request_id)
        if job.request.sequence_id is not None:
            self._end(job.request.sequence_id, trio.current_time())

    def _record_end(self, job: Job, reply: Reply | None) -> None:
        now = trio.current_time()
        sequence_id = job.request.sequence_id
        assert sequence_id is not None
        if job in self._parked:
            self._parked.discard(job)
            self._policy.stream_done(sequence_id, now)
        else:
            self._policy.done(sequence_id, now)
        if job.request.ends_sequence:
            self._end(sequence_id, now)
        if reply is not None:
            for name, value in reply.headers.items():
                if name.lower() == self._end_header:
                    for ended in filter(None, (part.strip() for part in value.split(";"))):
                        self._end(ended, now)

    def _end(self, sequence_id: str, now: float) -> None:
        """Close ``sequence_id``; requests of it still queued fail saying so."""
        for queued in self._policy.end(sequence_id, now):
            self._queued -= 1
            queued.fail(sequence_closed(self._policy.closed_error(sequence_id)))

    def _apply(self, now: float) -> None:
        for decision in self._policy.poll(now):
            if isinstance(decision, Expired):
                self._fail_expired(decision)
            elif isinstance(decision, Dispatch):
                self._send(decision)

    def _send(self, decision: Dispatch[Job, SequenceTaker]) -> None:
        batch = list(decision.items)
        self._queued -= len(batch)
        for job in batch:
            job.on_end = self._ended
        decision.worker.assign(batch)

    def _next_wakeup(self, now: float) -> float | None:
        return self._policy.next_wakeup(now)
