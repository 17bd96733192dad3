"""Server metrics with TorchServe's names, and the metrics API (port 8082)."""

from trioserve.metrics.catalog import (
    BUILTIN_METRICS,
    CONTENT_TYPE,
    LEGACY_METRICS,
    METRICS_MODES,
    help_text,
)
from trioserve.metrics.registry import ServerMetrics
from trioserve.metrics.system import SystemSampler, sample_system_forever

__all__ = [
    "BUILTIN_METRICS",
    "CONTENT_TYPE",
    "LEGACY_METRICS",
    "METRICS_MODES",
    "ServerMetrics",
    "SystemSampler",
    "help_text",
    "sample_system_forever",
]
