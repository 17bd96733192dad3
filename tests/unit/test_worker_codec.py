"""Input decoding (spec §2.2), output encoding (§2.4) and reply building."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from typing import Any

import pytest

from trioserve.core.messages import Param, WorkItem
from trioserve.worker.torchserve.codec import (
    decode_enabled,
    decode_request,
    decode_value,
    encode_output,
)
from trioserve.worker.torchserve.context import Context
from trioserve.worker.torchserve.replies import OutputError, final_reply, make_reply


@pytest.mark.parametrize(
    ("raw", "content_type", "expected"),
    [
        (b'{"a": [1, 2]}', "application/json", {"a": [1, 2]}),
        (b"[1, 2]", "application/json", [1, 2]),
        (b"not json", "application/json", bytearray(b"not json")),
        (b'{"a": 1}', "application/json; charset=utf-8", bytearray(b'{"a": 1}')),
        (b"hello", "text/plain", "hello"),
        ("h\u00e9".encode(), "text/csv; charset=utf-8", "h\u00e9"),
        (b"\xff\xfe", "text/plain", bytearray(b"\xff\xfe")),
        (b"\x00\x01", "application/octet-stream", bytearray(b"\x00\x01")),
        (b"{}", None, bytearray(b"{}")),
        (b"", "image/png", bytearray()),
    ],
)
def test_decode_value(raw: bytes, content_type: str | None, expected: Any) -> None:
    value = decode_value(Param("body", memoryview(raw), content_type))
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize("content_type", ["application/json", "text/plain", None])
def test_decode_disabled_gives_bytearray(content_type: str | None) -> None:
    assert decode_value(Param("b", b'"x"', content_type), decode=False) == bytearray(b'"x"')


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, True),
        ({"TS_DECODE_INPUT_REQUEST": "true"}, True),
        ({"TS_DECODE_INPUT_REQUEST": "TRUE"}, True),
        ({"TS_DECODE_INPUT_REQUEST": "false"}, False),
        ({"TS_DECODE_INPUT_REQUEST": "0"}, False),
    ],
)
def test_decode_enabled(env: dict[str, str], expected: bool) -> None:
    assert decode_enabled(env) is expected


def test_decode_request_and_headers() -> None:
    from trioserve.worker.torchserve.codec import request_headers

    item = WorkItem(
        "r1",
        [("Content-Type", "multipart/form-data"), ("data", "header wins")],
        [
            Param("data", b"[1]", "application/json"),
            Param("name", b"x", None),
            Param("name", b"y", "text/plain"),
        ],
    )
    assert decode_request(item) == {"data": [1], "name": "y"}
    assert request_headers(item) == {
        "data": "header wins",
        "name": {"content-type": "text/plain"},
        "Content-Type": "multipart/form-data",
    }


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b"\x00raw", b"\x00raw"),
        (bytearray(b"ba"), b"ba"),
        ("h\u00e9llo", "h\u00e9llo".encode()),
        ({"a": [1, 2]}, json.dumps({"a": [1, 2]}, indent=2).encode()),
        ([1.5, None, True], b"[\n  1.5,\n  null,\n  true\n]"),
        (3, b"3"),
        (None, b"null"),
    ],
)
def test_encode_output(value: Any, expected: bytes) -> None:
    assert bytes(encode_output(value)) == expected


def test_encode_tensor_with_torch_save() -> None:
    import torch

    tensor = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    body = encode_output(tensor)
    restored = torch.load(io.BytesIO(bytes(body)), weights_only=True)
    assert torch.equal(restored, tensor)


def test_encode_unserializable_raises() -> None:
    with pytest.raises(TypeError):
        encode_output(object())


def test_worker_modules_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import trioserve.worker.loop, trioserve.worker.torchserve.base_handler\n"
        "import trioserve.worker.torchserve.ts_shim\n"
        "from trioserve.worker.torchserve.codec import encode_output\n"
        "encode_output({'a': 1}); encode_output('x'); encode_output(b'y')\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr


def _context(n: int) -> Context:
    ctx = Context("m", "/d", None, n, None, "0.12.0")
    ctx.begin_batch([f"r{i}" for i in range(n)], [{} for _ in range(n)])
    return ctx


def _items(n: int) -> list[WorkItem]:
    return [WorkItem(f"r{i}", [], []) for i in range(n)]


def test_make_reply_uses_the_response_state() -> None:
    ctx = _context(2)
    ctx.set_response_status(201, "Created", 1)
    ctx.set_response_header(1, "x-count", 3)
    ctx.set_response_content_type(1, "application/json")
    reply = make_reply(ctx, 1, "r1", {"ok": True})
    assert reply.request_id == "r1"
    assert reply.status == 201
    assert reply.reason == "Created"
    assert reply.headers == {"x-count": "3"}
    assert reply.content_type == "application/json"
    assert json.loads(bytes(reply.body)) == {"ok": True}

    plain = make_reply(ctx, 0, "r0", "x")
    assert (plain.status, plain.reason, plain.headers, plain.content_type) == (200, "", {}, None)


def test_final_reply_one_per_request() -> None:
    batch = final_reply(9, _items(2), ["a", b"b"], _context(2))
    assert (batch.batch_id, batch.code, batch.final) == (9, 200, True)
    assert [(r.request_id, bytes(r.body)) for r in batch.replies] == [("r0", b"a"), ("r1", b"b")]


@pytest.mark.parametrize(
    ("answers", "code", "message"),
    [
        ("nope", 503, "Invalid model predict output"),
        (None, 503, "Invalid model predict output"),
        (["only one"], 503, "number of batch response mismatched"),
        (["a", "b", "c"], 503, "number of batch response mismatched"),
        (["a", object()], 503, "Unsupported model output data type."),
    ],
)
def test_final_reply_rejects_bad_answers(answers: Any, code: int, message: str) -> None:
    with pytest.raises(OutputError) as info:
        final_reply(1, _items(2), answers, _context(2))
    assert (info.value.code, info.value.message) == (code, message)


def test_stopping_criteria_sets_stream_next_header() -> None:
    ctx = _context(2)
    ctx.stopping_criteria = [lambda out: out == "end", lambda out: None]
    batch = final_reply(1, _items(2), ["more", "x"], ctx)
    assert batch.replies[0].headers == {"ts_stream_next": "true"}
    assert batch.replies[1].headers == {}
