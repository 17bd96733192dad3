"""The loaded C extension and the checks every wrapper makes before it calls into C.

The private cffi extension ``trioserve._collate`` is built from ``native/``; importing this
module fails with a hint when it is not built, or when it was built from sources whose
alignment does not match :mod:`trioserve.core.frames`. The checks here cover the Python side
of an argument (types, contiguity, writability, integer ranges) and raise
:class:`CollateError`, :class:`TypeError` or :class:`ValueError`; the C code checks every
size and bound again.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, TypeGuard

from trioserve.core.frames import ALIGN

try:
    from trioserve._collate import ffi, lib
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "trioserve's C collator (trioserve._collate) is not built: reinstall trioserve with "
        "`pip install -e .` (it needs a C compiler) or run `python native/build_collate.py`"
    ) from exc

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = [
    "I64_MAX",
    "ITEMSIZES",
    "U64_MAX",
    "CollateError",
    "buffers",
    "byte_view",
    "checked_int",
    "checked_itemsize",
    "ffi",
    "lib",
    "plain_bytes",
    "readable",
    "sequence",
    "writable",
]

if lib.TS_ALIGN != ALIGN:  # pragma: no cover - a build from mismatched sources
    raise ImportError(f"trioserve._collate aligns to {lib.TS_ALIGN}, frames to {ALIGN}")

_from_buffer = ffi.from_buffer
_new = ffi.new

ITEMSIZES: Final = (1, 2, 4, 8)
I64_MAX: Final = (1 << 63) - 1
U64_MAX: Final = (1 << 64) - 1


class CollateError(ValueError):
    """Arguments whose sizes, shapes or lengths do not fit together, or overflow."""


def readable(obj: object, what: str) -> Any:
    try:
        return ffi.from_buffer(obj)
    except TypeError:
        raise TypeError(f"{what} must be a bytes-like object, not {type(obj).__name__}") from None
    except (BufferError, ValueError) as exc:
        raise ValueError(f"{what} must be a C-contiguous buffer ({exc})") from None


def buffers(items: Sequence[Any], what: str) -> tuple[Any, Any, list[Any]]:
    """Parallel pointer and length arrays for buffers, and the cdata objects that pin them.

    The hot path of every batch call, so it is kept to C-level loops (``map``); only on a
    failure does it look for the culprit, to name it.
    """
    try:
        keep = list(map(_from_buffer, items))
    except (TypeError, BufferError, ValueError):
        for i, item in enumerate(items):
            readable(item, f"{what} {i}")
        raise  # pragma: no cover - readable raised for the culprit
    # One array.array filled from a list, then viewed in place: cheaper than ffi.new
    # converting each int, or array.array pulling from an iterator.
    lens = _from_buffer("uint64_t[]", array("Q", list(map(len, keep))))
    return _new("void *[]", keep), lens, keep


def writable(obj: object, what: str) -> Any:
    try:
        return ffi.from_buffer(obj, require_writable=True)
    except TypeError:
        raise TypeError(f"{what} must be a bytes-like object, not {type(obj).__name__}") from None
    except (BufferError, ValueError) as exc:
        raise ValueError(f"{what} must be a writable, C-contiguous buffer ({exc})") from None


def byte_view(obj: Buffer, what: str) -> memoryview:
    try:
        view = memoryview(obj)
    except TypeError:
        raise TypeError(f"{what} must be a bytes-like object, not {type(obj).__name__}") from None
    if not view.c_contiguous:
        raise ValueError(f"{what} must be a C-contiguous buffer")
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def plain_bytes(obj: object) -> TypeGuard[memoryview]:
    """A memoryview :func:`byte_view` would return as it is (the common ``out``)."""
    return type(obj) is memoryview and obj.format == "B" and obj.ndim == 1 and obj.c_contiguous


def checked_int(value: object, what: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise CollateError(f"{what} is {value}, outside [{low}, {high}]")
    return value


def sequence(items: object, what: str) -> Sequence[Any]:
    if type(items) is list or type(items) is tuple:
        return items  # the common case, without the ABC check
    if isinstance(items, bytes | bytearray | memoryview | str) or not isinstance(items, Sequence):
        raise TypeError(f"{what} must be a sequence (a list or tuple), not {type(items).__name__}")
    return items


def checked_itemsize(itemsize: object) -> int:
    if type(itemsize) is int and itemsize in ITEMSIZES:
        return itemsize
    if not isinstance(itemsize, int) or isinstance(itemsize, bool):
        raise TypeError(f"itemsize must be an int, not {type(itemsize).__name__}")
    if itemsize not in ITEMSIZES:
        raise CollateError(f"itemsize must be 1, 2, 4 or 8 bytes, not {itemsize}")
    return itemsize
