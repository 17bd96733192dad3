"""split(): per-request views of a batched output, against the reference."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.native import collate_ref as ref_impl
from trioserve import collate as c_impl
from trioserve.collate import CollateError

from .strategies import HUGE, I64, embedded, native_settings, outcome

IMPLS = pytest.mark.parametrize("impl", [c_impl, ref_impl], ids=["c", "ref"])


@native_settings
@given(
    st.data(),
    st.lists(st.integers(0, 6), max_size=8),
    st.integers(0, 24),
    st.booleans(),
    st.integers(0, 3),
)
def test_valid_splits(
    data: st.DataObject, lengths: list[int], row_size: int, padded: bool, extra: int
) -> None:
    stride = (max(lengths, default=0) + extra) if padded else None
    rows = len(lengths) * stride if stride is not None else sum(lengths)
    raw = data.draw(st.binary(min_size=rows * row_size, max_size=rows * row_size))
    buf = data.draw(embedded(raw))
    expected = []
    pos = 0
    for i, n in enumerate(lengths):
        start = pos if stride is None else i * stride * row_size
        expected.append(raw[start : start + n * row_size])
        pos = start + n * row_size
    for impl in (c_impl, ref_impl):
        views = impl.split(buf, lengths, row_size, stride=stride)
        assert [bytes(v) for v in views] == expected
        assert all(v.readonly == memoryview(buf).readonly for v in views)


@native_settings
@given(
    st.data(),
    st.lists(st.integers(-3, 8) | HUGE.filter(lambda v: v <= I64), max_size=6),
    st.integers(0, 16) | HUGE,
    st.none() | st.integers(0, 8) | HUGE.filter(lambda v: v <= I64),
    st.integers(0, 200),
)
def test_any_split_agrees_with_reference(
    data: st.DataObject, lengths: list[int], row_size: int, stride: int | None, size: int
) -> None:
    buf = data.draw(embedded(bytes(size)))
    c_out = outcome(c_impl.split, buf, lengths, row_size, stride=stride)
    ref_out = outcome(ref_impl.split, buf, lengths, row_size, stride=stride)
    assert c_out[0] == ref_out[0]
    if c_out[0] == "ok":
        assert [bytes(v) for v in c_out[1]] == [bytes(v) for v in ref_out[1]]
        assert sum(v.nbytes for v in c_out[1]) <= size
    else:
        assert c_out[1] == ref_out[1] == "CollateError"


@IMPLS
@pytest.mark.parametrize(
    ("lengths", "row_size", "stride", "size", "message"),
    [
        ([0, -1], 4, None, 0, "negative"),
        ([3], 4, 2, 8, "stride"),
        ([1 << 62], 8, None, 8, "overflow|runs past"),
        ([1, 1], 1 << 63, 1, 0, "overflow|runs past"),
        ([2], 1, None, 1, "runs past"),
        ([1], 4, None, 8, "cover 4 bytes but the buffer has 8"),
        ([1, 1], 4, 2, 8, "cover 16 bytes but the buffer has 8|runs past"),
        ([0], 1 << 64, None, 0, "outside"),
        ([0], 1, -1, 0, "outside"),
    ],
)
def test_split_errors(
    impl: Any, lengths: list[int], row_size: int, stride: int | None, size: int, message: str
) -> None:
    with pytest.raises(CollateError, match=message if impl is c_impl else None):
        impl.split(bytes(size), lengths, row_size, stride=stride)


@IMPLS
def test_split_edges(impl: Any) -> None:
    assert impl.split(b"", [], 4) == []
    assert impl.split(b"", [], 4, stride=3) == []
    assert [bytes(v) for v in impl.split(b"", [0, 0], 0)] == [b"", b""]
    assert [bytes(v) for v in impl.split(b"", [5, 7], 0, stride=7)] == [b"", b""]
    with pytest.raises(TypeError):
        impl.split(b"", [1.0], 4)
    with pytest.raises(TypeError):
        impl.split("text", [], 4)


def test_collate_then_split_round_trip() -> None:
    inputs = [b"ab" * 3, b"cd", b""]
    shapes = [(3, 2), (1, 2), (0, 2)]
    batch = c_impl.collate(inputs, shapes, 1)
    assert batch.lengths is not None
    views = c_impl.split(batch.buffer, batch.lengths, 2, stride=batch.shape[1])
    assert [bytes(v) for v in views] == inputs
