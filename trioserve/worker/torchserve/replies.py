"""A handler's answers into replies (one :class:`Reply` per request).

A reply's status, reason phrase, headers and content type come from the request's response
state in the :class:`~trioserve.worker.torchserve.context.Context` (what the handler set with
``set_response_status``/``set_response_header``/``set_response_content_type``). The content
type travels in :attr:`Reply.content_type`, not in the header map. The frames they go out in
are kept within what the server reads by :class:`trioserve.worker.responses.FrameLimit`.
"""

from __future__ import annotations

import logging
from typing import Any

from trioserve.core.messages import BatchReply, Reply, WorkItem
from trioserve.worker.torchserve.codec import encode_output
from trioserve.worker.torchserve.context import Context, RequestProcessor
from trioserve.worker.torchserve.errors import INVALID_OUTPUT, LENGTH_MISMATCH

log = logging.getLogger("trioserve.worker")

CONTENT_TYPE_KEY = "content-type"
STREAM_NEXT_HEADER = "ts_stream_next"
UNSUPPORTED_OUTPUT = (503, "Unsupported model output data type.")


class OutputError(Exception):
    """The handler's answer cannot be turned into replies; carries the batch code/message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _plain_processor(context: Any, idx: int) -> RequestProcessor | None:
    """Request ``idx``'s processor when ``context`` is exactly the worker's Context holding
    exactly RequestProcessors (nothing a handler subclassed or replaced); else None."""
    if type(context) is not Context:
        return None
    processors = context.request_processor
    if processors is None:
        return None
    processor = processors[idx]
    return processor if type(processor) is RequestProcessor else None


def make_reply(context: Any, idx: int, request_id: str, value: Any) -> Reply:
    """The reply to request ``idx`` whose answer is ``value``.

    Raises :class:`OutputError` (503) when ``value`` cannot be serialized.
    """
    try:
        body = encode_output(value)
    except (TypeError, ValueError) as exc:
        log.warning(
            "answer %d (request %s) cannot be serialized: %s: %s",
            idx,
            request_id,
            type(exc).__name__,
            exc,
        )
        raise OutputError(*UNSUPPORTED_OUTPUT) from exc
    processor = _plain_processor(context, idx)
    if processor is not None:
        # The worker's own Context and RequestProcessor: read the state directly (what the
        # getters below return), and skip the header copy when the handler set none.
        code, phrase = processor._status_code, processor._reason_phrase
        response_headers = processor._response_header
        content_type = response_headers.get(CONTENT_TYPE_KEY) if response_headers else None
    else:
        code, phrase = context.get_response_status(idx)
        response_headers = context.get_response_headers(idx)
        content_type = context.get_response_content_type(idx)
    headers = (
        {
            str(k): str(v)
            for k, v in response_headers.items()
            if k != CONTENT_TYPE_KEY and v is not None
        }
        if response_headers
        else {}
    )
    return Reply(
        request_id=request_id,
        body=body,
        status=int(code) if code is not None else 200,
        reason=str(phrase) if phrase is not None else "",
        headers=headers,
        content_type=str(content_type) if content_type else None,
    )


def _apply_stopping_criteria(context: Any, answers: list[Any]) -> None:
    """Continuous batching: tell the server per request whether more frames will follow."""
    criteria = getattr(context, "stopping_criteria", None)
    if not criteria:
        return
    for idx, answer in enumerate(answers):
        if idx >= len(criteria) or criteria[idx] is None:
            continue
        stop = criteria[idx](answer)
        if stop is not None:
            context.set_response_header(idx, STREAM_NEXT_HEADER, "false" if stop else "true")


def final_reply(batch_id: int, items: list[WorkItem], answers: Any, context: Any) -> BatchReply:
    """The final RESPONSE for a batch whose entry point returned ``answers``.

    Raises :class:`OutputError` when the answer is not a list of the batch's length or an
    element cannot be serialized.
    """
    if not isinstance(answers, list):
        raise OutputError(*INVALID_OUTPUT)
    if len(answers) != len(items):
        raise OutputError(*LENGTH_MISMATCH)
    _apply_stopping_criteria(context, answers)
    replies = [
        make_reply(context, idx, item.request_id, answer)
        for idx, (item, answer) in enumerate(zip(items, answers, strict=True))
    ]
    return BatchReply(batch_id, 200, "Prediction success", replies, final=True)
