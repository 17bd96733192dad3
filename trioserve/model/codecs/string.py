"""``StringCodec`` ("str"): a BYTES tensor as a list of UTF-8 strings."""

from __future__ import annotations

from typing import Any

from ..types import Datatype, Parameters, RequestInput, ResponseOutput, TensorData
from .base import InputCodec, register_input_codec, register_request_codec
from .lists import as_list, is_list_of
from .utils import InputOrOutput, SingleInputRequestCodec

__all__ = ["StringCodec", "StringRequestCodec", "decode_str", "encode_str"]

_ENCODING = "utf-8"


def encode_str(elem: str) -> bytes:
    return elem.encode(_ENCODING)


def decode_str(encoded: Any, str_codec: str = _ENCODING) -> str | None:
    """bytes are decoded, str kept (JSON gives str), None kept; anything else is ``""``."""
    if encoded is None:
        return None
    if isinstance(encoded, bytes):
        return encoded.decode(str_codec)
    if isinstance(encoded, str):
        return encoded
    return ""


def _decode(input_or_output: InputOrOutput) -> list[str]:
    return [decode_str(e) for e in as_list(input_or_output.data.root)]  # type: ignore[misc]


@register_input_codec
class StringCodec(InputCodec):
    """Encodes a list of strings as a ``[N, 1]`` BYTES tensor (bytes unless use_bytes=False)."""

    ContentType = "str"
    TypeHint = list[str]

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return is_list_of(payload, str)

    @classmethod
    def encode_output(
        cls, name: str, payload: Any, use_bytes: bool = True, **kwargs: Any
    ) -> ResponseOutput:
        packed = [encode_str(s) for s in payload] if use_bytes else list(payload)
        return ResponseOutput(
            name=name,
            datatype=Datatype.BYTES,
            shape=[len(payload), 1],
            data=TensorData(packed),
            parameters=Parameters(content_type=cls.ContentType),
        )

    @classmethod
    def decode_output(cls, response_output: ResponseOutput) -> list[str]:
        return _decode(response_output)

    @classmethod
    def decode_input(cls, request_input: RequestInput) -> list[str]:
        return _decode(request_input)

    @classmethod
    def encode_input(
        cls, name: str, payload: Any, use_bytes: bool = True, **kwargs: Any
    ) -> RequestInput:
        output = cls.encode_output(name, payload, use_bytes)
        return RequestInput(
            name=output.name,
            datatype=output.datatype,
            shape=output.shape,
            data=output.data,
            parameters=output.parameters,
        )


@register_request_codec
class StringRequestCodec(SingleInputRequestCodec):
    """Decodes a request's single input (a response's single output) as a list of strings."""

    InputCodec = StringCodec
    ContentType = StringCodec.ContentType
    TypeHint = list[str]
