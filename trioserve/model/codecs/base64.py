"""``Base64Codec`` ("base64"): a BYTES tensor of base64 text as a list of raw bytes."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from ..types import Datatype, Parameters, RequestInput, ResponseOutput, TensorData
from .base import InputCodec, register_input_codec
from .lists import as_list, is_list_of

__all__ = ["Base64Codec"]

_ENCODING = "ascii"


def _as_bytes(elem: bytes | str) -> bytes:
    return elem.encode(_ENCODING) if isinstance(elem, str) else elem


def _encode(elem: bytes | str, use_bytes: bool) -> bytes | str:
    encoded = base64.b64encode(_as_bytes(elem))
    return encoded if use_bytes else encoded.decode(_ENCODING)


def _decode(elem: bytes | str) -> bytes:
    raw = _as_bytes(elem)
    try:
        return base64.b64decode(raw, validate=True)
    except binascii.Error:
        # Not base64: taken as the raw bytes themselves.
        return raw


@register_input_codec
class Base64Codec(InputCodec):
    """Encodes a list of bytes as ``[N, 1]`` base64 elements; decoding undoes it."""

    ContentType = "base64"
    TypeHint = list[bytes]

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return is_list_of(payload, bytes)

    @classmethod
    def encode_output(
        cls, name: str, payload: Any, use_bytes: bool = True, **kwargs: Any
    ) -> ResponseOutput:
        return ResponseOutput(
            name=name,
            datatype=Datatype.BYTES,
            shape=[len(payload), 1],
            data=TensorData([_encode(e, use_bytes) for e in payload]),
            parameters=Parameters(content_type=cls.ContentType),
        )

    @classmethod
    def decode_output(cls, response_output: ResponseOutput) -> list[bytes]:
        return [_decode(e) for e in as_list(response_output.data.root)]

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
            parameters=Parameters(content_type=cls.ContentType),
        )

    @classmethod
    def decode_input(cls, request_input: RequestInput) -> list[bytes]:
        return [_decode(e) for e in as_list(request_input.data.root)]
