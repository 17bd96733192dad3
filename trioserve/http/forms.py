"""Form bodies as handler inputs, parsed strictly.

A ``multipart/form-data`` or ``application/x-www-form-urlencoded`` body on the TorchServe
prediction routes becomes one input per field: fields first, then files, each grouped by
name in the order the names first appear (a ``MultiDict``'s order, as Quart gave them);
a field's value is its text (decoded by the part's ``charset``: ascii, us-ascii, iso-8859-1
or utf-8, else utf-8, undecodable bytes replaced) as UTF-8 bytes, a file's value its bytes,
with the part's ``Content-Type``. That is what Quart's form parser gave before.

What Quart's parser did not do is refuse a malformed body: it answered it as an empty form,
and the handler ran with no input. Here every malformed body is a
:class:`~trioserve.core.errors.ServeError` (400) whose message says what is wrong: no
``boundary`` parameter, a body that never contains the boundary, a part without headers'
end, without ``Content-Disposition``, without a ``name`` or not ``form-data``, a part not
terminated by a delimiter or a body without the closing one, an urlencoded body that is not
UTF-8. A form of more than :data:`MAX_FORM_PARTS` parts or fields is refused with 413, as
Quart did: each becomes an input, so the count is what a small body could expand to.

The multipart framing is read by werkzeug's sans-IO ``MultipartDecoder`` (werkzeug comes
with Quart); this module feeds it the whole body, which the HTTP layer has already bounded by
``max_request_size``, and turns where it stopped into the message. It does no I/O (the unit
tests call :func:`parse_form` directly), but it lives in the HTTP adapter because core/
imports no web framework.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.http import parse_options_header
from werkzeug.sansio.multipart import (
    Data,
    Epilogue,
    Field,
    File,
    MultipartDecoder,
    NeedData,
    State,
)

from trioserve.core.errors import ErrorKind, ServeError, bad_request, quote
from trioserve.core.messages import Param

__all__ = ["FORM_TYPES", "MAX_FORM_PARTS", "MULTIPART", "URLENCODED", "parse_form"]

MULTIPART = "multipart/form-data"
URLENCODED = "application/x-www-form-urlencoded"
FORM_TYPES = frozenset({MULTIPART, URLENCODED})
# The most parts (fields) one form may have: Quart's MAX_FORM_PARTS, which applied before.
MAX_FORM_PARTS = 1000
# The part charsets honoured for field values (Quart's and werkzeug's safe list).
_CHARSETS = frozenset({"ascii", "us-ascii", "utf-8", "iso-8859-1"})
_QUOTE_LIMIT = 80  # how much of a client's value a message quotes


def parse_form(content_type: str, body: bytes) -> list[Param]:
    """The handler inputs of a form body; ``content_type`` is the request's header (its
    type must be one of :data:`FORM_TYPES`)."""
    mimetype, options = parse_options_header(content_type)
    mimetype = mimetype.lower()
    if mimetype == URLENCODED:
        return _urlencoded(body)
    if mimetype == MULTIPART:
        return _multipart(options.get("boundary"), body)
    raise ValueError(f"not a form content type: {content_type!r}")


def _too_many() -> ServeError:
    return ServeError(
        ErrorKind.TOO_LARGE,
        f"The form has more than {MAX_FORM_PARTS} fields, the most one form may have.",
    )


def _urlencoded(body: bytes) -> list[Param]:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(
            f"Malformed application/x-www-form-urlencoded body: byte {exc.start} is not "
            "UTF-8 (send other bytes percent-encoded)."
        ) from None
    try:
        pairs = parse_qsl(text, keep_blank_values=True, max_num_fields=MAX_FORM_PARTS)
    except ValueError:  # more than max_num_fields
        raise _too_many() from None
    return _grouped([Param(name, value.encode()) for name, value in pairs])


def _grouped(params: list[Param]) -> list[Param]:
    """``params`` grouped by name, the names in the order they first appear."""
    by_name: dict[str, list[Param]] = {}
    for param in params:
        by_name.setdefault(param.name, []).append(param)
    return [param for group in by_name.values() for param in group]


class _Multipart:
    """One multipart body through werkzeug's decoder, into fields and files."""

    def __init__(self, boundary: bytes) -> None:
        self.boundary = boundary
        self.decoder = MultipartDecoder(boundary, max_parts=MAX_FORM_PARTS)
        self.fields: list[Param] = []
        self.files: list[Param] = []
        self.parts = 0  # parts whose headers were read
        self.part: Field | File | None = None
        self.chunks: list[bytes] = []

    def run(self, body: bytes) -> list[Param]:
        self.decoder.receive_data(body)
        self.decoder.receive_data(None)  # the whole body is here
        while True:
            try:
                event = self.decoder.next_event()
            except RequestEntityTooLarge:
                raise _too_many() from None
            except ValueError as exc:
                raise self._malformed(exc) from None
            if isinstance(event, Epilogue):
                return _grouped(self.fields) + _grouped(self.files)
            if isinstance(event, (Field, File)):
                self._start(event)
            elif isinstance(event, Data):
                self.chunks.append(event.data)
                if not event.more_data:
                    self._finish()
            elif isinstance(event, NeedData):  # pragma: no cover - the decoder raises first
                raise self._malformed(ValueError("incomplete"))

    def _start(self, part: Field | File) -> None:
        self.parts += 1
        disposition = parse_options_header(part.headers["content-disposition"])[0]
        if disposition != "form-data":
            raise self._part_error(
                f"has Content-Disposition {quote(disposition, _QUOTE_LIMIT)}; "
                "a form's parts are form-data"
            )
        if part.name is None:
            raise self._part_error("has no name (Content-Disposition: form-data; name=...)")
        self.part = part
        self.chunks = []

    def _finish(self) -> None:
        part = self.part
        assert part is not None
        data = b"".join(self.chunks)
        content_type = part.headers.get("content-type")
        if isinstance(part, File):
            self.files.append(Param(part.name, data, content_type or None))
        else:
            charset = "utf-8"
            if content_type:
                named = parse_options_header(content_type)[1].get("charset", "").lower()
                charset = named if named in _CHARSETS else charset
            self.fields.append(Param(part.name, data.decode(charset, "replace").encode()))
        self.part = None

    def _part_error(self, problem: str) -> ServeError:
        return bad_request(f"Malformed multipart/form-data body: part {self.parts} {problem}.")

    def _malformed(self, exc: ValueError) -> ServeError:
        delimiter = "--" + self.boundary.decode("ascii")
        state = self.decoder.state
        if state is State.PREAMBLE:
            return bad_request(
                "Malformed multipart/form-data body: the delimiter "
                f"{quote(delimiter, _QUOTE_LIMIT)} of the Content-Type's boundary is not in it."
            )
        if state is State.PART:
            if "Content-Disposition" in str(exc):
                self.parts += 1
                return self._part_error("has no Content-Disposition header")
            if isinstance(exc, UnicodeDecodeError):
                self.parts += 1
                return self._part_error("has headers that are not UTF-8")
            if not bytes(self.decoder.buffer).strip():
                where = f"part {self.parts}" if self.parts else "its first delimiter"
                return bad_request(
                    f"Malformed multipart/form-data body: it ends after {where} without the "
                    f"closing delimiter {quote(delimiter + '--', _QUOTE_LIMIT)}."
                )
            self.parts += 1
            return self._part_error("has headers that do not end with an empty line")
        # DATA_START, DATA: the body ended inside a part.
        return self._part_error(
            "is not terminated: the body ends before the next delimiter or the closing "
            + quote(delimiter + "--", _QUOTE_LIMIT)
        )


def _multipart(boundary: str | None, body: bytes) -> list[Param]:
    if not boundary:
        raise bad_request(
            "Malformed multipart/form-data request: the Content-Type header has no boundary "
            "parameter (multipart/form-data; boundary=...)."
        )
    try:
        encoded = boundary.encode("ascii")
    except UnicodeEncodeError:
        raise bad_request(
            "Malformed multipart/form-data request: the boundary "
            f"{quote(boundary, _QUOTE_LIMIT)} is not ASCII."
        ) from None
    return _Multipart(encoded).run(body)
