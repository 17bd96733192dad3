"""A handler for OIP tests, written like one for TorchServe's kservev2 envelope: each OIP
input arrives as a row ``{"name", "shape", "datatype", "data"}`` and its answer becomes the
output named after it. Numbers are doubled (keeping the nested shape), strings reversed,
bools negated; a plain (non-OIP) request's body is answered as it came. An input named
``fail`` raises; one named ``batch`` answers how many rows the handler got, its batch taking
20 ms (so that requests sent meanwhile queue behind it and leave together, however quickly
the server hands a lone request to the idle worker); one named ``slow`` is answered like any
other, a quarter of a second late."""

from __future__ import annotations

import time
from typing import Any


def _apply(value: Any) -> Any:
    if isinstance(value, list):
        return [_apply(v) for v in value]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value * 2
    if isinstance(value, bytes | bytearray):
        return bytes(value)[::-1].decode("utf-8", "replace")
    if isinstance(value, str):
        return value[::-1]
    return value


def handle(data: list[dict[str, Any]] | None, context: Any) -> list[Any] | None:
    if data is None:
        return None
    answers: list[Any] = []
    if any(row.get("name") == "batch" for row in data):
        time.sleep(0.02)
    for row in data:
        if "datatype" not in row:
            answers.append(row.get("body"))
        elif row["name"] == "fail":
            raise ValueError("the handler was asked to fail")
        elif row["name"] == "batch":
            answers.append([len(data)])
        elif row["name"] == "slow":
            time.sleep(0.25)
            answers.append(_apply(row["data"]))
        else:
            answers.append(_apply(row["data"]))
    return answers
