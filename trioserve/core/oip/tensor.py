"""The :class:`Tensor` value type: one named OIP tensor, checked on construction.

A tensor always holds its binary form (little-endian, row-major, BYTES elements
length-prefixed), validated against its datatype and shape. One built from element values
(:meth:`Tensor.from_values`: JSON ``data`` or typed gRPC contents) also keeps the flat
element list, so :meth:`Tensor.to_list` and :meth:`Tensor.to_json` need no decoding; one
built from bytes (:meth:`Tensor.from_raw`: REST binary extension, gRPC raw contents)
keeps a view of the caller's buffer, not a copy, and decodes only when asked.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from trioserve.core.errors import ErrorKind, ServeError, quote
from trioserve.core.limits import shape_elements
from trioserve.core.oip.datatypes import Datatype, lookup_datatype
from trioserve.core.oip.elements import encode_elements, flatten
from trioserve.core.oip.packing import Buffer, byte_view, count_bytes_elements, unpack

ParamValue = str | int | float | bool
Parameters = dict[str, ParamValue]

MAX_DIMENSION = 2**63 - 1  # shapes are int64 on the gRPC wire
# The most dimensions a shape may have: numpy's own limit (NPY_MAXDIMS, 64 since numpy 2.0).
MAX_DIMS = 64


class Tensor:
    """One named tensor: ``name``, ``datatype`` (wire name, e.g. ``"FP32"``), ``shape``
    (a tuple of ints >= 0), ``parameters`` and its data.

    Build one with :meth:`from_values` or :meth:`from_raw`; both raise
    ``ServeError(BAD_INPUT)`` with a message for the client when something does not fit.
    ``role`` (``"input"``, ``"output"``, default ``"tensor"``) only words the messages:
    ``input 'x': shape [2] needs 2 elements but data has 3``. Treat a tensor as immutable.
    """

    __slots__ = ("_raw", "_values", "datatype", "datatype_info", "name", "parameters", "shape")

    name: str
    datatype: str
    datatype_info: Datatype
    shape: tuple[int, ...]
    parameters: Parameters

    def __init__(
        self,
        name: str,
        info: Datatype,
        shape: tuple[int, ...],
        parameters: Mapping[str, ParamValue] | None,
        raw: memoryview,
        values: list[Any] | None,
    ) -> None:
        """Internal: use :meth:`from_values` or :meth:`from_raw`, which check the data."""
        self.name = name
        self.datatype = info.name
        self.datatype_info = info
        self.shape = shape
        self.parameters = dict(parameters) if parameters else {}
        self._raw = raw
        self._values = values

    @classmethod
    def from_values(
        cls,
        name: str,
        datatype: str,
        shape: Sequence[int],
        data: Any,
        parameters: Mapping[str, ParamValue] | None = None,
        *,
        role: str = "tensor",
    ) -> Tensor:
        """A tensor from element values: JSON ``data`` (nested in the natural shape, or
        flat) or a flat list from typed gRPC contents. The element count must be the
        product of ``shape``; see ``elements.py`` for each datatype's element rules."""
        where = f"{role} {quote(name)}: "
        info = lookup_datatype(datatype, context=where)
        dims = check_shape(shape, where)
        flat, kinds = flatten(data)
        count = shape_elements(dims)
        if len(flat) != count:
            raise ServeError(
                ErrorKind.BAD_INPUT,
                f"{where}shape {list(dims)} needs {count} elements but data has {len(flat)}",
            )
        values, raw = encode_elements(info, flat, kinds, where)
        return cls(name, info, dims, parameters, memoryview(raw), values)

    @classmethod
    def from_raw(
        cls,
        name: str,
        datatype: str,
        shape: Sequence[int],
        raw: Buffer,
        parameters: Mapping[str, ParamValue] | None = None,
        *,
        role: str = "tensor",
    ) -> Tensor:
        """A tensor from its binary form. The size must be ``prod(shape) * itemsize``;
        BYTES data must hold exactly ``prod(shape)`` length-prefixed elements and nothing
        after them. ``raw`` is kept as a view, not copied: do not change it afterwards."""
        where = f"{role} {quote(name)}: "
        info = lookup_datatype(datatype, context=where)
        dims = check_shape(shape, where)
        count = shape_elements(dims)
        view = byte_view(raw)
        if info.itemsize is None:
            try:
                found = count_bytes_elements(view)
            except ValueError as exc:
                raise ServeError(
                    ErrorKind.BAD_INPUT, f"{where}malformed BYTES data: {exc}"
                ) from None
            if found != count:
                raise ServeError(
                    ErrorKind.BAD_INPUT,
                    f"{where}shape {list(dims)} needs {count} BYTES elements "
                    f"but the data holds {found}",
                )
        elif len(view) != count * info.itemsize:
            raise ServeError(
                ErrorKind.BAD_INPUT,
                f"{where}shape {list(dims)} of {info.name} needs {count * info.itemsize} "
                f"bytes ({count} elements of {info.itemsize}) but the data has {len(view)} bytes",
            )
        return cls(name, info, dims, parameters, view, None)

    @property
    def element_count(self) -> int:
        return math.prod(self.shape)

    @property
    def raw(self) -> memoryview:
        """The binary form: little-endian, row-major, BYTES elements length-prefixed."""
        return self._raw

    @property
    def nbytes(self) -> int:
        return len(self._raw)

    def to_list(self) -> list[Any]:
        """The elements as a new flat list of Python values: ``bool``, ``int``, ``float``
        (FP16 and BF16 too), ``bytes`` for BYTES. Values given to :meth:`from_values` come
        back as given (integers as ``int``; FP values as ``float``, not re-rounded to the
        datatype's precision: the binary form is)."""
        if self._values is None:
            return unpack(self.datatype_info, self._raw)
        if self.datatype == "BYTES":
            return [v.encode() if isinstance(v, str) else bytes(v) for v in self._values]
        return list(self._values)

    def to_json(self, *, role: str = "output") -> list[Any]:
        """The elements as a flat list of JSON values. BYTES elements become strings; one
        that is not valid UTF-8 has no JSON form, so this raises ``ServeError(BAD_INPUT)``
        telling the client to ask for the tensor as binary data (no base64 guessing)."""
        if self.datatype != "BYTES":
            return self.to_list()
        source = self._values if self._values is not None else unpack(self.datatype_info, self._raw)
        try:
            return [value if type(value) is str else value.decode() for value in source]
        except UnicodeDecodeError:
            index = next(i for i, value in enumerate(source) if not _utf8(value))
            raise ServeError(
                ErrorKind.BAD_INPUT,
                f"{role} {quote(self.name)}: BYTES element {index} is not valid UTF-8, so it "
                "has no JSON form; request this output as binary data "
                "(parameters.binary_data: true)",
            ) from None

    def __eq__(self, other: object) -> bool:
        """Same name, datatype, shape, parameters and binary form."""
        if not isinstance(other, Tensor):
            return NotImplemented
        return (
            self.name == other.name
            and self.datatype == other.datatype
            and self.shape == other.shape
            and self.parameters == other.parameters
            and self._raw == other._raw
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"Tensor(name={self.name!r}, datatype={self.datatype!r}, shape={self.shape!r}, "
            f"nbytes={self.nbytes})"
        )


def _utf8(value: str | bytes | bytearray) -> bool:
    if isinstance(value, str):
        return True
    try:
        value.decode()
    except UnicodeDecodeError:
        return False
    return True


def check_shape(shape: Sequence[int], where: str = "") -> tuple[int, ...]:
    """``shape`` as a tuple, if every dimension is an int from 0 to 2**63 - 1 (-1, a
    variable dimension, is for metadata, not for a tensor with data)."""
    if isinstance(shape, str | bytes) or not isinstance(shape, Sequence):
        raise ServeError(ErrorKind.BAD_INPUT, f"{where}shape must be an array of integers")
    if len(shape) > MAX_DIMS:
        raise ServeError(
            ErrorKind.BAD_INPUT,
            f"{where}shape has {len(shape)} dimensions; at most {MAX_DIMS} are allowed",
        )
    for dim in shape:
        if type(dim) is not int:
            raise ServeError(
                ErrorKind.BAD_INPUT,
                f"{where}shape {quote(shape)} has a dimension that is not an integer",
            )
        if dim < 0:
            raise ServeError(
                ErrorKind.BAD_INPUT,
                f"{where}shape {list(shape)} has a negative dimension ({dim}); a tensor with "
                "data needs concrete sizes (-1 is only for model metadata)",
            )
        if dim > MAX_DIMENSION:
            raise ServeError(
                ErrorKind.BAD_INPUT, f"{where}shape {list(shape)} has a dimension over 2**63 - 1"
            )
    return tuple(shape)
