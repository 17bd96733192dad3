"""The Open Inference Protocol's tensor datatypes, as one table.

Each :class:`Datatype` says how an element travels: its size in the binary forms (REST
binary extension, gRPC ``raw_*_contents``), its little-endian ``struct`` format, the Python
type of an element in JSON ``data``, and the ``InferTensorContents`` field that carries it
in typed gRPC contents (none for FP16 and BF16: they travel raw only).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from trioserve.core.errors import ErrorKind, ServeError, quote


@dataclass(frozen=True, slots=True)
class Datatype:
    """One OIP datatype.

    ``itemsize`` is the element's size in bytes in the binary forms; ``None`` for BYTES,
    whose elements are each a uint32 little-endian length and then that many bytes.
    ``struct_format`` is the element's little-endian :mod:`struct` format (``"<f"``);
    ``None`` for BF16 (no struct code: packed through float32, see ``halfs.py``) and BYTES.
    ``json_type`` is the Python type of an element in JSON ``data`` (``bool``, ``int``,
    ``float`` or ``str``). ``contents_field`` names the gRPC ``InferTensorContents`` field,
    ``None`` for FP16 and BF16. ``int_range`` is the inclusive (min, max) of an integer
    datatype, ``None`` for the others.
    """

    name: str
    itemsize: int | None
    struct_format: str | None
    json_type: type
    contents_field: str | None
    int_range: tuple[int, int] | None = None

    @property
    def is_integer(self) -> bool:
        return self.int_range is not None

    @property
    def is_float(self) -> bool:
        return self.json_type is float

    @property
    def struct_code(self) -> str | None:
        """The one-letter struct code (``"f"``), without the byte-order prefix."""
        return None if self.struct_format is None else self.struct_format[1:]


def _uint(bits: int) -> tuple[int, int]:
    return (0, 2**bits - 1)


def _int(bits: int) -> tuple[int, int]:
    return (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


_TABLE = (
    Datatype("BOOL", 1, "<?", bool, "bool_contents"),
    Datatype("UINT8", 1, "<B", int, "uint_contents", _uint(8)),
    Datatype("UINT16", 2, "<H", int, "uint_contents", _uint(16)),
    Datatype("UINT32", 4, "<I", int, "uint_contents", _uint(32)),
    Datatype("UINT64", 8, "<Q", int, "uint64_contents", _uint(64)),
    Datatype("INT8", 1, "<b", int, "int_contents", _int(8)),
    Datatype("INT16", 2, "<h", int, "int_contents", _int(16)),
    Datatype("INT32", 4, "<i", int, "int_contents", _int(32)),
    Datatype("INT64", 8, "<q", int, "int64_contents", _int(64)),
    Datatype("FP16", 2, "<e", float, None),
    Datatype("FP32", 4, "<f", float, "fp32_contents"),
    Datatype("FP64", 8, "<d", float, "fp64_contents"),
    Datatype("BF16", 2, None, float, None),
    Datatype("BYTES", None, None, str, "bytes_contents"),
)

#: Every datatype by its wire name, in the order of the OIP's table.
DATATYPES: Mapping[str, Datatype] = MappingProxyType({dt.name: dt for dt in _TABLE})


def lookup_datatype(name: str, *, context: str = "") -> Datatype:
    """The datatype named ``name`` (case-sensitive, as on the wire).

    Raises ``ServeError(BAD_INPUT)`` naming it and listing the valid names; ``context``
    (such as ``"input 'x': "``) starts the message.
    """
    found = DATATYPES.get(name)
    if found is None:
        raise ServeError(
            ErrorKind.BAD_INPUT,
            f"{context}unknown datatype {quote(name)}; valid datatypes: {', '.join(DATATYPES)}",
        )
    return found
