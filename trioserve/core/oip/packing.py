"""Elements to and from the binary form: little-endian, row-major, no padding.

Numeric datatypes pack with one :func:`struct.pack` call and unpack through :mod:`array`
(byte-swapped on a big-endian host), so neither direction loops over elements in Python.
BOOL is one byte per element (packed 0/1; any non-zero byte reads as true). BYTES elements
are each a uint32 little-endian length and then the bytes.

The functions here trust their arguments' types (the element checks in ``elements.py`` run
first) and raise :mod:`struct`'s own errors; :func:`split_bytes` raises ``ValueError``
with a message for the client.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

from trioserve.core.oip.datatypes import Datatype
from trioserve.core.oip.halfs import decode_bf16, decode_fp16, encode_bf16, encode_fp16

Buffer = bytes | bytearray | memoryview

_BIG_ENDIAN_HOST = sys.byteorder == "big"
_LENGTH = struct.Struct("<I")
MAX_BYTES_ELEMENT = 2**32 - 1


def _array_codes() -> dict[str, str]:
    """struct code -> the array typecode of the same size and signedness on this host."""
    candidates = {
        "b": "b", "B": "B", "h": "h", "H": "H", "i": "il", "I": "IL", "q": "ql", "Q": "QL",
        "f": "f", "d": "d",
    }  # fmt: skip
    codes = {}
    for code, options in candidates.items():
        size = struct.calcsize("<" + code)
        codes[code] = next(option for option in options if array(option).itemsize == size)
    return codes


_ARRAY_CODE = _array_codes()


def pack(datatype: Datatype, values: Sequence[Any]) -> bytes:
    """The binary form of ``values`` (a flat list of elements of ``datatype``).

    BYTES elements may be ``str`` (UTF-8 encoded) or ``bytes``. Raises ``struct.error``,
    ``OverflowError``, ``TypeError`` or ``UnicodeEncodeError`` for values that do not fit.
    """
    name = datatype.name
    if name == "BYTES":
        return pack_bytes(values)
    if name == "BOOL":
        return bytes(values)
    if name == "BF16":
        return encode_bf16(values)
    if name == "FP16":
        return encode_fp16(values)
    assert datatype.struct_format is not None
    return struct.pack(f"<{len(values)}{datatype.struct_format[1:]}", *values)


def unpack(datatype: Datatype, raw: Buffer) -> list[Any]:
    """The flat list of elements in ``raw``, whose length the caller has checked.

    BYTES elements come back as ``bytes``; FP16 and BF16 as ``float``.
    """
    name = datatype.name
    if name == "BYTES":
        return list(split_bytes(raw))
    if name == "BOOL":
        return list(map(bool, bytes(raw)))
    if name == "BF16":
        return decode_bf16(raw)
    if name == "FP16":
        return decode_fp16(raw)
    assert datatype.struct_format is not None
    values = array(_ARRAY_CODE[datatype.struct_format[1:]])
    values.frombytes(raw)
    if _BIG_ENDIAN_HOST:
        values.byteswap()
    return values.tolist()


def byte_view(raw: Buffer) -> memoryview:
    """A flat view of unsigned bytes on ``raw`` (no copy)."""
    view = memoryview(raw)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def pack_bytes(elements: Iterable[bytes | str]) -> bytes:
    """BYTES elements, each as a uint32 little-endian length and then its bytes. A ``str``
    is UTF-8 encoded (``UnicodeEncodeError`` for a lone surrogate); an element longer than
    4 GiB - 1 raises ``OverflowError``.

    The buffer grows in place: ``b"".join`` of a part list holds each part and a 80-byte
    buffer record per part until it is done, ~200 bytes for a 3-byte JSON element ``""``."""
    packed = bytearray()
    for element in elements:
        data = element.encode() if isinstance(element, str) else element
        if len(data) > MAX_BYTES_ELEMENT:
            raise OverflowError(f"a BYTES element of {len(data)} bytes exceeds 4 GiB - 1")
        packed += _LENGTH.pack(len(data))
        packed += data
    return bytes(packed)


def split_bytes(raw: Buffer) -> list[bytes]:
    """The elements of a BYTES buffer. Raises ``ValueError`` (with a message for the
    client) when the buffer ends inside an element or its length prefix."""
    data = byte_view(raw).tobytes()  # slicing bytes is much faster than slicing a view
    size = len(data)
    elements: list[bytes] = []
    append = elements.append
    unpack_from = _LENGTH.unpack_from
    offset = 0
    while offset < size:
        if size - offset < 4:
            raise ValueError(
                f"the data ends inside the length prefix of element {len(elements)} "
                f"({size - offset} of 4 bytes at offset {offset})"
            )
        (length,) = unpack_from(data, offset)
        start = offset + 4
        offset = start + length
        if offset > size:
            raise ValueError(
                f"element {len(elements)} declares {length} bytes but only {size - start} remain"
            )
        append(data[start:offset])
    return elements


def count_bytes_elements(raw: Buffer) -> int:
    """How many elements a BYTES buffer holds, checking its framing as
    :func:`split_bytes` does, without copying the elements."""
    view = byte_view(raw)
    size = len(view)
    count = 0
    offset = 0
    unpack_from = _LENGTH.unpack_from
    while offset < size:
        if size - offset < 4:
            raise ValueError(
                f"the data ends inside the length prefix of element {count} "
                f"({size - offset} of 4 bytes at offset {offset})"
            )
        (length,) = unpack_from(view, offset)
        offset += 4 + length
        if offset > size:
            raise ValueError(
                f"element {count} declares {length} bytes but only {size - offset + length} remain"
            )
        count += 1
    return count
