"""What the sequence batching policy (:mod:`trioserve.core.sequences`) answers (sans-IO).

:meth:`SequencePolicy.poll <trioserve.core.sequences.SequencePolicy.poll>` returns
:data:`Decision` values -- :class:`Dispatch` (send these heads of different sequences to this
worker as one batch) or :class:`Expired` (this sequence closed on its own; fail its queued
items) -- and the policy's events raise a :class:`SequenceError` instead of queueing what it
must refuse. Plain frozen values, so the driver and the tests can compare them. Every message
says what happened and what to do; the driver passes them on to the client unchanged.

Also here, the policy's own helper types: :class:`SequenceState` (its mutable record of one
sequence), :class:`ClosedIds` (the bounded memory of closed ids), :class:`ExpiryTimers` and
its argument checks.
"""

from __future__ import annotations

import enum
import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeAlias, TypeVar

__all__ = [
    "DEFAULT_SEQUENCE_ID_HEADER",
    "CloseReason",
    "ClosedIds",
    "Decision",
    "Dispatch",
    "Expired",
    "ExpiryTimers",
    "SequenceClosed",
    "SequenceError",
    "SequenceQueueFull",
    "SequenceState",
    "TooManySequences",
    "check_count",
    "check_seconds",
    "closed_message",
]

T = TypeVar("T", bound=Hashable)
W = TypeVar("W", bound=Hashable)
S = TypeVar("S")

DEFAULT_SEQUENCE_ID_HEADER = "ts_request_sequence_id"


class CloseReason(enum.Enum):
    """Why a sequence closed."""

    ENDED = "ended"  # the handler or the client ended it (``end``)
    IDLE = "idle"  # nothing queued or in flight for ``idle_timeout`` (sequenceMaxIdleMSec)
    LIFETIME = "lifetime"  # opened more than ``lifetime`` ago (sequenceTimeoutMSec)
    WORKER_FAILED = "worker_failed"  # the worker it was pinned to is gone, with its state


def _seconds(value: float | None) -> str:
    return "?" if value is None else f"{value:g}"


def closed_message(
    sequence_id: str,
    reason: CloseReason | None,
    *,
    idle_timeout: float | None = None,
    lifetime: float | None = None,
    id_header: str = DEFAULT_SEQUENCE_ID_HEADER,
) -> str:
    """The message for a request naming ``sequence_id``, which is not open: closed for
    ``reason``, or (``None``) never opened here or closed too long ago to be remembered."""
    why = {
        None: "is not open (never opened here, or closed long ago)",
        CloseReason.ENDED: "is closed (ended by its handler or client)",
        CloseReason.IDLE: (
            f"is closed (idle for more than {_seconds(idle_timeout)} s, sequenceMaxIdleMSec)"
        ),
        CloseReason.LIFETIME: (
            f"is closed (older than {_seconds(lifetime)} s, sequenceTimeoutMSec)"
        ),
        CloseReason.WORKER_FAILED: (
            "is closed (its worker failed, and the state the sequence kept there is lost)"
        ),
    }[reason]
    return f'Sequence "{sequence_id}" {why}; start a new sequence without the {id_header} header.'


class SequenceError(Exception):
    """A request of a sequence is refused; ``str(error)`` says why and what to do."""


class SequenceClosed(SequenceError):
    """The request names a sequence that is not open: closed for ``reason``, or (``None``)
    unknown. A closed id is never reopened while it is remembered."""

    def __init__(self, sequence_id: str, reason: CloseReason | None, message: str) -> None:
        super().__init__(message)
        self.sequence_id = sequence_id
        self.reason = reason


class TooManySequences(SequenceError):
    """``limit`` sequences (maxNumSequence) are open; a new one is refused, not queued."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"Too many open sequences: maxNumSequence is {limit}; end a sequence or wait for "
            "one to expire, then retry."
        )
        self.limit = limit


class SequenceQueueFull(SequenceError):
    """The sequence already has ``limit`` requests waiting (maxSequenceJobQueueSize)."""

    def __init__(self, sequence_id: str, limit: int) -> None:
        super().__init__(
            f'Sequence "{sequence_id}" already has {limit} requests waiting '
            f"(maxSequenceJobQueueSize is {limit}); wait for an answer before sending more."
        )
        self.sequence_id = sequence_id
        self.limit = limit


@dataclass(frozen=True, slots=True)
class Dispatch(Generic[T, W]):
    """Send ``items`` to ``worker`` as one batch; ``items[i]`` is the next request of sequence
    ``sequence_ids[i]`` (all different). The worker is now busy, and each of these sequences
    has a request in flight until ``done``."""

    worker: W
    items: tuple[T, ...]
    sequence_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Expired(Generic[T]):
    """Sequence ``sequence_id`` closed without ``end`` (idle, too old, or its worker gone):
    fail its still-queued ``items`` (maybe none) with ``message``. A request of it still in
    flight is left to finish."""

    sequence_id: str
    items: tuple[T, ...]
    message: str
    reason: CloseReason


Decision: TypeAlias = Dispatch[T, W] | Expired[T]


# -- the policy's helper types ---------------------------------------------------------------


def check_seconds(name: str, value: float | None) -> float | None:
    """A duration in seconds: finite and > 0, or None (no limit)."""
    if value is None:
        return None
    if not (isinstance(value, int | float) and math.isfinite(value)) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0 or None, not {value!r}")
    return float(value)


def check_count(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, not {value!r}")
    return value


@dataclass(slots=True, eq=False)
class SequenceState(Generic[T, W]):
    """The policy's record of one sequence; only the policy changes it."""

    id: str
    opened: float
    idle_since: float | None = None  # nothing queued nor in flight since; None while busy
    queue: deque[T] = field(default_factory=deque)
    in_flight: bool = False  # a request dispatched, not yet answered
    streaming: int = 0  # continuous batching: requests answered "more to come", not ended
    worker: W | None = None  # pinned at its first dispatch
    closed: CloseReason | None = None


class ClosedIds:
    """Closed sequence ids and why each closed: the ``capacity`` most recent (0: none)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = check_count("closed_capacity", capacity, 0)
        self._reasons: OrderedDict[str, CloseReason] = OrderedDict()

    def add(self, sequence_id: str, reason: CloseReason) -> None:
        if not self.capacity:
            return
        self._reasons[sequence_id] = reason
        self._reasons.move_to_end(sequence_id)
        while len(self._reasons) > self.capacity:
            self._reasons.popitem(last=False)  # the oldest is forgotten first

    def get(self, sequence_id: str) -> CloseReason | None:
        return self._reasons.get(sequence_id)

    def __contains__(self, sequence_id: object) -> bool:
        return sequence_id in self._reasons

    def __len__(self) -> int:
        return len(self._reasons)


class ExpiryTimers(Generic[S]):
    """Timers ``(due, kind, subject)``, earliest first (then lowest ``kind``). A timer the
    ``live`` predicate rejects is stale (its subject changed since) and is dropped unseen."""

    def __init__(self, live: Callable[[float, int, S], bool]) -> None:
        self._live = live
        self._heap: list[tuple[float, int, int, S]] = []
        self._pushed = 0  # a tie-breaker that keeps subjects out of comparisons
        self._limit = 64

    def push(self, due: float, kind: int, subject: S) -> None:
        self._pushed += 1
        heapq.heappush(self._heap, (due, kind, self._pushed, subject))
        if len(self._heap) > self._limit:  # mostly stale: keep the heap O(live timers)
            self._heap = [timer for timer in self._heap if self._live(*self._key(timer))]
            heapq.heapify(self._heap)
            self._limit = 2 * len(self._heap) + 64

    def pop_due(self, now: float) -> Iterator[tuple[int, S]]:
        """Remove and yield ``(kind, subject)`` of the live timers due at or before ``now``."""
        while self._heap and self._heap[0][0] <= now:
            due, kind, _, subject = heapq.heappop(self._heap)
            if self._live(due, kind, subject):
                yield kind, subject

    def next_due(self) -> float | None:
        """When the earliest live timer is due (None: no live timer)."""
        while self._heap and not self._live(*self._key(self._heap[0])):
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    @staticmethod
    def _key(timer: tuple[float, int, int, S]) -> tuple[float, int, S]:
        return timer[0], timer[1], timer[3]
