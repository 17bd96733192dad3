"""TorchServe's gRPC inference service (port 7070), on the Trio side of the bridge.

Each rpc builds the same transport-neutral :class:`InferenceRequest` the HTTP routes build,
submits it to the :class:`~trioserve.runtime.dataplane.Dataplane` and reads the call's
replies; the call is cancelled whenever the rpc ends early (deadline, client cancel, stream
error), which drops a queued request or tells the worker to stop. The call's ``grpc-timeout``
becomes the request's deadline, honoured while it waits in the queue.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from trioserve._proto.google.protobuf import Any as AnyMessage
from trioserve._proto.google.protobuf import Empty
from trioserve._proto.google.rpc import Status
from trioserve._proto.org.pytorch.serve.grpc.inference import (
    InferenceApIsServiceBase,
    PredictionResponse,
    PredictionsRequest,
    TorchServeHealthResponse,
)
from trioserve.auth import KeyKind
from trioserve.core import errors
from trioserve.core.errors import ServeError
from trioserve.core.messages import Param, Reply
from trioserve.core.request import InferenceRequest
from trioserve.grpc.calls import (
    BidiStreaming,
    Method,
    Receive,
    RpcContext,
    Send,
    ServerStreaming,
    Settle,
    Unary,
    collect_replies,
)
from trioserve.grpc.errors import grpc_code
from trioserve.grpc.ordered import answer_in_order
from trioserve.runtime.dataplane import Call, Dataplane

ERROR_INFO_TYPE_URL = "type.googleapis.com/google.rpc.ErrorInfo"
ERROR_DOMAIN = "trioserve"


def health_text(healthy: bool) -> str:
    """TorchServe's ``health`` string: pretty-printed JSON, no trailing newline."""
    return json.dumps({"status": "Healthy" if healthy else "Unhealthy"}, indent=2)


def _joined(replies: list[Reply]) -> PredictionResponse:
    return PredictionResponse(prediction=b"".join(bytes(reply.body) for reply in replies))


def handler_params(inputs: Mapping[str, bytes]) -> list[Param]:
    """Each ``input`` key becomes one handler input holding raw bytes, no content type."""
    return [Param(name, value) for name, value in inputs.items()]


def _required_model(request: PredictionsRequest) -> str:
    if not request.model_name:
        raise errors.bad_request("Parameter model_name is required.")
    return request.model_name


def _error_info(reason: str, domain: str) -> bytes:
    """``google.rpc.ErrorInfo{reason=1, domain=2}`` in protobuf wire format."""
    out = bytearray()
    for number, text in ((1, reason), (2, domain)):
        data = text.encode()
        out.append(number << 3 | 2)
        size = len(data)
        while size > 0x7F:
            out.append(size & 0x7F | 0x80)
            size >>= 7
        out.append(size)
        out += data
    return bytes(out)


def in_band_status(error: ServeError) -> Status:
    """The ``status`` of a StreamPredictions2 response answering ``error``."""
    return Status(
        code=grpc_code(error),
        message=error.message,
        details=[
            AnyMessage(
                type_url=ERROR_INFO_TYPE_URL,
                value=_error_info(error.reason, ERROR_DOMAIN),
            )
        ],
    )


@dataclass(slots=True)
class _Pending:
    """One StreamPredictions2 request waiting for its turn to be answered."""

    sequence_id: str | None
    call: Call | None = None
    error: ServeError | None = None


SERVICE: Final = "org.pytorch.serve.grpc.inference.InferenceAPIsService"


class InferenceRpcs:
    """``org.pytorch.serve.grpc.inference.InferenceAPIsService``: a thin adapter that turns
    each message into an :class:`InferenceRequest` for the :class:`Dataplane`."""

    base: ClassVar[type[Any]] = InferenceApIsServiceBase

    def __init__(self, dataplane: Dataplane) -> None:
        self._dataplane = dataplane

    def key_kind_of(self, method: str) -> KeyKind:
        return KeyKind.INFERENCE

    def methods(self) -> dict[str, Method]:
        return {
            "Ping": Unary(self.ping),
            "Predictions": Unary(self.predictions, self.start_predictions),
            "StreamPredictions": ServerStreaming(self.stream_predictions),
            "StreamPredictions2": BidiStreaming(self.stream_predictions2),
        }

    def _submit(
        self, message: PredictionsRequest, context: RpcContext, sequence_id: str | None = None
    ) -> Call:
        return self._dataplane.submit(
            InferenceRequest(
                model=_required_model(message),
                version=message.model_version or None,
                params=handler_params(message.input),
                deadline=context.deadline,
                sequence_id=sequence_id,
                # TorchServe's key: the client ends its sequence with this request.
                ends_sequence=sequence_id is not None
                and self._dataplane.sequences.end_header in message.input,
            )
        )

    # -- rpcs -------------------------------------------------------------------------

    async def ping(self, _request: Empty, _context: RpcContext) -> TorchServeHealthResponse:
        return TorchServeHealthResponse(health=health_text(self._dataplane.healthy()))

    async def predictions(
        self, request: PredictionsRequest, context: RpcContext
    ) -> PredictionResponse:
        """One answer; a handler that streams has its parts joined, as HTTP's body is."""
        parts: list[bytes] = []
        async with self._submit(request, context) as call:
            final = False
            while not final:  # next_reply, not replies(): no async generator per call
                reply, final = await call.next_reply()
                parts.append(bytes(reply.body))
        return PredictionResponse(prediction=b"".join(parts))

    def start_predictions(
        self, request: PredictionsRequest, context: RpcContext, settle: Settle
    ) -> Callable[[], None]:
        """:meth:`predictions` without a task: the replies are collected as they arrive."""
        return collect_replies(self._submit(request, context), _joined, settle)

    async def stream_predictions(
        self,
        request: PredictionsRequest,
        context: RpcContext,
        send: Send[PredictionResponse],
    ) -> None:
        """One message per intermediate reply, then the final one, then OK."""
        async with self._submit(request, context) as call:
            async for reply, _final in call.replies():
                await send(PredictionResponse(prediction=bytes(reply.body)))

    async def stream_predictions2(
        self,
        receive: Receive[PredictionsRequest],
        context: RpcContext,
        send: Send[PredictionResponse],
    ) -> None:
        """Requests are queued as they arrive and answered strictly in their order.

        A request that fails gets an in-band ``status`` and the stream stays open. When the
        client half-closes, every request already read is still answered before OK.
        """
        stream_sequence = ""  # the stream's sequence, once its first request is accepted

        def accept(message: PredictionsRequest) -> _Pending:
            nonlocal stream_sequence
            pending = self._accept(message, context, stream_sequence)
            if pending.call is not None and pending.call.stateful and not stream_sequence:
                stream_sequence = pending.call.sequence_id or ""
            return pending

        async def answer(pending: _Pending) -> None:
            await self._answer(pending, send)

        await answer_in_order(receive, accept, answer, lambda pending: pending.call)

    def _accept(
        self, message: PredictionsRequest, context: RpcContext, stream_sequence: str
    ) -> _Pending:
        """Submit one request of the stream. On a stateful model the stream carries one
        sequence: the first request opens it (a new id when it names none) and a later one
        without ``sequence_id`` joins it. A stateless model needs the id on every request."""
        sequence_id = message.sequence_id or stream_sequence
        pending = _Pending(sequence_id=sequence_id or None)
        try:
            pending.call = self._submit(message, context, sequence_id)
        except ServeError as error:
            pending.error = error
        return pending

    async def _answer(self, pending: _Pending, send: Send[PredictionResponse]) -> None:
        if pending.call is None:
            assert pending.error is not None
            await send(self._in_band(pending.error, pending.sequence_id))
            return
        call = pending.call
        try:
            async for reply, _final in call.replies():
                await send(
                    PredictionResponse(prediction=bytes(reply.body), sequence_id=call.sequence_id)
                )
        except ServeError as error:
            await send(self._in_band(error, call.sequence_id))
        finally:
            call.cancel()

    @staticmethod
    def _in_band(error: ServeError, sequence_id: str | None) -> PredictionResponse:
        return PredictionResponse(
            prediction=b"", sequence_id=sequence_id, status=in_band_status(error)
        )


__all__ = ["InferenceRpcs", "health_text", "in_band_status"]
