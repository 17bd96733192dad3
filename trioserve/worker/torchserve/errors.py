"""How a handler's failures become status codes (TorchServe's worker-side rules).

The whole batch fails with one code and message:

* ``MemoryError`` -> 507 ``Out of resources``
* ``PredictionException(message, error_code)`` -> ``error_code`` / ``message``
* an exception whose text contains ``CUDA`` -> 507 ``Out of resources``
* any other exception -> 503 ``Prediction failed``
* a return value that is not a list -> 503 ``Invalid model predict output``
* a list of the wrong length -> 503 ``number of batch response mismatched``

A failure to load is the worker's, whatever the model API: :mod:`trioserve.worker.errors`.
"""

from __future__ import annotations

from typing import Final

from trioserve.worker.errors import mentions_cuda

OUT_OF_RESOURCES: Final = (507, "Out of resources")
PREDICTION_FAILED: Final = (503, "Prediction failed")
INVALID_OUTPUT: Final = (503, "Invalid model predict output")
LENGTH_MISMATCH: Final = (503, "number of batch response mismatched")


class PredictionException(Exception):
    """Raised by a handler to fail its batch with a chosen status code and message."""

    def __init__(self, message: str, error_code: int = 500) -> None:
        super().__init__(message)
        self.message = message
        self.error_code = error_code

    def __str__(self) -> str:
        return f"{self.message} : {self.error_code}"


def _prediction_exception(exc: BaseException) -> tuple[int, str] | None:
    """Code and message of a PredictionException, ours or the real ``ts`` package's."""
    if not isinstance(exc, PredictionException) and type(exc).__name__ != "PredictionException":
        return None
    code = getattr(exc, "error_code", 500)
    message = getattr(exc, "message", None)
    if not isinstance(code, int) or isinstance(code, bool):
        try:
            code = int(code)
        except (TypeError, ValueError):
            code = 500
    return code, message if isinstance(message, str) else str(exc)


def batch_error(exc: BaseException) -> tuple[int, str]:
    """The batch-level (code, message) for an exception raised by the entry point."""
    if isinstance(exc, MemoryError):
        return OUT_OF_RESOURCES
    explicit = _prediction_exception(exc)
    if explicit is not None:
        return explicit
    if mentions_cuda(exc):
        return OUT_OF_RESOURCES
    return PREDICTION_FAILED
