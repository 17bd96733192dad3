"""``ts.handler_utils.timer``: the ``timed`` decorator for handler methods.

A method decorated with ``@timed`` records how long each call took, in milliseconds, as the
metric ``<class name>.<method name>`` through the handler's ``self.context.metrics``, as
TorchServe's does.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def timed(method: F) -> F:
    @functools.wraps(method)
    def timed_method(self: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        result = method(self, *args, **kwargs)
        elapsed_ms = (time.perf_counter() - started) * 1000
        context = getattr(self, "context", None)
        metrics = getattr(context, "metrics", None)
        if metrics is not None:
            metrics.add_time(f"{type(self).__name__}.{method.__name__}", elapsed_ms, None, "ms")
        return result

    return timed_method  # type: ignore[return-value]


__all__ = ["timed"]
