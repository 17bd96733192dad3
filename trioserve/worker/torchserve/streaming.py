"""Intermediate responses: ``send_intermediate_predict_response`` and its channel.

While a batch runs, ``context.cl_socket`` holds an :class:`IntermediateChannel`. A handler
streams with::

    send_intermediate_predict_response(ret, req_id_map, message, code, context)

which writes one RESPONSE frame (not final) at once, with one reply per request in
``req_id_map`` (``{batch index: request id}``), and returns when the frame is on the socket;
so intermediate frames always precede the batch's final frame.

The channel also accepts TorchServe's own wire bytes through ``sendall`` (what the real
``ts`` package's function writes when it is installed and used instead of the shim): they are
parsed and re-sent as a frame.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import Any

from trioserve.core.messages import BatchReply, Reply, encode_reply
from trioserve.worker.torchserve.replies import CONTENT_TYPE_KEY, STREAM_NEXT_HEADER, make_reply

_INT = struct.Struct(">i")


class IntermediateChannel:
    """Sends a batch's intermediate RESPONSE frames; ``write`` blocks until sent."""

    def __init__(
        self,
        batch_id: int,
        write: Callable[[bytes], None],
        encode: Callable[[BatchReply], bytes] = encode_reply,
    ) -> None:
        self.batch_id = batch_id
        self._write = write
        self._encode = encode  # a RESPONSE frame, within what the server reads

    def send_replies(self, code: int, message: str, replies: list[Reply]) -> None:
        self._write(self._encode(BatchReply(self.batch_id, code, message, replies, final=False)))

    def sendall(self, data: bytes | bytearray | memoryview) -> None:
        """Accept a TorchServe OTF inference reply and send it as an intermediate frame."""
        code, message, replies = parse_otf_response(bytes(data))
        for reply in replies:
            reply.headers.pop(STREAM_NEXT_HEADER, None)
            reply.headers.pop(CONTENT_TYPE_KEY, None)
        self.send_replies(code, message, replies)


def send_intermediate_predict_response(
    ret: list[Any],
    req_id_map: dict[int, str],
    message: str,
    code: int,
    context: Any = None,
) -> None:
    """Send ``ret[idx]`` to each request of ``req_id_map`` now, as a non-final response."""
    if str(os.environ.get("LOCAL_RANK", "0")) != "0":
        return
    channel = getattr(context, "cl_socket", None)
    if not isinstance(channel, IntermediateChannel):
        raise RuntimeError(
            "send_intermediate_predict_response needs the context of a batch being handled "
            "(context.cl_socket is only set while the entry point runs)"
        )
    replies = [make_reply(context, idx, rid, ret[idx]) for idx, rid in req_id_map.items()]
    channel.send_replies(code, str(message), replies)


class OtfError(ValueError):
    """Bytes that are not a TorchServe inference reply."""


class _Reader:
    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def integer(self) -> int:
        if self._pos + 4 > len(self._data):
            raise OtfError("truncated TorchServe reply")
        (value,) = _INT.unpack_from(self._data, self._pos)
        self._pos += 4
        return int(value)

    def blob(self, length: int | None = None) -> bytes:
        n = self.integer() if length is None else length
        if n < 0 or self._pos + n > len(self._data):
            raise OtfError("bad length in TorchServe reply")
        out = self._data[self._pos : self._pos + n]
        self._pos += n
        return out

    def text(self) -> str:
        return self.blob().decode("utf-8")


def parse_otf_response(data: bytes) -> tuple[int, str, list[Reply]]:
    """Decode TorchServe's inference reply: code, message, prediction records, -1."""
    reader = _Reader(data)
    code = reader.integer()
    message = reader.text()
    replies: list[Reply] = []
    while True:
        id_len = reader.integer()
        if id_len == -1:
            break
        request_id = reader.blob(id_len).decode("utf-8")
        content_type = reader.text() or None
        status = reader.integer()
        reason = reader.text()
        headers = {}
        for _ in range(reader.integer()):
            key = reader.text()
            headers[key] = reader.text()
        body = reader.blob()
        replies.append(Reply(request_id, body, status, reason, headers, content_type))
    return code, message, replies
