"""The content-type codecs of ``mlserver.codecs``: NumPy arrays, strings, base64, datetimes.

``PandasCodec`` is not provided: importing it raises an ImportError saying so.
"""

from __future__ import annotations

from typing import Any

from .base import (
    InputCodec,
    InputCodecLike,
    RequestCodec,
    RequestCodecLike,
    find_input_codec,
    find_request_codec,
    register_input_codec,
    register_request_codec,
)
from .base64 import Base64Codec
from .datetime import DatetimeCodec
from .decorator import decode_args
from .errors import CodecError, CodecNotFound
from .numpy import NumpyCodec, NumpyRequestCodec
from .string import StringCodec, StringRequestCodec
from .utils import (
    DecodedParameterName,
    decode_inference_request,
    decode_request_input,
    encode_inference_response,
    encode_response_output,
    get_decoded,
    get_decoded_or_raw,
    has_decoded,
)

__all__ = [
    "Base64Codec",
    "CodecError",
    "CodecNotFound",
    "DatetimeCodec",
    "DecodedParameterName",
    "InputCodec",
    "InputCodecLike",
    "NumpyCodec",
    "NumpyRequestCodec",
    "RequestCodec",
    "RequestCodecLike",
    "StringCodec",
    "StringRequestCodec",
    "decode_args",
    "decode_inference_request",
    "decode_request_input",
    "encode_inference_response",
    "encode_response_output",
    "find_input_codec",
    "find_request_codec",
    "get_decoded",
    "get_decoded_or_raw",
    "has_decoded",
    "register_input_codec",
    "register_request_codec",
]

PANDAS_MISSING = (
    "PandasCodec is not provided by trioserve's MLServer API (trioserve.model): it needs "
    "pandas and MLServer's pandas codec. Decode the inputs one by one (NumpyCodec, "
    "StringCodec, ...) or install mlserver itself, which trioserve then uses instead."
)


def __getattr__(name: str) -> Any:
    if name == "PandasCodec":
        raise ImportError(PANDAS_MISSING, name=f"{__name__}.PandasCodec")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
