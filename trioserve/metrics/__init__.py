"""Server metrics with TorchServe's names, and the metrics API (port 8082)."""

from trioserve.metrics.app import create_metrics_app, metrics_api_description
from trioserve.metrics.registry import (
    BUILTIN_METRICS,
    CONTENT_TYPE,
    LEGACY_METRICS,
    METRICS_MODES,
    ServerMetrics,
    help_text,
)
from trioserve.metrics.system import SystemSampler, sample_system_forever

__all__ = [
    "BUILTIN_METRICS",
    "CONTENT_TYPE",
    "LEGACY_METRICS",
    "METRICS_MODES",
    "ServerMetrics",
    "SystemSampler",
    "create_metrics_app",
    "help_text",
    "metrics_api_description",
    "sample_system_forever",
]
