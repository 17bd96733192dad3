"""``NumpyCodec`` ("np"): a tensor as a NumPy array; ``NumpyRequestCodec``: a request as one.

numpy is not one of trioserve's base dependencies (docs/design.md, "numpy and the model
API"), so this module does not import it: ``np`` is numpy imported on first use, with an
error that says how to install it. ``mlserver.codecs``, and so every MLServer model folder,
loads without numpy; only encoding or decoding an array needs it. ``can_encode`` is false
while numpy has not been imported by anyone (no array can exist before), and
``NumpyCodec.TypeHint`` is ``numpy.ndarray`` where numpy is installed.
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Any

from ..types import Datatype, Parameters, RequestInput, ResponseOutput, TensorData
from .base import InputCodec, register_input_codec, register_request_codec
from .lists import is_list_of
from .string import encode_str
from .utils import InputOrOutput, SingleInputRequestCodec, inject_batch_dimension

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["NUMPY_MISSING", "NumpyCodec", "NumpyRequestCodec", "to_datatype", "to_dtype"]

NUMPY_MISSING = (
    "NumpyCodec (content type 'np') needs numpy, which is not installed here: "
    "pip install numpy (trioserve's 'torch' extra includes it)"
)


class _LazyNumpy:
    """Stands for the numpy module until an attribute is first looked up: then imports it
    and puts it in its place (this module's ``np``)."""

    def __getattr__(self, name: str) -> Any:
        try:
            import numpy
        except ModuleNotFoundError as exc:
            if exc.name != "numpy":
                raise
            raise ModuleNotFoundError(NUMPY_MISSING, name="numpy") from None
        globals()["np"] = numpy
        return getattr(numpy, name)


if not TYPE_CHECKING:
    np = _LazyNumpy()


class _NoNumpy:
    """``NumpyCodec.TypeHint`` where numpy is not installed: no type hint is this class."""


class _NumpyCodecType(type):
    @property
    def TypeHint(cls) -> Any:
        try:
            return np.ndarray
        except ModuleNotFoundError:
            return _NoNumpy


_TO_NUMPY: dict[Datatype, str] = {
    Datatype.BOOL: "bool",
    Datatype.UINT8: "uint8",
    Datatype.UINT16: "uint16",
    Datatype.UINT32: "uint32",
    Datatype.UINT64: "uint64",
    Datatype.INT8: "int8",
    Datatype.INT16: "int16",
    Datatype.INT32: "int32",
    Datatype.INT64: "int64",
    Datatype.FP16: "float16",
    Datatype.FP32: "float32",
    Datatype.FP64: "float64",
    Datatype.BYTES: "bytes",
}
# NumPy has more types than the protocol: strings and objects travel as BYTES.
_FROM_NUMPY: dict[str, Datatype] = {
    **{name: datatype for datatype, name in _TO_NUMPY.items()},
    "object": Datatype.BYTES,
    "S": Datatype.BYTES,
    "U": Datatype.BYTES,
}


def _raw(input_or_output: InputOrOutput) -> Any:
    return getattr(input_or_output.data, "root", input_or_output.data)


def to_dtype(input_or_output: InputOrOutput) -> np.dtype[Any]:
    """The NumPy dtype of a tensor; BYTES is ``str`` for strings, else ``S<last dim>``."""
    datatype = Datatype(input_or_output.datatype)
    name = _TO_NUMPY[datatype]
    if datatype is Datatype.BYTES:
        if is_list_of(_raw(input_or_output), str):
            return np.dtype(str)
        return np.dtype((name, input_or_output.shape[-1]))
    return np.dtype(name)


def to_datatype(dtype: np.dtype[Any]) -> Datatype:
    """The protocol datatype of a NumPy dtype (by name, else by kind)."""
    key = str(dtype)
    if key not in _FROM_NUMPY:
        key = dtype.kind
    return _FROM_NUMPY[key]


def _to_ndarray(input_or_output: InputOrOutput) -> npt.NDArray[Any]:
    data = _raw(input_or_output)
    dtype = to_dtype(input_or_output)
    if Datatype(input_or_output.datatype) is Datatype.BYTES and is_list_of(data, bytes):
        # Each bytes element is a buffer of fixed-size elements; join them all.
        return np.concatenate([np.frombuffer(buffer, dtype) for buffer in data])
    return np.array(data, dtype)


def _nan_to_none(value: Any) -> Any:
    return None if math.isnan(value) else value


def _encode_data(data: npt.NDArray[Any], datatype: Datatype) -> list[Any]:
    if datatype is Datatype.BYTES:
        if np.issubdtype(data.dtype, str):
            return [encode_str(s) for s in data.flatten().tolist()]
        if np.issubdtype(data.dtype, bytes):
            # One buffer for the whole array: much faster than a list of elements.
            return [data.tobytes()]
    flat: list[Any] = data.flatten().tolist()
    if datatype is not Datatype.BYTES and np.isnan(data).any():
        flat = [_nan_to_none(v) for v in flat]
    return flat


@register_input_codec
class NumpyCodec(InputCodec, metaclass=_NumpyCodecType):
    """Decodes an input (output) tensor as a NumPy array of its shape."""

    ContentType = "np"

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        # Without numpy imported no array exists: nothing to import to say so.
        numpy = sys.modules.get("numpy")
        return numpy is not None and isinstance(payload, numpy.ndarray)

    @classmethod
    def encode_output(cls, name: str, payload: Any, **kwargs: Any) -> ResponseOutput:
        datatype = to_datatype(payload.dtype)
        return ResponseOutput(
            name=name,
            datatype=datatype,
            shape=inject_batch_dimension(list(payload.shape)),
            data=TensorData(_encode_data(payload, datatype)),
            parameters=Parameters(content_type=cls.ContentType),
        )

    @classmethod
    def decode_output(cls, response_output: ResponseOutput) -> npt.NDArray[Any]:
        return cls.decode_input(response_output)  # type: ignore[arg-type]

    @classmethod
    def encode_input(cls, name: str, payload: Any, **kwargs: Any) -> RequestInput:
        output = cls.encode_output(name=name, payload=payload)
        return RequestInput(
            name=output.name,
            datatype=output.datatype,
            shape=output.shape,
            data=output.data,
            parameters=Parameters(content_type=cls.ContentType),
        )

    @classmethod
    def decode_input(cls, request_input: RequestInput) -> npt.NDArray[Any]:
        return _to_ndarray(request_input).reshape(request_input.shape)


@register_request_codec
class NumpyRequestCodec(SingleInputRequestCodec):
    """Decodes a request's single input (a response's single output) as a NumPy array."""

    InputCodec = NumpyCodec
    ContentType = NumpyCodec.ContentType
