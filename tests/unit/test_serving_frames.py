"""What the control process and the other serving processes say (sans-IO): a request, a
reply and an error survive the link (marshal, through the link's framing) unchanged, and a
deadline travels as what is left of it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.link_frames import FrameReader, encode
from trioserve.core.messages import Param, Reply
from trioserve.core.request import InferenceRequest
from trioserve.core.serving_frames import (
    FAILED,
    REPLY,
    SUBMIT,
    error_from,
    error_tuple,
    reply_from,
    reply_tuple,
    request_from,
    request_tuple,
)

text = st.text(max_size=20)
params = st.lists(st.builds(Param, text, st.binary(max_size=64), st.none() | text), max_size=4)
requests = st.builds(
    InferenceRequest,
    model=text,
    version=st.none() | text,
    params=params,
    headers=st.lists(st.tuples(text, text), max_size=4),
    sequence_id=st.none() | text,
    ends_sequence=st.booleans(),
    streamed=st.booleans(),
)


def through_link(frame: tuple[object, ...]) -> tuple[object, ...]:
    (got,) = FrameReader().feed(encode([frame]))
    return got


@given(requests, st.none() | st.floats(0, 1e6), st.floats(-1e6, 1e6))
def test_a_request_crosses_the_link_whole(
    request: InferenceRequest, remaining: float | None, now: float
) -> None:
    frame = through_link((SUBMIT, 7, request_tuple(request, remaining)))
    assert frame[:2] == (SUBMIT, 7)
    got = request_from(frame[2], now)  # type: ignore[arg-type]
    assert (got.model, got.version, got.headers, got.request_id) == (
        request.model,
        request.version,
        request.headers,
        request.request_id,
    )
    assert [(p.name, bytes(p.value), p.content_type) for p in got.params] == [
        (p.name, bytes(p.value), p.content_type) for p in request.params
    ]
    assert (got.sequence_id, got.ends_sequence, got.streamed) == (
        request.sequence_id,
        request.ends_sequence,
        request.streamed,
    )
    assert got.deadline == (None if remaining is None else now + remaining)


@given(
    st.builds(
        Reply,
        text,
        st.binary(max_size=64),
        st.integers(100, 599),
        text,
        st.dictionaries(text, text, max_size=3),
        st.none() | text,
    ),
    st.booleans(),
)
def test_a_reply_crosses_the_link_whole(reply: Reply, final: bool) -> None:
    frame = through_link((REPLY, 3, reply_tuple(reply), final))
    assert reply_from(frame[2]) == reply and frame[3] is final  # type: ignore[arg-type]


@given(
    st.sampled_from(list(ErrorKind)),
    st.text(max_size=100),
    st.none() | st.integers(0, 3600),
    st.none() | st.integers(100, 599),
)
def test_an_error_crosses_the_link_with_its_kind_and_fields(
    kind: ErrorKind, message: str, retry_after: int | None, code: int | None
) -> None:
    error = ServeError(kind, message, retry_after=retry_after, code=code)
    frame = through_link((FAILED, 9, *error_tuple(error)))
    got = error_from(frame[2:])
    assert (got.kind, got.message, got.reason, got.retry_after, got.code) == (
        error.kind,
        error.message,
        error.reason,
        error.retry_after,
        error.code,
    )
