"""KServe's v1 prediction protocol, sans IO: the request body and the answer body.

A v1 request is a JSON object ``{"instances": [...]}`` sent to
``POST /v1/models/{name}:predict`` (or ``:explain``); its answer is
``{"predictions": [...]}`` (``{"explanations": [...]}``), one element per instance, in order.
The HTTP adapter checks the body with :func:`instances_of` before it queues the request, so
that a malformed one is a 400 naming what is wrong; the worker reads the instances again
from the same bytes and joins the handler's answers with :func:`answer_body`.

The work item of a v1 request carries :data:`V1_HEADER`; TorchServe's ``kserve`` envelope is
what it stands for, applied to that request only (see :mod:`trioserve.worker.torchserve.kserve`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from trioserve.core import jsontext
from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.limits import DEFAULT_LIMITS, RequestLimits, check_instances

__all__ = ["EXPLAIN_HEADER", "V1_HEADER", "answer_body", "answer_key", "instances_of"]

V1_HEADER: Final = "x-trioserve-kserve-v1"  # on a work item: its body is a v1 request
EXPLAIN_HEADER: Final = "explain"  # "True" on an explanation (TorchServe's request header)

_JSON_TYPES: Final = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


def _kind(value: Any) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def instances_of(
    body: bytes | bytearray | memoryview, limits: RequestLimits = DEFAULT_LIMITS
) -> list[Any]:
    """The instances of a v1 request body; ``ServeError(BAD_INPUT)`` saying what is wrong
    when it is not ``{"instances": [...]}``, ``ServeError(TOO_LARGE)`` when it has more
    than ``limits.max_request_instances``."""
    try:
        value = jsontext.parse(body)
    except jsontext.JSONError as exc:
        raise ServeError(ErrorKind.BAD_INPUT, f"the request body is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ServeError(
            ErrorKind.BAD_INPUT,
            f'the request body must be a JSON object {{"instances": [...]}}, not {_kind(value)}',
        )
    if "instances" not in value:
        raise ServeError(
            ErrorKind.BAD_INPUT,
            'the request body has no "instances" field (a KServe v1 request is '
            '{"instances": [...]})',
        )
    instances = value["instances"]
    if not isinstance(instances, list):
        raise ServeError(
            ErrorKind.BAD_INPUT, f'"instances" must be an array, not {_kind(instances)}'
        )
    check_instances(len(instances), limits)
    return instances


def answer_key(explain: bool) -> str:
    """The field of the answer: ``explanations`` for ``:explain``, else ``predictions``."""
    return "explanations" if explain else "predictions"


def answer_body(key: str, elements: Iterable[bytes]) -> bytes:
    """``{key: [e0, e1, ...]}`` from elements that are each JSON already."""
    return b'{"' + key.encode("ascii") + b'":[' + b",".join(elements) + b"]}"
