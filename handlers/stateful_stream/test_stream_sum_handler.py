"""The continuous-batching demo handler, run step by step the way a worker runs it: a
request that goes on comes back with its id and headers but no parameters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trioserve.core.messages import Param, WorkItem
from trioserve.worker.torchserve.batch import prepare, run_batch

HANDLER = Path(__file__).resolve().parent / "stream_sum_handler.py"
ID, START, END = "ts_request_sequence_id", "ts_request_sequence_start", "ts_request_sequence_end"


class Steps:
    """Drives the handler like the server does: each step is the running requests (without
    parameters) then the new ones; an answer with ``ts_stream_next: true`` goes on."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.running: list[WorkItem] = []
        self.count = 0

    def step(self, *new: tuple[str, str, int, bool]) -> dict[str, tuple[str, bool, dict[str, str]]]:
        """New requests as (request id, sequence id, value, start); returns each request's
        (answer, more to come, headers)."""
        items = [WorkItem(i.request_id, i.headers, []) for i in self.running]
        for request_id, sequence_id, value, start in new:
            headers = [(ID, sequence_id), *([(START, "true")] if start else [])]
            items.append(WorkItem(request_id, headers, [Param("body", str(value).encode())]))
        self.count += 1
        data = prepare(self.model.context, items)
        reply = run_batch(self.model.entry, self.model.context, self.count, items, data)
        self.model.context.end_batch()
        assert reply.code == 200, reply.message
        out = {}
        going_on = []
        for item, answer in zip(items, reply.replies, strict=True):
            more = answer.headers.get("ts_stream_next") == "true"
            out[item.request_id] = (bytes(answer.body).decode(), more, answer.headers)
            if more:
                going_on.append(item)
        self.running = going_on
        return out


def test_even_values_answer_once_and_odd_values_stream(load_model: Any, tmp_path: Path) -> None:
    config = {"handler": {"stream_steps": 3}}
    steps = Steps(load_model(HANDLER, tmp_path, model_yaml_config=config, batch_size=4))
    assert steps.step(("r1", "s", 2, True))["r1"][:2] == ("2", False)
    first = steps.step(("r2", "s", 3, False))
    assert first["r2"][:2] == ("5", True) and first["r2"][2]["x-step-batch"] == "1"
    second = steps.step(("r3", "t", 4, True))  # another sequence joins the running batch
    assert second["r2"][:2] == ("5", True) and second["r3"][:2] == ("4", False)
    assert second["r3"][2]["x-step-batch"] == "2"
    assert steps.step()["r2"][:2] == ("5", False)  # the third answer is the last
    assert steps.running == []


def test_minus_one_stops_the_running_stream_at_its_next_step(
    load_model: Any, tmp_path: Path
) -> None:
    steps = Steps(load_model(HANDLER, tmp_path, batch_size=4))
    steps.step(("r1", "s", 2, True))
    assert steps.step(("r2", "s", 3, False))["r2"][1] is True
    cancelled = steps.step(("r3", "s", -1, False))
    assert cancelled["r3"][:2] == ("-1", False)
    assert cancelled["r2"][:2] == ("5", False)  # its last answer
    assert steps.step(("r4", "s", 4, False))["r4"][:2] == ("9", False)  # the sum goes on
    assert steps.step(("r5", "s", 1, False))["r5"][1] is True  # a later stream is not cancelled


def test_zero_ends_the_sequence_and_its_streams(load_model: Any, tmp_path: Path) -> None:
    steps = Steps(load_model(HANDLER, tmp_path, batch_size=4))
    steps.step(("r1", "s", 2, True))
    steps.step(("r2", "s", 3, False))
    ended = steps.step(("r3", "s", 0, False))
    assert ended["r3"][:2] == ("5", False) and ended["r3"][2][END] == "s"
    assert ended["r2"][:2] == ("5", False)
    refused = steps.step(("r4", "s", 2, False))["r4"]
    assert "no state" in refused[0] and refused[2][END] == "s"


def test_a_request_of_an_unknown_sequence_is_answered_400(load_model: Any, tmp_path: Path) -> None:
    model = load_model(HANDLER, tmp_path)
    item = WorkItem("r1", [(ID, "nope")], [Param("body", b"2")])
    reply = run_batch(model.entry, model.context, 1, [item], prepare(model.context, [item]))
    (answer,) = reply.replies
    assert answer.status == 400 and answer.headers[END] == "nope"
