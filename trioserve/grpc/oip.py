"""The Open Inference Protocol over gRPC (``inference.GRPCInferenceService``), on the gRPC
inference port (7070) beside TorchServe's service, on the Trio side of the bridge.

A thin adapter onto the :class:`~trioserve.runtime.dataplane.Dataplane`, sharing
:mod:`trioserve.runtime.oip` with the REST adapter: it only turns messages into
:class:`~trioserve.core.oip.Tensor` values and back. Inputs come from typed
``InferTensorContents`` (the field of the input's datatype) or from ``raw_input_contents``
(one blob per input, in order); outputs are always answered as ``raw_output_contents``, as
Triton answers (tritonclient's ``as_numpy`` and MLServer's codecs read them).

``ModelStreamInfer`` answers the requests of a stream in their order, one message per reply
of the model (a streaming handler's intermediate replies included). The message is
MLServer's ``ModelInferResponse`` (an error ends the stream with its status), or, with
``oip_grpc_stream_shape=triton``, Triton's ``ModelStreamInferResponse`` (an error is answered
in-band in ``error_message`` and the stream stays open).

Errors map as over REST: NOT_FOUND (unknown model or version), INVALID_ARGUMENT (bad
input), UNAVAILABLE (not ready, queue full), INTERNAL (the handler failed).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import outcome

from trioserve._proto.inference import (
    GrpcInferenceServiceBase,
    ModelInferRequest,
    ModelInferResponse,
    ModelMetadataRequest,
    ModelMetadataResponse,
    ModelReadyRequest,
    ModelReadyResponse,
    ModelStreamInferResponse,
    RepositoryIndexRequest,
    RepositoryIndexResponse,
    RepositoryIndexResponseModelIndex,
    RepositoryModelLoadRequest,
    RepositoryModelLoadResponse,
    RepositoryModelUnloadRequest,
    RepositoryModelUnloadResponse,
    ServerLiveRequest,
    ServerLiveResponse,
    ServerMetadataRequest,
    ServerMetadataResponse,
    ServerReadyRequest,
    ServerReadyResponse,
)
from trioserve.auth import KeyKind
from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.messages import Reply
from trioserve.core.oip.request import RequestedOutput
from trioserve.grpc.calls import (
    BidiStreaming,
    ClientGone,
    Method,
    Receive,
    RpcContext,
    Send,
    Settle,
    Unary,
    collect_replies,
)
from trioserve.grpc.oip_messages import (
    infer_response,
    oip_error,
    parameters_of,
    request_inputs,
    requested_outputs,
    tensor_metadata,
)
from trioserve.grpc.oip_stream import stream_into_model, streams_into_model
from trioserve.grpc.ordered import answer_in_order
from trioserve.grpc.triton import TritonExtensionRpcs
from trioserve.runtime import oip, oip_repository
from trioserve.runtime.dataplane import Call, Dataplane
from trioserve.runtime.model import ModelVersion
from trioserve.runtime.oip_repository import ModelControl

SERVICE: Final = "inference.GRPCInferenceService"
STREAM_SHAPES: Final = ("mlserver", "triton")
# The gRPC OIP extensions trioserve answers (REST's binary_tensor_data has no gRPC meaning).
EXTENSIONS: Final = ("parameters", "model_repository", "model_configuration", "statistics")
# Loading and unloading change the server: they need the management key.
MANAGEMENT_RPCS: Final = frozenset({"RepositoryModelLoad", "RepositoryModelUnload"})

# -- the service ----------------------------------------------------------------------


class _TritonStreamBase(GrpcInferenceServiceBase):
    """The generated service, with ModelStreamInfer answering ModelStreamInferResponse."""

    def __mapping__(self) -> dict[str, Any]:
        mapping: dict[str, Any] = dict(super().__mapping__())
        path = f"/{SERVICE}/ModelStreamInfer"
        mapping[path] = mapping[path]._replace(reply_type=ModelStreamInferResponse)
        return mapping


@dataclass(slots=True)
class _Pending:
    """One ModelStreamInfer request waiting for its turn to be answered."""

    message: ModelInferRequest
    model: ModelVersion | None = None
    requested: list[RequestedOutput] | None = None
    call: Call | None = None
    error: ServeError | None = None


class OipRpcs(TritonExtensionRpcs):
    """``inference.GRPCInferenceService`` with MLServer's ModelStreamInfer messages."""

    base: ClassVar[type[Any]] = GrpcInferenceServiceBase
    stream_shape: ClassVar[str] = "mlserver"

    def __init__(self, dataplane: Dataplane, management: ModelControl | None = None) -> None:
        super().__init__(dataplane)
        self._management = management

    def key_kind_of(self, method: str) -> KeyKind:
        return KeyKind.MANAGEMENT if method in MANAGEMENT_RPCS else KeyKind.INFERENCE

    def methods(self) -> dict[str, Method]:
        return {
            "ServerLive": Unary(self.server_live),
            "ServerReady": Unary(self.server_ready),
            "ModelReady": Unary(self.model_ready),
            "ServerMetadata": Unary(self.server_metadata),
            "ModelMetadata": Unary(self.model_metadata),
            "ModelInfer": Unary(self.model_infer, self.start_model_infer),
            "ModelStreamInfer": BidiStreaming(self.model_stream_infer),
            "RepositoryIndex": Unary(self.repository_index),
            "RepositoryModelLoad": Unary(self.repository_model_load),
            "RepositoryModelUnload": Unary(self.repository_model_unload),
            "ModelConfig": Unary(self.model_config),
            "ModelStatistics": Unary(self.model_statistics),
        }

    # -- rpcs ---------------------------------------------------------------------------

    async def server_live(
        self, _request: ServerLiveRequest, _context: RpcContext
    ) -> ServerLiveResponse:
        return ServerLiveResponse(live=True)

    async def server_ready(
        self, _request: ServerReadyRequest, _context: RpcContext
    ) -> ServerReadyResponse:
        return ServerReadyResponse(ready=self._dataplane.healthy())

    async def model_ready(
        self, request: ModelReadyRequest, _context: RpcContext
    ) -> ModelReadyResponse:
        model = self._dataplane.model(request.name, request.version or None)
        return ModelReadyResponse(ready=model.ready_workers > 0)

    async def server_metadata(
        self, _request: ServerMetadataRequest, _context: RpcContext
    ) -> ServerMetadataResponse:
        return ServerMetadataResponse(
            name=oip.SERVER_NAME, version=oip.SERVER_VERSION, extensions=list(EXTENSIONS)
        )

    async def model_metadata(
        self, request: ModelMetadataRequest, _context: RpcContext
    ) -> ModelMetadataResponse:
        model = self._dataplane.model(request.name, request.version or None)
        meta = oip.model_metadata(self._dataplane, model)
        return ModelMetadataResponse(
            name=meta.name,
            versions=meta.versions,
            platform=meta.platform,
            inputs=[tensor_metadata(t) for t in meta.inputs],
            outputs=[tensor_metadata(t) for t in meta.outputs],
        )

    async def model_infer(
        self, request: ModelInferRequest, context: RpcContext
    ) -> ModelInferResponse:
        """One answer: the model's final reply."""
        try:
            pending = self._accept(request, context)
            if pending.error is not None:
                raise pending.error
            assert pending.call is not None and pending.model is not None
            outputs = await oip.final_outputs(pending.call)
            return infer_response(pending.model, request, outputs, pending.requested or [])
        except ServeError as error:
            raise oip_error(error) from None

    def start_model_infer(
        self, request: ModelInferRequest, context: RpcContext, settle: Settle
    ) -> Callable[[], None]:
        """:meth:`model_infer` without a task: the replies are collected as they arrive."""
        pending = self._accept(request, context)
        if pending.error is not None:
            raise oip_error(pending.error)
        assert pending.call is not None and pending.model is not None
        model, requested = pending.model, pending.requested or []

        def answer(replies: list[Reply]) -> ModelInferResponse:
            return infer_response(model, request, oip.outputs_of(replies[-1]), requested)

        def settle_as_oip(result: outcome.Outcome[Any]) -> None:
            if isinstance(result, outcome.Error) and isinstance(result.error, ServeError):
                result = outcome.Error(oip_error(result.error))
            settle(result)

        return collect_replies(pending.call, answer, settle_as_oip)

    async def model_stream_infer(
        self,
        receive: Receive[ModelInferRequest],
        context: RpcContext,
        send: Send[Any],
    ) -> None:
        """Requests are submitted as they arrive and answered strictly in their order, one
        message per reply. When the client half-closes, every request already read is still
        answered before OK. To an MLServer model the whole stream is one request
        (:mod:`trioserve.grpc.oip_stream`)."""
        first = await receive()
        if first is None:
            return
        try:
            model = self._dataplane.model(first.model_name, first.model_version or None)
        except ServeError:
            model = None  # answered in its turn below
        if model is not None and streams_into_model(model):
            unreadable: list[ServeError] = []  # a message that could not be read

            async def reading() -> ModelInferRequest | None:
                try:
                    return await receive()
                except ClientGone:
                    raise
                except ServeError as error:
                    unreadable.append(error)
                    raise

            try:
                await stream_into_model(
                    self._dataplane, model, first, reading, context, self._send_each(send)
                )
            except ClientGone:
                raise
            except ServeError as error:
                if unreadable and error is unreadable[0]:
                    raise  # in both shapes, as for requests answered one by one
                await self._failed(oip_error(error), send)
            return
        replay: list[ModelInferRequest] = [first]

        async def again() -> ModelInferRequest | None:
            return replay.pop() if replay else await receive()

        async def answer(pending: _Pending) -> None:
            try:
                await self._answer(pending, send)
            except ClientGone:
                raise
            except ServeError as error:
                await self._failed(oip_error(error), send)

        await answer_in_order(
            again,
            lambda message: self._accept(message, context),
            answer,
            lambda pending: pending.call,
        )

    async def repository_index(
        self, request: RepositoryIndexRequest, _context: RpcContext
    ) -> RepositoryIndexResponse:
        self._repository()
        entries = oip_repository.index(self._dataplane, only_ready=request.ready)
        return RepositoryIndexResponse(
            models=[
                RepositoryIndexResponseModelIndex(
                    name=e.name, version=e.version, state=e.state, reason=e.reason
                )
                for e in entries
            ]
        )

    async def repository_model_load(
        self, request: RepositoryModelLoadRequest, _context: RpcContext
    ) -> RepositoryModelLoadResponse:
        management = self._repository()
        await oip_repository.load(self._dataplane, management, _model_name(request))
        return RepositoryModelLoadResponse()

    async def repository_model_unload(
        self, request: RepositoryModelUnloadRequest, _context: RpcContext
    ) -> RepositoryModelUnloadResponse:
        management = self._repository()
        await oip_repository.unload(self._dataplane, management, _model_name(request))
        return RepositoryModelUnloadResponse()

    # -- helpers ------------------------------------------------------------------------

    def _accept(self, message: ModelInferRequest, context: RpcContext) -> _Pending:
        """Check and submit one request; a failure is kept for its turn to be answered."""
        pending = _Pending(message)
        try:
            model = self._dataplane.model(message.model_name, message.model_version or None)
            inputs = request_inputs(message, self._dataplane.limits)
            pending.requested = requested_outputs(message, self._dataplane.limits)
            pending.model = model
            pending.call = oip.submit(
                self._dataplane,
                model,
                inputs,
                deadline=context.deadline,
                request_id=message.id or None,
                parameters=parameters_of(message.parameters),
            )
        except ServeError as error:
            pending.error = error
        return pending

    async def _answer(self, pending: _Pending, send: Send[Any]) -> None:
        if pending.error is not None:
            raise pending.error
        assert pending.call is not None and pending.model is not None
        async for reply, _final in pending.call.replies():
            response = infer_response(
                pending.model,
                pending.message,
                oip.outputs_of(reply),
                pending.requested or [],
                oip.response_id(reply, pending.message.id),
            )
            await send(self._wrap(response))

    def _wrap(self, response: ModelInferResponse) -> Any:
        return response

    def _send_each(self, send: Send[Any]) -> Callable[[ModelInferResponse], Awaitable[None]]:
        async def each(response: ModelInferResponse) -> None:
            await send(self._wrap(response))

        return each

    async def _failed(self, error: ServeError, send: Send[Any]) -> None:
        """MLServer's shape: an error ends the stream with its status."""
        raise error

    def _repository(self) -> ModelControl:
        if self._management is None:
            raise ServeError(
                ErrorKind.NOT_IMPLEMENTED, "the repository extension is not served here"
            )
        return self._management


def _model_name(request: RepositoryModelLoadRequest | RepositoryModelUnloadRequest) -> str:
    if not request.model_name:
        raise ServeError(ErrorKind.BAD_INPUT, "model_name is required")
    return request.model_name


class TritonStreamOipRpcs(OipRpcs):
    """``inference.GRPCInferenceService`` with Triton's ModelStreamInfer messages
    (``oip_grpc_stream_shape=triton``)."""

    base: ClassVar[type[Any]] = _TritonStreamBase
    stream_shape: ClassVar[str] = "triton"

    def _wrap(self, response: ModelInferResponse) -> Any:
        return ModelStreamInferResponse(infer_response=response)

    async def _failed(self, error: ServeError, send: Send[Any]) -> None:
        """Triton's shape: the error is answered in-band and the stream stays open."""
        await send(ModelStreamInferResponse(error_message=error.message))


def oip_service(
    dataplane: Dataplane,
    stream_shape: str = "mlserver",
    management: ModelControl | None = None,
) -> OipRpcs:
    """The service, with ModelStreamInfer in the given shape (``mlserver`` or ``triton``);
    the repository RPCs need ``management`` (without it they answer UNIMPLEMENTED)."""
    if stream_shape not in STREAM_SHAPES:
        raise ValueError(f"unknown ModelStreamInfer shape {stream_shape!r}")
    if stream_shape == "triton":
        return TritonStreamOipRpcs(dataplane, management)
    return OipRpcs(dataplane, management)


__all__ = [
    "OipRpcs",
    "TritonStreamOipRpcs",
    "oip_service",
]
