"""TorchServe's gRPC inference service (port 7070), on the Trio side of the bridge.

Each rpc builds the same transport-neutral :class:`InferenceRequest` the HTTP routes build
and reads the job's replies; the job is cancelled whenever the call ends early (deadline,
client cancel, stream error), which drops a queued job or tells the worker to stop.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import trio

from trioserve._proto.google.protobuf import Any as AnyMessage
from trioserve._proto.google.protobuf import Empty
from trioserve._proto.google.rpc import Status
from trioserve._proto.org.pytorch.serve.grpc.inference import (
    PredictionResponse,
    PredictionsRequest,
    TorchServeHealthResponse,
)
from trioserve.auth import KeyKind
from trioserve.core import errors
from trioserve.core.errors import ServeError
from trioserve.core.messages import Param
from trioserve.core.request import InferenceRequest
from trioserve.grpc.calls import (
    BidiStreaming,
    Method,
    Receive,
    RpcContext,
    Send,
    ServerStreaming,
    Unary,
    grpc_code,
    single_error,
)
from trioserve.grpc.sequences import (
    DEFAULT_SEQUENCE_ID_HEADER,
    Accepted,
    SequenceRequest,
    SequenceRouter,
    StatelessSequences,
)
from trioserve.metrics import ServerMetrics
from trioserve.runtime.jobs import Job
from trioserve.runtime.manager import ModelManager

# How many requests of one StreamPredictions2 stream may wait for their answers before the
# server stops reading the stream (HTTP/2 flow control then holds the client back).
MAX_PENDING_PER_STREAM = 64

ERROR_INFO_TYPE_URL = "type.googleapis.com/google.rpc.ErrorInfo"
ERROR_DOMAIN = "trioserve"


def health_text(healthy: bool) -> str:
    """TorchServe's ``health`` string: pretty-printed JSON, no trailing newline."""
    return json.dumps({"status": "Healthy" if healthy else "Unhealthy"}, indent=2)


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
                value=_error_info(error.type_name, ERROR_DOMAIN),
            )
        ],
    )


@dataclass(slots=True)
class _Pending:
    """One StreamPredictions2 request waiting for its turn to be answered."""

    sequence_id: str | None
    accepted: Accepted | None = None
    error: ServeError | None = None


class InferenceRpcs:
    """``org.pytorch.serve.grpc.inference.InferenceAPIsService``."""

    key_kind = KeyKind.INFERENCE

    def __init__(
        self,
        manager: ModelManager,
        *,
        metrics: ServerMetrics | None = None,
        sequences: SequenceRouter | None = None,
        sequence_id_header: str = DEFAULT_SEQUENCE_ID_HEADER,
    ) -> None:
        self._manager = manager
        self._metrics = metrics
        self._sequences = sequences or StatelessSequences(
            self.submit, sequence_id_header=sequence_id_header
        )

    def methods(self) -> dict[str, Method]:
        return {
            "Ping": Unary(self.ping),
            "Predictions": Unary(self.predictions),
            "StreamPredictions": ServerStreaming(self.stream_predictions),
            "StreamPredictions2": BidiStreaming(self.stream_predictions2),
        }

    # -- the shared path of a request -------------------------------------------------

    def submit(self, request: InferenceRequest) -> Job:
        if self._metrics is not None:
            self._metrics.request_received(request.model, request.version)
        return self._manager.submit(request)

    def _finished(self, job: Job) -> None:
        if self._metrics is None or job.started_at is None:
            return
        request = job.request
        self._metrics.request_finished(
            request.model,
            request.version,
            latency_us=(trio.current_time() - job.enqueued_at) * 1e6,
            queue_us=(job.started_at - job.enqueued_at) * 1e6,
        )

    def _job(self, request: PredictionsRequest) -> Job:
        return self.submit(
            InferenceRequest(
                model=_required_model(request),
                version=request.model_version or None,
                params=handler_params(request.input),
            )
        )

    # -- rpcs -------------------------------------------------------------------------

    async def ping(self, _request: Empty, _context: RpcContext) -> TorchServeHealthResponse:
        return TorchServeHealthResponse(health=health_text(self._manager.healthy()))

    async def predictions(
        self, request: PredictionsRequest, _context: RpcContext
    ) -> PredictionResponse:
        """One answer; a handler that streams has its parts joined, as HTTP's body is."""
        job = self._job(request)
        try:
            parts = [bytes(reply.body) async for reply, _final in job.replies()]
        finally:
            job.cancel()
        self._finished(job)
        return PredictionResponse(prediction=b"".join(parts))

    async def stream_predictions(
        self,
        request: PredictionsRequest,
        _context: RpcContext,
        send: Send[PredictionResponse],
    ) -> None:
        """One message per intermediate reply, then the final one, then OK."""
        job = self._job(request)
        try:
            async for reply, _final in job.replies():
                await send(PredictionResponse(prediction=bytes(reply.body)))
        finally:
            job.cancel()
        self._finished(job)

    async def stream_predictions2(
        self,
        receive: Receive[PredictionsRequest],
        _context: RpcContext,
        send: Send[PredictionResponse],
    ) -> None:
        """Requests are queued as they arrive and answered strictly in their order.

        A request that fails gets an in-band ``status`` and the stream stays open. When the
        client half-closes, every request already read is still answered before OK.
        """
        live: set[Job] = set()
        pending_send, pending_recv = trio.open_memory_channel[_Pending](MAX_PENDING_PER_STREAM)

        async def read_requests() -> None:
            async with pending_send:
                while (message := await receive()) is not None:
                    pending = self._accept(message)
                    if pending.accepted is not None:
                        live.add(pending.accepted.job)
                    await pending_send.send(pending)

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_requests)
                async with pending_recv:
                    async for pending in pending_recv:
                        await self._answer(pending, send)
                        if pending.accepted is not None:
                            live.discard(pending.accepted.job)
        except BaseExceptionGroup as group:
            raise single_error(group) from None
        finally:
            for job in live:
                job.cancel()

    def _accept(self, message: PredictionsRequest) -> _Pending:
        pending = _Pending(sequence_id=message.sequence_id)
        try:
            pending.accepted = self._sequences.submit(
                SequenceRequest(
                    model=_required_model(message),
                    version=message.model_version or None,
                    params=handler_params(message.input),
                    sequence_id=message.sequence_id,
                )
            )
        except ServeError as error:
            pending.error = error
        return pending

    async def _answer(self, pending: _Pending, send: Send[PredictionResponse]) -> None:
        if pending.accepted is None:
            assert pending.error is not None
            await send(self._in_band(pending.error, pending.sequence_id))
            return
        sequence_id = pending.accepted.sequence_id
        job = pending.accepted.job
        try:
            async for reply, _final in job.replies():
                await send(
                    PredictionResponse(prediction=bytes(reply.body), sequence_id=sequence_id)
                )
        except ServeError as error:
            await send(self._in_band(error, sequence_id))
            return
        finally:
            job.cancel()
        self._finished(job)

    @staticmethod
    def _in_band(error: ServeError, sequence_id: str | None) -> PredictionResponse:
        return PredictionResponse(
            prediction=b"", sequence_id=sequence_id, status=in_band_status(error)
        )


__all__ = ["MAX_PENDING_PER_STREAM", "InferenceRpcs", "health_text", "in_band_status"]
