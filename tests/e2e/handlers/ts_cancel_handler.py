"""A stand-in for the handler of TorchServe's ``examples/stateful/sequence_continuous_batching``
with the same protocol, for its test config (batchSize 1): a running sum per sequence.

* The first request of a sequence (start header) sets the sum to its value and is answered
  once.
* After that, a value is added to the sum. An even one is answered once; an odd one streams
  the sum: one answer per step of the running batch, ``handler.stream_steps`` (default 10,
  TorchServe's) more after the first, each step taking ``handler.step_ms``.
* ``-1`` cancels the sequence's running streams: each gives its last answer in the step the
  cancel runs in (the cancel must join the running batch while they run), and the cancel
  answers ``-1``.
* ``0`` answers the sum and ends the sequence (``ts_request_sequence_end`` response header);
  its running streams end at the same step.

Bodies are text (``3``) or JSON (``{"input": 3}``), as TorchServe's test sends them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Sequence:
    total: int = 0
    cancelled: bool = False
    ended: bool = False
    streams: dict[str, int] = field(default_factory=dict)  # request id -> answers left


class CancellableSums:
    def __init__(self) -> None:
        self.sequences: dict[str, Sequence] = {}
        self.stream_steps = 10
        self.step_seconds = 0.0

    def configure(self, context: Any) -> None:
        config = (getattr(context, "model_yaml_config", None) or {}).get("handler") or {}
        self.stream_steps = int(config.get("stream_steps", 10))
        self.step_seconds = float(config.get("step_ms", 0)) / 1000.0

    def handle(self, data: list[dict[str, Any]], context: Any) -> list[str]:
        rows = []  # (sequence id, request id, answer)
        going_on = False
        for idx, row in enumerate(data):
            sequence_id = context.get_sequence_id(idx)
            request_id = context.get_request_id(idx)
            context.set_response_header(idx, context.header_key_sequence_id, sequence_id)
            seq = self.sequences.get(sequence_id)
            if seq is not None and request_id in seq.streams:  # a stream going on
                going_on = True
                rows.append((sequence_id, request_id, str(seq.total)))
                continue
            value = _value(row.get("data", row.get("body")))
            if context.get_request_header(idx, context.header_key_sequence_start) == "true":
                self.sequences[sequence_id] = Sequence(total=value)
                rows.append((sequence_id, "", str(value)))
                continue
            if seq is None:
                raise ValueError(f"sequence {sequence_id} was never started in this worker")
            if value == -1:
                seq.cancelled = bool(seq.streams)
                rows.append((sequence_id, "", "-1"))
                continue
            seq.total += value
            if value == 0:
                seq.ended = True
                context.set_response_header(idx, context.header_key_sequence_end, sequence_id)
            elif value % 2:
                seq.streams[request_id] = self.stream_steps
            rows.append((sequence_id, request_id if value % 2 else "", str(seq.total)))
        if going_on and self.step_seconds:
            time.sleep(self.step_seconds)  # a decoding step's work
        # Decided after every row of the step was read, as TorchServe's stopping criteria.
        context.stopping_criteria = [self._criterion(sid, rid) for sid, rid, _ in rows]
        return [answer for _, _, answer in rows]

    def _criterion(self, sequence_id: str, request_id: str) -> Any:
        def stop(_answer: Any) -> bool | None:
            seq = self.sequences.get(sequence_id)
            if seq is None or request_id not in seq.streams:
                self._settle(sequence_id)
                return None  # answered once
            left = seq.streams[request_id]
            if left > 0 and not (seq.cancelled or seq.ended):
                seq.streams[request_id] = left - 1
                return False  # more to come
            del seq.streams[request_id]
            self._settle(sequence_id)
            return True  # the last answer

        return stop

    def _settle(self, sequence_id: str) -> None:
        """A cancel stops the streams running when it came; an ended sequence is dropped
        once its streams have stopped."""
        seq = self.sequences.get(sequence_id)
        if seq is not None and not seq.streams:
            seq.cancelled = False
            if seq.ended:
                del self.sequences[sequence_id]


def _value(raw: Any) -> int:
    if isinstance(raw, (bytes, bytearray)):
        raw = raw.decode("utf-8")
    if isinstance(raw, str) and raw.lstrip().startswith("{"):
        raw = json.loads(raw)
    if isinstance(raw, dict):
        raw = raw.get("input")
    return int(str(raw).strip())


_service = CancellableSums()
_configured = False


def handle(data: list[dict[str, Any]] | None, context: Any) -> list[str] | None:
    global _configured
    if not _configured:
        _service.configure(context)
        _configured = True
    if data is None:
        return None
    return _service.handle(data, context)
