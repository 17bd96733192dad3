"""OpenAI's error object and the status of each failure (sans-IO).

Every failure on the OpenAI paths answers ``{"error": {"message", "type", "param", "code"}}``
with the status OpenAI's clients map to their exception classes (400 ``BadRequestError``,
401 ``AuthenticationError``, 404 ``NotFoundError``, 429 ``RateLimitError``, 5xx
``InternalServerError``).
"""

from __future__ import annotations

import json
from typing import Final

from trioserve.core.errors import ErrorKind, ServeError

# The error ``type`` OpenAI gives each status class.
_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


class OpenAIError(Exception):
    """A refusal or failure, as OpenAI reports it."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after

    @property
    def type(self) -> str:
        return _TYPES.get(
            self.status, "server_error" if self.status >= 500 else "invalid_request_error"
        )

    def body(self) -> bytes:
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return json.dumps({"error": error}, ensure_ascii=False).encode()


def bad_request(param: str | None, message: str, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def unsupported(param: str, what: str) -> OpenAIError:
    return OpenAIError(
        400, f"{what} is not supported by this server", param=param, code="unsupported_parameter"
    )


def model_not_found(name: str, why: str = "does not exist") -> OpenAIError:
    return OpenAIError(404, f"The model '{name}' {why}", param="model", code="model_not_found")


def from_serve_error(error: ServeError, status: int) -> OpenAIError:
    """``error`` (answered ``status`` on the rest of the port) in OpenAI's shape."""
    code = {
        ErrorKind.UNAUTHENTICATED: "invalid_api_key",
        ErrorKind.NOT_FOUND: "model_not_found",
        ErrorKind.UNAVAILABLE: "service_unavailable",
        ErrorKind.TIMEOUT: "timeout",
    }.get(error.kind)
    return OpenAIError(status, error.message, code=code, retry_after=error.retry_after)


__all__ = ["OpenAIError", "bad_request", "from_serve_error", "model_not_found", "unsupported"]
