"""What the server's metrics are: TorchServe's names, units and labels, the metrics modes,
and the names the Prometheus exposition uses for each metric.

Pure data and two small functions, shared by the registry (:mod:`.registry`) and the
prometheus_client adapters (:mod:`.families`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from trioserve.core.request import Outcome

__all__ = [
    "BUILTIN_METRICS",
    "CONTENT_TYPE",
    "DEFAULT_VERSION",
    "HOST_LEVEL",
    "INFERENCE_LATENCY",
    "KINDS",
    "LEGACY_METRICS",
    "METRICS_MODES",
    "QUEUE_LATENCY",
    "REQUESTS_TOTAL",
    "Kind",
    "MetricSpec",
    "exposed_names",
    "help_text",
]

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
METRICS_MODES: Final = ("prometheus", "legacy", "log")
DEFAULT_VERSION: Final = "default"
HOST_LEVEL: Final = "Host"

Kind = Literal["counter", "gauge", "histogram"]
KINDS: Final[tuple[Kind, ...]] = ("counter", "gauge", "histogram")

REQUESTS_TOTAL: Final = "ts_inference_requests_total"
INFERENCE_LATENCY: Final = "ts_inference_latency_microseconds"
QUEUE_LATENCY: Final = "ts_queue_latency_microseconds"
# The metrics that stay Prometheus metrics in ``legacy`` mode.
LEGACY_METRICS: Final = frozenset({REQUESTS_TOTAL, INFERENCE_LATENCY, QUEUE_LATENCY})


@dataclass(frozen=True)
class MetricSpec:
    """What a metric is: its type, its unit (for HELP and logs) and its label names."""

    kind: Kind
    unit: str
    labels: tuple[str, ...]


_TS_LABELS = ("model_name", "model_version", "hostname")
_HOST_LABELS = ("Level", "Hostname")

# The frontend's own metrics (TorchServe's ``ts/configs/metrics.yaml``), in exposition order.
BUILTIN_METRICS: Final[Mapping[str, MetricSpec]] = {
    REQUESTS_TOTAL: MetricSpec("counter", "Count", _TS_LABELS),
    INFERENCE_LATENCY: MetricSpec("counter", "Microseconds", _TS_LABELS),
    QUEUE_LATENCY: MetricSpec("counter", "Microseconds", _TS_LABELS),
    "Requests2XX": MetricSpec("counter", "Count", _HOST_LABELS),
    "Requests4XX": MetricSpec("counter", "Count", _HOST_LABELS),
    "Requests5XX": MetricSpec("counter", "Count", _HOST_LABELS),
    "QueueTime": MetricSpec("gauge", "Milliseconds", _HOST_LABELS),
    "WorkerThreadTime": MetricSpec("gauge", "Milliseconds", _HOST_LABELS),
    "WorkerLoadTime": MetricSpec("gauge", "Milliseconds", ("WorkerName", *_HOST_LABELS)),
    "CPUUtilization": MetricSpec("gauge", "Percent", _HOST_LABELS),
    "MemoryUsed": MetricSpec("gauge", "Megabytes", _HOST_LABELS),
    "MemoryAvailable": MetricSpec("gauge", "Megabytes", _HOST_LABELS),
    "MemoryUtilization": MetricSpec("gauge", "Percent", _HOST_LABELS),
    "DiskUsage": MetricSpec("gauge", "Gigabytes", _HOST_LABELS),
    "DiskUtilization": MetricSpec("gauge", "Percent", _HOST_LABELS),
    "DiskAvailable": MetricSpec("gauge", "Gigabytes", _HOST_LABELS),
}


def help_text(kind: Kind, unit: str) -> str:
    """TorchServe's HELP line for a metric."""
    return f"Torchserve prometheus {kind} metric with unit: {unit}"


def exposed_names(name: str, kind: str) -> frozenset[str]:
    """Every name the exposition uses for metric ``name`` (family and sample names)."""
    if kind == "counter":
        family = name.removesuffix("_total")
        return frozenset({family, f"{family}_total"})
    if kind == "histogram":
        return frozenset({name, f"{name}_bucket", f"{name}_sum", f"{name}_count"})
    return frozenset({name})


# The host counter of each request outcome (TorchServe's response classes).
OUTCOME_COUNTERS: Final[dict[Outcome, str]] = {
    Outcome.OK: "Requests2XX",
    Outcome.CLIENT_ERROR: "Requests4XX",
    Outcome.SERVER_ERROR: "Requests5XX",
}
