"""A continuous-batching stateful handler: a running sum per sequence that can stream.

It follows the conventions of TorchServe's
``examples/stateful/sequence_continuous_batching`` example, so the same clients work:

* the first request of a sequence carries the start header
  (``ts_request_sequence_start: true``): the sequence's sum starts at 0;
* an even value is added to the sum and answered once;
* an odd value is added, then the sum is *streamed*: one answer per step of the running
  batch, ``handler.stream_steps`` answers in all (default 6), the last one final;
* ``0`` ends the sequence: it answers the sum, sets the end response header
  (``ts_request_sequence_end: <id>``, which makes the server close the sequence) and stops
  the sequence's streams at their next step;
* ``-1`` cancels the sequence's running streams (each sends one last answer at the next
  step) and answers ``-1``.

Continuous batching is TorchServe's contract: the handler is called once per step with the
running batch, where a request that goes on has no parameters (its row is ``{}``) and is
recognised by its request id; ``context.stopping_criteria`` holds one callable per row,
called with that row's answer: ``None`` answers the request once, ``False`` sends the
answer and keeps the request in the running batch, ``True`` sends it as the last one.

Every answer also carries the header ``x-step-batch``: how many requests the step ran
(requests joining a running batch show up there). ``handler.step_ms`` makes each step take
that long (default 0), as a model's decoding step would.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

DEFAULT_CAPACITY = 100
DEFAULT_STREAM_STEPS = 6


@dataclass
class SequenceState:
    total: int = 0
    cancelled: bool = False
    ended: bool = False
    streams: set[str] = field(default_factory=set)  # request ids streaming now


class Once:
    """The stopping criterion of a request answered in one step."""

    def __call__(self, _answer: Any) -> bool | None:
        return None


class Stream:
    """The stopping criterion of a streaming request: False while more answers follow."""

    def __init__(self, owner: StreamingSums, sequence_id: str, request_id: str, steps: int):
        self.owner = owner
        self.sequence_id = sequence_id
        self.request_id = request_id
        self.left = steps

    def __call__(self, _answer: Any) -> bool | None:
        self.left -= 1
        state = self.owner.sequences.get(self.sequence_id)
        if self.left > 0 and state is not None and not (state.cancelled or state.ended):
            return False
        self.owner.finish(self)
        return True


class StreamingSums:
    def __init__(self) -> None:
        self.sequences: OrderedDict[str, SequenceState] = OrderedDict()
        self.running: dict[str, Stream] = {}  # request id -> its stream
        self.capacity = DEFAULT_CAPACITY
        self.stream_steps = DEFAULT_STREAM_STEPS
        self.step_seconds = 0.0

    def initialize(self, context: Any) -> None:
        config = (getattr(context, "model_yaml_config", None) or {}).get("handler") or {}
        self.capacity = int((config.get("cache") or {}).get("capacity", DEFAULT_CAPACITY))
        self.stream_steps = max(1, int(config.get("stream_steps", DEFAULT_STREAM_STEPS)))
        self.step_seconds = float(config.get("step_ms", 0)) / 1000.0

    def finish(self, stream: Stream) -> None:
        self.running.pop(stream.request_id, None)
        state = self.sequences.get(stream.sequence_id)
        if state is not None:
            state.streams.discard(stream.request_id)
            if not state.streams:
                state.cancelled = False  # a cancel stops the streams running when it came
                if state.ended:
                    self.sequences.pop(stream.sequence_id, None)

    def handle(self, data: list[dict[str, Any]], context: Any) -> list[str]:
        answers: list[str] = []
        criteria: list[Any] = []
        for idx, row in enumerate(data):
            answer, criterion = self._one(idx, row, context)
            answers.append(answer)
            criteria.append(criterion)
            context.set_response_header(idx, "x-step-batch", str(len(data)))
        context.stopping_criteria = criteria
        if self.step_seconds:
            time.sleep(self.step_seconds)
        return answers

    def _one(self, idx: int, row: dict[str, Any], context: Any) -> tuple[str, Any]:
        sequence_id = context.get_sequence_id(idx)
        request_id = context.get_request_id(idx)
        context.set_response_header(idx, context.header_key_sequence_id, sequence_id)
        stream = self.running.get(request_id)
        if stream is not None:  # a request that goes on: its row is empty
            state = self.sequences.get(sequence_id)
            return str(state.total if state else 0), stream
        if context.get_request_header(idx, context.header_key_sequence_start) == "true":
            self.sequences[sequence_id] = SequenceState()
            while len(self.sequences) > self.capacity:
                self.sequences.popitem(last=False)  # the least recently started
        state = self.sequences.get(sequence_id)
        if state is None:
            context.set_response_status(400, "no state for this sequence", idx)
            context.set_response_header(idx, context.header_key_sequence_end, sequence_id)
            return f"sequence {sequence_id} has no state in this worker", Once()
        value = _integer(row.get("data", row.get("body")))
        if value == -1:
            state.cancelled = bool(state.streams)
            return "-1", Once()
        state.total += value
        if value == 0:
            state.ended = True
            context.set_response_header(idx, context.header_key_sequence_end, sequence_id)
            if not state.streams:
                self.sequences.pop(sequence_id, None)
            return str(state.total), Once()
        if value % 2 == 0:
            return str(state.total), Once()
        stream = Stream(self, sequence_id, request_id, self.stream_steps)
        self.running[request_id] = stream
        state.streams.add(request_id)
        return str(state.total), stream


def _integer(raw: Any) -> int:
    if isinstance(raw, (bytes, bytearray)):
        raw = raw.decode("utf-8")
    if isinstance(raw, dict):
        raw = raw.get("input")
    return int(str(raw).strip())


_service = StreamingSums()
_initialized = False


def handle(data: list[dict[str, Any]] | None, context: Any) -> list[str] | None:
    global _initialized
    if not _initialized:
        _service.initialize(context)
        _initialized = True
    if data is None:
        return None
    return _service.handle(data, context)
