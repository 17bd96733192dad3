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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from trioserve._proto.inference import (
    GrpcInferenceServiceBase,
    InferParameter,
    ModelInferRequest,
    ModelInferRequestInferInputTensor,
    ModelInferResponse,
    ModelInferResponseInferOutputTensor,
    ModelMetadataRequest,
    ModelMetadataResponse,
    ModelMetadataResponseTensorMetadata,
    ModelReadyRequest,
    ModelReadyResponse,
    ModelStreamInferResponse,
    ServerLiveRequest,
    ServerLiveResponse,
    ServerMetadataRequest,
    ServerMetadataResponse,
    ServerReadyRequest,
    ServerReadyResponse,
)
from trioserve.auth import KeyKind
from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.oip.datatypes import lookup_datatype
from trioserve.core.oip.raw import TensorMeta
from trioserve.core.oip.request import RequestedOutput
from trioserve.core.oip.response import select_outputs
from trioserve.core.oip.tensor import Parameters, ParamValue, Tensor
from trioserve.grpc.calls import (
    BidiStreaming,
    ClientGone,
    Method,
    Receive,
    RpcContext,
    Send,
    Unary,
)
from trioserve.grpc.ordered import answer_in_order
from trioserve.runtime import oip
from trioserve.runtime.dataplane import Call, Dataplane
from trioserve.runtime.model import ModelVersion

SERVICE: Final = "inference.GRPCInferenceService"
STREAM_SHAPES: Final = ("mlserver", "triton")
# The gRPC OIP extensions trioserve answers (REST's binary_tensor_data has no gRPC meaning).
EXTENSIONS: Final = ("parameters",)

CONTENTS_FIELDS: Final = (
    "bool_contents",
    "int_contents",
    "int64_contents",
    "uint_contents",
    "uint64_contents",
    "fp32_contents",
    "fp64_contents",
    "bytes_contents",
)
_INT64_MAX: Final = 2**63 - 1


# -- parameters -----------------------------------------------------------------------


def parameter_value(parameter: InferParameter) -> ParamValue | None:
    """The value an ``InferParameter`` holds (None: it holds none)."""
    for value in (
        parameter.bool_param,
        parameter.int64_param,
        parameter.string_param,
        parameter.double_param,
        parameter.uint64_param,
    ):
        if value is not None:
            return value
    return None


def parameters_of(parameters: Mapping[str, InferParameter]) -> Parameters:
    """A message's ``parameters`` map as plain values (entries holding nothing dropped)."""
    found: Parameters = {}
    for key, parameter in parameters.items():
        value = parameter_value(parameter)
        if value is not None:
            found[key] = value
    return found


def infer_parameter(value: ParamValue) -> InferParameter:
    if isinstance(value, bool):
        return InferParameter(bool_param=value)
    if isinstance(value, int):
        if value > _INT64_MAX:
            return InferParameter(uint64_param=value)
        return InferParameter(int64_param=value)
    if isinstance(value, float):
        return InferParameter(double_param=value)
    return InferParameter(string_param=value)


def infer_parameters(parameters: Mapping[str, ParamValue]) -> dict[str, InferParameter]:
    return {key: infer_parameter(value) for key, value in parameters.items()}


# -- tensors --------------------------------------------------------------------------


def _bad(message: str) -> ServeError:
    return ServeError(ErrorKind.BAD_INPUT, message)


def _typed_input(tensor: ModelInferRequestInferInputTensor, parameters: Parameters) -> Tensor:
    where = f"input {tensor.name!r}: "
    info = lookup_datatype(tensor.datatype, context=where)
    contents = tensor.contents
    if info.contents_field is None:
        raise _bad(f"{where}{info.name} data can only be sent in raw_input_contents")
    others = (
        [name for name in CONTENTS_FIELDS if getattr(contents, name)]
        if contents is not None
        else []
    )
    if [name for name in others if name != info.contents_field]:
        raise _bad(
            f"{where}{info.name} data belongs in contents.{info.contents_field}, "
            f"not in contents.{', contents.'.join(n for n in others if n != info.contents_field)}"
        )
    values = [] if contents is None else list(getattr(contents, info.contents_field))
    return Tensor.from_values(
        tensor.name, tensor.datatype, tensor.shape, values, parameters, role="input"
    )


def request_inputs(message: ModelInferRequest) -> list[Tensor]:
    """The input tensors of a ``ModelInferRequest``, checked (``ServeError(BAD_INPUT)``)."""
    raw = message.raw_input_contents
    if raw and len(raw) != len(message.inputs):
        raise _bad(
            f"raw_input_contents holds {len(raw)} blobs but the request has "
            f"{len(message.inputs)} inputs: one blob per input, in order"
        )
    seen: set[str] = set()
    inputs = []
    for index, tensor in enumerate(message.inputs):
        if tensor.name in seen:
            raise _bad(f"input {tensor.name!r} is given more than once")
        seen.add(tensor.name)
        parameters = parameters_of(tensor.parameters)
        if raw:
            contents = tensor.contents
            if contents is not None and any(getattr(contents, n) for n in CONTENTS_FIELDS):
                raise _bad(
                    f"input {tensor.name!r}: contents and raw_input_contents cannot both "
                    "be used in one request"
                )
            inputs.append(
                Tensor.from_raw(
                    tensor.name,
                    tensor.datatype,
                    tensor.shape,
                    raw[index],
                    parameters,
                    role="input",
                )
            )
        else:
            inputs.append(_typed_input(tensor, parameters))
    return inputs


def requested_outputs(message: ModelInferRequest) -> list[RequestedOutput]:
    return [
        RequestedOutput(output.name, parameters_of(output.parameters)) for output in message.outputs
    ]


def infer_response(
    model: ModelVersion,
    message: ModelInferRequest,
    outputs: Sequence[Tensor],
    requested: Sequence[RequestedOutput],
) -> ModelInferResponse:
    """The answer to ``message``: the chosen outputs, their data in ``raw_output_contents``."""
    chosen = [tensor for tensor, _binary in select_outputs(outputs, requested, True)]
    return ModelInferResponse(
        model_name=model.name,
        model_version=model.version,
        id=message.id,
        outputs=[
            ModelInferResponseInferOutputTensor(
                name=tensor.name,
                datatype=tensor.datatype,
                shape=list(tensor.shape),
                parameters=infer_parameters(tensor.parameters),
            )
            for tensor in chosen
        ],
        raw_output_contents=[bytes(tensor.raw) for tensor in chosen],
    )


def _tensor_metadata(meta: TensorMeta) -> ModelMetadataResponseTensorMetadata:
    return ModelMetadataResponseTensorMetadata(
        name=meta.name, datatype=meta.datatype, shape=list(meta.shape)
    )


def oip_error(error: ServeError) -> ServeError:
    """``error`` as an OIP client must see it: a handler's exception is INTERNAL, not
    TorchServe's UNAVAILABLE "Prediction failed" (which tells a client to retry)."""
    if oip.is_handler_exception(error):
        return ServeError(ErrorKind.HANDLER_FAILED, error.message, reason=error.reason)
    return error


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


class OipRpcs:
    """``inference.GRPCInferenceService`` with MLServer's ModelStreamInfer messages."""

    key_kind = KeyKind.INFERENCE
    base: ClassVar[type[Any]] = GrpcInferenceServiceBase
    stream_shape: ClassVar[str] = "mlserver"

    def __init__(self, dataplane: Dataplane) -> None:
        self._dataplane = dataplane

    def methods(self) -> dict[str, Method]:
        return {
            "ServerLive": Unary(self.server_live),
            "ServerReady": Unary(self.server_ready),
            "ModelReady": Unary(self.model_ready),
            "ServerMetadata": Unary(self.server_metadata),
            "ModelMetadata": Unary(self.model_metadata),
            "ModelInfer": Unary(self.model_infer),
            "ModelStreamInfer": BidiStreaming(self.model_stream_infer),
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
            inputs=[_tensor_metadata(t) for t in meta.inputs],
            outputs=[_tensor_metadata(t) for t in meta.outputs],
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

    async def model_stream_infer(
        self,
        receive: Receive[ModelInferRequest],
        context: RpcContext,
        send: Send[Any],
    ) -> None:
        """Requests are submitted as they arrive and answered strictly in their order, one
        message per reply. When the client half-closes, every request already read is still
        answered before OK."""

        async def answer(pending: _Pending) -> None:
            try:
                await self._answer(pending, send)
            except ClientGone:
                raise
            except ServeError as error:
                await self._failed(oip_error(error), send)

        await answer_in_order(
            receive,
            lambda message: self._accept(message, context),
            answer,
            lambda pending: pending.call,
        )

    # -- helpers ------------------------------------------------------------------------

    def _accept(self, message: ModelInferRequest, context: RpcContext) -> _Pending:
        """Check and submit one request; a failure is kept for its turn to be answered."""
        pending = _Pending(message)
        try:
            model = self._dataplane.model(message.model_name, message.model_version or None)
            inputs = request_inputs(message)
            pending.requested = requested_outputs(message)
            pending.model = model
            pending.call = oip.submit(self._dataplane, model, inputs, deadline=context.deadline)
        except ServeError as error:
            pending.error = error
        return pending

    async def _answer(self, pending: _Pending, send: Send[Any]) -> None:
        if pending.error is not None:
            raise pending.error
        assert pending.call is not None and pending.model is not None
        async for reply, _final in pending.call.replies():
            response = infer_response(
                pending.model, pending.message, oip.outputs_of(reply), pending.requested or []
            )
            await send(self._wrap(response))

    def _wrap(self, response: ModelInferResponse) -> Any:
        return response

    async def _failed(self, error: ServeError, send: Send[Any]) -> None:
        """MLServer's shape: an error ends the stream with its status."""
        raise error


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


def oip_service(dataplane: Dataplane, stream_shape: str = "mlserver") -> OipRpcs:
    """The service, with ModelStreamInfer in the given shape (``mlserver`` or ``triton``)."""
    if stream_shape not in STREAM_SHAPES:
        raise ValueError(f"unknown ModelStreamInfer shape {stream_shape!r}")
    if stream_shape == "triton":
        return TritonStreamOipRpcs(dataplane)
    return OipRpcs(dataplane)


__all__ = [
    "OipRpcs",
    "TritonStreamOipRpcs",
    "infer_response",
    "oip_service",
    "request_inputs",
]
