"""Handler output into RESPONSE messages (one :class:`Reply` per request).

A reply's status, reason phrase, headers and content type come from the request's response
state in the :class:`~trioserve.worker.torchserve.context.Context` (what the handler set with
``set_response_status``/``set_response_header``/``set_response_content_type``). The content
type travels in :attr:`Reply.content_type`, not in the header map.

Every RESPONSE and METRICS frame is encoded by a :class:`FrameLimit`, which keeps it within
what the server reads: a reply larger than ``max_response_size`` is answered 413 instead, a
frame still over the server's limit fails its replies (500), and metric records that do not
fit are dropped. The server would otherwise refuse the frame and restart this worker (a
client's request must never do that).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from trioserve.core.frames import Kind, encode
from trioserve.core.limits import response_frame_limit, response_too_large
from trioserve.core.messages import (
    DEFAULT_MAX_RESPONSE_SIZE,
    BatchReply,
    LoadSpec,
    Reply,
    WorkItem,
    encode_reply,
)
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


def error_reply(batch_id: int, code: int, message: str) -> BatchReply:
    """A final RESPONSE that fails the whole batch."""
    return BatchReply(batch_id, code, message, [], final=True)


@dataclass(frozen=True, slots=True)
class FrameLimit:
    """What the server reads from this worker: reply bodies of at most
    ``max_response_size`` bytes, in frames of at most ``frame`` bytes."""

    max_response_size: int = DEFAULT_MAX_RESPONSE_SIZE
    frame: int = response_frame_limit(DEFAULT_MAX_RESPONSE_SIZE, 1)

    @classmethod
    def of(cls, spec: LoadSpec) -> FrameLimit:
        frame = spec.max_response_frame or response_frame_limit(
            spec.max_response_size, spec.batch_size
        )
        return cls(spec.max_response_size, frame)

    def reply(self, reply: BatchReply) -> bytes:
        """The RESPONSE frame of ``reply``, within the limits: each reply over
        ``max_response_size`` becomes a 413 naming the setting; when the frame is still too
        large (the replies' headers), every reply of it becomes a 500 saying so."""
        limit = self.max_response_size
        if any(memoryview(r.body).nbytes > limit for r in reply.replies):
            reply = replace(reply, replies=[self._within(r) for r in reply.replies])
        frame = encode_reply(reply)
        if len(frame) <= self.frame:
            return frame
        log.error(
            "batch %d: its answer (%d bytes) is too large to send", reply.batch_id, len(frame)
        )
        message = (
            f"the batch's answer is {len(frame)} bytes, more than the server reads from a "
            f"worker ({self.frame} bytes: max_response_size for each request of a full batch, "
            "and 1 MiB)"
        ).encode()
        failed = [Reply(r.request_id, message, 500, "Response Too Large") for r in reply.replies]
        return encode_reply(replace(reply, replies=failed))

    def _within(self, reply: Reply) -> Reply:
        size = memoryview(reply.body).nbytes
        if size <= self.max_response_size:
            return reply
        log.warning(
            "request %s: its answer (%d bytes) is too large to send", reply.request_id, size
        )
        message = response_too_large(size, self.max_response_size)
        return Reply(reply.request_id, message.encode(), 413, "Response Too Large")

    def metrics(self, records: list[dict[str, Any]]) -> bytes:
        """The METRICS frame of ``records``; nothing (the records dropped, with a warning)
        when it would be larger than the server reads."""
        frame = encode(Kind.METRICS, {"metrics": records})
        if len(frame) <= self.frame:
            return frame
        log.warning(
            "dropping %d metric records: %d bytes is too large to send", len(records), len(frame)
        )
        return b""
