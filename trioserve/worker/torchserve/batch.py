"""Running one batch through the entry point, synchronously (in the handler thread).

:func:`run_batch` never raises for anything the handler does: every outcome becomes the
batch's final :class:`~trioserve.core.messages.BatchReply`, either 200 with one reply per
request or an error code with no replies (see :mod:`trioserve.worker.torchserve.errors`).
Tracebacks go to the worker's log (stderr).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from trioserve.core.messages import BatchReply, WorkItem
from trioserve.worker.responses import error_reply
from trioserve.worker.tensors import BatchTensor
from trioserve.worker.torchserve.codec import decode_request, request_headers
from trioserve.worker.torchserve.context import Context
from trioserve.worker.torchserve.errors import PREDICTION_FAILED, batch_error
from trioserve.worker.torchserve.replies import OutputError, final_reply

log = logging.getLogger("trioserve.worker")

# A handler's entry point, called as entry(data, context) (see loader.py).
Entry = Callable[[Any, Any], Any]


def prepare(
    context: Context,
    items: list[WorkItem],
    *,
    decode: bool = True,
    cancel_check: Callable[[str], bool] | None = None,
    channel: Any = None,
    tensors: Mapping[str, BatchTensor] | None = None,
) -> list[dict[str, Any]]:
    """Install the batch's request state (and its checked collated ``tensors``) on
    ``context``; return the handler's ``data``."""
    context.begin_batch(
        [item.request_id for item in items],
        [request_headers(item) for item in items],
        cancel_check=cancel_check,
        channel=channel,
        tensors=tensors,
    )
    return [decode_request(item, decode) for item in items]


def _ids(items: list[WorkItem]) -> str:
    """The batch's request ids for a log line (only joined when a batch fails)."""
    return ",".join(item.request_id for item in items)


def run_batch(
    entry: Entry,
    context: Context,
    batch_id: int,
    items: list[WorkItem],
    data: list[dict[str, Any]],
) -> BatchReply:
    """Call ``entry(data, context)`` and turn whatever happens into the final reply."""
    start = time.perf_counter()
    try:
        answers = entry(data, context)
    except BaseException as exc:
        code, message = batch_error(exc)
        log.error(
            "batch %d (requests %s) failed: %d %s",
            batch_id,
            _ids(items),
            code,
            message,
            exc_info=exc,
        )
        return error_reply(batch_id, code, message)
    elapsed_ms = (time.perf_counter() - start) * 1000
    try:
        reply = final_reply(batch_id, items, answers, context)
    except OutputError as exc:
        log.error("batch %d (requests %s): %s", batch_id, _ids(items), exc.message)
        return error_reply(batch_id, exc.code, exc.message)
    except Exception as exc:
        log.error(
            "batch %d (requests %s): building the replies failed",
            batch_id,
            _ids(items),
            exc_info=exc,
        )
        return error_reply(batch_id, *PREDICTION_FAILED)
    metrics = context.metrics
    if metrics is not None and hasattr(metrics, "add_time"):
        try:
            metrics.add_time("PredictionTime", round(elapsed_ms, 2), None, "ms")
        except Exception:
            log.exception("recording PredictionTime failed")
    return reply
