"""collate(): the C collator against the pure-Python reference and an independent oracle."""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.native import collate_ref as ref_impl
from trioserve import collate as c_impl
from trioserve._collate import ffi
from trioserve.collate import ALIGN, CollateError

from .strategies import (
    HUGE,
    SENTINEL,
    Batch,
    batches,
    exact,
    expected_collation,
    native_settings,
    outcome,
)

IMPLS = pytest.mark.parametrize("impl", [c_impl, ref_impl], ids=["c", "ref"])


@native_settings
@given(
    batches(),
    st.sampled_from(["none", "exact", "embedded"]),
    st.integers(0, 9),
    st.integers(0, 9),
    st.booleans(),
)
def test_matches_reference_and_oracle(
    batch: Batch, own_out: str, lead: int, spare: int, as_lists: bool
) -> None:
    data, shape, lengths = expected_collation(batch)
    if as_lists:  # not the equal-tuples fast path
        batch.shapes = [list(s) for s in batch.shapes]
    results = []
    for impl in (c_impl, ref_impl):
        storage: Any = None
        out: Any = None
        if own_out == "exact":
            storage = out = exact(len(data))
            lead = spare = 0
        elif own_out == "embedded":
            storage = bytearray([SENTINEL]) * (lead + len(data) + spare)
            out = memoryview(storage)[lead:]
        got = impl.collate(batch.inputs, batch.shapes, batch.itemsize, out)
        assert bytes(got.buffer) == data
        assert got.shape == shape
        assert got.lengths == lengths
        assert got.buffer.nbytes == math.prod(shape) * batch.itemsize
        assert not got.buffer.readonly
        if storage is not None:
            # written in place, and not one byte outside [lead, lead + nbytes)
            assert bytes(storage[lead : lead + len(data)]) == data
            assert storage[:lead] == bytes([SENTINEL]) * lead
            assert storage[lead + len(data) :] == bytes([SENTINEL]) * spare
        results.append(got)
    layout = c_impl.plan(batch.shapes, batch.itemsize)
    assert layout == ref_impl.plan(batch.shapes, batch.itemsize)
    assert (layout.shape, layout.nbytes, layout.lengths) == (shape, len(data), lengths)


@native_settings
@given(batches())
def test_allocated_output_is_aligned(batch: Batch) -> None:
    got = c_impl.collate(batch.inputs, batch.shapes, batch.itemsize)
    if got.buffer.nbytes:
        address = int(ffi.cast("uintptr_t", ffi.from_buffer(got.buffer)))
        assert address % ALIGN == 0


@st.composite
def hostile(draw: st.DrawFn) -> tuple[Batch, Any, str]:
    """A valid batch, then one thing broken in it."""
    batch = draw(batches())
    shapes = list(batch.shapes)
    n = len(shapes)
    i = draw(st.integers(0, n - 1))
    out: Any = None
    how = draw(
        st.sampled_from(
            [
                "size",
                "negative",
                "trailing",
                "rank",
                "huge",
                "short-out",
                "readonly-out",
                "overlap",
                "itemsize",
                "empty",
                "count",
            ]
        )
    )
    if how == "size":
        # one input a few bytes longer or shorter than its shape says
        delta = draw(st.integers(-3, 3).filter(bool))
        data = batch.raw[i]
        data = data[:delta] if delta < 0 else data + bytes(delta)
        if len(data) == len(batch.raw[i]):  # shortening an empty input: grow it instead
            data = bytes(1)
        batch.inputs[i] = data
    elif how == "negative" and shapes[i]:
        d = draw(st.integers(0, len(shapes[i]) - 1))
        shapes[i] = tuple(
            -draw(st.integers(1, 1 << 63)) if k == d else v for k, v in enumerate(shapes[i])
        )
    elif how == "trailing" and len(shapes[i]) > 1 and n > 1:
        d = draw(st.integers(1, len(shapes[i]) - 1))
        j = (i + 1) % n
        shapes[j] = tuple(v + 1 if k == d else v for k, v in enumerate(shapes[j]))
    elif how == "rank" and n > 1:
        shapes[i] = (*shapes[i], 1)
    elif how == "huge":
        # sizes that overflow 64 bits or need exabytes: never allocated, never read
        shape = [max(v, 1) for v in shapes[i]] or [1]
        shape[draw(st.integers(0, len(shape) - 1))] = draw(HUGE)
        shapes[i] = tuple(shape)
        if len(shape) > 1:  # keep trailing dimensions equal: the size is what is wrong
            shapes = [(s[0], *shape[1:]) if len(s) == len(shape) else s for s in shapes]
    elif how == "short-out":
        nbytes = len(expected_collation(batch)[0])
        if nbytes == 0:
            batch.inputs[i] = bytes(1)  # fall back to a size error
        else:
            out = bytearray(draw(st.integers(0, nbytes - 1)))
    elif how == "readonly-out":
        out = bytes(len(expected_collation(batch)[0]) + 1)
        if len(out) == 1:
            batch.inputs[i] = bytes(1)
    elif how == "overlap":
        nbytes = len(expected_collation(batch)[0])
        if not batch.raw[i]:
            batch.inputs[i] = bytes(1)
        else:
            # out and input i share memory
            storage = bytearray(nbytes + len(batch.raw[i]))
            shift = draw(st.integers(0, len(storage) - len(batch.raw[i])))
            storage[shift : shift + len(batch.raw[i])] = batch.raw[i]
            batch.inputs[i] = memoryview(storage)[shift : shift + len(batch.raw[i])]
            start = draw(st.integers(0, min(shift + len(batch.raw[i]) - 1, len(storage) - nbytes)))
            start = max(start, shift + len(batch.raw[i]) - nbytes, 0)
            out = memoryview(storage)[start : start + nbytes]
    elif how == "itemsize":
        batch = Batch(
            batch.inputs, shapes, draw(st.sampled_from([0, 3, 5, 16, -1, 1 << 64])), batch.raw
        )
    elif how == "empty":
        return Batch([], [], batch.itemsize, []), None, how
    elif how == "count":
        shapes = shapes[:-1] if draw(st.booleans()) else [*shapes, shapes[0]]
    else:
        batch.inputs[i] = bytes(len(batch.raw[i]) + 1)
    return Batch(batch.inputs, shapes, batch.itemsize, batch.raw), out, how


@native_settings
@given(hostile())
def test_hostile_inputs_raise_value_error(case: tuple[Batch, Any, str]) -> None:
    batch, out, how = case
    for impl in (c_impl, ref_impl):
        before = bytes(out) if out is not None else None
        # a ValueError (outcome() lets anything else through); which one depends on what is
        # checked first when a case breaks two rules at once
        result = outcome(impl.collate, batch.inputs, batch.shapes, batch.itemsize, out)
        assert result[0] == "error", (impl.__name__, how)
        if out is not None:
            assert bytes(out) == before  # checked before anything is written


@IMPLS
@pytest.mark.parametrize(
    ("shapes", "itemsize", "message"),
    [
        ([], 4, "nothing to collate"),
        ([(1 << 32, 1 << 32)], 8, "overflows 64 bits"),
        ([(1 << 62,)], 8, "overflows 64 bits"),
        ([(1,), (1 << 63,)], 1, "outside 64 bits"),
        ([(2, 3), (2, 4)], 4, "shape"),
        ([(2, 3), (2, 3, 1)], 4, "rank"),
        ([(-1, 3)], 4, "negative"),
        ([(2, 3)], 3, "itemsize"),
    ],
)
def test_plan_errors(impl: Any, shapes: list[Any], itemsize: int, message: str) -> None:
    with pytest.raises(CollateError, match=message if impl is c_impl else None):
        impl.plan(shapes, itemsize)


@IMPLS
def test_zero_size_inputs(impl: Any) -> None:
    got = impl.collate([b"", b"", b"\x01\x02"], [(0, 2), (0, 2), (1, 2)], 1)
    assert bytes(got.buffer) == b"\x00\x00\x00\x00\x01\x02"
    assert got.shape == (3, 1, 2)
    assert got.lengths == (0, 0, 1)
    empty = impl.collate([b"", b""], [(3, 0), (5, 0)], 8)
    assert empty.buffer.nbytes == 0
    assert empty.shape == (2, 5, 0)
    assert empty.lengths == (3, 5)
    # a dimension of zero makes the product zero even next to huge ones
    huge = impl.collate([b""], [(1 << 40, 0, 1 << 40)], 8)
    assert huge.shape == (1, 1 << 40, 0, 1 << 40)
    assert huge.buffer.nbytes == 0


@IMPLS
def test_argument_types(impl: Any) -> None:
    with pytest.raises(TypeError):
        impl.collate([1], [(1,)], 1)
    with pytest.raises(TypeError):
        impl.collate(b"ab", [(1,), (1,)], 1)
    with pytest.raises(TypeError):
        impl.collate([b"a"], [(1.0,)], 1)
    with pytest.raises(TypeError):
        impl.collate([b"a"], [(1,)], True)
    with pytest.raises(TypeError):
        impl.collate([b"a"], [(1,)], 1, out=3)
    with pytest.raises(TypeError):
        impl.collate([b"a"], [1], 1)
    with pytest.raises(ValueError, match="contiguous"):
        impl.collate([memoryview(b"abcd")[::2]], [(2,)], 1)
    with pytest.raises(ValueError, match="writable"):
        impl.collate([b"ab"], [(2,)], 1, out=b"xx")


@pytest.mark.parametrize("dtype", ["int8", "float16", "int32", "float32", "float64", "uint64"])
def test_numpy_inputs_of_every_width(dtype: str) -> None:
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 100, size=(rows, 3, 2)).astype(dtype) for rows in (2, 5, 0, 5)]
    got = c_impl.collate(arrays, [a.shape for a in arrays], np.dtype(dtype).itemsize)
    batch = np.frombuffer(got.buffer, dtype=dtype).reshape(got.shape)
    assert got.shape == (4, 5, 3, 2)
    assert got.lengths == (2, 5, 0, 5)
    for i, array in enumerate(arrays):
        assert (batch[i, : len(array)] == array).all()
        assert (batch[i, len(array) :] == 0).all()
    same = [arrays[1], arrays[3]]
    stacked = c_impl.collate(same, [(5, 3, 2)] * 2, np.dtype(dtype).itemsize)
    assert stacked.lengths is None
    assert (np.frombuffer(stacked.buffer, dtype=dtype).reshape(stacked.shape) == same).all()


def test_numpy_and_torch_see_the_batch() -> None:
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((4, 3), dtype=np.float32)]
    got = c_impl.collate(arrays, [a.shape for a in arrays], 4)
    tensor = torch.frombuffer(got.buffer, dtype=torch.float32).view(got.shape)
    expected = torch.nn.utils.rnn.pad_sequence([torch.from_numpy(a) for a in arrays], True)
    assert torch.equal(tensor, expected)
    assert got.lengths == (2, 4)
    # the tensor shares the buffer: no copy was made
    tensor[0, 0, 0] = 42.0
    assert np.frombuffer(got.buffer, dtype=np.float32)[0] == 42.0

    equal = [np.full((2, 2), i, dtype=np.int64) for i in range(3)]
    got = c_impl.collate(equal, [(2, 2)] * 3, 8)
    stacked = torch.frombuffer(got.buffer, dtype=torch.int64).view(got.shape)
    assert torch.equal(stacked, torch.stack([torch.from_numpy(a) for a in equal]))
    assert got.lengths is None


@example(sizes=[1 << 20] * 4)
@native_settings
@given(st.lists(st.integers(0, 1 << 16), min_size=1, max_size=4))
def test_concurrent_calls(sizes: list[int]) -> None:
    """Calls from several threads at once (the GIL is released) do not interfere."""
    inputs = [bytes([k % 251]) * size for k, size in enumerate(sizes)]
    shapes = [(size,) for size in sizes]
    expected = bytes(ref_impl.collate(inputs, shapes, 1).buffer)
    results: list[bytes] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(5):
                results.append(bytes(c_impl.collate(inputs, shapes, 1).buffer))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert results == [expected] * 20
