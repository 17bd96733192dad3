"""The one table from neutral error kinds to HTTP statuses, and TorchServe's error body.

Every HTTP answer that reports a :class:`~trioserve.core.errors.ServeError` is built here:
status from :data:`HTTP_STATUS` (or the handler's own code), body
``{"code", "type", "message"}`` with the error's reason as ``type``, ``Retry-After`` when
the error says when to retry. An error closes the connection, as TorchServe's do. No body
carries a message longer than :data:`~trioserve.core.errors.MAX_MESSAGE` characters: a
``ServeError`` cuts its own, and a protocol error's is cut here.
"""

from __future__ import annotations

from typing import Final

from trioserve.core.errors import ErrorKind, ServeError, bounded
from trioserve.http.bodies import NO_CACHE_HEADERS, Answer, json_text

HTTP_STATUS: Final[dict[ErrorKind, int]] = {
    ErrorKind.BAD_INPUT: 400,
    ErrorKind.UNAUTHENTICATED: 401,
    ErrorKind.FORBIDDEN: 403,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.NOT_ALLOWED: 405,
    ErrorKind.CONFLICT: 409,
    ErrorKind.TOO_LARGE: 413,
    ErrorKind.CANCELLED: 499,
    ErrorKind.WORKER_FAILED: 500,
    ErrorKind.HANDLER_FAILED: 500,
    ErrorKind.INTERNAL: 500,
    ErrorKind.NOT_IMPLEMENTED: 501,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.TIMEOUT: 504,
    ErrorKind.OUT_OF_MEMORY: 507,  # TorchServe's answer for a worker killed by SIGKILL
}


def http_status(error: ServeError) -> int:
    """The status an HTTP client sees for ``error``."""
    if error.code is not None and 400 <= error.code < 600:
        return error.code  # the handler chose it
    return HTTP_STATUS[error.kind]


def error_body(error: ServeError) -> dict[str, object]:
    """The TorchServe error body, keys in TorchServe's order."""
    return {"code": http_status(error), "type": error.reason, "message": error.message}


def error_answer(error: ServeError, request_id: str | None = None) -> Answer:
    """The TorchServe error answer for ``error``."""
    headers = [*NO_CACHE_HEADERS.items(), ("Content-Type", "application/json")]
    if request_id is not None:
        headers.append(("x-request-id", request_id))
    if error.retry_after is not None:
        headers.append(("Retry-After", str(error.retry_after)))
    return Answer(http_status(error), headers, json_text(error_body(error)).encode(), close=True)


def protocol_error_answer(status: int, message: str) -> Answer:
    """An answer for a request the HTTP layer itself refused (malformed, too slow, too
    large a head): TorchServe's body with the HTTP status the parser chose."""
    reason = "BadRequestException" if status < 500 else "InternalServerException"
    headers = [*NO_CACHE_HEADERS.items(), ("Content-Type", "application/json")]
    body = {"code": status, "type": reason, "message": bounded(message)}
    return Answer(status, headers, json_text(body).encode(), close=True)
