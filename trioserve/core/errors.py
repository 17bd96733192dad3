"""Transport-neutral errors.

Every failure a client can see is a :class:`ServeError`: an :class:`ErrorKind` (what went
wrong, in terms no transport owns), a *reason* (a stable machine-readable name such as
``ModelNotFoundException``; TorchServe's exception names are kept, because its clients read
them) and a message that says what happened and what to do. Nothing here knows a status
code: each adapter maps kinds once, HTTP in :mod:`trioserve.http.errors` (status and
TorchServe body), gRPC in :mod:`trioserve.grpc.errors` (status code and ``ErrorInfo``).

The one number an error may carry is ``code``, on :attr:`ErrorKind.HANDLER_FAILED` only:
a handler may choose the status of its own failure (``PredictionException(message, code)``
in TorchServe's handler contract), and adapters honour it.

A message never carries more than :data:`MAX_MESSAGE` characters: where it quotes a value
the client sent (a name, a datatype, a key), :func:`quote` gives a prefix and the length; and
whatever a call site does, :class:`ServeError` cuts its message to the limit (on
construction and on every later assignment), so an error body stays small however large the
input it reports.
"""

from __future__ import annotations

import enum
from typing import Final


class ErrorKind(enum.Enum):
    """What went wrong, independent of the transport that reports it."""

    BAD_INPUT = "bad_input"  # the request is malformed or names an invalid value
    UNAUTHENTICATED = "unauthenticated"  # missing, wrong or expired key
    FORBIDDEN = "forbidden"  # understood, but not allowed in the current state
    NOT_FOUND = "not_found"  # no such model, version or resource
    NOT_ALLOWED = "not_allowed"  # the operation is switched off or not offered there
    CONFLICT = "conflict"  # it exists already
    TOO_LARGE = "too_large"  # over a size limit
    UNAVAILABLE = "unavailable"  # no worker, queue full, shutting down: retry later
    TIMEOUT = "timeout"  # the request's deadline passed before it could run
    WORKER_FAILED = "worker_failed"  # the worker died or broke the protocol
    OUT_OF_MEMORY = "out_of_memory"  # the worker was killed, most likely for memory
    HANDLER_FAILED = "handler_failed"  # the handler reported a failure (``code`` may say which)
    CANCELLED = "cancelled"  # the client went away
    NOT_IMPLEMENTED = "not_implemented"
    INTERNAL = "internal"  # a bug: no code path meant to raise it

    @property
    def client_fault(self) -> bool:
        """True when retrying the same request unchanged cannot help (a 4xx-style error)."""
        return self in _CLIENT_FAULTS


_CLIENT_FAULTS = frozenset(
    {
        ErrorKind.BAD_INPUT,
        ErrorKind.UNAUTHENTICATED,
        ErrorKind.FORBIDDEN,
        ErrorKind.NOT_FOUND,
        ErrorKind.NOT_ALLOWED,
        ErrorKind.CONFLICT,
        ErrorKind.TOO_LARGE,
        ErrorKind.CANCELLED,
    }
)

# The reason an error has when its constructor names none.
DEFAULT_REASON: dict[ErrorKind, str] = {
    ErrorKind.BAD_INPUT: "BadRequestException",
    ErrorKind.UNAUTHENTICATED: "InvalidKeyException",
    ErrorKind.FORBIDDEN: "ForbiddenException",
    ErrorKind.NOT_FOUND: "ResourceNotFoundException",
    ErrorKind.NOT_ALLOWED: "MethodNotAllowedException",
    ErrorKind.CONFLICT: "ConflictStatusException",
    ErrorKind.TOO_LARGE: "RequestTooLargeException",
    ErrorKind.UNAVAILABLE: "ServiceUnavailableException",
    ErrorKind.TIMEOUT: "ServiceUnavailableException",
    ErrorKind.WORKER_FAILED: "InternalServerException",
    ErrorKind.OUT_OF_MEMORY: "InternalServerException",
    ErrorKind.HANDLER_FAILED: "InternalServerException",
    ErrorKind.CANCELLED: "ClientClosedRequest",
    ErrorKind.NOT_IMPLEMENTED: "NotImplementedException",
    ErrorKind.INTERNAL: "InternalServerException",
}


# The longest message an error carries (characters), and how much of a quoted value it shows.
MAX_MESSAGE: Final = 4096
QUOTE_LIMIT: Final = 64


def quote(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``value`` as ``repr`` shows it (``'name'``); when that is long, only a prefix,
    followed by the length: a message names what the client sent without echoing all of
    it (``'nnnn...'... (1048576 characters)``)."""
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        return f"{value[:limit]!r}... ({len(value)} characters)"
    return excerpt(repr(value), limit)


def excerpt(text: str, limit: int = QUOTE_LIMIT) -> str:
    """``text`` as it is, or its first ``limit`` characters and its length when longer
    (for messages that show a client's value unquoted, as TorchServe's wording does)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def bounded(message: str, limit: int = MAX_MESSAGE) -> str:
    """``message`` cut to at most ``limit`` characters, saying how long it was."""
    if len(message) <= limit:
        return message
    tail = f"... (message cut: {len(message)} characters)"
    return message[: limit - len(tail)] + tail


class ServeError(Exception):
    """An error that is reported to a client. Its :attr:`message` is :func:`bounded`."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        reason: str | None = None,
        retry_after: int | None = None,
        code: int | None = None,
    ) -> None:
        super().__init__()
        self.kind = kind
        self.message = message  # the property: cut, and kept in args
        self.reason = reason if reason is not None else DEFAULT_REASON[kind]
        self.retry_after = retry_after  # seconds after which a retry may succeed
        self.code = code if kind is ErrorKind.HANDLER_FAILED else None

    @property
    def message(self) -> str:
        return self._message

    @message.setter
    def message(self, text: str) -> None:
        self._message = bounded(text)
        self.args = (self._message,)

    @property
    def client_fault(self) -> bool:
        """True when retrying the same request unchanged cannot help. A handler's own
        status code decides for a handler failure that carries one."""
        if self.code is not None:
            return 400 <= self.code < 500
        return self.kind.client_fault

    def __repr__(self) -> str:
        return f"ServeError({self.kind.name}, {self.reason!r}, {self.message!r})"


def bad_request(message: str) -> ServeError:
    return ServeError(ErrorKind.BAD_INPUT, message)


def model_not_found(name: str) -> ServeError:
    return ServeError(
        ErrorKind.NOT_FOUND, f"Model not found: {excerpt(name)}", reason="ModelNotFoundException"
    )


def version_not_found(name: str, version: str) -> ServeError:
    return ServeError(
        ErrorKind.NOT_FOUND,
        f"Model version: {excerpt(version)} does not exist for model: {excerpt(name)}",
        reason="ModelVersionNotFoundException",
    )


def resource_not_found() -> ServeError:
    return ServeError(
        ErrorKind.NOT_FOUND, "Requested resource is not found, please refer to API document."
    )


def method_not_allowed() -> ServeError:
    return ServeError(
        ErrorKind.NOT_ALLOWED, "Requested method is not allowed, please refer to API document."
    )


def request_too_large(limit: int) -> ServeError:
    return ServeError(
        ErrorKind.TOO_LARGE, f"Request body is larger than max_request_size ({limit} bytes)."
    )


def internal_error(exc: BaseException) -> ServeError:
    """An exception no code path meant to raise, reported with its name."""
    return ServeError(ErrorKind.INTERNAL, f"{type(exc).__name__}: {exc}")


def _model_label(name: str, version: str | None) -> str:
    return f'Model "{name}"' if version is None else f'Model "{name}" Version {version}'


def no_worker(name: str, version: str | None, why: str) -> ServeError:
    """The request could not be queued. ``why`` names the limit that was hit."""
    return ServeError(
        ErrorKind.UNAVAILABLE,
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
    return ServeError(ErrorKind.WORKER_FAILED, message)


def worker_killed_oom(detail: str = "") -> ServeError:
    message = "Worker died." if not detail else f"Worker died. {detail}"
    return ServeError(ErrorKind.OUT_OF_MEMORY, message)


def prediction_failed(code: int, message: str) -> ServeError:
    """A batch-level failure reported by a worker (handler raised, bad output, ...), with
    the status code the worker chose (TorchServe's ``PredictionException`` code)."""
    return ServeError(ErrorKind.HANDLER_FAILED, message, code=code)


def shutting_down() -> ServeError:
    return ServeError(
        ErrorKind.UNAVAILABLE,
        "The server is shutting down and does not accept new requests.",
        retry_after=5,
    )


def deadline_passed() -> ServeError:
    return ServeError(
        ErrorKind.TIMEOUT,
        "The request's deadline (the client's, or the model's clientTimeoutInMills) passed "
        "while it waited in the queue; it was not run.",
    )


def deadline_exceeded() -> ServeError:
    return ServeError(
        ErrorKind.TIMEOUT,
        "The request's deadline passed before its answer came; it was cancelled.",
    )
