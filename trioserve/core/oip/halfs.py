"""FP16 and BF16 without numpy.

FP16 is IEEE binary16, which :mod:`struct` packs directly (format ``e``, round to nearest
even from the Python float). BF16 is the upper half of an IEEE binary32: a value is first
rounded to float32 (as ``struct`` format ``f`` does) and then to BF16 with round to nearest,
ties to even, on the float32's bits, the way torch converts; any NaN becomes the quiet NaN
``0x7FC0``.

Encoders raise :class:`OverflowError` for a finite value that the datatype cannot hold
(it would round to infinity); infinities and NaN themselves are kept. Callers turn the
error into a client message.

The BF16 encoder works on the whole buffer at once: it reads the float32 bytes as one big
integer and adds the rounding bias to every 32-bit lane in a single addition (no NaN lane
present means no lane can carry into the next), so there is no per-element Python loop
except when a NaN is present.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Sequence

_BIG_ENDIAN_HOST = sys.byteorder == "big"
BF16_NAN = 0x7FC0
_BF16_INF = 0x7F80
_ONE_LANE = b"\x01\x00\x00\x00"
_BIAS_LANE = b"\xff\x7f\x00\x00"  # 0x7FFF, little-endian, in a 32-bit lane

Number = int | float


def encode_fp16(values: Sequence[Number]) -> bytes:
    """Little-endian binary16 of each value (``OverflowError`` past +-65504 after rounding)."""
    return struct.pack(f"<{len(values)}e", *values)


def decode_fp16(raw: bytes | bytearray | memoryview) -> list[float]:
    """The floats of a little-endian binary16 buffer (its length must be even)."""
    return list(struct.unpack_from(f"<{len(raw) // 2}e", raw))


def bf16_bits(value: Number) -> int:
    """The BF16 bit pattern of one value: float32, then round to nearest even.

    The reference for :func:`encode_bf16`, which does the same for many values at once.
    Raises ``OverflowError`` when a finite value rounds to infinity.
    """
    if value != value:
        return BF16_NAN
    bits: int = struct.unpack("<I", struct.pack("<f", value))[0]
    rounded: int = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    if rounded & 0x7FFF == _BF16_INF and bits & 0x7FFFFFFF != 0x7F800000:
        raise OverflowError(f"{value!r} is too large for BF16")
    return rounded


def encode_bf16(values: Sequence[Number]) -> bytes:
    """Little-endian BF16 of each value (see the module docstring for the rounding)."""
    count = len(values)
    if count == 0:
        return b""
    if _has_nan(values):
        return struct.pack(f"<{count}H", *map(bf16_bits, values))
    # Overflow: rounding is monotonic, so the extremes say whether any value overflows.
    bf16_bits(max(values))
    bf16_bits(min(values))
    lanes = int.from_bytes(struct.pack(f"<{count}f", *values), "little")
    ones = int.from_bytes(_ONE_LANE * count, "little")
    bias = int.from_bytes(_BIAS_LANE * count, "little")
    # Lane i of (lanes >> 16) & ones is bit 16 of lane i: the lowest bit that BF16 keeps.
    rounded = (lanes + bias + ((lanes >> 16) & ones)).to_bytes(4 * count, "little")
    out = bytearray(2 * count)
    out[0::2] = rounded[2::4]
    out[1::2] = rounded[3::4]
    return bytes(out)


def decode_bf16(raw: bytes | bytearray | memoryview) -> list[float]:
    """The floats of a little-endian BF16 buffer (its length must be even): each element
    becomes the upper half of a float32 whose lower half is zero."""
    source = bytes(raw)
    count = len(source) // 2
    widened = bytearray(4 * count)
    widened[2::4] = source[0::2]
    widened[3::4] = source[1::2]
    floats = array("f")
    floats.frombytes(widened)
    if _BIG_ENDIAN_HOST:
        floats.byteswap()
    return floats.tolist()


def _has_nan(values: Sequence[Number]) -> bool:
    """True when a value is NaN. The sum is NaN when one is (or when +inf meets -inf, a
    false alarm that only costs the slow path); summing floats runs in C."""
    total = sum(values)
    if total == total:
        return False
    return any(value != value for value in values)
