"""A stateful TorchServe handler: a running sum per sequence, kept in the worker process.

Written like TorchServe's ``examples/stateful`` handler: the first request of a sequence
carries the start header (``ts_request_sequence_start: true``), which resets the sequence's
sum; each request adds its integer body to it and answers the new sum; a body of ``0`` ends
the sequence, by setting the end response header (``ts_request_sequence_end: <id>``), which
makes the server close it. The sums live in a bounded cache (``handler.cache.capacity`` in
the archive's model-config.yaml, default 100): the server pins a sequence to one worker, so
every request of a sequence finds its sum there.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

DEFAULT_CAPACITY = 100


class RunningSums:
    def __init__(self) -> None:
        self.cache: OrderedDict[str, int] = OrderedDict()
        self.capacity = DEFAULT_CAPACITY

    def initialize(self, context: Any) -> None:
        config = getattr(context, "model_yaml_config", None) or {}
        cache = (config.get("handler") or {}).get("cache") or {}
        self.capacity = int(cache.get("capacity", DEFAULT_CAPACITY))

    def handle(self, data: list[dict[str, Any]], context: Any) -> list[str]:
        answers = []
        for idx, row in enumerate(data):
            sequence_id = context.get_sequence_id(idx)
            if context.get_request_header(idx, context.header_key_sequence_start) == "true":
                self.cache[sequence_id] = 0
                while len(self.cache) > self.capacity:
                    self.cache.popitem(last=False)  # the least recently started
            elif sequence_id not in self.cache:
                raise ValueError(f"sequence {sequence_id} has no state in this worker")
            value = _integer(row.get("data", row.get("body")))
            if value == 0:
                answers.append(str(self.cache.pop(sequence_id)))
                context.set_response_header(idx, context.header_key_sequence_end, sequence_id)
                continue
            self.cache[sequence_id] += value
            answers.append(str(self.cache[sequence_id]))
        return answers


def _integer(raw: Any) -> int:
    if isinstance(raw, (bytes, bytearray)):
        raw = raw.decode("utf-8")
    if isinstance(raw, dict):
        raw = raw.get("input")
    return int(str(raw).strip())


_service = RunningSums()
_initialized = False


def handle(data: list[dict[str, Any]] | None, context: Any) -> list[str] | None:
    global _initialized
    if not _initialized:
        _service.initialize(context)
        _initialized = True
    if data is None:
        return None
    return _service.handle(data, context)
