"""The one table from neutral error kinds to gRPC status codes (``google.rpc.Code``)."""

from __future__ import annotations

from typing import Final

from trioserve.core.errors import ErrorKind, ServeError

OK = 0
CANCELLED = 1
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
ALREADY_EXISTS = 6
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9
ABORTED = 10
OUT_OF_RANGE = 11
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14
UNAUTHENTICATED = 16

GRPC_STATUS: Final[dict[ErrorKind, int]] = {
    ErrorKind.BAD_INPUT: INVALID_ARGUMENT,
    ErrorKind.UNAUTHENTICATED: UNAUTHENTICATED,
    ErrorKind.FORBIDDEN: PERMISSION_DENIED,
    ErrorKind.NOT_FOUND: NOT_FOUND,
    ErrorKind.NOT_ALLOWED: FAILED_PRECONDITION,
    ErrorKind.CONFLICT: ABORTED,
    ErrorKind.TOO_LARGE: RESOURCE_EXHAUSTED,
    ErrorKind.UNAVAILABLE: UNAVAILABLE,
    ErrorKind.TIMEOUT: DEADLINE_EXCEEDED,
    ErrorKind.WORKER_FAILED: INTERNAL,
    ErrorKind.OUT_OF_MEMORY: RESOURCE_EXHAUSTED,  # as TorchServe's gRPC transport says
    ErrorKind.HANDLER_FAILED: INTERNAL,
    ErrorKind.CANCELLED: CANCELLED,
    ErrorKind.NOT_IMPLEMENTED: UNIMPLEMENTED,
    ErrorKind.INTERNAL: INTERNAL,
}

# A handler may fail with a status code of its choosing (TorchServe's PredictionException);
# the code is HTTP-style by that contract and maps as TorchServe's gRPC transport maps it.
_FOR_HANDLER_CODE: Final[dict[int, int]] = {
    400: INVALID_ARGUMENT,
    401: UNAUTHENTICATED,
    403: PERMISSION_DENIED,
    404: NOT_FOUND,
    409: ABORTED,
    413: RESOURCE_EXHAUSTED,
    416: OUT_OF_RANGE,
    429: RESOURCE_EXHAUSTED,
    499: CANCELLED,
    501: UNIMPLEMENTED,
    503: UNAVAILABLE,
    504: DEADLINE_EXCEEDED,
    507: RESOURCE_EXHAUSTED,
}


def grpc_code(error: ServeError) -> int:
    """The gRPC status code a client sees for ``error``."""
    if error.code is not None:
        if error.code in _FOR_HANDLER_CODE:
            return _FOR_HANDLER_CODE[error.code]
        return FAILED_PRECONDITION if 400 <= error.code < 500 else INTERNAL
    return GRPC_STATUS[error.kind]
