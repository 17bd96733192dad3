"""Request envelopes: optional wrappers around a handler's entry point.

* ``body``: the entry point sees the requests as they are (a no-op wrapper).
* ``json``: each request's ``data`` (or ``body``) is a JSON object ``{"instances": [...]}``;
  the entry point is called once with all instances of the batch, flattened, and its answers
  are regrouped into one ``{"predictions": [...]}`` per request.

``kserve`` and ``kservev2`` are refused at load time with a clear message.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from trioserve.worker.errors import LoadError, PredictionException

Entry = Callable[[Any, Any], Any]

SUPPORTED = ("body", "json")


def _instances(row: Any, idx: int) -> list[Any]:
    value = row.get("data") if isinstance(row, dict) else None
    if value is None and isinstance(row, dict):
        value = row.get("body")
    if isinstance(value, bytes | bytearray | str):
        try:
            value = json.loads(value)
        except ValueError:
            raise PredictionException(f"request {idx}: body is not JSON", 400) from None
    if not isinstance(value, dict) or not isinstance(value.get("instances"), list):
        raise PredictionException(
            f'request {idx}: the json envelope expects {{"instances": [...]}}', 400
        )
    instances: list[Any] = value["instances"]
    return instances


def json_envelope(entry: Entry) -> Entry:
    def wrapped(data: Any, context: Any) -> Any:
        if data is None:  # a function handler's initialisation call
            return entry(data, context)
        groups = [_instances(row, idx) for idx, row in enumerate(data)]
        flat = [instance for group in groups for instance in group]
        answers = entry(flat, context)
        if not isinstance(answers, list) or len(answers) != len(flat):
            return answers  # the worker reports the malformed answer
        out: list[dict[str, Any]] = []
        start = 0
        for group in groups:
            out.append({"predictions": answers[start : start + len(group)]})
            start += len(group)
        return out

    return wrapped


def validate(envelope: str | None) -> None:
    """Raise :class:`LoadError` unless the envelope is supported (or there is none)."""
    if envelope and envelope not in SUPPORTED:
        raise LoadError(
            f"request envelope {envelope!r} is not supported by trioserve's worker "
            f"(supported: {', '.join(SUPPORTED)}); remove it from the model config or use one "
            "of those"
        )


def wrap(envelope: str | None, entry: Entry) -> Entry:
    """``entry`` wrapped in the named envelope (no name: unchanged)."""
    validate(envelope)
    if envelope == "json":
        return json_envelope(entry)
    return entry
