"""The dynamic batching policy for one model version (sans-IO).

:class:`BatchPolicy` decides which queued requests go to which worker, and when. It holds no
trio, reads no clock and does no I/O: the driver (a trio task per model version) feeds it
events and a time ``now`` (``trio.current_time()``), and acts on the decisions it returns::

    policy.submit(job, now, deadline)      # may raise QueueFull
    policy.cancel(job)                     # the client went away; True if it was still queued
    policy.worker_idle(w) / worker_busy(w) / worker_gone(w)
    policy.worker_prefetch(w)              # busy w takes one more batch behind, if full
    policy.requeue(w, jobs)                # a dispatched batch never reached its worker
    policy.take(w, room, now)              # continuous batching: up to room items, at once

    for decision in policy.poll(now):      # after every event, and at every wake-up
        Dispatch(worker, items, reason)    # send these items, in this order, as one batch
        Expire(items)                      # their deadline passed in the queue: fail them
    policy.next_wakeup(now)                # sleep until then (or until the next event)

``poll`` is the only call that produces decisions; the driver calls it after every event and
when ``next_wakeup`` arrives. ``next_wakeup`` is exact: ``poll`` at any earlier time returns
nothing, ``poll`` at that time returns something, and ``None`` means nothing will happen
until the next event. Time must not go backwards (``ValueError``).

The rules
---------

A batch is the oldest queued items, at most ``batch_size`` of them, so FIFO order holds within
a batch and across batches (batches are dispatched in order; several workers then run them
concurrently). A batch is formed only when a worker is idle to take it and goes to the worker
that has been idle longest. With an idle worker and items queued, the policy dispatches:

a. ``FULL`` -- ``batch_size`` items are queued: a full batch, at once;
b. ``IDLE`` -- idle workers outnumber busy ones (always so when nothing is in flight): all
   that is queued, at once. A lone request never waits for the window;
c. ``WINDOW`` -- otherwise, once the oldest queued item has waited ``max_delay`` since it was
   submitted: all that is queued;
d. ``DEADLINE`` -- otherwise, once a queued item's deadline has come: all that is queued,
   rather than let that item expire beside an idle worker.

e. ``FULL`` behind -- when no idle worker is left and ``batch_size`` items are queued, a busy
   worker that offered to (``worker_prefetch``) takes that full batch behind the one it runs.
   The worker then starts it the moment it finishes the current one, instead of idling while
   the driver hears of the finish, forms the next batch and sends it (on a loaded CPU that
   round trip costs as much as a small model's batch). Only full batches: a partial batch
   queued behind a busy worker would only wait there instead of growing.

An item's ``deadline`` is the latest time it may still be dispatched. An item still queued
after its deadline (all workers were busy) is returned in an ``Expire`` decision and never
dispatched. Bounds: no batch exceeds ``batch_size``; no item waits longer than ``max_delay``
(or past its deadline) while a worker is idle -- it waits longer only while every worker is
busy, and once its window has elapsed it goes in the next batch that reaches it, without a
further wait.
``capacity`` bounds the queue: ``submit`` raises :class:`QueueFull` (the caller answers 503)
instead of blocking.

Why dispatch at once when workers are idle (rule b)
---------------------------------------------------

Waiting for a batch to fill trades the latency of the items already queued for larger, cheaper
batches later. That trade pays only when worker capacity is scarce, i.e. when spending a
worker on a small batch now would make later requests wait for it. With nothing in flight,
waiting buys nothing: the worker idles for the whole window, and requests that arrive
meanwhile would have found the next idle worker anyway -- or, with one worker, they queue
while the batch runs and leave together as the next batch. That is natural batching: under
load the queue fills while workers are busy, so batches grow with the load and no timer is
needed; the window matters only in between. TorchServe and MLServer always wait the window
(MLServer measured 0.9 ms -> 11.4 ms at concurrency 1 with a 10 ms window); trioserve's light
load costs nothing.

Several workers: the rule "dispatch at once only when all workers are idle" is right for one
or two workers but degrades with more: with eight workers, one batch in flight would make
every new request wait the full window while seven workers idle -- MLServer's flaw back at
moderate load. The opposite, "dispatch whenever a worker is idle" (Triton's default,
``max_queue_delay_microseconds: 0``), sends one-item batches to every idle worker until all
are busy, so at moderate-to-high load a steady stream is served as concurrent one-item
batches that share the GPU badly, and batches form only past saturation. trioserve
dispatches at once while idle workers outnumber busy ones (fewer than half are busy): then
capacity is plentiful, a burst still finds idle workers, and the window would only idle a
worker. Once half or more are busy, capacity is scarce and a partial batch waits for
``max_delay`` (or a full batch, or a deadline) so that the remaining workers take larger
batches. For one or two workers this is exactly "nothing in flight"; as load rises past half
the workers batches start to grow, and as it falls latency returns to the model's own time.

Other choices, against the peers' flaws: batches are formed late, when a worker can take one,
from one shared queue, so items that arrive while every worker is busy join the next batch
(MLServer closes batches before any worker is free, and TorchServe lets each idle worker sit
on its own half-filled batch for the full window). The window is measured from submission, so
an item that waited for a busy worker is not made to wait a further window. A full queue is
refused at once rather than blocking the caller (MLServer), and an expired item is failed,
never run or pushed back (Triton's ``DELAY`` can starve).

Items and workers are hashable values compared by equality (jobs compare by identity); an item
may be queued once at a time.

The decision types are in :mod:`trioserve.core.batch_decisions` (re-exported here). The rest
stays one module although it runs past 400 lines: :class:`BatchPolicy` is one state machine
whose events, rules and deadline bookkeeping all read and change the same queue, heap and
worker sets, and this docstring is the reference for its rules and their reasons
(docs/batching.md points here).
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from trioserve.core.batch_decisions import Decision, Dispatch, Expire, QueueFull, Reason

__all__ = [
    "BatchPolicy",
    "Decision",
    "Dispatch",
    "Expire",
    "QueueFull",
    "Reason",
]

T = TypeVar("T", bound=Hashable)
W = TypeVar("W", bound=Hashable)


@dataclass(slots=True, eq=False)
class _Entry(Generic[T]):
    item: T
    seq: int
    submitted: float
    deadline: float | None


class BatchPolicy(Generic[T, W]):
    """Batching decisions for one model version; see the module docstring."""

    def __init__(self, *, batch_size: int, max_delay: float, capacity: int) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, not {batch_size!r}")
        if not (isinstance(max_delay, int | float) and math.isfinite(max_delay)) or max_delay < 0:
            raise ValueError(f"max_delay must be a finite number >= 0, not {max_delay!r}")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an integer >= 1, not {capacity!r}")
        self._batch_size = batch_size
        self._max_delay = float(max_delay)
        self._capacity = capacity
        # Queued items in submission order (``seq`` increases along it, requeues included).
        self._queue: OrderedDict[T, _Entry[T]] = OrderedDict()
        # Items found past their deadline, not yet reported by ``poll``.
        self._expired: dict[T, _Entry[T]] = {}
        # (deadline, seq, entry) of queued items; stale entries are dropped lazily.
        self._deadlines: list[tuple[float, int, _Entry[T]]] = []
        # Idle workers, longest idle first; busy workers; the batch each one was sent.
        self._idle: OrderedDict[W, None] = OrderedDict()
        self._busy: set[W] = set()
        # Busy workers that will take one more batch behind the one they run, if it is full.
        self._prefetch: OrderedDict[W, None] = OrderedDict()
        self._inflight: dict[W, list[_Entry[T]]] = {}
        self._seq = 0
        self._now = -math.inf

    # -- observation -----------------------------------------------------------------------

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def max_delay(self) -> float:
        return self._max_delay

    @property
    def capacity(self) -> int:
        return self._capacity

    def __len__(self) -> int:
        """Items waiting in the queue (not those found expired and not yet polled)."""
        return len(self._queue)

    @property
    def has_work(self) -> bool:
        """Whether :meth:`poll` could decide anything: items are queued (or found expired).
        While it is false, a worker that becomes idle or offers to prefetch changes no
        decision, so the driver need not poll for it (the next :meth:`submit` will)."""
        return bool(self._queue or self._expired)

    def queued(self) -> list[T]:
        """The queued items, oldest first."""
        return list(self._queue)

    @property
    def idle_workers(self) -> int:
        return len(self._idle)

    @property
    def busy_workers(self) -> int:
        return len(self._busy)

    # -- events ----------------------------------------------------------------------------

    def submit(self, item: T, now: float, deadline: float | None = None) -> None:
        """Queue ``item`` at ``now``; it must be dispatched by ``deadline`` or it expires.

        Raises :class:`QueueFull` when ``capacity`` items are queued (items already past
        their deadline do not count), and ``ValueError`` when ``item`` is already queued.
        A deadline already past is accepted; the next ``poll`` expires the item.
        """
        self._advance(now)
        if deadline is not None:
            if math.isnan(deadline):
                raise ValueError("deadline must not be NaN")
            if deadline == math.inf:
                deadline = None
        self._expire_due(now)
        if item in self._queue or item in self._expired:
            raise ValueError(f"{item!r} is already queued")
        if len(self._queue) >= self._capacity:
            raise QueueFull(self._capacity)
        entry = _Entry(item, self._seq, now, deadline)
        self._seq += 1
        if deadline is not None and deadline < now:
            self._expired[item] = entry
            return
        self._queue[item] = entry
        if deadline is not None:
            self._push_deadline(entry, deadline)

    def cancel(self, item: T) -> bool:
        """Forget a queued ``item``. ``False`` when it is not queued (e.g. already dispatched:
        cancelling it is then the driver's business with the worker)."""
        if self._queue.pop(item, None) is not None:
            return True
        return self._expired.pop(item, None) is not None

    def worker_idle(self, worker: W) -> None:
        """``worker`` can take a batch: a new worker, or its batch is finished."""
        self._busy.discard(worker)
        self._prefetch.pop(worker, None)
        self._inflight.pop(worker, None)
        if worker not in self._idle:
            self._idle[worker] = None

    def worker_busy(self, worker: W) -> None:
        """``worker`` serves but cannot take a batch now (it counts as busy)."""
        self._idle.pop(worker, None)
        self._prefetch.pop(worker, None)
        self._busy.add(worker)

    def worker_prefetch(self, worker: W) -> None:
        """Busy ``worker`` will queue one more batch behind the one it runs, so that it never
        waits for the driver between batches -- but only a full batch: a partial one is
        better left to grow (or to go to a worker that becomes idle). The offer holds until
        a batch is dispatched to it or the worker's state changes (idle, busy, gone)."""
        if worker not in self._busy:
            raise ValueError(f"{worker!r} is not busy: an idle worker takes batches anyway")
        self._prefetch[worker] = None

    def worker_gone(self, worker: W) -> None:
        """``worker`` no longer serves (stopped, died, restarting): forget it and its batch.
        A worker that is starting or backing off should be gone, not busy."""
        self._idle.pop(worker, None)
        self._busy.discard(worker)
        self._prefetch.pop(worker, None)
        self._inflight.pop(worker, None)

    def requeue(self, worker: W, items: Iterable[T] | None = None) -> None:
        """The batch last dispatched to ``worker`` never reached it (call this before
        reporting the worker idle or gone, which forget the batch): put ``items`` (those of
        that batch still wanted; all of them by default) back in the queue in submission
        order, ahead of younger items, with their original submit times and deadlines.
        Requeued items may exceed ``capacity``. The worker's state is unchanged."""
        batch = self._inflight.get(worker)
        if batch is None:
            raise ValueError(f"no batch is in flight on {worker!r}")
        if items is None:
            chosen = list(batch)
        else:
            by_item = {entry.item: entry for entry in batch}
            chosen = []
            for item in items:
                entry = by_item.pop(item, None)
                if entry is None:
                    raise ValueError(f"{item!r} is not (or twice) in the batch of {worker!r}")
                chosen.append(entry)
        for entry in chosen:
            if entry.item in self._queue or entry.item in self._expired:
                raise ValueError(f"{entry.item!r} is already queued")
        del self._inflight[worker]
        merged = sorted([*self._queue.values(), *chosen], key=lambda entry: entry.seq)
        self._queue = OrderedDict((entry.item, entry) for entry in merged)
        for entry in chosen:
            if entry.deadline is not None:
                self._push_deadline(entry, entry.deadline)

    def take(self, worker: W, room: int, now: float) -> list[T]:
        """Continuous batching: ``worker`` runs a batch with ``room`` free slots and starts
        its next step now; it takes up to ``room`` of the oldest queued items at once (no
        window: the running batch must not wait), and is busy with them (``requeue`` puts
        them back if the step never reaches it). Items past their deadline are left for
        ``poll`` to expire. ``[]`` when nothing is queued or ``room`` is 0."""
        self._advance(now)
        if isinstance(room, bool) or not isinstance(room, int) or room < 0:
            raise ValueError(f"room must be an integer >= 0, not {room!r}")
        self._expire_due(now)
        self._idle.pop(worker, None)
        self._prefetch.pop(worker, None)
        self._busy.add(worker)
        size = min(room, self._batch_size, len(self._queue))
        if not size:
            return []
        entries = [self._queue.popitem(last=False)[1] for _ in range(size)]
        self._inflight[worker] = entries
        return [entry.item for entry in entries]

    def drain(self) -> list[T]:
        """Remove and return every item not yet dispatched or reported (e.g. at shutdown),
        in submission order. Workers are untouched."""
        entries = sorted([*self._queue.values(), *self._expired.values()], key=lambda e: e.seq)
        self._queue.clear()
        self._expired.clear()
        self._deadlines.clear()
        return [entry.item for entry in entries]

    # -- decisions -------------------------------------------------------------------------

    def poll(self, now: float) -> list[Decision[T, W]]:
        """The decisions due at ``now``: at most one ``Expire`` first, then the batches, in
        queue order, each to the worker idle longest."""
        self._advance(now)
        decisions: list[Decision[T, W]] = []
        self._expire_due(now)
        if self._expired:
            expired = sorted(self._expired.values(), key=lambda entry: entry.seq)
            self._expired.clear()
            decisions.append(Expire(tuple(entry.item for entry in expired)))
        while self._idle and self._queue:
            reason = self._dispatch_reason(now)
            if reason is None:
                break
            size = min(self._batch_size, len(self._queue))
            entries = [self._queue.popitem(last=False)[1] for _ in range(size)]
            worker, _ = self._idle.popitem(last=False)
            self._busy.add(worker)
            self._inflight[worker] = entries
            decisions.append(Dispatch(worker, tuple(entry.item for entry in entries), reason))
        while self._prefetch and len(self._queue) >= self._batch_size:
            # Every idle worker has been served first; a busy one takes a full batch behind.
            entries = [self._queue.popitem(last=False)[1] for _ in range(self._batch_size)]
            worker, _ = self._prefetch.popitem(last=False)
            self._inflight[worker] = entries
            decisions.append(Dispatch(worker, tuple(entry.item for entry in entries), Reason.FULL))
        return decisions

    def next_wakeup(self, now: float) -> float | None:
        """When to call :meth:`poll` if no event comes first: ``now`` when something is due
        already, ``None`` when nothing will be due until an event."""
        self._advance(now)
        if self._expired:
            return now
        earliest: float | None = None
        deadline = self._min_deadline()
        if deadline is not None:
            # Expiry happens strictly after the deadline: the next float.
            earliest = math.nextafter(deadline, math.inf)
        if self._prefetch and len(self._queue) >= self._batch_size:
            return now
        if self._idle and self._queue:
            if len(self._queue) >= self._batch_size or self._spare_workers():
                return now
            window = self._head().submitted + self._max_delay
            if deadline is not None:
                window = min(window, deadline)
            earliest = window if earliest is None else min(earliest, window)
        return None if earliest is None else max(now, earliest)

    # -- internals -------------------------------------------------------------------------

    def _advance(self, now: float) -> None:
        if math.isnan(now):
            raise ValueError("now must not be NaN")
        if now < self._now:
            raise ValueError(f"time went backwards: {now!r} < {self._now!r}")
        self._now = now

    def _spare_workers(self) -> bool:
        """Rule b: idle workers outnumber busy ones."""
        return len(self._busy) < len(self._idle)

    def _head(self) -> _Entry[T]:
        return next(iter(self._queue.values()))

    def _dispatch_reason(self, now: float) -> Reason | None:
        """Whether (and why) a batch is due now; there is an idle worker and a queued item."""
        if len(self._queue) >= self._batch_size:
            return Reason.FULL
        if self._spare_workers():
            return Reason.IDLE
        if self._head().submitted + self._max_delay <= now:
            return Reason.WINDOW
        deadline = self._min_deadline()
        if deadline is not None and deadline <= now:
            return Reason.DEADLINE
        return None

    def _live(self, entry: _Entry[T]) -> bool:
        return self._queue.get(entry.item) is entry

    def _push_deadline(self, entry: _Entry[T], deadline: float) -> None:
        heapq.heappush(self._deadlines, (deadline, entry.seq, entry))
        if len(self._deadlines) > 2 * len(self._queue) + 64:
            # Dispatched and cancelled items leave stale entries; keep the heap O(queue).
            self._deadlines = [
                (entry.deadline, entry.seq, entry)
                for entry in self._queue.values()
                if entry.deadline is not None
            ]
            heapq.heapify(self._deadlines)

    def _min_deadline(self) -> float | None:
        """The earliest deadline of a queued item."""
        heap = self._deadlines
        while heap and not self._live(heap[0][2]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def _expire_due(self, now: float) -> None:
        """Move queued items whose deadline is before ``now`` to the expired set."""
        heap = self._deadlines
        while heap and heap[0][0] < now:
            _, _, entry = heapq.heappop(heap)
            if self._live(entry):
                del self._queue[entry.item]
                self._expired[entry.item] = entry
