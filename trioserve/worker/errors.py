"""Why a model failed to load, as the LOAD_RESULT's status code (TorchServe's worker-side
rule, applied to every model the worker hosts).

``MemoryError`` or ``CUDA`` in the text -> 507 ``System out of memory``; anything else -> 500
with the exception's type and text (TorchServe says only ``Unknown exception``).
:class:`LoadError` is what the loaders raise for a reason they can state plainly.

How a TorchServe handler's failures while answering become status codes is in
:mod:`trioserve.worker.torchserve.errors`.
"""

from __future__ import annotations

from typing import Final

LOAD_OUT_OF_MEMORY: Final = (507, "System out of memory")


class LoadError(Exception):
    """The model cannot be loaded for a reason the worker can state plainly."""


def mentions_cuda(exc: BaseException) -> bool:
    """Whether the exception's text says ``CUDA`` (how TorchServe tells GPU memory errors)."""
    try:
        return "CUDA" in str(exc)
    except Exception:
        return False


def load_error(exc: BaseException) -> tuple[int, str]:
    """The LOAD_RESULT (code, message) for an exception raised while loading."""
    if isinstance(exc, MemoryError) or mentions_cuda(exc):
        return LOAD_OUT_OF_MEMORY
    try:
        text = str(exc)
    except Exception:
        text = "<exception text unavailable>"
    name = type(exc).__name__
    return 500, f"{name}: {text}" if text else name
