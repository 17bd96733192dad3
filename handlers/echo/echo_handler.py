"""Echo handler: answers every request with its own input.

A torch-free, module-level TorchServe handler (``handle(data, context)``). It needs nothing but
the standard library, so it also serves as the smallest possible example of the handler
contract:

* ``data`` is a list with one ``{parameter_name: value}`` dict per request in the batch; the
  worker has already decoded each value (``application/json`` -> the JSON value, ``text/*`` ->
  ``str``, anything else -> ``bytearray``).
* The answer is a list of the same length; element ``i`` answers request ``i``.

What comes back:

* ``bytes``/``bytearray`` -> the same bytes;
* ``str`` -> the same string (sent UTF-8 encoded);
* a JSON value (dict, list, number, bool, null) -> the same JSON value. A JSON *string* (the
  request's content type says JSON but the decoded value is a ``str``) is answered as JSON text,
  quotes included, so the client reads back exactly the JSON it sent.

The response content type is the request's content type when it is known (the parameter's own
content type, else the ``Content-Type`` request header); otherwise it is inferred from the value
(``application/json``, ``text/plain; charset=utf-8`` or ``application/octet-stream``).
"""

from __future__ import annotations

import json
from typing import Any

JSON_CONTENT_TYPE = "application/json"
TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"
BINARY_CONTENT_TYPE = "application/octet-stream"

# Parameter names tried first, in order: the raw HTTP body, then a form field / gRPC input
# called "data". Anything else: the request's first parameter.
_PREFERRED_PARAMETERS = ("body", "data")


def _header(context: Any, idx: int, key: str) -> Any:
    """``context.get_request_header(idx, key)``, or None if the context cannot say."""
    getter = getattr(context, "get_request_header", None)
    if getter is None:
        return None
    try:
        return getter(idx, key)
    except (AttributeError, IndexError, KeyError, RuntimeError, TypeError):
        return None


def _as_content_type(value: Any) -> str | None:
    """A non-empty content type string from a header value, else None."""
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, str) and value.strip():
        return value.strip()
    return None


def request_content_type(context: Any, idx: int, parameter: str | None) -> str | None:
    """The content type of request ``idx`` (of its ``parameter``), if the context knows it.

    TorchServe exposes it twice: each parameter name maps to ``{"content-type": ...}`` and the
    HTTP ``Content-Type`` header is forwarded under the name the client used.
    """
    if context is None:
        return None
    if parameter is not None:
        per_parameter = _header(context, idx, parameter)
        if isinstance(per_parameter, dict):
            for key, value in per_parameter.items():
                if str(key).lower() == "content-type":
                    found = _as_content_type(value)
                    if found is not None:
                        return found
    for key in ("Content-Type", "content-type", "CONTENT-TYPE", "Content-type"):
        found = _as_content_type(_header(context, idx, key))
        if found is not None:
            return found
    return None


def _is_json(content_type: str | None) -> bool:
    if content_type is None:
        return False
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type == JSON_CONTENT_TYPE or media_type.endswith("+json")


def pick_parameter(row: Any) -> tuple[str | None, Any]:
    """The (name, value) this request is about: ``body``, else ``data``, else the first one."""
    if not isinstance(row, dict):
        return None, row
    for name in _PREFERRED_PARAMETERS:
        if name in row:
            return name, row[name]
    for name, value in row.items():
        return str(name), value
    return None, None


def echo_one(value: Any, content_type: str | None) -> tuple[Any, str]:
    """The answer for one request value and the content type to send it with."""
    if isinstance(value, bytes | bytearray):
        return bytes(value), content_type or BINARY_CONTENT_TYPE
    if isinstance(value, str):
        if _is_json(content_type):
            # The worker decoded a JSON string: answer the JSON text the client sent.
            return json.dumps(value), content_type or JSON_CONTENT_TYPE
        return value, content_type or TEXT_CONTENT_TYPE
    # A JSON value (dict, list, number, bool, null): the worker serialises it back to JSON.
    return value, content_type or JSON_CONTENT_TYPE


def handle(data: list[Any] | None, context: Any) -> list[Any] | None:
    """TorchServe entry point. Called once with ``data=None`` when the model loads."""
    if data is None:
        return None
    responses: list[Any] = []
    for idx, row in enumerate(data):
        parameter, value = pick_parameter(row)
        answer, content_type = echo_one(value, request_content_type(context, idx, parameter))
        setter = getattr(context, "set_response_content_type", None)
        if setter is not None:
            setter(idx, content_type)
        responses.append(answer)
    return responses
