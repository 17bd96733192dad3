"""Request values into handler input, handler output into response bytes.

Input (TorchServe's worker-side decoding, on unless ``TS_DECODE_INPUT_REQUEST`` says
otherwise): a parameter whose content type is exactly ``application/json`` becomes the
parsed JSON value (:func:`trioserve.core.jsontext.parse`); the raw bytes as a ``bytearray``
if that fails, as for a body nested deeper than its depth limit; one whose content
type starts with ``text`` becomes a ``str`` (a ``bytearray`` if it is not UTF-8); anything
else is a ``bytearray``.

Output: ``bytes``/``bytearray`` as they are, ``str`` as UTF-8, a ``torch.Tensor`` as the bytes
of ``torch.save``, anything else as ``json.dumps(value, indent=2)``.
"""

from __future__ import annotations

import io
import json
import os
import sys
from json.encoder import encode_basestring_ascii
from typing import Any

from trioserve.core import jsontext
from trioserve.core.messages import Param, WorkItem


def decode_enabled(environ: dict[str, str] | None = None) -> bool:
    """Whether ``TS_DECODE_INPUT_REQUEST`` asks for decoding (unset counts as yes)."""
    value = (os.environ if environ is None else environ).get("TS_DECODE_INPUT_REQUEST")
    return value is None or value.strip().lower() == "true"


def decode_value(param: Param, decode: bool = True) -> Any:
    """The handler's view of one parameter value."""
    raw = param.value
    content_type = param.content_type or ""
    if decode and content_type == "application/json":
        try:
            return jsontext.parse(bytes(raw))
        except jsontext.JSONError:
            return bytearray(raw)
    if decode and content_type.startswith("text"):
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            return bytearray(raw)
    return bytearray(raw)


def decode_request(item: WorkItem, decode: bool = True) -> dict[str, Any]:
    """``{parameter name: value}`` for one request; a repeated name keeps its last value."""
    return {p.name: decode_value(p, decode) for p in item.params}


def request_headers(item: WorkItem) -> dict[str, Any]:
    """The request's header map as a handler sees it.

    Each parameter name maps to ``{"content-type": ...}`` (an empty string when the
    parameter has none); then every request header is added under the name it was sent with,
    later ones overriding earlier ones and the parameter entries.
    """
    headers: dict[str, Any] = {p.name: {"content-type": p.content_type or ""} for p in item.params}
    for name, value in item.headers:
        headers[name] = value
    return headers


def _tensor_bytes(value: Any) -> bytes | None:
    """``torch.save`` bytes if ``value`` is a tensor; torch is only looked at if imported."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(value, torch.Tensor):
        return None
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


INDENT = "  "
MAX_FAST_DEPTH = 64
_INF = float("inf")
_REPR_INT = int.__repr__
_REPR_FLOAT = float.__repr__


class _Unsupported(Exception):
    """A value :func:`_dumps_indent2` leaves to ``json.dumps``."""


def _float_text(value: float) -> str:
    if value != value:
        return "NaN"
    if value == _INF:
        return "Infinity"
    if value == -_INF:
        return "-Infinity"
    return _REPR_FLOAT(value)


def _write_json(value: Any, parts: list[str], level: int) -> None:
    kind = type(value)
    if kind is str:
        parts.append(encode_basestring_ascii(value))
    elif kind is float:
        parts.append(_float_text(value))
    elif kind is int:
        parts.append(_REPR_INT(value))
    elif value is None:
        parts.append("null")
    elif value is True:
        parts.append("true")
    elif value is False:
        parts.append("false")
    elif kind is dict:
        if not value:
            parts.append("{}")
            return
        if level >= MAX_FAST_DEPTH:
            raise _Unsupported
        newline = "\n" + INDENT * (level + 1)
        separator = "," + newline
        parts.append("{")
        for key in value:
            if type(key) is not str:
                raise _Unsupported
            parts.append(newline)
            newline = separator
            parts.append(encode_basestring_ascii(key))
            parts.append(": ")
            _write_json(value[key], parts, level + 1)
        parts.append("\n" + INDENT * level + "}")
    elif kind is list or kind is tuple:
        if not value:
            parts.append("[]")
            return
        if level >= MAX_FAST_DEPTH:
            raise _Unsupported
        newline = "\n" + INDENT * (level + 1)
        separator = "," + newline
        parts.append("[")
        for item in value:
            parts.append(newline)
            newline = separator
            _write_json(item, parts, level + 1)
        parts.append("\n" + INDENT * level + "]")
    else:
        raise _Unsupported


def dumps_indent2(value: Any) -> str:
    """``json.dumps(value, indent=2)``, character for character.

    Values made only of plain ``dict`` (with ``str`` keys), ``list``, ``tuple``, ``str``,
    ``int``, ``float``, ``bool`` and ``None`` (no subclasses) are written here, several times
    faster than the standard library's pure-Python indenting encoder; anything else (and
    anything nested deeper than :data:`MAX_FAST_DEPTH`, which covers circular references) is
    left to ``json.dumps``, errors included.
    """
    parts: list[str] = []
    try:
        _write_json(value, parts, 0)
    except _Unsupported:
        return json.dumps(value, indent=2)
    return "".join(parts)


def encode_output(value: Any) -> bytes | bytearray:
    """Response body bytes for one element of the handler's answer.

    Raises ``TypeError``/``ValueError`` when the value cannot be serialized.
    """
    if isinstance(value, bytes | bytearray):
        return value
    if isinstance(value, memoryview):
        return value.tobytes()
    if isinstance(value, str):
        return value.encode("utf-8")
    tensor = _tensor_bytes(value)
    if tensor is not None:
        return tensor
    return dumps_indent2(value).encode("utf-8")
