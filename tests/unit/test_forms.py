"""Form bodies on the prediction routes (trioserve/http/forms.py): a well-formed form gives
the inputs Quart's form parser gave (the parser trioserve used before, run here as the
reference), and every malformed one a 400 that says what is wrong instead of an empty input.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import httpx
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from quart.formparser import FormDataParser
from werkzeug.http import parse_options_header

from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.messages import Param
from trioserve.http.forms import MAX_FORM_PARTS, MULTIPART, URLENCODED, parse_form

BOUNDARY = "------------------------b61bf621109d04b8"
CT = f"{MULTIPART}; boundary={BOUNDARY}"
# What curl 7.88 sends for -F data=hello -F file=@f.txt -F empty= -F 'img=@f.txt;type=image/png'
CURL_BODY = (
    f"--{BOUNDARY}\r\n"
    'Content-Disposition: form-data; name="data"\r\n\r\nhello\r\n'
    f"--{BOUNDARY}\r\n"
    'Content-Disposition: form-data; name="file"; filename="f.txt"\r\n'
    "Content-Type: text/plain\r\n\r\nfiledata\n\r\n"
    f"--{BOUNDARY}\r\n"
    'Content-Disposition: form-data; name="empty"\r\n\r\n\r\n'
    f"--{BOUNDARY}\r\n"
    'Content-Disposition: form-data; name="img"; filename="f.txt"\r\n'
    "Content-Type: image/png\r\n\r\nfiledata\n\r\n"
    f"--{BOUNDARY}--\r\n"
).encode()


class _Body:
    """Quart's request body, as its form parser reads it: awaitable and async-iterable."""

    def __init__(self, data: bytes) -> None:
        self.data: bytes | None = data
        self.whole = data

    def __await__(self) -> Generator[Any, None, bytes]:
        return self._all().__await__()

    async def _all(self) -> bytes:
        return self.whole

    def __aiter__(self) -> _Body:
        return self

    async def __anext__(self) -> bytes:
        if self.data is None:
            raise StopAsyncIteration
        data, self.data = self.data, None
        return data


async def quart_params(content_type: str, body: bytes) -> list[Param]:
    """What trioserve made of a form before: Quart's parser with the app's defaults."""
    mimetype, options = parse_options_header(content_type)
    parser = FormDataParser(max_form_memory_size=None, max_form_parts=MAX_FORM_PARTS)
    form, files = await parser.parse(_Body(body), mimetype.lower(), len(body), options)
    params = [Param(k, v.encode()) for k, v in form.items(multi=True)]
    for key, storage in files.items(multi=True):
        params.append(Param(key, storage.read(), storage.content_type or None))
        storage.close()
    return params


def refused(content_type: str, body: bytes) -> ServeError:
    with pytest.raises(ServeError) as caught:
        parse_form(content_type, body)
    return caught.value


def _part(headers: str, data: str, boundary: str = BOUNDARY) -> str:
    return f"--{boundary}\r\n{headers}\r\n\r\n{data}\r\n"


# --- well-formed forms ----------------------------------------------------------------------


async def test_curl_form_fields_files_and_an_empty_field() -> None:
    expected = [
        Param("data", b"hello"),
        Param("empty", b""),
        Param("file", b"filedata\n", "text/plain"),
        Param("img", b"filedata\n", "image/png"),
    ]
    assert parse_form(CT, CURL_BODY) == expected
    assert await quart_params(CT, CURL_BODY) == expected


def _httpx_form(data: dict[str, Any], files: Any = None) -> tuple[str, bytes]:
    request = httpx.Request("POST", "http://x/", data=data, files=files)
    return request.headers["content-type"], request.read()


async def test_several_files_under_one_name_and_repeated_fields_keep_their_order() -> None:
    files = [
        ("f", ("a.bin", b"\x00\x01\xff", "application/octet-stream")),
        ("f", ("b.txt", b"second", "text/plain")),
        ("g", ("c.txt", b"", "text/plain")),
    ]
    content_type, body = _httpx_form({"x": ["1", "2"], "y": "é"}, files)
    params = parse_form(content_type, body)
    assert params == await quart_params(content_type, body)
    assert [(p.name, p.value) for p in params] == [
        ("x", b"1"),
        ("x", b"2"),
        ("y", "é".encode()),
        ("f", b"\x00\x01\xff"),
        ("f", b"second"),
        ("g", b""),
    ]


async def test_field_charsets_preamble_epilogue_and_lf_line_breaks_as_before() -> None:
    body = (
        b"a preamble\r\n"
        + _part('Content-Disposition: form-data; name="l"\r\nContent-Type: text/plain; '
                'charset=iso-8859-1', "").encode()[:-2] + b"\xe9\r\n"
        + _part('Content-Disposition: form-data; name="bad"', "").encode()[:-2] + b"\xff\r\n"
        + f"--{BOUNDARY}--\r\nan epilogue".encode()
    )  # fmt: skip
    params = parse_form(CT, body)
    assert params == [Param("l", "é".encode()), Param("bad", "\ufffd".encode())]
    assert params == await quart_params(CT, body)
    lf = f'--{BOUNDARY}\nContent-Disposition: form-data; name="a"\n\nv\n--{BOUNDARY}--\n'
    assert parse_form(CT, lf.encode()) == [Param("a", b"v")] == await quart_params(CT, lf.encode())


async def test_a_form_with_no_parts_and_odd_spellings_of_the_type() -> None:
    closing_only = f"--{BOUNDARY}--\r\n".encode()
    assert parse_form(CT, closing_only) == [] == await quart_params(CT, closing_only)
    quoted = f'Multipart/Form-Data; charset=utf-8; boundary="{BOUNDARY}"'
    assert parse_form(quoted, CURL_BODY) == parse_form(CT, CURL_BODY)


async def test_urlencoded_as_before() -> None:
    for body in (b"a=1&b=&c&d=%C3%A9+x&a=2", b"", b"x=%ZZ"):
        params = parse_form(URLENCODED, body)
        assert params == await quart_params(URLENCODED, body)
    # grouped by name, the names in the order they first appear (a MultiDict's order)
    assert parse_form(URLENCODED, b"a=1&b=&c&d=%C3%A9+x&a=2") == [
        Param("a", b"1"),
        Param("a", b"2"),
        Param("b", b""),
        Param("c", b""),
        Param("d", "é x".encode()),
    ]


# --- malformed forms: 400 naming the problem ------------------------------------------------


@pytest.mark.parametrize(
    ("content_type", "body", "message"),
    [
        (
            MULTIPART,
            CURL_BODY,
            "Malformed multipart/form-data request: the Content-Type header has no boundary "
            "parameter (multipart/form-data; boundary=...).",
        ),
        (
            f"{MULTIPART}; boundary=",
            CURL_BODY,
            "Malformed multipart/form-data request: the Content-Type header has no boundary "
            "parameter (multipart/form-data; boundary=...).",
        ),
        (
            f"{MULTIPART}; boundary=other",
            CURL_BODY,
            "Malformed multipart/form-data body: the delimiter '--other' of the Content-Type's "
            "boundary is not in it.",
        ),
        (
            CT,
            b"",
            f"Malformed multipart/form-data body: the delimiter '--{BOUNDARY}' of the "
            "Content-Type's boundary is not in it.",
        ),
        (
            CT,
            _part('Content-Disposition: form-data; name="a"', "unterminated").encode()[:-2],
            "Malformed multipart/form-data body: part 1 is not terminated: the body ends "
            f"before the next delimiter or the closing '--{BOUNDARY}--'.",
        ),
        (
            CT,
            (
                _part('Content-Disposition: form-data; name="a"', "x")
                + _part('Content-Disposition: form-data; name="b"', "y")
                + f"--{BOUNDARY}\r\n"
            ).encode(),
            f"Malformed multipart/form-data body: it ends after part 2 without the closing "
            f"delimiter '--{BOUNDARY}--'.",
        ),
        (
            CT,
            f"--{BOUNDARY}\r\n".encode(),
            "Malformed multipart/form-data body: it ends after its first delimiter without the "
            f"closing delimiter '--{BOUNDARY}--'.",
        ),
        (
            CT,
            (_part('Content-Disposition: form-data; name="a"', "x") + f"--{BOUNDARY}\r\n").encode()
            + b'Content-Disposition: form-data; name="b"\r\n',
            "Malformed multipart/form-data body: part 2 has headers that do not end with an "
            "empty line.",
        ),
        (
            CT,
            (_part("Content-Type: text/plain", "x") + f"--{BOUNDARY}--").encode(),
            "Malformed multipart/form-data body: part 1 has no Content-Disposition header.",
        ),
        (
            CT,
            (_part("Content-Disposition: form-data", "x") + f"--{BOUNDARY}--").encode(),
            "Malformed multipart/form-data body: part 1 has no name "
            "(Content-Disposition: form-data; name=...).",
        ),
        (
            CT,
            (
                _part('Content-Disposition: form-data; name="a"', "x")
                + _part('Content-Disposition: form-data; filename="f.txt"', "x")
                + f"--{BOUNDARY}--"
            ).encode(),
            "Malformed multipart/form-data body: part 2 has no name "
            "(Content-Disposition: form-data; name=...).",
        ),
        (
            CT,
            (_part('Content-Disposition: attachment; name="a"', "x") + f"--{BOUNDARY}--").encode(),
            "Malformed multipart/form-data body: part 1 has Content-Disposition 'attachment'; "
            "a form's parts are form-data.",
        ),
        (
            CT,
            f"--{BOUNDARY}\r\n".encode()
            + b'Content-Disposition: form-data; name="\xff"\r\n\r\nx\r\n'
            + f"--{BOUNDARY}--".encode(),
            "Malformed multipart/form-data body: part 1 has headers that are not UTF-8.",
        ),
        (
            f"{MULTIPART}; boundary*=utf-8''%C3%A9",
            CURL_BODY,
            "Malformed multipart/form-data request: the boundary 'é' is not ASCII.",
        ),
        (
            URLENCODED,
            b"a=1&b=\xff",
            "Malformed application/x-www-form-urlencoded body: byte 6 is not UTF-8 (send other "
            "bytes percent-encoded).",
        ),
    ],
    ids=[
        "no-boundary-parameter",
        "empty-boundary",
        "body-without-the-boundary",
        "empty-body",
        "unterminated-part",
        "no-closing-delimiter",
        "only-a-delimiter",
        "unterminated-headers",
        "no-content-disposition",
        "no-name",
        "file-without-a-name",
        "not-form-data",
        "headers-not-utf8",
        "non-ascii-boundary",
        "urlencoded-not-utf8",
    ],
)
async def test_malformed_forms_are_refused_saying_why(
    content_type: str, body: bytes, message: str
) -> None:
    error = refused(content_type, body)
    assert (error.kind, str(error)) == (ErrorKind.BAD_INPUT, message)


async def test_quart_answered_those_with_an_empty_or_partial_form() -> None:
    """Why this module exists: the reference parser took the malformed bodies above for a
    form with fewer fields (so the handler ran with {} or less than was sent)."""
    unterminated = _part('Content-Disposition: form-data; name="a"', "x").encode()[:-2]
    assert await quart_params(MULTIPART, CURL_BODY) == []
    assert await quart_params(f"{MULTIPART}; boundary=other", CURL_BODY) == []
    assert await quart_params(CT, unterminated) == []
    no_disposition = (_part("Content-Type: text/plain", "x") + f"--{BOUNDARY}--").encode()
    assert await quart_params(CT, no_disposition) == []
    assert await quart_params(URLENCODED, b"a=\xff") == []


def test_a_quoted_value_is_capped() -> None:
    disposition = "x" * 10_000
    body = (_part(f"Content-Disposition: {disposition}; name=a", "v") + f"--{BOUNDARY}--").encode()
    message = str(refused(CT, body))
    assert len(message) < 300 and "(10000 characters)" in message


def test_more_parts_or_fields_than_the_limit_are_413() -> None:
    part = _part('Content-Disposition: form-data; name="a"', "x")
    at_limit = (part * MAX_FORM_PARTS + f"--{BOUNDARY}--").encode()
    assert len(parse_form(CT, at_limit)) == MAX_FORM_PARTS
    over = (part * (MAX_FORM_PARTS + 1) + f"--{BOUNDARY}--").encode()
    limit = f"The form has more than {MAX_FORM_PARTS} fields, the most one form may have."
    assert (refused(CT, over).kind, str(refused(CT, over))) == (ErrorKind.TOO_LARGE, limit)
    assert len(parse_form(URLENCODED, b"&".join([b"a=1"] * MAX_FORM_PARTS))) == MAX_FORM_PARTS
    many = b"&".join([b"a"] * (MAX_FORM_PARTS + 1))
    assert (refused(URLENCODED, many).kind, str(refused(URLENCODED, many))) == (
        ErrorKind.TOO_LARGE,
        limit,
    )


# --- property: any body, well-formed or mutated ---------------------------------------------

NAMES = st.text(st.characters(codec="utf-8", exclude_characters='"\r\n\\'), max_size=8)
VALUES = st.binary(max_size=40)


@st.composite
def forms(draw: st.DrawFn) -> tuple[str, bytes]:
    fields = draw(st.lists(st.tuples(NAMES, st.text(max_size=20)), max_size=4))
    files = draw(
        st.lists(
            st.tuples(
                NAMES,
                st.tuples(
                    st.text(st.characters(codec="ascii", exclude_characters='"\r\n\\'), max_size=8),
                    VALUES,
                    st.sampled_from(["text/plain", "application/octet-stream", "image/png"]),
                ),
            ),
            max_size=3,
        )
    )
    data: dict[str, list[str]] = {}
    for name, value in fields:
        data.setdefault(name, []).append(value)
    if not data and not files:
        return URLENCODED, b""
    # httpx: multipart when there are files, else urlencoded
    return _httpx_form(data, files or None)


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, bytes]:
    content_type, body = draw(forms())
    how = draw(st.sampled_from(["cut", "flip", "insert", "delete", "boundary"]))
    if how == "boundary":
        return draw(st.sampled_from([MULTIPART, f"{MULTIPART}; boundary=zz"])), body
    at = draw(st.integers(0, max(len(body) - 1, 0)))
    if how == "cut":
        return content_type, body[:at]
    if how == "flip" and body:
        return content_type, body[:at] + bytes([body[at] ^ draw(st.integers(1, 255))]) + body[
            at + 1 :
        ]
    if how == "insert":
        junk = draw(st.sampled_from([b"\r\n", b"--", b"\r\n\r\n", b'"', b";", b"\xff"]))
        return content_type, body[:at] + junk + body[at:]
    return content_type, body[:at] + body[at + draw(st.integers(1, 10)) :]


@settings(max_examples=150, deadline=None)
@given(forms())
def test_well_formed_forms_parse_as_quart_parsed_them(form: tuple[str, bytes]) -> None:
    content_type, body = form
    assert parse_form(content_type, body) == trio.run(quart_params, content_type, body)


@settings(max_examples=400, deadline=None)
@given(mutated())
def test_a_mutated_form_parses_as_before_or_is_refused_with_a_serve_error(
    form: tuple[str, bytes],
) -> None:
    content_type, body = form
    try:
        params = parse_form(content_type, body)
    except ServeError as error:
        refusal: ServeError | None = error
    else:
        refusal = None
    if refusal is not None:
        assert refusal.kind is ErrorKind.BAD_INPUT
        assert str(refusal).startswith("Malformed ")
    else:  # accepted: what Quart made of it
        assert params == trio.run(quart_params, content_type, body)
