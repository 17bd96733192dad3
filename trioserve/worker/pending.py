"""Work the worker's frame reader hands on: a LOAD or a BATCH received and checked, waiting
for the handler thread (or, for an MLServer model, its event loop)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trioserve.core.messages import LoadSpec, WorkItem
from trioserve.worker.tensors import BatchTensor

if TYPE_CHECKING:
    from trioserve.worker.attached import AttachedConnection


@dataclass(slots=True)
class PendingLoad:
    """A LOAD received, for the handler thread to carry out."""

    spec: LoadSpec


@dataclass(slots=True)
class PendingBatch:
    """A BATCH received and checked, for the handler thread to run; answered on the attached
    connection it came from (``origin``) or the primary one (None)."""

    batch_id: int
    items: list[WorkItem]
    tensors: dict[str, BatchTensor] = field(default_factory=dict)
    origin: AttachedConnection | None = None


Pending = PendingLoad | PendingBatch


__all__ = ["Pending", "PendingBatch", "PendingLoad"]
