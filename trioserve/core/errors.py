"""Transport-neutral errors.

Every failure a client can see is a :class:`ServeError`: an HTTP status, the TorchServe
exception type name (the ``type`` field of the error body) and a message that says what
happened and what to do. Each transport maps it once: HTTP uses the status and the
``{"code", "type", "message"}`` body, gRPC maps the status with :data:`GRPC_STATUS_FOR_HTTP`.
"""

from __future__ import annotations

from typing import Final


class ServeError(Exception):
    """An error that is reported to a client."""

    def __init__(
        self,
        status: int,
        type_name: str,
        message: str,
        *,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type_name = type_name
        self.message = message
        self.retry_after = retry_after

    def body(self) -> dict[str, object]:
        """The TorchServe error body, keys in TorchServe's order."""
        return {"code": self.status, "type": self.type_name, "message": self.message}

    def __repr__(self) -> str:
        return f"ServeError({self.status}, {self.type_name!r}, {self.message!r})"


def bad_request(message: str) -> ServeError:
    return ServeError(400, "BadRequestException", message)


def model_not_found(name: str) -> ServeError:
    return ServeError(404, "ModelNotFoundException", f"Model not found: {name}")


def version_not_found(name: str, version: str) -> ServeError:
    return ServeError(
        404,
        "ModelVersionNotFoundException",
        f"Model version: {version} does not exist for model: {name}",
    )


def resource_not_found() -> ServeError:
    return ServeError(
        404,
        "ResourceNotFoundException",
        "Requested resource is not found, please refer to API document.",
    )


def method_not_allowed() -> ServeError:
    return ServeError(
        405,
        "MethodNotAllowedException",
        "Requested method is not allowed, please refer to API document.",
    )


def request_too_large(limit: int) -> ServeError:
    return ServeError(
        413,
        "RequestTooLargeException",
        f"Request body is larger than max_request_size ({limit} bytes).",
    )


def internal_error(exc: BaseException) -> ServeError:
    """An exception no code path meant to raise, reported as a 500 that names it."""
    return ServeError(500, "InternalServerException", f"{type(exc).__name__}: {exc}")


def _model_label(name: str, version: str | None) -> str:
    return f'Model "{name}"' if version is None else f'Model "{name}" Version {version}'


def no_worker(name: str, version: str | None, why: str) -> ServeError:
    """503: the request could not be queued. ``why`` names the limit that was hit."""
    return ServeError(
        503,
        "ServiceUnavailableException",
        f"{_model_label(name, version)} has no worker to serve inference request: {why}",
        retry_after=1,
    )


def queue_full(name: str, version: str | None, capacity: int) -> ServeError:
    return no_worker(
        name,
        version,
        f"the job queue is full ({capacity} requests, job_queue_size). Retry later or "
        "add workers with the scale workers API.",
    )


def worker_died(detail: str = "") -> ServeError:
    message = "Worker died." if not detail else f"Worker died. {detail}"
    return ServeError(500, "InternalServerException", message)


def worker_killed_oom(detail: str = "") -> ServeError:
    message = "Worker died." if not detail else f"Worker died. {detail}"
    return ServeError(507, "InternalServerException", message)


def prediction_failed(status: int, message: str) -> ServeError:
    """A batch-level error reported by a worker (handler raised, bad output, ...)."""
    return ServeError(status, "InternalServerException", message)


def shutting_down() -> ServeError:
    return ServeError(
        503,
        "ServiceUnavailableException",
        "The server is shutting down and does not accept new requests.",
        retry_after=5,
    )


# HTTP status -> gRPC status code (spec §1.4).
GRPC_STATUS_FOR_HTTP: Final[dict[int, int]] = {
    400: 3,  # INVALID_ARGUMENT
    401: 16,  # UNAUTHENTICATED
    403: 7,  # PERMISSION_DENIED
    404: 5,  # NOT_FOUND
    409: 10,  # ABORTED
    413: 8,  # RESOURCE_EXHAUSTED
    429: 8,
    416: 11,  # OUT_OF_RANGE
    499: 1,  # CANCELLED
    501: 12,  # UNIMPLEMENTED
    503: 14,  # UNAVAILABLE
    504: 4,  # DEADLINE_EXCEEDED
}


def grpc_status_for_http(status: int) -> int:
    if 200 <= status < 300:
        return 0
    if status in GRPC_STATUS_FOR_HTTP:
        return GRPC_STATUS_FOR_HTTP[status]
    if 400 <= status < 500:
        return 9  # FAILED_PRECONDITION
    return 13  # INTERNAL
