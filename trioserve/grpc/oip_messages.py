"""Messages of ``inference.GRPCInferenceService`` to and from the protocol-neutral OIP
values: ``InferParameter`` maps to plain parameters, ``ModelInferRequest`` inputs (typed
``*_contents`` or ``raw_input_contents``) to :class:`~trioserve.core.oip.Tensor` values, and
output tensors to a ``ModelInferResponse`` answered in ``raw_output_contents``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from trioserve._proto.inference import (
    InferParameter,
    ModelInferRequest,
    ModelInferRequestInferInputTensor,
    ModelInferResponse,
    ModelInferResponseInferOutputTensor,
    ModelMetadataResponseTensorMetadata,
)
from trioserve.core.errors import ErrorKind, ServeError, quote
from trioserve.core.limits import (
    DEFAULT_LIMITS,
    RequestLimits,
    check_elements,
    check_inputs,
    check_outputs,
    declared_elements,
)
from trioserve.core.oip.datatypes import lookup_datatype
from trioserve.core.oip.raw import TensorMeta
from trioserve.core.oip.request import RequestedOutput
from trioserve.core.oip.response import select_outputs
from trioserve.core.oip.tensor import Parameters, ParamValue, Tensor
from trioserve.runtime import oip
from trioserve.runtime.model import ModelVersion

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


def parameters_of(parameters: Mapping[str, InferParameter | None]) -> Parameters:
    """A message's ``parameters`` map as plain values (entries holding nothing dropped).

    A map entry on the wire without its value field (``{1: key}``, valid protobuf: the value
    is the default message) reaches here as ``None`` from betterproto2: it holds nothing."""
    found: Parameters = {}
    for key, parameter in parameters.items():
        if parameter is None:
            continue
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
    where = f"input {quote(tensor.name)}: "
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


def request_inputs(
    message: ModelInferRequest, limits: RequestLimits = DEFAULT_LIMITS
) -> list[Tensor]:
    """The input tensors of a ``ModelInferRequest``, checked (``ServeError(BAD_INPUT)``;
    ``ServeError(TOO_LARGE)``, before any tensor is built, beyond ``limits``)."""
    check_inputs(len(message.inputs), limits)
    check_elements(declared_elements(tensor.shape for tensor in message.inputs), limits)
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
            raise _bad(f"input {quote(tensor.name)} is given more than once")
        seen.add(tensor.name)
        parameters = parameters_of(tensor.parameters)
        if raw:
            contents = tensor.contents
            if contents is not None and any(getattr(contents, n) for n in CONTENTS_FIELDS):
                raise _bad(
                    f"input {quote(tensor.name)}: contents and raw_input_contents cannot both "
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


def requested_outputs(
    message: ModelInferRequest, limits: RequestLimits = DEFAULT_LIMITS
) -> list[RequestedOutput]:
    check_outputs(len(message.outputs), limits)
    return [
        RequestedOutput(output.name, parameters_of(output.parameters)) for output in message.outputs
    ]


def infer_response(
    model: ModelVersion,
    message: ModelInferRequest,
    outputs: Sequence[Tensor],
    requested: Sequence[RequestedOutput],
    response_id: str | None = None,
) -> ModelInferResponse:
    """The answer to ``message``: the chosen outputs, their data in ``raw_output_contents``;
    its id is ``response_id`` when given, else the request's."""
    chosen = [tensor for tensor, _binary in select_outputs(outputs, requested, True)]
    return ModelInferResponse(
        model_name=model.name,
        model_version=model.version,
        id=response_id or message.id,
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


def tensor_metadata(meta: TensorMeta) -> ModelMetadataResponseTensorMetadata:
    return ModelMetadataResponseTensorMetadata(
        name=meta.name, datatype=meta.datatype, shape=list(meta.shape)
    )


def oip_error(error: ServeError) -> ServeError:
    """``error`` as an OIP client must see it: a handler's exception is INTERNAL, not
    TorchServe's UNAVAILABLE "Prediction failed" (which tells a client to retry)."""
    if oip.is_handler_exception(error):
        return ServeError(ErrorKind.HANDLER_FAILED, error.message, reason=error.reason)
    return error


__all__ = [
    "infer_parameter",
    "infer_parameters",
    "infer_response",
    "oip_error",
    "parameter_value",
    "parameters_of",
    "request_inputs",
    "requested_outputs",
    "tensor_metadata",
]
