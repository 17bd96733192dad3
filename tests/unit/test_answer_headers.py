"""The headers of a prediction's answer: the shortcut for an answer without handler headers
gives exactly the merge's list, and header encoding refuses what could split the head."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trioserve.core.messages import Reply
from trioserve.http.bodies import NO_CACHE_HEADERS, encode_headers
from trioserve.http.inference import reply_headers


def merged(
    reply: Reply, request_id: str, sequence: tuple[str, str] | None
) -> list[tuple[str, str]]:
    """The rule, written plainly: no-cache headers, then the handler's (replacing any of the
    same name in any case), the content type, the request id, the sequence header."""
    out = {key.lower(): (key, value) for key, value in NO_CACHE_HEADERS.items()}
    for key, value in reply.headers.items():
        out[key.lower()] = (key, value)
    if reply.content_type:
        out["content-type"] = ("Content-Type", reply.content_type)
    out["x-request-id"] = ("x-request-id", request_id)
    if sequence is not None:
        out[sequence[0].lower()] = sequence
    return list(out.values())


NAMES = st.sampled_from(
    ["Pragma", "pragma", "X-Request-ID", "Content-Type", "ts_request_sequence_id", "X-Other"]
)


@given(
    headers=st.dictionaries(NAMES, st.text(max_size=5), max_size=3),
    content_type=st.none() | st.sampled_from(["", "application/json", "text/plain"]),
    sequence_name=st.none() | NAMES,
)
def test_the_answer_headers_follow_the_merge_rule(
    headers: dict[str, str], content_type: str | None, sequence_name: str | None
) -> None:
    reply = Reply("r", b"", 200, "", headers, content_type)
    sequence = None if sequence_name is None else (sequence_name, "s-1")
    assert reply_headers(reply, "id-1", sequence) == merged(reply, "id-1", sequence)


def test_encoding_keeps_order_and_refuses_a_split_head() -> None:
    pairs = [*NO_CACHE_HEADERS.items(), ("x-request-id", "abc"), ("X-Ünicode-Value", "é")]
    with pytest.raises(ValueError, match="invalid response header"):
        encode_headers(pairs)  # a name outside ASCII
    pairs[-1] = ("X-Value", "é")
    assert encode_headers(pairs) == [
        (name.encode("ascii"), value.encode("latin-1")) for name, value in pairs
    ]
    for bad in ("a\r\nSet-Cookie: x", "a\nb", "a\0b"):
        with pytest.raises(ValueError, match="invalid response header"):
            encode_headers([("Pragma", "no-cache"), ("X-Bad", bad)])
