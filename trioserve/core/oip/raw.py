"""Raw binary requests (``Inference-Header-Content-Length: 0``): the body is one input's
data and nothing else, so the model's declaration of that input supplies its name,
datatype and shape.

Rules (after Triton's): the model must have exactly one input. For a numeric or BOOL
input, at most one dimension may be variable (-1) and it is derived from the body's size;
when the first dimension and one other are variable, the first is taken as a batch of 1.
For a BYTES input, the declared shape (with -1 read as 1) must hold one element, and the
whole body is that element's bytes (no length prefix). The outputs of a raw request are
all answered binary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.oip.datatypes import lookup_datatype
from trioserve.core.oip.packing import Buffer, byte_view, pack_bytes
from trioserve.core.oip.request import HEADER_LENGTH_HEADER, InferRequest
from trioserve.core.oip.tensor import Tensor

_RAW = f"a raw binary request ({HEADER_LENGTH_HEADER}: 0)"


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """A tensor a model declares (as in model metadata): -1 marks a variable dimension."""

    name: str
    datatype: str
    shape: tuple[int, ...]


def raw_request(body: Buffer, inputs: Sequence[TensorMeta]) -> InferRequest:
    """The request a raw binary ``body`` makes for a model whose inputs are ``inputs``.

    Raises ``ServeError(BAD_INPUT)`` when the model does not take raw requests (not one
    input, more than one variable dimension, a BYTES input of more than one element) or
    when the body's size does not fit the input.
    """
    if len(inputs) != 1:
        raise ServeError(
            ErrorKind.BAD_INPUT,
            f"{_RAW} needs a model with exactly one input; this model has {len(inputs)}",
        )
    meta = inputs[0]
    info = lookup_datatype(meta.datatype, context=f"input {meta.name!r}: ")
    view = byte_view(body)
    if info.itemsize is None:
        shape = [1 if dim < 0 else dim for dim in meta.shape]
        if math.prod(shape) != 1:
            raise ServeError(
                ErrorKind.BAD_INPUT,
                f"{_RAW} can fill a BYTES input only when its shape holds one element; "
                f"input {meta.name!r} has shape {list(meta.shape)}",
            )
        data = pack_bytes([bytes(view)])
        tensor = Tensor.from_raw(meta.name, meta.datatype, shape, data, role="input")
    else:
        shape = _concrete_shape(meta, info.itemsize, len(view))
        tensor = Tensor.from_raw(meta.name, meta.datatype, shape, view, role="input")
    return InferRequest([tensor], raw=True)


def _concrete_shape(meta: TensorMeta, itemsize: int, size: int) -> list[int]:
    shape = list(meta.shape)
    variable = [index for index, dim in enumerate(shape) if dim < 0]
    if len(variable) == 2 and variable[0] == 0:
        shape[0] = 1  # a batch of one
        variable = variable[1:]
    if len(variable) > 1:
        raise ServeError(
            ErrorKind.BAD_INPUT,
            f"{_RAW} needs an input with at most one variable dimension; input "
            f"{meta.name!r} has shape {list(meta.shape)}",
        )
    if variable:
        unit = itemsize * math.prod(dim for dim in shape if dim >= 0)
        if unit == 0 or size % unit:
            raise ServeError(
                ErrorKind.BAD_INPUT,
                f"{_RAW}: the body's {size} bytes do not fill input {meta.name!r} of shape "
                f"{list(meta.shape)} ({meta.datatype}) with whole {unit}-byte slices",
            )
        shape[variable[0]] = size // unit
    return shape
