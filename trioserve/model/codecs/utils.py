"""Decoding requests and encoding responses through the registered codecs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Union

from ..types import (
    InferenceRequest,
    InferenceResponse,
    MetadataTensor,
    Parameters,
    RequestInput,
    RequestOutput,
    ResponseOutput,
)
from .base import (
    InputCodecLike,
    RequestCodec,
    RequestCodecLike,
    find_input_codec,
    find_input_codec_by_payload,
    find_request_codec,
    find_request_codec_by_payload,
)
from .errors import CodecError

if TYPE_CHECKING:
    from ..settings import ModelSettings

__all__ = [
    "DecodedParameterName",
    "DefaultInputPrefix",
    "DefaultOutputPrefix",
    "InputOrOutput",
    "SingleInputRequestCodec",
    "decode_inference_request",
    "decode_request_input",
    "encode_inference_response",
    "encode_response_output",
    "get_decoded",
    "get_decoded_or_raw",
    "has_decoded",
    "inject_batch_dimension",
]

DefaultOutputPrefix = "output-"
DefaultInputPrefix = "input-"
# The attribute of ``parameters`` where a decoded value is kept (never serialised).
DecodedParameterName = "_decoded_payload"

InputOrOutput = RequestInput | ResponseOutput
Codec = InputCodecLike | RequestCodecLike
Parametrised = InferenceRequest | RequestInput | RequestOutput | ResponseOutput | InferenceResponse
Tagged = Union[MetadataTensor, "ModelSettings"]


def inject_batch_dimension(shape: list[int]) -> list[int]:
    """A one-dimensional shape ``[N]`` becomes ``[N, 1]``; others are left alone."""
    return shape if len(shape) > 1 else [*shape, 1]


def _content_type(obj: Parametrised, metadata: Tagged | None = None) -> str | None:
    if obj.parameters is not None and obj.parameters.content_type:
        return obj.parameters.content_type
    if metadata is not None and metadata.parameters and metadata.parameters.content_type:
        return metadata.parameters.content_type
    return None


def _save_decoded(obj: Parametrised, decoded: Any) -> None:
    if not obj.parameters:
        obj.parameters = Parameters()
    setattr(obj.parameters, DecodedParameterName, decoded)


def has_decoded(obj: Parametrised) -> bool:
    return bool(obj.parameters) and hasattr(obj.parameters, DecodedParameterName)


def get_decoded(obj: Parametrised) -> Any:
    if has_decoded(obj):
        return getattr(obj.parameters, DecodedParameterName)
    return None


def get_decoded_or_raw(obj: Parametrised) -> Any:
    """The decoded value; else a tensor's ``data``, or the object itself."""
    if has_decoded(obj):
        return get_decoded(obj)
    if isinstance(obj, RequestInput | ResponseOutput):
        return obj.data
    return obj


def encode_response_output(
    payload: Any,
    request_output: RequestOutput,
    metadata_outputs: dict[str, MetadataTensor] | None = None,
) -> ResponseOutput | None:
    """Encode through the output's (or its metadata's) content type, else by payload."""
    metadata = (metadata_outputs or {}).get(request_output.name)
    content_type = _content_type(request_output, metadata)
    codec = find_input_codec(content_type) if content_type else find_input_codec_by_payload(payload)
    if not codec:
        return None
    return codec.encode_output(name=request_output.name, payload=payload)


def encode_inference_response(
    payload: Any, model_settings: ModelSettings
) -> InferenceResponse | None:
    """Encode through the first request codec that can encode ``payload``."""
    codec = find_request_codec_by_payload(payload)
    if not codec:
        return None
    version = model_settings.parameters.version if model_settings.parameters else None
    return codec.encode_response(model_settings.name, payload, version)


def decode_request_input(
    request_input: RequestInput, metadata_inputs: dict[str, MetadataTensor] | None = None
) -> Any | None:
    """Decode by the input's (or its metadata's) content type, keeping the result on it."""
    content_type = _content_type(request_input, (metadata_inputs or {}).get(request_input.name))
    if content_type is None:
        return None
    codec = find_input_codec(content_type)
    if codec is None:
        return None
    decoded = codec.decode_input(request_input)
    _save_decoded(request_input, decoded)
    return decoded


def decode_inference_request(
    inference_request: InferenceRequest,
    model_settings: ModelSettings | None = None,
    metadata_inputs: dict[str, MetadataTensor] | None = None,
) -> Any | None:
    """Decode each input, then the whole request when a request codec applies.

    Returns the decoded request, or the request itself when no request codec applies.
    """
    for request_input in inference_request.inputs:
        decode_request_input(request_input, metadata_inputs)
    content_type = _content_type(inference_request, model_settings)
    if content_type is not None:
        codec = find_request_codec(content_type)
        if codec is not None:
            decoded = codec.decode_request(inference_request)
            _save_decoded(inference_request, decoded)
            return decoded
    return inference_request


class SingleInputRequestCodec(RequestCodec):
    """A request codec that is its one input (output) tensor, through ``InputCodec``."""

    InputCodec: InputCodecLike | None = None

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return cls.InputCodec is not None and cls.InputCodec.can_encode(payload)

    @classmethod
    def _input_codec(cls) -> InputCodecLike:
        if cls.InputCodec is None:
            raise NotImplementedError(f"No input codec found for {type(cls)} request codec")
        return cls.InputCodec

    @classmethod
    def encode_response(
        cls, model_name: str, payload: Any, model_version: str | None = None, **kwargs: Any
    ) -> InferenceResponse:
        output = cls._input_codec().encode_output(f"{DefaultOutputPrefix}1", payload, **kwargs)
        return InferenceResponse(
            model_name=model_name,
            model_version=model_version,
            parameters=Parameters(content_type=cls.ContentType),
            outputs=[output],
        )

    @classmethod
    def decode_response(cls, response: InferenceResponse) -> Any:
        if len(response.outputs) != 1:
            raise CodecError(
                f"The '{cls.ContentType}' codec only supports a single output tensor "
                f"({len(response.outputs)} were received)"
            )
        first = response.outputs[0]
        if not has_decoded(first) and cls.InputCodec is not None:
            _save_decoded(first, cls.InputCodec.decode_output(first))
        return get_decoded_or_raw(first)

    @classmethod
    def encode_request(cls, payload: Any, **kwargs: Any) -> InferenceRequest:
        inp = cls._input_codec().encode_input(f"{DefaultInputPrefix}1", payload, **kwargs)
        return InferenceRequest(inputs=[inp], parameters=Parameters(content_type=cls.ContentType))

    @classmethod
    def decode_request(cls, request: InferenceRequest) -> Any:
        if len(request.inputs) != 1:
            raise CodecError(
                f"The '{cls.ContentType}' codec only supports a single input tensor "
                f"({len(request.inputs)} were received)"
            )
        first = request.inputs[0]
        if not has_decoded(first) and cls.InputCodec is not None:
            _save_decoded(first, cls.InputCodec.decode_input(first))
        return get_decoded_or_raw(first)
