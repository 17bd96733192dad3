"""Intermediate responses, the OTF adapter on ``cl_socket``, and request envelopes."""

from __future__ import annotations

import struct

import pytest

from trioserve.core.frames import Kind, decode
from trioserve.core.messages import BatchReply, decode_reply
from trioserve.worker.errors import LoadError
from trioserve.worker.torchserve.context import Context
from trioserve.worker.torchserve.envelopes import validate, wrap
from trioserve.worker.torchserve.errors import PredictionException
from trioserve.worker.torchserve.streaming import (
    IntermediateChannel,
    OtfError,
    parse_otf_response,
    send_intermediate_predict_response,
)


def _streaming_context(sent: list[bytes]) -> Context:
    ctx = Context("m", "/d", None, 3, None, "0.12.0")
    ctx.begin_batch(["r0", "r1", "r2"], [{}, {}, {}], channel=IntermediateChannel(11, sent.append))
    return ctx


def _reply(frame: bytes) -> BatchReply:
    decoded = decode(frame)
    assert decoded.kind is Kind.RESPONSE
    return decode_reply(decoded)


def test_intermediate_response_frame() -> None:
    sent: list[bytes] = []
    ctx = _streaming_context(sent)
    ctx.set_response_content_type(2, "text/plain")
    ctx.set_response_header(2, "x-step", "1")
    send_intermediate_predict_response(["a", "b", "c"], {0: "r0", 2: "r2"}, "Partial", 206, ctx)
    (frame,) = sent
    reply = _reply(frame)
    assert (reply.batch_id, reply.code, reply.message, reply.final) == (11, 206, "Partial", False)
    assert [(r.request_id, bytes(r.body)) for r in reply.replies] == [("r0", b"a"), ("r2", b"c")]
    assert reply.replies[1].content_type == "text/plain"
    assert reply.replies[1].headers == {"x-step": "1"}


def test_only_local_rank_zero_sends(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[bytes] = []
    ctx = _streaming_context(sent)
    monkeypatch.setenv("LOCAL_RANK", "1")
    send_intermediate_predict_response(["a", "b", "c"], {0: "r0"}, "m", 200, ctx)
    assert sent == []


def test_outside_a_batch_is_a_clear_error() -> None:
    ctx = Context("m", "/d", None, 1, None, "0.12.0")
    with pytest.raises(RuntimeError, match=r"cl_socket is only set while"):
        send_intermediate_predict_response(["a"], {0: "r0"}, "m", 200, ctx)


def _otf_string(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return struct.pack(">i", len(data)) + data


def _otf_reply() -> bytes:
    out = struct.pack(">i", 200) + _otf_string("Intermediate")
    out += _otf_string("req-1") + _otf_string("text/plain") + struct.pack(">i", 200)
    out += _otf_string("")
    out += struct.pack(">i", 2) + _otf_string("ts_stream_next") + _otf_string("true")
    out += _otf_string("content-type") + _otf_string("text/plain")
    out += _otf_string(b"chunk\x00")
    out += _otf_string("req-2") + struct.pack(">i", 0) + struct.pack(">i", 500)
    out += _otf_string("Oops") + struct.pack(">i", 0) + _otf_string("")
    return out + struct.pack(">i", -1)


def test_parse_otf_response() -> None:
    code, message, replies = parse_otf_response(_otf_reply())
    assert (code, message) == (200, "Intermediate")
    first, second = replies
    assert (first.request_id, first.content_type, first.status, first.reason) == (
        "req-1",
        "text/plain",
        200,
        "",
    )
    assert bytes(first.body) == b"chunk\x00"
    assert (second.request_id, second.content_type, second.status, second.reason) == (
        "req-2",
        None,
        500,
        "Oops",
    )
    assert bytes(second.body) == b""


def test_real_ts_writes_through_cl_socket_become_frames() -> None:
    sent: list[bytes] = []
    IntermediateChannel(4, sent.append).sendall(_otf_reply())
    reply = _reply(sent[0])
    assert not reply.final
    assert reply.batch_id == 4
    assert reply.replies[0].headers == {}  # stream marker and content type are not headers


@pytest.mark.parametrize("data", [b"", b"\x00\x00\x00\xc8", _otf_reply()[:-6]])
def test_parse_otf_truncated(data: bytes) -> None:
    with pytest.raises(OtfError):
        parse_otf_response(data)


def test_envelope_validation() -> None:
    validate(None)
    for known in ("json", "body", "kserve", "kservev2"):
        validate(known)
    for name in ("kservev3", "weird"):
        with pytest.raises(LoadError, match=f"'{name}' is not supported"):
            validate(name)


def test_body_envelope_is_identity() -> None:
    def entry(d: object, c: object) -> object:
        return d

    assert wrap("body", entry) is entry
    assert wrap(None, entry) is entry


def test_json_envelope_rejects_bad_bodies() -> None:
    wrapped = wrap("json", lambda d, c: d)
    with pytest.raises(PredictionException) as info:
        wrapped([{"body": {"no": "instances"}}], None)
    assert info.value.error_code == 400
    with pytest.raises(PredictionException, match="not JSON"):
        wrapped([{"body": bytearray(b"{")}], None)


def test_json_envelope_passes_malformed_answers_through() -> None:
    wrapped = wrap("json", lambda d, c: "oops")
    assert wrapped([{"body": {"instances": [1]}}], None) == "oops"
