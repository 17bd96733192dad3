"""Sequence batching for one model version (sans-IO): TorchServe's stateful sequences.

:class:`SequencePolicy` decides which request of which sequence goes to which worker, and
when a sequence closes. Like :class:`~trioserve.core.batching.BatchPolicy` it holds no trio,
reads no clock and does no I/O: the driver (a trio task per model version) passes ``now``
(``trio.current_time()``) into every call and acts on what comes back::

    policy.open(sequence_id or None, now)  # -> (id, newly opened); SequenceClosed, TooMany...
    policy.submit(sequence_id, item, now)  # SequenceClosed, SequenceQueueFull
    policy.cancel(item)                    # the client went away; True if it was queued
    policy.done(sequence_id, now)          # its request in flight was answered
    policy.park(sequence_id, now)          # ... "more to come" (continuous batching)
    policy.stream_done(sequence_id, now)   # a parked request ended
    policy.end(sequence_id, now)           # -> queued items to fail; the sequence is closed
    policy.worker_idle(w, now) / worker_busy(w, now)
    policy.worker_gone(w, now)             # -> [Expired] of the sequences pinned to w
    policy.take(w, room, now)              # continuous batching: a step's new requests

    for decision in policy.poll(now):      # after every event, and at every wake-up
        Expired(sequence_id, items, message, reason)  # closed on its own: fail the items
        Dispatch(worker, items, sequence_ids)         # send as one batch
    policy.next_wakeup(now)                # sleep until then (or until the next event)

``next_wakeup`` is exact, as BatchPolicy's: ``poll`` earlier returns nothing, ``poll`` then
returns something, ``None`` means nothing happens until an event. Time must not go backwards.

The rules
---------

* A request naming a never-seen id (or none: the policy mints ``ts-seq-<uuid4>``) opens a
  sequence. At most ``max_sequences`` (maxNumSequence) are open; one more is refused at once
  (:class:`TooManySequences`), not left waiting for a slot as in TorchServe. A sequence that
  closes frees its slot at once.
* Each sequence has its own FIFO of at most ``max_queue_per_sequence`` requests
  (maxSequenceJobQueueSize, else :class:`SequenceQueueFull`) and at most one request in
  flight, the next waiting for ``done``: its requests run strictly in order, never two in a
  batch.
* Continuous batching: a request whose step was answered "more to come" stays in the
  worker's running batch; :meth:`SequencePolicy.park` then lets the sequence's next request
  go (TorchServe's example sends ``-1`` to cancel a stream that is still running: it must
  reach the same running batch), and the sequence is not idle until every parked request of
  it has ended (:meth:`SequencePolicy.stream_done`). Between steps, :meth:`SequencePolicy.take`
  fills the running batch's free slots at once from the ready sequences (no waiting). For
  this, the driver's ``batch_size`` is twice the model's ``batchSize``
  (:attr:`~trioserve.core.model_settings.ModelSettings.batch_capacity`, TorchServe's rule):
  a running stream then leaves room for its own sequence's next request even with
  ``batchSize: 1``.
* A sequence is pinned to one worker for its life (its state lives there): at its first
  dispatch, to the known worker with the fewest pinned open sequences (ties: an idle worker
  with room in this poll, then the one idle first). It waits for a busy least-loaded worker
  rather than unbalance them.
* An idle worker gets at once (no batching delay) up to ``batch_size`` heads of its
  sequences, oldest *ready* first. A sequence is ready when it has a request queued and none
  in flight, and goes to the back of the ready order each time it becomes ready: round-robin,
  so a ready sequence waits at most ``(max_sequences - 1) // batch_size`` idle turns of its
  worker, however many requests the others have queued.
* A sequence closes on ``end``, when idle (nothing queued or in flight) for ``idle_timeout``
  (sequenceMaxIdleMSec), when ``lifetime`` (sequenceTimeoutMSec) old, or when its worker is
  gone. Its queued requests are handed back to be failed; one in flight is left to finish.
  Expiry happens at the due time itself; one found by another call is reported by ``poll``.
* The last ``closed_capacity`` closed ids are remembered: a request naming one is refused
  with :class:`SequenceClosed` saying why it closed, not silently reopened without the state
  the client expects (as TorchServe 0.12 does).

Items and workers are hashable values compared by equality; an item may be queued once at a
time. The decision and error types, the expiry timers and the closed-id memory are in
:mod:`trioserve.core.sequence_decisions`. What is left here runs past 400 lines and stays one
module: :class:`SequencePolicy` is one state machine whose events, plan and expiries all read
and change the same sequences, ready order and worker pins, and this docstring is the
reference for its rules.
"""

from __future__ import annotations

import functools
import math
import uuid
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

from trioserve.core.sequence_decisions import (
    DEFAULT_SEQUENCE_ID_HEADER,
    ClosedIds,
    CloseReason,
    Decision,
    Dispatch,
    Expired,
    ExpiryTimers,
    SequenceClosed,
    SequenceError,
    SequenceQueueFull,
    SequenceState,
    TooManySequences,
    check_count,
    check_seconds,
    closed_message,
)

__all__ = [
    "CloseReason",
    "Decision",
    "Dispatch",
    "Expired",
    "SequenceClosed",
    "SequenceError",
    "SequencePolicy",
    "SequenceQueueFull",
    "TooManySequences",
]

T = TypeVar("T", bound=Hashable)
W = TypeVar("W", bound=Hashable)
_LIFETIME, _IDLE = 0, 1  # timer kinds; at the same due time the lifetime is the reason


def mint_sequence_id() -> str:
    """A new sequence's id, as TorchServe mints them (``ts-seq-<uuid4>``)."""
    return f"ts-seq-{uuid.uuid4()}"


class SequencePolicy(Generic[T, W]):
    """Sequence batching decisions for one model version; see the module docstring."""

    def __init__(
        self,
        *,
        batch_size: int,
        max_sequences: int,
        max_queue_per_sequence: int,
        idle_timeout: float | None = None,
        lifetime: float | None = None,
        closed_capacity: int = 10_000,
        id_header: str = DEFAULT_SEQUENCE_ID_HEADER,
    ) -> None:
        self._batch_size = check_count("batch_size", batch_size, 1)
        self._max_sequences = check_count("max_sequences", max_sequences, 1)
        self._max_queue = check_count("max_queue_per_sequence", max_queue_per_sequence, 1)
        self._idle_timeout = check_seconds("idle_timeout", idle_timeout)
        self._lifetime = check_seconds("lifetime", lifetime)
        self._message = functools.partial(
            closed_message,
            idle_timeout=self._idle_timeout,
            lifetime=self._lifetime,
            id_header=id_header,
        )
        self._open: dict[str, SequenceState[T, W]] = {}
        # Sequences with a request queued and none in flight, in the order they became so.
        self._ready: OrderedDict[str, SequenceState[T, W]] = OrderedDict()
        self._closed = ClosedIds(closed_capacity)
        self._pending: list[SequenceState[T, W]] = []  # expired, not yet reported by poll
        self._where: dict[T, SequenceState[T, W]] = {}  # queued item -> its sequence
        self._timers: ExpiryTimers[SequenceState[T, W]] = ExpiryTimers(self._live)
        self._pins: dict[W, dict[str, SequenceState[T, W]]] = {}  # known worker -> pinned
        self._idle: OrderedDict[W, None] = OrderedDict()  # idle first, first
        self._stamp: dict[W, int] = {}  # when each worker last became idle (or known)
        self._ticks = 0  # counts workers becoming idle or known
        self._now = -math.inf

    # -- observation -----------------------------------------------------------------------

    @property
    def open_count(self) -> int:
        """Open sequences (each holds one of ``max_sequences`` slots)."""
        return len(self._open)

    @property
    def has_work(self) -> bool:
        """An expiry to report, or a request ready (maybe waiting for its worker)."""
        return bool(self._pending or self._ready)

    def is_open(self, sequence_id: str) -> bool:
        return sequence_id in self._open

    def open_ids(self) -> list[str]:
        """The ids of the open sequences, oldest first."""
        return list(self._open)

    def pinned(self, worker: W) -> int:
        """How many open sequences are pinned to ``worker``."""
        return len(self._pins.get(worker, ()))

    def worker_of(self, sequence_id: str) -> W | None:
        """The worker an open sequence is pinned to (None: not yet dispatched, or not open)."""
        seq = self._open.get(sequence_id)
        return None if seq is None else seq.worker

    def sequence_of(self, item: T) -> str | None:
        """The sequence of a queued ``item`` (None when it is not queued)."""
        seq = self._where.get(item)
        return None if seq is None else seq.id

    def queued(self, sequence_id: str) -> list[T]:
        """The queued items of an open sequence, oldest first ([] when it is not open)."""
        seq = self._open.get(sequence_id)
        return [] if seq is None else list(seq.queue)

    def closed_error(self, sequence_id: str) -> SequenceClosed:
        """The error for a request naming ``sequence_id``, which is not open."""
        reason = self._closed.get(sequence_id)
        return SequenceClosed(sequence_id, reason, self._message(sequence_id, reason))

    # -- events ----------------------------------------------------------------------------

    def open(self, sequence_id: str | None, now: float) -> tuple[str, bool]:
        """Open a sequence (``(id, True)``, a minted id for ``None``) or join an open one
        (``(sequence_id, False)``). :class:`SequenceClosed` for a remembered closed id,
        :class:`TooManySequences` when ``max_sequences`` are open."""
        self._advance(now)
        if sequence_id is not None:
            if not sequence_id:
                raise ValueError("a sequence id must not be empty")
            if sequence_id in self._open:
                return sequence_id, False
            if sequence_id in self._closed:
                raise self.closed_error(sequence_id)
        if len(self._open) >= self._max_sequences:
            raise TooManySequences(self._max_sequences)
        if sequence_id is None:
            sequence_id = mint_sequence_id()
        seq: SequenceState[T, W] = SequenceState(sequence_id, now)
        self._open[sequence_id] = seq
        if self._lifetime is not None:
            self._timers.push(now + self._lifetime, _LIFETIME, seq)
        self._become_idle(seq, now)
        return sequence_id, True

    def submit(self, sequence_id: str, item: T, now: float) -> None:
        """Queue ``item`` as the next request of an open sequence (else
        :class:`SequenceClosed`; :class:`SequenceQueueFull` when its queue is full)."""
        self._advance(now)
        seq = self._open.get(sequence_id)
        if seq is None:
            raise self.closed_error(sequence_id)
        if item in self._where:
            raise ValueError(f"{item!r} is already queued")
        if len(seq.queue) >= self._max_queue:
            raise SequenceQueueFull(sequence_id, self._max_queue)
        seq.queue.append(item)
        self._where[item] = seq
        seq.idle_since = None
        if not seq.in_flight and len(seq.queue) == 1:
            self._ready[seq.id] = seq

    def cancel(self, item: T, now: float | None = None) -> bool:
        """Forget a queued ``item``; False when it is not queued (dispatched already, or
        handed back). A sequence left with nothing queued or in flight is idle from now."""
        if now is not None:
            self._advance(now)
        seq = self._where.pop(item, None)
        if seq is None:
            return False
        seq.queue.remove(item)
        if seq.closed is None and not seq.queue:
            self._ready.pop(seq.id, None)
            if not seq.in_flight and not seq.streaming:
                self._become_idle(seq, self._now)
        return True

    def done(self, sequence_id: str, now: float) -> None:
        """The request of ``sequence_id`` in flight is answered: its next may go, or it is idle
        from now. Ignored once it is closed; ``ValueError`` if it has nothing in flight."""
        self._advance(now)
        seq = self._open.get(sequence_id)
        if seq is None:
            return
        if not seq.in_flight:
            raise ValueError(f"sequence {sequence_id!r} has no request in flight")
        seq.in_flight = False
        if seq.queue:
            self._ready[seq.id] = seq
        elif not seq.streaming:
            self._become_idle(seq, now)

    def park(self, sequence_id: str, now: float) -> None:
        """Continuous batching: the request of ``sequence_id`` in flight was answered "more to
        come" and stays in its worker's running batch. The sequence's next request may go;
        the sequence is not idle until :meth:`stream_done`. Ignored once it is closed;
        ``ValueError`` if it has nothing in flight."""
        self._advance(now)
        seq = self._open.get(sequence_id)
        if seq is None:
            return
        if not seq.in_flight:
            raise ValueError(f"sequence {sequence_id!r} has no request in flight")
        seq.in_flight = False
        seq.streaming += 1
        if seq.queue:
            self._ready[seq.id] = seq

    def stream_done(self, sequence_id: str, now: float) -> None:
        """A parked request of ``sequence_id`` ended (its last answer, a failure, or its
        client left). Ignored once it is closed; ``ValueError`` if none is parked."""
        self._advance(now)
        seq = self._open.get(sequence_id)
        if seq is None:
            return
        if not seq.streaming:
            raise ValueError(f"sequence {sequence_id!r} has no parked request")
        seq.streaming -= 1
        if not seq.streaming and not seq.in_flight and not seq.queue:
            self._become_idle(seq, now)

    def end(self, sequence_id: str, now: float) -> list[T]:
        """Close ``sequence_id`` (its handler or client ended it) and return its queued items,
        to be failed; a request in flight is left to finish. [] when it is not open."""
        self._advance(now)
        seq = self._open.get(sequence_id)
        if seq is None:
            return []
        self._close(seq, CloseReason.ENDED)
        return self._take(seq)

    def worker_idle(self, worker: W, now: float) -> None:
        """``worker`` can take a batch: a new worker, or its batch is answered."""
        self._advance(now)
        self._pins.setdefault(worker, {})
        if worker not in self._idle:
            self._idle[worker] = None
            self._ticks += 1
            self._stamp[worker] = self._ticks

    def worker_busy(self, worker: W, now: float) -> None:
        """``worker`` serves (its sequences stay pinned) but cannot take a batch now."""
        self._advance(now)
        if worker not in self._pins:
            self._pins[worker] = {}
            self._ticks += 1
            self._stamp[worker] = self._ticks
        self._idle.pop(worker, None)

    def worker_gone(self, worker: W, now: float) -> list[Expired[T]]:
        """``worker`` no longer serves: close the sequences pinned to it (their state is lost)
        and return them with their queued items to fail (those in flight are the driver's)."""
        self._advance(now)
        self._idle.pop(worker, None)
        self._stamp.pop(worker, None)
        pinned = list(self._pins.pop(worker, {}).values())
        for seq in pinned:
            self._close(seq, CloseReason.WORKER_FAILED)
        return [self._expired(seq) for seq in pinned]

    # -- decisions -------------------------------------------------------------------------

    def poll(self, now: float) -> list[Decision[T, W]]:
        """The decisions due at ``now``: the expiries first, then one batch per idle worker
        that has ready sequences, in the order the workers became idle."""
        self._advance(now)
        decisions: list[Decision[T, W]] = [self._expired(seq) for seq in self._pending]
        self._pending.clear()
        for worker, batch in self._plan(self._idle_rooms()).items():
            del self._idle[worker]
            decisions.append(self._dispatch(worker, batch))
        return decisions

    def take(self, worker: W, room: int, now: float) -> Dispatch[T, W] | None:
        """Continuous batching: ``worker`` starts the next step of its running batch now and
        has ``room`` free slots (at most ``batch_size`` count). It takes at once (no waiting)
        what an idle worker with that much room would get, and is busy. None when nothing is
        ready for it; expiries found meanwhile are left for :meth:`poll`. A refused ``room``
        changes nothing."""
        if isinstance(room, bool) or not isinstance(room, int) or room < 0:
            raise ValueError(f"room must be an integer >= 0, not {room!r}")
        self.worker_busy(worker, now)
        room = min(room, self._batch_size)
        batch = self._plan({worker: room}).get(worker) if room else None
        return self._dispatch(worker, batch) if batch else None

    def next_wakeup(self, now: float) -> float | None:
        """When to call :meth:`poll` if no event comes first: ``now`` when something is due
        already, else the next expiry, ``None`` when nothing will be due until an event."""
        self._advance(now)
        if self._pending or self._plan(self._idle_rooms()):
            return now
        return self._timers.next_due()

    # -- internals -------------------------------------------------------------------------

    def _advance(self, now: float) -> None:
        """Check the time, then close the sequences whose expiry is due at ``now``."""
        if math.isnan(now):
            raise ValueError("now must not be NaN")
        if now < self._now:
            raise ValueError(f"time went backwards: {now!r} < {self._now!r}")
        self._now = now
        for kind, seq in self._timers.pop_due(now):
            self._close(seq, CloseReason.LIFETIME if kind == _LIFETIME else CloseReason.IDLE)
            self._pending.append(seq)

    def _idle_rooms(self) -> dict[W, int]:
        """Each idle worker, with room for a whole batch."""
        return dict.fromkeys(self._idle, self._batch_size)

    def _plan(self, rooms: dict[W, int]) -> dict[W, list[SequenceState[T, W]]]:
        """The batch each worker of ``rooms`` (worker -> free slots) would get now (empty
        ones left out); changes nothing."""
        room: dict[W, list[SequenceState[T, W]]] = {worker: [] for worker in rooms}
        if not room or not self._ready:
            return {}
        added: dict[W, int] = {}  # sequences this plan pins to each worker
        unfilled = sum(1 for size in rooms.values() if size > 0)
        if not unfilled:
            return {}

        def load(worker: W) -> tuple[int, bool, int]:
            batch = room.get(worker)
            full = batch is None or len(batch) >= rooms[worker]
            return len(self._pins[worker]) + added.get(worker, 0), full, self._stamp[worker]

        for seq in self._ready.values():
            worker = seq.worker
            if worker is None:
                worker = min(self._pins, key=load)
            batch = room.get(worker)
            if batch is None or len(batch) >= rooms[worker]:
                continue
            batch.append(seq)
            if seq.worker is None:
                added[worker] = added.get(worker, 0) + 1
            if len(batch) == rooms[worker]:
                unfilled -= 1
                if not unfilled:
                    break
        return {worker: batch for worker, batch in room.items() if batch}

    def _dispatch(self, worker: W, batch: list[SequenceState[T, W]]) -> Dispatch[T, W]:
        """Send the head of each sequence of ``batch`` to ``worker`` (pinning new ones)."""
        pins = self._pins[worker]
        items: list[T] = []
        for seq in batch:
            if seq.worker is None:
                seq.worker = worker
                pins[seq.id] = seq
            item = seq.queue.popleft()
            del self._where[item]
            del self._ready[seq.id]
            seq.in_flight = True
            items.append(item)
        return Dispatch(worker, tuple(items), tuple(seq.id for seq in batch))

    def _become_idle(self, seq: SequenceState[T, W], now: float) -> None:
        seq.idle_since = now
        if self._idle_timeout is not None:
            self._timers.push(now + self._idle_timeout, _IDLE, seq)

    def _live(self, due: float, kind: int, seq: SequenceState[T, W]) -> bool:
        """Whether an expiry timer still holds: an idle timer is stale once the sequence was
        busy since (it has a newer one, if idle again)."""
        if self._open.get(seq.id) is not seq:
            return False
        if kind == _LIFETIME:
            return True
        assert self._idle_timeout is not None
        return seq.idle_since is not None and seq.idle_since + self._idle_timeout == due

    def _close(self, seq: SequenceState[T, W], reason: CloseReason) -> None:
        """Close an open sequence: free its slot, unpin it, remember its id."""
        del self._open[seq.id]
        self._ready.pop(seq.id, None)
        seq.closed = reason
        if seq.worker is not None:
            self._pins.get(seq.worker, {}).pop(seq.id, None)
        self._closed.add(seq.id, reason)

    def _take(self, seq: SequenceState[T, W]) -> list[T]:
        """Remove and return a closed sequence's queued items."""
        items = list(seq.queue)
        seq.queue.clear()
        for item in items:
            del self._where[item]
        return items

    def _expired(self, seq: SequenceState[T, W]) -> Expired[T]:
        """A closed sequence's Expired decision, with its queued items (now removed)."""
        assert seq.closed is not None
        items = tuple(self._take(seq))
        return Expired(seq.id, items, self._message(seq.id, seq.closed), seq.closed)
