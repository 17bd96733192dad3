"""HTTP/1.1 server-side framing without I/O (RFC 9112): requests in, response bytes out.

:class:`RequestReader` turns the bytes of one connection into complete requests (head and
whole body; the server buffers bodies anyway, bounded by ``max_body_size``). It is strict
where laxness lets one request be read two ways (request smuggling): a request with both
``Content-Length`` and ``Transfer-Encoding``, a ``Content-Length`` that is not one decimal
number, a transfer coding other than ``chunked``, obsolete line folding or a header name with
spaces before its colon are refused with :class:`HttpError`; after any error the connection
must be closed. It is lenient where that is harmless: bare ``LF`` line ends and empty lines
before a request line are accepted.

The response helpers build a status line and headers (``Content-Length`` or chunked, a
``Date``, ``Connection: close`` when the connection ends) and chunk framing.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import Final

_TOKEN: Final = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
_REQUEST_LINE: Final = re.compile(rb"([-!#$%&'*+.^_`|~0-9A-Za-z]+) ([\x21-\x7e]+) HTTP/(\d)\.(\d)")
_HEAD_END: Final = re.compile(rb"\r?\n\r?\n")
# Field values: visible ASCII, obs-text, space and tab; no other control characters.
_BAD_VALUE: Final = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
# A head's header lines when every one is well formed (possessive: linear on any input), and
# each line's name and raw value. A head that does not match is read line by line, which
# says what is wrong.
_FIELD_LINE: Final = rb"[-!#$%&'*+.^_`|~0-9A-Za-z]++:[^\x00-\x08\x0a-\x1f\x7f]*+"
_FIELD_BLOCK: Final = re.compile(rb"(?:" + _FIELD_LINE + rb"\r?\n)*+" + _FIELD_LINE)
_FIELD: Final = re.compile(rb"([-!#$%&'*+.^_`|~0-9A-Za-z]++):([^\x00-\x08\x0a-\x1f\x7f]*+)")
_CHUNK_SIZE: Final = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(?:;[^\r\n]*)?")

DEFAULT_MAX_HEAD_SIZE: Final = 64 * 1024
DEFAULT_MAX_HEADERS: Final = 100


class HttpError(Exception):
    """A request that cannot be read; answer ``status`` and close the connection."""

    def __init__(self, status: int, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.path = path  # the request's path, when its head was read


@dataclass(slots=True)
class Request:
    method: str
    target: str  # the request target as sent (origin form: path and query)
    http_version: str  # "1.0" or "1.1"
    headers: list[tuple[bytes, bytes]]  # names lowercased, values without surrounding blanks
    body: bytes
    keep_alive: bool

    @property
    def path(self) -> str:
        """The target's path, still percent-encoded."""
        return self.target.partition("?")[0]

    @property
    def query(self) -> str:
        return self.target.partition("?")[2]

    def header(self, name: bytes) -> bytes | None:
        """The first value of header ``name`` (lowercase), or None."""
        for key, value in self.headers:
            if key == name:
                return value
        return None


@dataclass(slots=True)
class _Head:
    method: str
    target: str
    http_version: str
    headers: list[tuple[bytes, bytes]]
    keep_alive: bool
    expect_continue: bool
    content_length: int  # -1: chunked


class RequestReader:
    """Reads the requests of one connection, one after the other."""

    def __init__(
        self,
        *,
        max_body_size: int,
        max_head_size: int = DEFAULT_MAX_HEAD_SIZE,
        max_headers: int = DEFAULT_MAX_HEADERS,
    ) -> None:
        self.max_body_size = max_body_size
        self.max_head_size = max_head_size
        self.max_headers = max_headers
        self._buffer = bytearray()
        self._head: _Head | None = None
        # chunked body state: bytes of the body so far and where parsing goes on
        self._chunks: list[bytes] = []
        self._chunked_size = 0
        self._chunk_pos = 0
        self._continue_sent = False

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as part of a request."""
        return len(self._buffer)

    @property
    def started(self) -> bool:
        """Whether any byte of the next request has arrived."""
        return self._head is not None or bool(self._buffer.lstrip(b"\r\n"))

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def wants_continue(self) -> bool:
        """True once, when the head asked for ``100 Continue`` and the body is still to come.

        The caller then sends :data:`CONTINUE` so that the client sends the body."""
        head = self._head
        if head is None or not head.expect_continue or self._continue_sent:
            return False
        self._continue_sent = True
        return True

    def next_request(self) -> Request | None:
        """The next complete request, or None until more bytes arrive.

        Raises :class:`HttpError` for a malformed or oversized request."""
        head = self._head
        if head is None:
            head = self._head = self._read_head()
            if head is None:
                return None
        if head.content_length >= 0:
            if len(self._buffer) < head.content_length:
                return None
            body = bytes(self._buffer[: head.content_length])
            del self._buffer[: head.content_length]
        else:
            try:
                done = self._read_chunks()
            except HttpError as error:
                error.path = head.target.partition("?")[0]
                raise
            if not done:
                return None
            body = b"".join(self._chunks)
            self._chunks = []
            self._chunked_size = 0
        self._head = None
        self._continue_sent = False
        return Request(
            head.method, head.target, head.http_version, head.headers, body, head.keep_alive
        )

    # -- the head -------------------------------------------------------------------------

    def _read_head(self) -> _Head | None:
        buffer = self._buffer
        start = 0
        while buffer.startswith(b"\r\n", start) or buffer.startswith(b"\n", start):
            start += 2 if buffer.startswith(b"\r\n", start) else 1
        end = _HEAD_END.search(buffer, start)
        if end is None:
            if len(buffer) - start > self.max_head_size:
                raise HttpError(431, "the request head is too large")
            if start:
                del buffer[:start]
            return None
        if end.start() - start > self.max_head_size:
            raise HttpError(431, "the request head is too large")
        text = bytes(buffer[start : end.start()])
        del buffer[: end.end()]
        return self._parse_head(text)

    def _parse_head(self, text: bytes) -> _Head:
        if text.count(b"\n") > self.max_headers:
            raise HttpError(431, f"the request has more than {self.max_headers} headers")
        line_end = text.find(b"\n")
        line = (text if line_end < 0 else text[:line_end]).removesuffix(b"\r")
        match = _REQUEST_LINE.fullmatch(line)
        if match is None:
            raise HttpError(400, "malformed request line")
        method, target, major, minor = match.groups()
        if major != b"1" or minor not in (b"0", b"1"):
            raise HttpError(505, "only HTTP/1.0 and HTTP/1.1 are supported")
        http11 = minor == b"1"
        headers = [] if line_end < 0 else header_fields(text, line_end + 1)
        content_length = -2  # none seen
        chunked = False
        host = False
        connection: list[bytes] = []
        expect_continue = False
        for name, value in headers:
            if name not in _FRAMING:
                continue
            if name == b"content-length":
                content_length = _content_length(value, content_length)
            elif name == b"transfer-encoding":
                if chunked or value.lower() != b"chunked":
                    raise HttpError(501, f"transfer coding {value.decode('latin-1')!r}")
                chunked = True
            elif name == b"host":
                if host:
                    raise HttpError(400, "more than one Host header")
                host = True
            elif name == b"connection":
                connection.extend(t.strip().lower() for t in value.split(b","))
            elif name == b"expect":
                if value.lower() != b"100-continue":
                    raise HttpError(417, f"unsupported expectation {value.decode('latin-1')!r}")
                expect_continue = http11
        if chunked and content_length != -2:
            raise HttpError(400, "both Content-Length and Transfer-Encoding are present")
        if chunked and not http11:
            raise HttpError(400, "Transfer-Encoding in an HTTP/1.0 request")
        if http11 and not host:
            raise HttpError(400, "missing Host header")
        if content_length > self.max_body_size:
            raise HttpError(413, "request body too large", _path(target))
        if http11:
            keep_alive = b"close" not in connection
        else:
            keep_alive = b"keep-alive" in connection and b"close" not in connection
        return _Head(
            method.decode("ascii"),
            _origin_form(target.decode("ascii")),
            "1.1" if http11 else "1.0",
            headers,
            keep_alive,
            expect_continue,
            -1 if chunked else max(content_length, 0),
        )

    # -- a chunked body -------------------------------------------------------------------

    def _read_chunks(self) -> bool:
        """Parse what is buffered; True once the last chunk and trailers are in."""
        buffer = self._buffer
        while True:
            line_end = buffer.find(b"\n")
            if line_end < 0:
                if len(buffer) > 4096:
                    raise HttpError(400, "malformed chunk size line")
                return False
            line = bytes(buffer[:line_end]).removesuffix(b"\r")
            match = _CHUNK_SIZE.fullmatch(line)
            if match is None:
                raise HttpError(400, "malformed chunk size line")
            size = int(match[1], 16)
            if size == 0:
                return self._read_trailers(line_end + 1)
            if self._chunked_size + size > self.max_body_size:
                raise HttpError(413, "request body too large")
            data_start = line_end + 1
            data_end = data_start + size
            if len(buffer) < data_end + 1:
                return False
            if buffer.startswith(b"\r\n", data_end):
                after = data_end + 2
            elif buffer.startswith(b"\n", data_end):
                after = data_end + 1
            elif len(buffer) < data_end + 2 and buffer.startswith(b"\r", data_end):
                return False
            else:
                raise HttpError(400, "chunk data is not followed by a line end")
            self._chunks.append(bytes(buffer[data_start:data_end]))
            self._chunked_size += size
            del buffer[:after]

    def _read_trailers(self, start: int) -> bool:
        buffer = self._buffer
        if buffer.startswith(b"\r\n", start) or buffer.startswith(b"\n", start):
            end = start + (2 if buffer.startswith(b"\r\n", start) else 1)
            del buffer[:end]
            return True
        found = _HEAD_END.search(buffer, start)
        if found is None:
            if len(buffer) - start > self.max_head_size:
                raise HttpError(431, "the request trailers are too large")
            return False
        del buffer[: found.end()]  # trailer fields are read and dropped
        return True


_FRAMING: Final = frozenset(
    {b"content-length", b"transfer-encoding", b"host", b"connection", b"expect"}
)


def header_fields(text: bytes, start: int) -> list[tuple[bytes, bytes]]:
    """The header lines of a head from ``start`` (the byte after the request line's end):
    (name lowercased, value without surrounding blanks) each, in order. Raises
    :class:`HttpError` for obsolete line folding, a malformed line or a control character
    in a value."""
    if _FIELD_BLOCK.fullmatch(text, start) is not None:
        return [(name.lower(), value.strip(b" \t")) for name, value in _FIELD.findall(text, start)]
    return header_fields_checked(text, start)


def header_fields_checked(text: bytes, start: int) -> list[tuple[bytes, bytes]]:
    """:func:`header_fields` one line at a time: the path of a head that has something wrong
    (and the reference the one-pattern path is tested against)."""
    fields: list[tuple[bytes, bytes]] = []
    for raw in text[start:].split(b"\n"):
        raw = raw.removesuffix(b"\r")
        if raw[:1] in (b" ", b"\t"):
            raise HttpError(400, "obsolete line folding is not accepted")
        name, colon, value = raw.partition(b":")
        if not colon or _TOKEN.fullmatch(name) is None:
            raise HttpError(400, f"malformed header line {raw[:100]!r}")
        value = value.strip(b" \t")
        if _BAD_VALUE.search(value) is not None:
            raise HttpError(400, f"control character in header {name.decode()!r}")
        fields.append((name.lower(), value))
    return fields


def _content_length(value: bytes, seen: int) -> int:
    if value.isdigit() and len(value) <= 18:  # the usual case: one plain number
        length = int(value)
        if seen not in (-2, length):
            raise HttpError(400, "conflicting Content-Length values")
        return length
    values = {v.strip() for v in value.split(b",")}
    if len(values) != 1:
        raise HttpError(400, "conflicting Content-Length values")
    (text,) = values
    if not text.isdigit() or len(text) > 18:
        raise HttpError(400, f"invalid Content-Length {value.decode('latin-1')!r}")
    length = int(text)
    if seen not in (-2, length):
        raise HttpError(400, "conflicting Content-Length values")
    return length


def _path(target: bytes) -> str | None:
    """The path of a raw request target, or None when it is not one."""
    try:
        return _origin_form(target.decode("ascii")).partition("?")[0]
    except (UnicodeDecodeError, HttpError):
        return None


def _origin_form(target: str) -> str:
    """The path and query of a request target (absolute form reduced to origin form)."""
    if target.startswith("/"):
        return target
    lowered = target[:8].lower()
    if lowered.startswith(("http://", "https://")):
        rest = target.split("://", 1)[1]
        slash = rest.find("/")
        query = rest.find("?")
        if slash < 0 or (0 <= query < slash):
            return "/" + (rest[query:] if query >= 0 else "")
        return rest[slash:]
    if target == "*":
        return "*"
    raise HttpError(400, f"malformed request target {target[:100]!r}")


# -- responses -------------------------------------------------------------------------------

CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"
LAST_CHUNK: Final = b"0\r\n\r\n"

_STATUS_LINES: Final = {
    s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode("ascii")) for s in HTTPStatus
}
_date_cache: tuple[int, bytes] = (0, b"")


def http_date() -> bytes:
    """The current time as an HTTP date, recomputed at most once a second."""
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, formatdate(now, usegmt=True).encode("ascii"))
    return _date_cache[1]


def no_body(status: int, method: str) -> bool:
    """Whether a response has no body whatever its headers say (RFC 9110 §6.4.1)."""
    return method == "HEAD" or status < 200 or status in (204, 304)


def response_head(
    status: int,
    headers: Iterable[tuple[bytes, bytes]],
    *,
    length: int | None,
    keep_alive: bool,
) -> bytes:
    """Status line and headers. ``length`` None means a chunked body follows, -1 a body that
    ends when the connection closes (for an HTTP/1.0 client; ``keep_alive`` must be False).

    ``headers`` must not carry ``Content-Length``, ``Transfer-Encoding`` or ``Connection``:
    framing is decided here."""
    status_line = _STATUS_LINES.get(status)
    if status_line is None:
        status_line = b"HTTP/1.1 %d \r\n" % status
    parts = [status_line]
    parts += [b"%s: %s\r\n" % pair for pair in headers]
    if length is None:
        parts.append(b"transfer-encoding: chunked\r\n")
    elif length >= 0:
        parts.append(b"content-length: %d\r\n" % length)
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    parts.append(b"date: %s\r\n\r\n" % http_date())
    return b"".join(parts)


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body (empty data gives nothing: an empty chunk would end it)."""
    if not data:
        return b""
    return b"%x\r\n%s\r\n" % (len(data), data)
