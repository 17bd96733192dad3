"""A stateful handler written like TorchServe's ``examples/stateful`` one: a running sum per
sequence, kept in the worker process, started on the start header, ended (with the end
response header) when a request sends 0. Each answer is ``"<sum> <worker pid>"`` so tests
can check sequence affinity."""

from __future__ import annotations

import os
from typing import Any


class RunningSum:
    def __init__(self) -> None:
        self.cache: dict[str, int] = {}

    def handle(self, data: list[dict[str, Any]], context: Any) -> list[str]:
        answers = []
        for idx, row in enumerate(data):
            sequence_id = context.get_sequence_id(idx)
            started = context.get_request_header(idx, context.header_key_sequence_start)
            if started == "true":
                self.cache[sequence_id] = 0
            elif sequence_id not in self.cache:
                raise ValueError(f"sequence {sequence_id} was never started in this worker")
            raw = row.get("data") or row.get("body")
            value = int(raw.decode() if isinstance(raw, (bytes, bytearray)) else raw)
            if value == 0:
                total = self.cache.pop(sequence_id)
                context.set_response_header(idx, context.header_key_sequence_end, sequence_id)
            else:
                self.cache[sequence_id] += value
                total = self.cache[sequence_id]
            answers.append(f"{total} {os.getpid()}")
        return answers


_service = RunningSum()


def handle(data: list[dict[str, Any]] | None, context: Any) -> list[str] | None:
    if data is None:
        return None
    return _service.handle(data, context)
