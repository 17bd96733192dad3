"""The streaming handler sends one chunk per word, then ``[done]``."""

from __future__ import annotations

import importlib
import json
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

HANDLER = Path(__file__).resolve().parent / "stream_handler.py"
FAST = {"handler": {"delay_ms": 0}}


@pytest.fixture
def stream_handler(ts_importable: None) -> ModuleType:
    return importlib.import_module("stream_handler")


def _text(chunks: list[bytes]) -> str:
    return b"".join(chunks).decode("utf-8")


def test_chunks_arrive_in_order_and_concatenate(load_model: Any, tmp_path: Path) -> None:
    model = load_model(HANDLER, tmp_path, model_yaml_config=FAST)
    result = model.infer([(b"hello streaming world", "text/plain")])

    assert result.final.code == 200
    assert len(result.intermediate) == 3
    assert all(not frame.final for frame in result.intermediate)
    assert result.final.final
    assert result.chunks("req-1-0") == [b"hello ", b"streaming ", b"world ", b"[done]"]
    assert _text(result.chunks("req-1-0")) == "hello streaming world [done]"
    for frame in [*result.intermediate, result.final]:
        (reply,) = frame.replies
        assert reply.status == 200
        assert reply.content_type == "text/plain; charset=utf-8"


@pytest.mark.parametrize(
    ("body", "content_type", "expected"),
    [
        (b'{"prompt": "a b", "tokens": 5}', "application/json", ["a ", "b ", "a ", "b ", "a "]),
        (b'{"prompt": "one two three", "tokens": 2}', None, ["one ", "two "]),
        (b'{"prompt": "x y", "tokens": 0}', "application/json", []),
        (b'{"prompt": "only prompt"}', "application/json", ["only ", "prompt "]),
        (b"  spaced\tout\n words ", "text/plain", ["spaced ", "out ", "words "]),
        ("ünïcode wörds".encode(), None, ["ünïcode ", "wörds "]),
        (b"", "text/plain", []),
        (b"{not json", "text/plain", ["{not ", "json "]),
    ],
)
def test_prompt_forms(
    load_model: Any,
    tmp_path: Path,
    body: bytes,
    content_type: str | None,
    expected: list[str],
) -> None:
    model = load_model(HANDLER, tmp_path, model_yaml_config=FAST)
    result = model.infer([(body, content_type)])
    assert result.final.code == 200
    chunks = [c.decode("utf-8") for c in result.chunks("req-1-0")]
    assert chunks == [*expected, "[done]"]


def test_batch_streams_side_by_side(load_model: Any, tmp_path: Path) -> None:
    model = load_model(HANDLER, tmp_path, model_yaml_config=FAST, batch_size=2)
    result = model.infer([(b"a b c", "text/plain"), (b"x", "text/plain")])

    # Round one carries a word for both requests, later rounds only for the longer one.
    assert [[r.request_id for r in f.replies] for f in result.intermediate] == [
        ["req-1-0", "req-1-1"],
        ["req-1-0"],
        ["req-1-0"],
    ]
    assert _text(result.chunks("req-1-0")) == "a b c [done]"
    assert _text(result.chunks("req-1-1")) == "x [done]"


def test_delay_comes_from_model_config(load_model: Any, tmp_path: Path) -> None:
    model = load_model(HANDLER, tmp_path, model_yaml_config={"handler": {"delay_ms": 40}})
    start = time.monotonic()
    result = model.infer([(b"one two three", "text/plain")])
    elapsed = time.monotonic() - start
    assert _text(result.chunks("req-1-0")) == "one two three [done]"
    # A pause after each of the three words.
    assert elapsed >= 3 * 0.040


def test_default_delay_is_50_ms(stream_handler: ModuleType) -> None:
    class Ctx:
        model_yaml_config: dict[str, Any] = {}

    assert stream_handler.delay_seconds(Ctx()) == pytest.approx(0.050)


@pytest.mark.parametrize("bad", ["soon", -1, float("nan")])
def test_bad_delay_is_refused_at_load(load_model: Any, tmp_path: Path, bad: Any) -> None:
    with pytest.raises(ValueError, match=r"handler\.delay_ms"):
        load_model(HANDLER, tmp_path, model_yaml_config={"handler": {"delay_ms": bad}})


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": 3},
        {"prompt": "a", "tokens": -1},
        {"prompt": "a", "tokens": "2"},
        {"prompt": "a", "tokens": 10_001},
    ],
)
def test_bad_request_fails_the_batch(
    load_model: Any, tmp_path: Path, stream_handler: ModuleType, body: Any
) -> None:
    model = load_model(HANDLER, tmp_path, model_yaml_config=FAST)
    result = model.infer([(json.dumps(body).encode(), "application/json")])
    assert result.intermediate == []
    assert (result.final.code, result.final.message) == (503, "Prediction failed")
    with pytest.raises(ValueError, match="request 0"):
        stream_handler.parse_request(body)


def test_expected_text_matches_plan(stream_handler: ModuleType) -> None:
    assert stream_handler.expected_text("a b", 3) == "a b a [done]"
    assert stream_handler.plan_chunks("", 4) == []
