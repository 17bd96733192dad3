"""Typed tensor inputs a model declares for batching (sans-IO).

A model's ``model-config.yaml`` may declare, as a trioserve extension, the raw inputs that
the server should collate into one tensor per batch::

    tensorInputs:
      body: {dtype: float32, shape: [256]}      # each request: 256 floats -> batch [N, 256]
      tokens: {dtype: int64, shape: [-1, 8]}    # ragged first dim -> [N, max_len, 8] + lengths

Each request's input of that name is then its raw bytes (row-major, little-endian), checked
when the request arrives; the worker's handler finds the batch as a zero-copy tensor
(``context.get_batch_tensor(name)``) beside the usual per-request ``data``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ITEMSIZE = {
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "float16": 2,
    "bfloat16": 2,
    "int32": 4,
    "float32": 4,
    "int64": 8,
    "float64": 8,
}


class TensorSpecError(ValueError):
    """A malformed ``tensorInputs`` declaration."""


@dataclass(frozen=True, slots=True)
class TensorInput:
    name: str
    dtype: str
    trailing: tuple[int, ...]  # the dimensions after the first
    first: int | None  # the first dimension; None = varies per request (padded batch)

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def row_bytes(self) -> int:
        return self.itemsize * math.prod(self.trailing)

    def rows(self, nbytes: int) -> int:
        """The first dimension of a request whose input has ``nbytes`` bytes.

        Raises ``ValueError`` with a message for the client when the size does not fit.
        """
        row = self.row_bytes
        if self.first is not None:
            expected = self.first * row
            if nbytes != expected:
                raise ValueError(
                    f"input {self.name!r} must be {expected} bytes ({self.first}x"
                    f"{list(self.trailing)} {self.dtype}), got {nbytes}"
                )
            return self.first
        if row == 0 or nbytes % row:
            raise ValueError(
                f"input {self.name!r} must be a whole number of rows of {row} bytes "
                f"({list(self.trailing)} {self.dtype}), got {nbytes} bytes"
            )
        return nbytes // row

    def to_meta(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": [self.first, *self.trailing]}


def _dim(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TensorSpecError(f"{where}: dimensions must be non-negative integers, got {value!r}")
    return value


def parse_tensor_inputs(raw: object) -> dict[str, TensorInput]:
    """``tensorInputs`` from a model-config mapping (``None`` or absent = none)."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise TensorSpecError("tensorInputs must be a mapping of input name to {dtype, shape}")
    specs: dict[str, TensorInput] = {}
    for name, entry in raw.items():
        where = f"tensorInputs.{name}"
        if not isinstance(name, str) or not name:
            raise TensorSpecError(f"{where}: input names must be non-empty strings")
        if not isinstance(entry, Mapping):
            raise TensorSpecError(f"{where} must be a mapping with dtype and shape")
        dtype = entry.get("dtype")
        if dtype not in ITEMSIZE:
            raise TensorSpecError(
                f"{where}.dtype must be one of {', '.join(sorted(ITEMSIZE))}, got {dtype!r}"
            )
        shape = entry.get("shape")
        if not isinstance(shape, list) or not shape:
            raise TensorSpecError(f"{where}.shape must be a non-empty list of dimensions")
        head = shape[0]
        first = None if head is None or head == -1 else _dim(head, where)
        trailing = tuple(_dim(d, where) for d in shape[1:])
        if first is None and math.prod(trailing) == 0:
            raise TensorSpecError(f"{where}: a variable first dimension needs non-zero rows")
        specs[name] = TensorInput(name, str(dtype), trailing, first)
    return specs
