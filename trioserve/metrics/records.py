"""The records of a worker's METRICS frame: what makes one unusable, and its name for logs.

A record is a JSON object with ``name``, ``type`` (COUNTER, GAUGE or HISTOGRAM, any case),
a finite number ``value``, optional ``unit``, ``dimensions`` (names to values) and
``request_id``. A record the registry cannot use is logged once and dropped.
"""

from __future__ import annotations

import math
from typing import Any

from trioserve.metrics.catalog import BUILTIN_METRICS, KINDS

__all__ = ["record_name", "record_problem"]


def record_problem(record: dict[str, Any]) -> str | None:
    """Why ``record`` cannot become a metric, or None when it can."""
    name = record.get("name")
    kind = str(record.get("type", "")).lower()
    value = record.get("value")
    dimensions = record.get("dimensions") or {}
    if not isinstance(name, str) or not name:
        return "it has no name"
    if kind not in KINDS:
        return f"type {record.get('type')!r} is not COUNTER, GAUGE or HISTOGRAM"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"value {value!r} is not a number"
    if not math.isfinite(value):
        return f"value {value!r} is not finite"
    if kind == "counter" and value < 0:
        return "a counter cannot decrease"
    if not isinstance(dimensions, dict) or not all(isinstance(k, str) for k in dimensions):
        return "its dimensions are not an object of names to values"
    if name in BUILTIN_METRICS:
        return "the name belongs to a frontend metric"
    return None


def record_name(record: Any) -> str:
    """The record's name for a log line, whatever the record is."""
    name = record.get("name") if isinstance(record, dict) else None
    return name if isinstance(name, str) else repr(name)
