"""What the batching policy (:mod:`trioserve.core.batching`) answers (sans-IO).

:meth:`BatchPolicy.poll <trioserve.core.batching.BatchPolicy.poll>` returns
:data:`Decision` values -- :class:`Dispatch` (send these items to this worker as one batch,
for this :class:`Reason`) or :class:`Expire` (fail these items) -- and
:meth:`~trioserve.core.batching.BatchPolicy.submit` raises :class:`QueueFull` instead of
blocking. Plain frozen values, so the driver and the tests can compare them.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeAlias, TypeVar

__all__ = [
    "Decision",
    "Dispatch",
    "Expire",
    "QueueFull",
    "Reason",
]

T = TypeVar("T", bound=Hashable)
W = TypeVar("W", bound=Hashable)


class QueueFull(Exception):
    """The queue holds ``capacity`` items; the request is refused, not queued."""

    def __init__(self, capacity: int) -> None:
        super().__init__(f"the batching queue is full ({capacity} requests)")
        self.capacity = capacity


class Reason(enum.Enum):
    """Why a batch was dispatched (the rules a to e of :mod:`trioserve.core.batching`)."""

    FULL = "full"
    IDLE = "idle"
    WINDOW = "window"
    DEADLINE = "deadline"


@dataclass(frozen=True, slots=True)
class Dispatch(Generic[T, W]):
    """Send ``items``, in this order, to ``worker`` as one batch; the worker is now busy."""

    worker: W
    items: tuple[T, ...]
    reason: Reason


@dataclass(frozen=True, slots=True)
class Expire(Generic[T]):
    """These items' deadlines passed while they were queued: fail them, never run them."""

    items: tuple[T, ...]


Decision: TypeAlias = Dispatch[T, W] | Expire[T]
