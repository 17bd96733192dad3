"""The OIP Tensor: element values <-> binary form for every datatype, and every refusal."""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.oip import DATATYPES, Tensor

INTEGER_TYPES = [name for name, dt in DATATYPES.items() if dt.int_range is not None]


def nest(flat: list[Any], shape: tuple[int, ...]) -> Any:
    """``flat`` nested in the natural shape (row-major)."""
    if len(shape) <= 1:
        return list(flat)
    step = len(flat) // shape[0] if shape[0] else 0
    return [nest(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


@contextmanager
def refused(message: str) -> Iterator[pytest.ExceptionInfo[ServeError]]:
    """Expects a BAD_INPUT ServeError whose message contains ``message``."""
    with pytest.raises(ServeError, match=re.escape(message)) as caught:
        yield caught
    assert caught.value.kind is ErrorKind.BAD_INPUT


def round_trip(datatype: str, values: list[Any]) -> tuple[Tensor, Tensor]:
    built = Tensor.from_values("t", datatype, [len(values)], values)
    again = Tensor.from_raw("t", datatype, [len(values)], bytes(built.raw))
    return built, again


# --- round trips, every datatype ---------------------------------------------------------


@pytest.mark.parametrize("datatype", INTEGER_TYPES)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_integer_round_trip(datatype: str, data: st.DataObject) -> None:
    low, high = DATATYPES[datatype].int_range or (0, 0)
    values = data.draw(st.lists(st.integers(low, high), max_size=30))
    built, again = round_trip(datatype, values)
    fmt = DATATYPES[datatype].struct_format or ""
    assert bytes(built.raw) == struct.pack(f"<{len(values)}{fmt[1:]}", *values)
    assert built.to_list() == again.to_list() == values
    assert again.to_json() == values and built == again


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=False), max_size=30))
def test_fp32_round_trip(values: list[float]) -> None:
    built, again = round_trip("FP32", values)
    assert bytes(built.raw) == struct.pack(f"<{len(values)}f", *values)
    assert again.to_list() == values == again.to_json()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(allow_nan=False), max_size=30))
def test_fp64_round_trip(values: list[float]) -> None:
    built, again = round_trip("FP64", values)
    assert again.to_list() == values == built.to_list()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(width=16, allow_nan=False), max_size=30))
def test_fp16_round_trip(values: list[float]) -> None:
    _, again = round_trip("FP16", values)
    assert again.to_list() == values


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 0xFFFF).filter(lambda b: (b & 0x7FFF) <= 0x7F80), max_size=30))
def test_bf16_round_trip(patterns: list[int]) -> None:
    """Every BF16 value but NaN survives raw -> values -> raw and values -> raw -> values."""
    raw = struct.pack(f"<{len(patterns)}H", *patterns)
    decoded = Tensor.from_raw("t", "BF16", [len(patterns)], raw).to_list()
    built, again = round_trip("BF16", decoded)
    assert bytes(built.raw) == raw and again.to_list() == decoded


@settings(max_examples=100, deadline=None)
@given(st.lists(st.booleans(), max_size=30))
def test_bool_round_trip(values: list[bool]) -> None:
    built, again = round_trip("BOOL", values)
    assert bytes(built.raw) == bytes(values)
    assert again.to_list() == values == again.to_json()


def test_bool_reads_any_non_zero_byte_as_true() -> None:
    assert Tensor.from_raw("t", "BOOL", [3], b"\x00\x01\x07").to_list() == [False, True, True]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(), max_size=10))
def test_bytes_round_trip_text(values: list[str]) -> None:
    built, again = round_trip("BYTES", values)
    assert again.to_json() == values == built.to_json()
    assert again.to_list() == [v.encode() for v in values] == built.to_list()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(), max_size=10))
def test_bytes_round_trip_binary(values: list[bytes]) -> None:
    built, again = round_trip("BYTES", values)
    assert again.to_list() == values
    expected = b"".join(struct.pack("<I", len(v)) + v for v in values)
    assert bytes(built.raw) == expected


def test_bytes_framing_with_empty_elements() -> None:
    tensor = Tensor.from_values("t", "BYTES", [3], ["", "ab", ""])
    assert bytes(tensor.raw) == b"\0\0\0\0" + b"\2\0\0\0ab" + b"\0\0\0\0"
    assert Tensor.from_raw("t", "BYTES", [3], tensor.raw).to_json() == ["", "ab", ""]
    assert Tensor.from_raw("t", "BYTES", [0], b"").to_list() == []


def test_fp_values_keep_their_precision_in_the_list_but_not_in_binary() -> None:
    tensor = Tensor.from_values("t", "FP32", [2], [0.1, 3])
    assert tensor.to_list() == [0.1, 3.0] and isinstance(tensor.to_list()[1], float)
    assert Tensor.from_raw("t", "FP32", [2], tensor.raw).to_list() == [
        struct.unpack("<f", struct.pack("<f", 0.1))[0],
        3.0,
    ]


def test_nan_and_infinity_are_kept() -> None:
    for datatype in ("FP16", "FP32", "FP64", "BF16"):
        tensor = Tensor.from_values("t", datatype, [3], [math.nan, math.inf, -math.inf])
        again = Tensor.from_raw("t", datatype, [3], tensor.raw).to_list()
        assert math.isnan(again[0]) and again[1:] == [math.inf, -math.inf]


def test_integral_floats_are_accepted_as_integers() -> None:
    tensor = Tensor.from_values("t", "INT64", [3], [1.0, -2.0, 3])
    assert tensor.to_list() == [1, -2, 3] and all(type(v) is int for v in tensor.to_list())


# --- shapes and nesting ------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=4).flatmap(
        lambda dims: st.tuples(
            st.just(tuple(dims)),
            st.lists(
                st.integers(-(2**31), 2**31 - 1),
                min_size=math.prod(dims),
                max_size=math.prod(dims),
            ),
        )
    )
)
def test_nested_and_flat_data_make_the_same_tensor(case: tuple[tuple[int, ...], list[int]]) -> None:
    shape, flat = case
    nested = Tensor.from_values("t", "INT32", shape, nest(flat, shape))
    assert nested == Tensor.from_values("t", "INT32", list(shape), flat)
    assert nested.shape == shape and nested.to_list() == flat


def test_ragged_nesting_counts_elements_only() -> None:
    tensor = Tensor.from_values("t", "INT8", [2, 2], [1, [2, [3]], 4])
    assert tensor.to_list() == [1, 2, 3, 4]


def test_scalar_tensor_and_empty_tensor() -> None:
    assert Tensor.from_values("t", "INT32", [], 7).to_list() == [7]
    assert Tensor.from_values("t", "INT32", [], [7]).element_count == 1
    empty = Tensor.from_values("t", "FP32", [0, 3], [])
    assert empty.nbytes == 0 and empty.to_list() == [] and empty.element_count == 0


def test_tuples_nest_for_python_callers() -> None:
    assert Tensor.from_values("t", "INT8", (2, 2), ((1, 2), (3, 4))).to_list() == [1, 2, 3, 4]


# --- refusals ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("datatype", "data", "message"),
    [
        ("INT8", [1, 128], "input 'x': data element 1 is 128, not in range (-128..127) for INT8"),
        ("INT8", [-129], "data element 0 is -129, not in range (-128..127) for INT8"),
        ("UINT8", [-1], "data element 0 is -1, not in range (0..255) for UINT8"),
        ("UINT64", [2**64], "is 18446744073709551616, not in range (0..18446744073709551615)"),
        ("INT64", [2**63], "not in range"),
        ("INT32", [1, True], "data element 1 is true, not an integer for INT32"),
        ("INT32", [1.5], "data element 0 is 1.5, not an integer for INT32"),
        ("INT32", [math.nan], "data element 0 is NaN, not an integer for INT32"),
        ("INT32", ["1"], 'data element 0 is "1", not an integer for INT32'),
        ("INT32", [None], "data element 0 is null, not an integer for INT32"),
        ("FP32", [1, False], "data element 1 is false, not a number for FP32"),
        ("FP32", ["a"], 'data element 0 is "a", not a number for FP32'),
        ("FP32", [{"a": 1}], 'data element 0 is {"a": 1}, not a number for FP32'),
        ("FP32", [0.0, 1e39], "data element 1 is 1e+39, not in range for FP32"),
        ("FP64", [10**400], "not in range for FP64"),
        (
            "BF16",
            [1.5, 10**400],
            "data element 1 is 1000000000000000000000000000000000000..., not in",
        ),
        ("FP16", [0.5, -(10**400)], "not in range for FP16"),
        ("FP16", [65520], "data element 0 is 65520, not in range for FP16"),
        ("BF16", [1.0, 3.4e38], "data element 1 is 3.4e+38, not in range for BF16"),
        ("BF16", [math.nan, -1e39], "data element 1 is -1e+39, not in range for BF16"),
        ("BOOL", [True, 1], "data element 1 is 1, not a boolean for BOOL"),
        ("BYTES", ["a", 1], "data element 1 is 1, not a string for BYTES"),
        ("BYTES", ["\ud800"], "not valid Unicode for BYTES"),
    ],
)
def test_bad_elements_are_named(datatype: str, data: list[Any], message: str) -> None:
    with refused(message):
        Tensor.from_values("x", datatype, [len(data)], data, role="input")


def test_long_values_are_cut_in_messages() -> None:
    with refused('data element 0 is "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa..., not a number'):
        Tensor.from_values("x", "FP32", [1], ["a" * 100])


def test_element_count_must_match_the_shape() -> None:
    with refused("input 'x': shape [2, 3] needs 6 elements but data has 5"):
        Tensor.from_values("x", "FP32", [2, 3], [[1, 2, 3], [4, 5]], role="input")


def test_unknown_datatype_lists_the_valid_ones() -> None:
    with refused("tensor 'x': unknown datatype 'FLOAT32'; valid datatypes: BOOL, UINT8") as e:
        Tensor.from_values("x", "FLOAT32", [1], [1.0])
    assert "BF16, BYTES" in e.value.message
    with refused("unknown datatype 'fp32'"):
        Tensor.from_raw("x", "fp32", [1], b"\0\0\0\0")


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ([-1, 3], "shape [-1, 3] has a negative dimension (-1)"),
        ([2, -5], "has a negative dimension (-5)"),
        ([True], "has a dimension that is not an integer"),
        ([1.0], "has a dimension that is not an integer"),
        ([2**63], "has a dimension over 2**63 - 1"),
        ("12", "shape must be an array of integers"),
    ],
)
def test_bad_shapes(shape: Any, message: str) -> None:
    with refused(message):
        Tensor.from_values("x", "INT8", shape, [1])
    with refused(message):
        Tensor.from_raw("x", "INT8", shape, b"\1")


@pytest.mark.parametrize(
    ("datatype", "shape", "raw", "message"),
    [
        ("FP32", [2, 3], bytes(20), "shape [2, 3] of FP32 needs 24 bytes (6 elements of 4)"),
        ("FP32", [2], bytes(9), "needs 8 bytes (2 elements of 4) but the data has 9 bytes"),
        ("BF16", [1], b"", "needs 2 bytes"),
        ("BOOL", [0], b"\0", "needs 0 bytes"),
        ("BYTES", [1], b"\1\0", "malformed BYTES data: the data ends inside the length prefix"),
        ("BYTES", [1], b"\5\0\0\0abc", "element 0 declares 5 bytes but only 3 remain"),
        ("BYTES", [2], b"\1\0\0\0a", "shape [2] needs 2 BYTES elements but the data holds 1"),
        (
            "BYTES",
            [1],
            b"\1\0\0\0a\0\0\0\0",
            "shape [1] needs 1 BYTES elements but the data holds 2",
        ),
        ("BYTES", [1], b"\1\0\0\0a\0", "the data ends inside the length prefix of element 1"),
    ],
)
def test_raw_size_must_match(datatype: str, shape: list[int], raw: bytes, message: str) -> None:
    with refused(message):
        Tensor.from_raw("x", datatype, shape, raw, role="input")


def test_non_utf8_bytes_have_no_json_form() -> None:
    built = Tensor.from_values("x", "BYTES", [2], ["ok", b"\xff\xfe"])
    from_raw = Tensor.from_raw("x", "BYTES", [2], built.raw)
    for tensor in (built, from_raw):
        assert tensor.to_list() == [b"ok", b"\xff\xfe"]
        with refused("output 'x': BYTES element 1 is not valid UTF-8") as e:
            tensor.to_json()
        assert "parameters.binary_data: true" in e.value.message


# --- the value type ----------------------------------------------------------------------


def test_from_raw_keeps_a_view_of_the_callers_buffer() -> None:
    body = struct.pack("<3i", 1, 2, 3)
    tensor = Tensor.from_raw("x", "INT32", [2], memoryview(body)[4:])
    assert tensor.raw.obj is body and tensor.to_list() == [2, 3]


def test_equality_parameters_and_repr() -> None:
    params = {"content_type": "np"}
    a = Tensor.from_values("x", "INT16", [2], [1, 2], params)
    params["content_type"] = "changed"
    assert a.parameters == {"content_type": "np"}
    b = Tensor.from_raw("x", "INT16", [2], struct.pack("<2h", 1, 2), {"content_type": "np"})
    assert a == b
    assert a != Tensor.from_values("x", "INT16", [2], [1, 3], {"content_type": "np"})
    assert a != Tensor.from_values("x", "UINT16", [2], [1, 2], {"content_type": "np"})
    assert a != Tensor.from_values("x", "INT16", [1, 2], [1, 2], {"content_type": "np"})
    assert repr(a) == "Tensor(name='x', datatype='INT16', shape=(2,), nbytes=4)"
    assert a.datatype_info is DATATYPES["INT16"]


def test_to_list_returns_a_new_list() -> None:
    tensor = Tensor.from_values("x", "INT8", [2], [1, 2])
    tensor.to_list().append(3)
    assert tensor.to_list() == [1, 2]
