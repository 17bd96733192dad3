"""The stateful demo handler keeps a running sum per sequence and ends one on 0."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import Request

HANDLER = Path(__file__).resolve().parent / "stateful_handler.py"
ID = "ts_request_sequence_id"
START = "ts_request_sequence_start"


def step(sequence_id: str, value: int, *, start: bool = False) -> Request:
    headers = {ID: sequence_id, **({START: "true"} if start else {})}
    return Request(str(value).encode(), "text/plain", headers)


def test_sums_per_sequence_in_one_batch_and_across_batches(load_model: Any, tmp_path: Path) -> None:
    model = load_model(HANDLER, tmp_path, batch_size=4)
    first = model.infer([step("a", 2, start=True), step("b", 10, start=True)])
    assert [first.chunks(f"req-1-{i}")[-1] for i in range(2)] == [b"2", b"10"]
    second = model.infer([step("b", 5), step("a", 4)])
    assert [second.chunks(f"req-2-{i}")[-1] for i in range(2)] == [b"15", b"6"]


def test_zero_ends_the_sequence_with_the_end_header(load_model: Any, tmp_path: Path) -> None:
    model = load_model(HANDLER, tmp_path)
    model.infer([step("a", 3, start=True)])
    ended = model.infer([step("a", 0)])
    (reply,) = ended.final.replies
    assert bytes(reply.body) == b"3"
    assert reply.headers["ts_request_sequence_end"] == "a"
    refused = model.infer([step("a", 1)])
    assert refused.final.code != 200  # no state left for "a"


def test_the_cache_is_bounded_by_its_capacity(load_model: Any, tmp_path: Path) -> None:
    config = {"handler": {"cache": {"capacity": 2}}}
    model = load_model(HANDLER, tmp_path, model_yaml_config=config)
    for name in ("a", "b", "c"):
        model.infer([step(name, 1, start=True)])
    assert model.infer([step("c", 1)]).chunks("req-4-0")[-1] == b"2"
    assert model.infer([step("a", 1)]).final.code != 200  # the oldest was dropped


@pytest.mark.parametrize("body", [b"7", b'{"input": 7}', b" 7 "])
def test_bodies_as_text_or_json(load_model: Any, tmp_path: Path, body: bytes) -> None:
    model = load_model(HANDLER, tmp_path)
    request = Request(
        body, "application/json" if b"{" in body else "text/plain", {ID: "x", START: "true"}
    )
    assert model.infer([request]).chunks("req-1-0")[-1] == b"7"
