"""The sans-IO HTTP/1.1 request reader and response framing (trioserve.core.http1)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trioserve.core import http1
from trioserve.core.http1 import (
    LAST_CHUNK,
    HttpError,
    Request,
    RequestReader,
    chunk,
    no_body,
    response_head,
)


def read_all(data: bytes, *, max_body: int = 1 << 20, pieces: list[int] | None = None) -> list:
    """Every request in ``data``, fed whole or cut at the given sizes."""
    reader = RequestReader(max_body_size=max_body)
    out: list[Request] = []
    cuts = pieces or [len(data)]
    pos = 0
    for size in [*cuts, len(data)]:
        reader.feed(data[pos : pos + size])
        pos += size
        while (request := reader.next_request()) is not None:
            out.append(request)
        if pos >= len(data):
            break
    return out


def test_a_simple_request_with_a_body() -> None:
    (r,) = read_all(
        b"POST /predictions/m?x=1 HTTP/1.1\r\nHost: h\r\nContent-Type: text/plain\r\n"
        b"Content-Length: 5\r\n\r\nhello"
    )
    assert (r.method, r.target, r.path, r.query, r.http_version) == (
        "POST",
        "/predictions/m?x=1",
        "/predictions/m",
        "x=1",
        "1.1",
    )
    assert r.body == b"hello" and r.keep_alive
    assert r.header(b"content-type") == b"text/plain"
    assert r.headers[0] == (b"host", b"h")  # names lowercased, order kept


def test_pipelined_requests_come_out_one_by_one() -> None:
    one = b"GET /ping HTTP/1.1\r\nHost: h\r\n\r\n"
    two = b"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\nok"
    requests = read_all(one + two + one)
    assert [r.method for r in requests] == ["GET", "POST", "GET"]
    assert requests[1].body == b"ok"


@given(cuts=st.lists(st.integers(1, 7), max_size=80))
@settings(max_examples=200, deadline=None)
def test_any_split_of_the_bytes_gives_the_same_requests(cuts: list[int]) -> None:
    data = (
        b"\r\nPOST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3;ext=1\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\nTrailer: x\r\n\r\n"
        b"PUT /b HTTP/1.0\nContent-Length: 3\n\nxyz"
    )
    requests = read_all(data, pieces=cuts)
    assert [(r.method, r.path, r.body) for r in requests] == [
        ("POST", "/a", b"abc0123456789abcdef"),
        ("PUT", "/b", b"xyz"),
    ]
    assert requests[0].keep_alive and not requests[1].keep_alive  # HTTP/1.0 closes


@given(body=st.binary(max_size=3000), size=st.integers(1, 700))
def test_chunked_bodies_round_trip(body: bytes, size: int) -> None:
    chunks = b"".join(chunk(body[i : i + size]) for i in range(0, len(body), size))
    head = b"POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
    (r,) = read_all(head + chunks + LAST_CHUNK)
    assert r.body == body


@pytest.mark.parametrize(
    ("data", "status", "words"),
    [
        (b"GARBAGE\r\n\r\n", 400, "request line"),
        (b"GET / HTTP/2.0\r\nHost: h\r\n\r\n", 505, "HTTP/1.0"),
        (b"GET / HTTP/1.1\r\n\r\n", 400, "Host"),
        (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "Host"),
        (b"GET / HTTP/1.1\r\nHost: h\r\nBad Name: x\r\n\r\n", 400, "header line"),
        (b"GET / HTTP/1.1\r\nHost: h\r\nX : y\r\n\r\n", 400, "header line"),
        (b"GET / HTTP/1.1\r\nHost: h\r\nX: a\r\n b\r\n\r\n", 400, "folding"),
        (b"GET / HTTP/1.1\r\nHost: h\r\nX: a\x01b\r\n\r\n", 400, "control"),
        (b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: -1\r\n\r\n", 400, "Content-Length"),
        (b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1, 2\r\n\r\n", 400, "conflicting"),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            400,
            "conflicting",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n",
            400,
            "both",
        ),
        (b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n", 501, "gzip"),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            400,
            "chunk size",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n",
            400,
            "line end",
        ),
        (b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 99999\r\n\r\n", 413, "too large"),
        (b"GET / HTTP/1.1\r\nHost: h\r\nExpect: magic\r\n\r\n", 417, "expectation"),
        (b"GET relative HTTP/1.1\r\nHost: h\r\n\r\n", 400, "target"),
    ],
)
def test_malformed_requests_are_refused_with_a_reason(data: bytes, status: int, words: str) -> None:
    with pytest.raises(HttpError) as caught:
        read_all(data, max_body=1000)
    assert caught.value.status == status
    assert words in caught.value.message


def test_a_chunked_body_over_the_limit_is_refused_before_it_is_buffered() -> None:
    reader = RequestReader(max_body_size=10)
    reader.feed(b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n")
    reader.feed(b"8\r\n12345678\r\n")
    assert reader.next_request() is None
    reader.feed(b"ffffff\r\n")  # announces far more than the limit: refused at once
    with pytest.raises(HttpError) as caught:
        reader.next_request()
    assert caught.value.status == 413


def test_heads_are_bounded() -> None:
    reader = RequestReader(max_body_size=10, max_head_size=100, max_headers=3)
    reader.feed(b"GET / HTTP/1.1\r\n" + b"X: " + b"a" * 200)
    with pytest.raises(HttpError) as caught:
        reader.next_request()
    assert caught.value.status == 431
    reader = RequestReader(max_body_size=10, max_headers=3)
    reader.feed(b"GET / HTTP/1.1\r\nHost: h\r\n" + b"X: 1\r\n" * 3 + b"\r\n")
    with pytest.raises(HttpError) as caught:
        reader.next_request()
    assert caught.value.status == 431


def test_continue_is_wanted_once_and_only_while_the_body_is_missing() -> None:
    reader = RequestReader(max_body_size=100)
    reader.feed(b"POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
    assert reader.next_request() is None
    assert reader.wants_continue() is True
    assert reader.wants_continue() is False
    reader.feed(b"ok")
    request = reader.next_request()
    assert request is not None and request.body == b"ok"
    assert reader.wants_continue() is False


def test_keep_alive_rules() -> None:
    def keep(head: bytes) -> bool:
        (r,) = read_all(head + b"\r\n")
        return r.keep_alive

    assert keep(b"GET / HTTP/1.1\r\nHost: h\r\n")
    assert not keep(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n")
    assert not keep(b"GET / HTTP/1.0\r\n")
    assert keep(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n")


def test_absolute_form_targets_are_reduced_to_their_path() -> None:
    (r,) = read_all(b"GET http://example.com:8080/ping?q=1 HTTP/1.1\r\nHost: h\r\n\r\n")
    assert r.target == "/ping?q=1"
    (r,) = read_all(b"GET http://example.com HTTP/1.1\r\nHost: h\r\n\r\n")
    assert r.target == "/"


@given(data=st.binary(max_size=400))
@settings(max_examples=300)
def test_hostile_bytes_give_requests_or_http_errors_and_nothing_else(data: bytes) -> None:
    reader = RequestReader(max_body_size=50, max_head_size=200)
    reader.feed(data)
    status = None
    try:
        while reader.next_request() is not None:
            pass
    except HttpError as error:
        status = error.status
    assert status is None or 400 <= status < 600


def test_response_heads() -> None:
    head = response_head(200, [(b"x-a", b"1")], length=5, keep_alive=True)
    assert head.startswith(b"HTTP/1.1 200 OK\r\nx-a: 1\r\ncontent-length: 5\r\n")
    assert head.endswith(b"\r\n\r\n") and b"date: " in head and b"connection" not in head
    head = response_head(503, [], length=None, keep_alive=False)
    assert b"503 Service Unavailable" in head
    assert b"transfer-encoding: chunked\r\n" in head and b"connection: close\r\n" in head
    head = response_head(200, [], length=-1, keep_alive=False)
    assert b"content-length" not in head and b"transfer-encoding" not in head
    assert chunk(b"") == b"" and chunk(b"abc") == b"3\r\nabc\r\n"
    assert no_body(204, "GET") and no_body(200, "HEAD") and not no_body(200, "GET")


# -- the header lines: one pattern for a well-formed head, line by line otherwise -----------

_FIELD_BYTES = st.sampled_from(
    [
        b"a",
        b"Z",
        b"-",
        b"!",
        b"~",
        b":",
        b" ",
        b"\t",
        b"\r",
        b"\x00",
        b"\x7f",
        b"\x80",
        b"\xff",
        b"9",
    ]
)
_LINES = st.lists(
    st.lists(_FIELD_BYTES, max_size=12).map(b"".join),
    min_size=1,
    max_size=6,
)


def _fields_or_error(read: Any, text: bytes, start: int) -> Any:
    try:
        return read(text, start)
    except http1.HttpError as error:
        return (error.status, error.message)


@given(request_line=st.sampled_from([b"GET / HTTP/1.1", b"POST /x HTTP/1.0\r"]), lines=_LINES)
@settings(max_examples=600)
def test_header_lines_read_alike_by_pattern_and_line_by_line(
    request_line: bytes, lines: list[bytes]
) -> None:
    text = b"\n".join([request_line, *lines])
    start = len(request_line) + 1
    assert _fields_or_error(http1.header_fields, text, start) == _fields_or_error(
        http1.header_fields_checked, text, start
    )


@given(
    names=st.lists(st.from_regex(rb"\A[-!#$%&'*+.^_`|~0-9A-Za-z]{1,8}\Z"), min_size=1, max_size=5),
    values=st.lists(
        st.from_regex(rb"\A[ \t]{0,2}[\x21-\x7e\x80-\xff]{0,6}[ \t]{0,2}\Z"), min_size=5
    ),
    crlf=st.booleans(),
)
def test_well_formed_header_lines_take_the_pattern(
    names: list[bytes], values: list[bytes], crlf: bool
) -> None:
    eol = b"\r\n" if crlf else b"\n"
    text = b"GET / HTTP/1.1" + b"".join(
        eol + n + b":" + v for n, v in zip(names, values, strict=False)
    )
    start = text.find(b"\n") + 1
    assert http1._FIELD_BLOCK.fullmatch(text, start) is not None
    expected = [(n.lower(), v.strip(b" \t")) for n, v in zip(names, values, strict=False)]
    assert http1.header_fields(text, start) == expected
