"""The RESPONSE frames the worker sends, whatever model API answered, and their limits.

:func:`error_reply` is a batch failed as a whole. Every RESPONSE and METRICS frame is
encoded by a :class:`FrameLimit`, which keeps it within what the server reads: a reply
larger than ``max_response_size`` is answered 413 instead, a frame still over the server's
limit fails its replies (500), and metric records that do not fit are dropped. The server
would otherwise refuse the frame and restart this worker (a client's request must never do
that).
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
    encode_reply,
)

log = logging.getLogger("trioserve.worker")


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
