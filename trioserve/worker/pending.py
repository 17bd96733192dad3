"""Work the worker's frame reader hands on: a LOAD or a BATCH received and checked, waiting
for the handler thread (or, for an MLServer model, its event loop)."""

from __future__ import annotations

from dataclasses import dataclass, field

from trioserve.core.messages import LoadSpec, WorkItem
from trioserve.worker.tensors import BatchTensor


@dataclass(slots=True)
class PendingLoad:
    """A LOAD received, for the handler thread to carry out."""

    spec: LoadSpec


@dataclass(slots=True)
class PendingBatch:
    """A BATCH received and checked, for the handler thread to run."""

    batch_id: int
    items: list[WorkItem]
    tensors: dict[str, BatchTensor] = field(default_factory=dict)


Pending = PendingLoad | PendingBatch


__all__ = ["Pending", "PendingBatch", "PendingLoad"]
