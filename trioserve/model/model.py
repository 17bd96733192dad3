"""``MLModel``: the base class of an MLServer inference runtime."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from .codecs import (
    InputCodecLike,
    RequestCodecLike,
    decode_inference_request,
    decode_request_input,
    encode_inference_response,
    encode_response_output,
    get_decoded,
    has_decoded,
)
from .codecs.errors import CodecNotFound
from .settings import ModelSettings
from .types import (
    InferenceRequest,
    InferenceResponse,
    MetadataModelResponse,
    MetadataTensor,
    Parameters,
    RequestInput,
    RequestOutput,
    ResponseOutput,
)

__all__ = ["MLModel"]


def _index(tensors: list[MetadataTensor] | None) -> dict[str, MetadataTensor]:
    return {tensor.name: tensor for tensor in tensors or []}


class MLModel:
    """An inference runtime: override ``load`` and ``predict`` (and ``predict_stream``)."""

    def __init__(self, settings: ModelSettings) -> None:
        self._settings = settings
        self._inputs_index = _index(settings.inputs)
        self._outputs_index = _index(settings.outputs)
        self.ready = False

    async def load(self) -> bool:
        """Load the model's artefacts; the result is the model's readiness."""
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        """Run one inference request."""
        raise NotImplementedError("predict() method not implemented")

    async def predict_stream(
        self, payloads: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        """Stream responses for a stream of requests; by default, ``predict`` of the first."""
        yield await self.predict(await payloads.__anext__())

    async def unload(self) -> bool:
        """Free the model's resources; the result says whether it is now unloaded."""
        return True

    @property
    def name(self) -> str:
        return self._settings.name

    @property
    def version(self) -> str | None:
        return self._settings.version

    @property
    def settings(self) -> ModelSettings:
        return self._settings

    @property
    def inputs(self) -> list[MetadataTensor] | None:
        """The inputs' metadata (settable, e.g. at load time)."""
        return self._settings.inputs

    @inputs.setter
    def inputs(self, value: list[MetadataTensor]) -> None:
        self._settings.inputs = value
        self._inputs_index = _index(value)

    @property
    def outputs(self) -> list[MetadataTensor] | None:
        """The outputs' metadata (settable, e.g. at load time)."""
        return self._settings.outputs

    @outputs.setter
    def outputs(self, value: list[MetadataTensor]) -> None:
        self._settings.outputs = value
        self._outputs_index = _index(value)

    def decode(
        self, request_input: RequestInput, default_codec: InputCodecLike | None = None
    ) -> Any:
        """An input as a Python value: by its content type (or its metadata's), else by
        ``default_codec``, else its raw data."""
        decode_request_input(request_input, self._inputs_index)
        if has_decoded(request_input):
            return get_decoded(request_input)
        if default_codec:
            return default_codec.decode_input(request_input)
        return request_input.data

    def decode_request(
        self, inference_request: InferenceRequest, default_codec: RequestCodecLike | None = None
    ) -> Any:
        """A request as a Python value: by its content type (or the model's), else by
        ``default_codec``, else the request itself."""
        decode_inference_request(inference_request, self._settings, self._inputs_index)
        if has_decoded(inference_request):
            return get_decoded(inference_request)
        if default_codec:
            return default_codec.decode_request(inference_request)
        return inference_request

    def encode_response(
        self, payload: Any, default_codec: RequestCodecLike | None = None
    ) -> InferenceResponse:
        """A Python value as a response, by a request codec that can encode it."""
        response = encode_inference_response(payload, self._settings)
        if response:
            return response
        if default_codec:
            return default_codec.encode_response(self.name, payload, self.version)
        raise CodecNotFound(payload_type=str(type(payload)), is_input=False, is_request=True)

    def encode(
        self,
        payload: Any,
        request_output: RequestOutput,
        default_codec: InputCodecLike | None = None,
    ) -> ResponseOutput:
        """A Python value as a response output: by the output's content type (or its
        metadata's), else by the payload's type, else by ``default_codec``."""
        output = encode_response_output(payload, request_output, self._outputs_index)
        if output:
            return output
        if default_codec:
            return default_codec.encode_output(request_output.name, payload)
        raise CodecNotFound(name=request_output.name, is_input=False, is_request=False)

    async def metadata(self) -> MetadataModelResponse:
        metadata = MetadataModelResponse(
            name=self.name,
            platform=self._settings.platform,
            versions=self._settings.versions,
            inputs=self._settings.inputs,
            outputs=self._settings.outputs,
        )
        if self._settings.parameters:
            metadata.parameters = Parameters(content_type=self._settings.parameters.content_type)
        return metadata
