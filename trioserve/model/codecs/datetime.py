"""``DatetimeCodec`` ("datetime"): a BYTES tensor of ISO 8601 text as a list of datetimes."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..types import Datatype, Parameters, RequestInput, ResponseOutput, TensorData
from .base import InputCodec, register_input_codec
from .lists import as_list, is_list_of

__all__ = ["DatetimeCodec"]

_ENCODING = "ascii"


def _encode(elem: str | datetime, use_bytes: bool) -> bytes | str:
    # A string is taken as already ISO-formatted.
    iso = elem if isinstance(elem, str) else elem.isoformat()
    return iso.encode(_ENCODING) if use_bytes else iso


def _decode(elem: bytes | str) -> datetime:
    return datetime.fromisoformat(elem if isinstance(elem, str) else elem.decode(_ENCODING))


@register_input_codec
class DatetimeCodec(InputCodec):
    """Encodes a list of datetimes (or ISO strings) as ``[N, 1]`` ISO 8601 elements."""

    ContentType = "datetime"
    TypeHint = list[str | datetime]

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return is_list_of(payload, datetime)

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
    def decode_output(cls, response_output: ResponseOutput) -> list[datetime]:
        return [_decode(e) for e in as_list(response_output.data.root)]

    @classmethod
    def encode_input(
        cls, name: str, payload: Any, use_bytes: bool = True, **kwargs: Any
    ) -> RequestInput:
        output = cls.encode_output(name, payload, use_bytes=use_bytes)
        return RequestInput(
            name=output.name,
            datatype=output.datatype,
            shape=output.shape,
            data=output.data,
            parameters=Parameters(content_type=cls.ContentType),
        )

    @classmethod
    def decode_input(cls, request_input: RequestInput) -> list[datetime]:
        return [_decode(e) for e in as_list(request_input.data.root)]
