"""Answering one batch with the loaded handler, in the handler thread: :func:`answer_batch`.

The frame loop hands each batch here with the handler's entry point and its
:class:`~trioserve.worker.torchserve.context.Context`. A batch that holds KServe v1 or OIP
requests runs as rows (:func:`trioserve.worker.torchserve.kserve.rows_runner`: each v1
instance, each OIP input one row); any other batch one row per request
(:mod:`trioserve.worker.torchserve.batch`). Whatever happens the result is the batch's final
reply: the handler's failures become their codes there, a failure of the worker's own is
503 ``Prediction failed`` here (logged), and the context's batch state is cleared after.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from trioserve.core.messages import BatchReply, LoadSpec, WorkItem
from trioserve.worker.responses import error_reply
from trioserve.worker.tensors import BatchTensor
from trioserve.worker.torchserve import kserve
from trioserve.worker.torchserve.batch import Entry, prepare, run_batch
from trioserve.worker.torchserve.context import Context
from trioserve.worker.torchserve.errors import PREDICTION_FAILED
from trioserve.worker.torchserve.streaming import IntermediateChannel

log = logging.getLogger("trioserve.worker")


def answer_batch(
    entry: Entry,
    context: Context,
    spec: LoadSpec,
    batch_id: int,
    items: list[WorkItem],
    *,
    decode: bool,
    cancel_check: Callable[[str], bool],
    tensors: Mapping[str, BatchTensor],
    write: Callable[[bytes], None],
    encode: Callable[[BatchReply], bytes],
) -> BatchReply:
    """The final reply to batch ``batch_id`` of the model loaded from ``spec``; the handler's
    intermediate replies are encoded with ``encode`` and written with ``write`` (blocking)."""
    channel = IntermediateChannel(batch_id, write, encode)
    try:
        # v1 or OIP requests:
        runner = kserve.rows_runner(items, spec.envelope, spec.request_limits)
        if runner is not None:
            return runner(
                entry,
                context,
                batch_id,
                items,
                decode=decode,
                cancel_check=cancel_check,
                channel=channel,
                tensors=tensors,
            )
        data = prepare(
            context,
            items,
            decode=decode,
            cancel_check=cancel_check,
            channel=channel,
            tensors=tensors,
        )
        return run_batch(entry, context, batch_id, items, data)
    except BaseException as exc:  # run_batch catches the handler's; this is the worker's
        log.error("batch %d could not be run", batch_id, exc_info=exc)
        return error_reply(batch_id, *PREDICTION_FAILED)
    finally:
        context.end_batch()


__all__ = ["answer_batch"]
