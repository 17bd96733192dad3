"""The echo handler answers every request with its own input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import echo_handler
import pytest

HANDLER = Path(__file__).resolve().parent / "echo_handler.py"


class FakeContext:
    """Just enough of ``ts.context.Context`` to call ``handle`` directly."""

    def __init__(self, headers: list[dict[str, Any]]) -> None:
        self.headers = headers
        self.content_types: dict[int, str] = {}

    def get_request_header(self, idx: int, key: str) -> Any:
        return self.headers[idx].get(key)

    def set_response_content_type(self, idx: int, value: str) -> None:
        self.content_types[idx] = value


def test_mixed_batch_is_echoed_unchanged() -> None:
    data = [
        {"body": bytearray(b"\x00\x01raw\xff")},
        {"body": "héllo wörld"},
        {"body": {"a": [1, 2.5, None], "b": {"nested": True}}},
    ]
    context = FakeContext(
        [
            {"body": {"content-type": "application/octet-stream"}},
            {"body": {"content-type": ""}, "Content-Type": "text/plain"},
            {"body": {"content-type": "application/json"}},
        ]
    )

    answers = echo_handler.handle(data, context)

    assert answers == [b"\x00\x01raw\xff", "héllo wörld", data[2]["body"]]
    assert type(answers[0]) is bytes
    assert type(answers[1]) is str
    assert context.content_types == {
        0: "application/octet-stream",
        1: "text/plain",
        2: "application/json",
    }


def test_initialisation_call_returns_nothing() -> None:
    assert echo_handler.handle(None, FakeContext([])) is None


def test_content_type_falls_back_to_the_value_type() -> None:
    context = FakeContext([{}, {}, {}])
    answers = echo_handler.handle([{"body": b"x"}, {"body": "y"}, {"body": [1]}], context)
    assert answers == [b"x", "y", [1]]
    assert context.content_types == {
        0: "application/octet-stream",
        1: "text/plain; charset=utf-8",
        2: "application/json",
    }


def test_context_without_request_state_is_tolerated() -> None:
    class Bare:
        def get_request_header(self, idx: int, key: str) -> Any:
            raise RuntimeError("no batch is being handled")

    assert echo_handler.handle([{"data": "text"}], Bare()) == ["text"]


def test_through_the_worker_mixed_batch(load_model: Any, tmp_path: Path) -> None:
    model = load_model(HANDLER, tmp_path, batch_size=3)
    payload = {"a": [1, 2], "ok": True, "name": "ünï"}
    requests = [
        (b"\x00\x01\x02binary\xfe", "application/octet-stream"),
        ("plain text ✓".encode(), "text/plain; charset=utf-8"),
        (json.dumps(payload).encode(), "application/json"),
    ]

    result = model.infer(requests)

    assert result.intermediate == []
    assert result.final.code == 200
    replies = result.final.replies
    assert [r.request_id for r in replies] == ["req-1-0", "req-1-1", "req-1-2"]
    assert bytes(replies[0].body) == b"\x00\x01\x02binary\xfe"
    assert bytes(replies[1].body).decode() == "plain text ✓"
    assert json.loads(bytes(replies[2].body)) == payload
    assert [r.content_type for r in replies] == [
        "application/octet-stream",
        "text/plain; charset=utf-8",
        "application/json",
    ]
    assert all(r.status == 200 for r in replies)


@pytest.mark.parametrize("body", [b'"just a string"', b"42", b"null", b"[true, false]"])
def test_json_scalars_round_trip_as_json(load_model: Any, tmp_path: Path, body: bytes) -> None:
    model = load_model(HANDLER, tmp_path)
    (reply,) = model.infer([(body, "application/json")]).final.replies
    assert json.loads(bytes(reply.body)) == json.loads(body)
    assert reply.content_type == "application/json"


def test_no_content_type_echoes_bytes(load_model: Any, tmp_path: Path) -> None:
    model = load_model(HANDLER, tmp_path)
    (reply,) = model.infer([(b"anything at all", None)]).final.replies
    assert bytes(reply.body) == b"anything at all"
    assert reply.content_type == "application/octet-stream"
