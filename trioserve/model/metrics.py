"""``mlserver.register`` / ``mlserver.log``: custom metrics from inside a model.

MLServer exports these as Prometheus histograms. trioserve's worker may install a sink
(:func:`set_sink`) that receives each logged value; without one, values are dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

__all__ = ["log", "register", "set_sink"]

logger = logging.getLogger("trioserve.model.metrics")

MetricSink = Callable[[str, float], None]

_registered: dict[str, str] = {}
_sink: MetricSink | None = None


def set_sink(sink: MetricSink | None) -> None:
    """Where logged values go (the worker's metrics); None drops them."""
    global _sink
    _sink = sink


def register(name: str, description: str) -> None:
    """Declare a custom metric (idempotent)."""
    _registered.setdefault(name, description)


def log(**metrics: float) -> None:
    """Record values of custom metrics: ``log(my_metric=1.5)``."""
    for name, value in metrics.items():
        if name not in _registered:
            register(name, name)
        if _sink is not None:
            _sink(name, float(value))
        else:
            logger.debug("custom metric %s=%s (no sink installed)", name, value)
