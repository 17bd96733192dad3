"""Per model version inference statistics, as Triton's statistics extension reports them
(sans-IO: the caller gives durations and the wall clock).

One :class:`ModelStats` per model version (``ModelVersion.stats``), counted where the
dataplane and the worker supervisor already measure:

- per request, when its outcome is known (``Call`` in ``runtime/dataplane.py``):
  :meth:`ModelStats.request_succeeded` (its whole time, and the time it waited in the queue)
  or :meth:`ModelStats.request_failed`;
- per batch a worker answered (``core/inflight.py`` via the supervisor):
  :meth:`ModelStats.batch_done` with its size and how long the worker ran it: that is
  ``compute_infer``, per request (each request of the batch is counted with the batch's
  time, as Triton does) and per batch size (``batch_stats``), and it adds to
  ``inference_count`` (requests) and ``execution_count`` (batches).

``compute_input`` and ``compute_output`` are not measured apart (the worker's time is all
``compute_infer``): they report ``compute_infer``'s count with 0 ns (perf_analyzer refuses
statistics whose three compute counts differ). A few integer adds per request and per batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Duration:
    """Triton's ``StatisticDuration``: how many, and their total time in nanoseconds."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass(slots=True)
class ModelStats:
    """The counters of one model version."""

    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    inference_count: int = 0  # requests the model ran (batch items)
    execution_count: int = 0  # batches the model ran
    last_inference_ms: int = 0  # when the last request ended, ms since the epoch; 0: never
    batches: dict[int, Duration] = field(default_factory=dict)  # compute_infer by batch size

    def request_succeeded(self, total_ns: int, queue_ns: int, now_ms: int) -> None:
        self.success.add(total_ns)
        self.queue.add(queue_ns)
        self.last_inference_ms = now_ms

    def request_failed(self, total_ns: int, now_ms: int) -> None:
        self.fail.add(total_ns)
        self.last_inference_ms = now_ms

    def batch_done(self, size: int, compute_ns: int) -> None:
        """A worker answered a batch of ``size`` requests after ``compute_ns``."""
        self.inference_count += size
        self.execution_count += 1
        self.compute_infer.add(compute_ns * size, size)
        by_size = self.batches.get(size)
        if by_size is None:
            by_size = self.batches[size] = Duration()
        by_size.add(compute_ns)

    def json(self, name: str, version: str) -> dict[str, Any]:
        """One entry of ``model_stats`` in Triton's JSON form."""
        zero = Duration().json()
        computed = {"count": self.compute_infer.count, "ns": 0}
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.json(),
                "fail": self.fail.json(),
                "queue": self.queue.json(),
                "compute_input": computed,
                "compute_infer": self.compute_infer.json(),
                "compute_output": dict(computed),
                "cache_hit": zero,
                "cache_miss": zero,
            },
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": {"count": self.batches[size].count, "ns": 0},
                    "compute_infer": self.batches[size].json(),
                    "compute_output": {"count": self.batches[size].count, "ns": 0},
                }
                for size in sorted(self.batches)
            ],
        }


__all__ = ["Duration", "ModelStats"]
