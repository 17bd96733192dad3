"""FP16 and BF16 conversions of the OIP codec, checked by hand and against torch."""

from __future__ import annotations

import math
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trioserve.core.oip.halfs import (
    bf16_bits,
    decode_bf16,
    decode_fp16,
    encode_bf16,
    encode_fp16,
)

# The largest float32 that BF16 does not round to infinity (bits 0x7F7F7FFF).
BF16_LIMIT = struct.unpack("<f", struct.pack("<I", 0x7F7F7FFF))[0]


def f32(bits: int) -> float:
    """The float32 with these bits, as a Python float."""
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


def words(raw: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(raw) // 2}H", raw))


def torch_bits(values: list[float], dtype: torch.dtype) -> list[int]:
    return [v & 0xFFFF for v in torch.tensor(values, dtype=dtype).view(torch.int16).tolist()]


@pytest.mark.parametrize(
    ("value", "bits"),
    [
        (1.0, 0x3F80),
        (-2.0, 0xC000),
        (0.0, 0x0000),
        (-0.0, 0x8000),
        (0.5, 0x3F00),
        (f32(0x3F808000), 0x3F80),  # tie, lower neighbour even: down
        (f32(0x3F818000), 0x3F82),  # tie, lower neighbour odd: up to even
        (f32(0x3F808001), 0x3F81),  # just above the tie: up
        (f32(0x3F807FFF), 0x3F80),  # just below the tie: down
        (f32(0xBF818000), 0xBF82),  # ties to even for negatives too
        (f32(0x3FFF8000), 0x4000),  # rounding carries into the exponent
        (f32(0x00000001), 0x0000),  # smallest subnormal rounds to zero
        (f32(0x00018000), 0x0002),  # subnormal tie, odd: up
        (f32(0x7F7F7FFF), 0x7F7F),  # largest value that stays finite
        (math.inf, 0x7F80),
        (-math.inf, 0xFF80),
        (1 + 2**-8 + 2**-30, 0x3F80),  # rounded to float32 first (a tie there): as torch
    ],
)
def test_bf16_rounding_cases(value: float, bits: int) -> None:
    assert bf16_bits(value) == bits
    assert words(encode_bf16([value])) == [bits]
    assert words(encode_bf16([value, 1.0, value])) == [bits, 0x3F80, bits]


def test_bf16_nan_stays_nan() -> None:
    for nan in (math.nan, -math.nan, f32(0x7F800001), f32(0xFFFFFFFF)):
        assert bf16_bits(nan) == 0x7FC0
    raw = encode_bf16([1.0, math.nan, -3.0])
    assert words(raw) == [0x3F80, 0x7FC0, 0xC040]
    decoded = decode_bf16(raw)
    assert decoded[0] == 1.0 and math.isnan(decoded[1]) and decoded[2] == -3.0


@pytest.mark.parametrize("value", [f32(0x7F7F8000), 3.4e38, -3.4e38, 1e39, 1e300])
def test_bf16_values_that_would_round_to_infinity_are_refused(value: float) -> None:
    with pytest.raises(OverflowError):
        bf16_bits(value)
    with pytest.raises(OverflowError):
        encode_bf16([0.0, value])
    with pytest.raises(OverflowError):
        encode_bf16([math.nan, value])  # the per-element path, taken when a NaN is present


def test_bf16_decode_is_the_upper_half_of_a_float32() -> None:
    raw = struct.pack("<4H", 0x3F80, 0xC040, 0x7F80, 0x0001)
    assert decode_bf16(raw) == [1.0, -3.0, math.inf, f32(0x00010000)]
    assert decode_bf16(memoryview(raw)) == decode_bf16(raw)
    assert decode_bf16(b"") == [] and encode_bf16([]) == b""


finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
any32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
bf16_range = st.floats(min_value=-BF16_LIMIT, max_value=BF16_LIMIT, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(any32, bf16_range), max_size=40))
def test_bf16_whole_buffer_encoding_matches_the_per_element_reference(values: list[float]) -> None:
    values = [v for v in values if math.isnan(v) or abs(v) <= BF16_LIMIT]
    assert words(encode_bf16(values)) == [bf16_bits(v) for v in values]


@settings(max_examples=200, deadline=None)
@given(st.lists(bf16_range | st.sampled_from([math.inf, -math.inf, 0.0, -0.0]), max_size=40))
def test_bf16_matches_torch(values: list[float]) -> None:
    """torch rounds a Python float to float32 and then to BF16, ties to even, as we do."""
    assert words(encode_bf16(values)) == torch_bits(values, torch.bfloat16)
    decoded = decode_bf16(encode_bf16(values))
    assert decoded == torch.tensor(values, dtype=torch.bfloat16).float().tolist()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(width=16, allow_nan=False) | finite32.filter(lambda v: abs(v) < 65504)))
def test_fp16_matches_torch(values: list[float]) -> None:
    """On float32 values (torch goes through float32; struct rounds the double directly,
    as numpy does, so the two can differ on doubles right at a tie)."""
    raw = encode_fp16(values)
    assert words(raw) == torch_bits(values, torch.float16)
    assert decode_fp16(raw) == torch.tensor(values, dtype=torch.float16).float().tolist()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(width=16, allow_nan=False)))
def test_fp16_round_trips_exactly_on_fp16_values(values: list[float]) -> None:
    assert decode_fp16(encode_fp16(values)) == values


def test_fp16_cases() -> None:
    assert words(encode_fp16([1.0, -2.0, 65504.0, math.inf])) == [0x3C00, 0xC000, 0x7BFF, 0x7C00]
    assert words(encode_fp16([65519.0])) == [0x7BFF]  # below the tie with 65536: down
    assert math.isnan(decode_fp16(encode_fp16([math.nan]))[0])
    with pytest.raises(OverflowError):
        encode_fp16([65520.0])
