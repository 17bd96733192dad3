"""pack()/unpack(): the C frame packer against the reference and trioserve.core.frames."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.native import collate_ref as ref_impl
from trioserve import collate as c_impl
from trioserve._collate import ffi
from trioserve.collate import ALIGN, CollateError
from trioserve.core import frames
from trioserve.core.frames import FrameError, Kind

from .strategies import HUGE, SENTINEL, U64, embed, embedded, native_settings, outcome

IMPLS = pytest.mark.parametrize("impl", [c_impl, ref_impl], ids=["c", "ref"])

metas = st.dictionaries(st.text(max_size=6), st.integers() | st.text(max_size=6), max_size=4)
blob_data = st.lists(st.binary(max_size=300), max_size=8)
kinds = st.sampled_from(list(Kind))


@native_settings
@given(st.data(), blob_data, metas, kinds, st.integers(0, 255))
def test_pack_is_frames_encode(
    data: st.DataObject, blobs: list[bytes], meta: dict[str, Any], kind: Kind, flags: int
) -> None:
    payloads = [data.draw(embedded(blob)) for blob in blobs]
    expected = frames.encode(kind, meta, list(blobs), flags=flags)
    for impl in (c_impl, ref_impl):
        packed = impl.pack(payloads, meta, kind=kind, flags=flags)
        assert isinstance(packed, bytearray)
        assert packed == expected
        assert impl.frame_size(payloads, meta) == len(expected)
        decoded = frames.decode(packed)
        assert [bytes(b) for b in decoded.blobs] == blobs
        # the metadata given as its JSON bytes
        meta_bytes = json.dumps(meta, separators=(",", ":")).encode()
        assert impl.pack(payloads, meta_bytes, kind=kind, flags=flags) == expected


@native_settings
@given(st.data(), blob_data, metas, kinds, st.integers(0, 255))
def test_unpack_is_frames_decode(
    data: st.DataObject, blobs: list[bytes], meta: dict[str, Any], kind: Kind, flags: int
) -> None:
    frame = frames.encode(kind, meta, list(blobs), flags=flags)
    buf = data.draw(embedded(frame))
    for impl in (c_impl, ref_impl):
        got = impl.unpack_frame(buf)
        assert got.kind is kind
        assert got.flags == flags
        assert json.loads(bytes(got.meta)) == meta
        assert [bytes(b) for b in got.blobs] == blobs
        assert [bytes(b) for b in impl.unpack(buf)] == blobs
        # views, not copies: each blob sits at its 64-byte-aligned offset of the frame
        view = memoryview(buf).cast("B")
        for blob in got.blobs:
            if blob.nbytes:
                start = _address(blob) - _address(view)
                assert start % ALIGN == 0
                assert bytes(view[start : start + blob.nbytes]) == bytes(blob)


def _address(view: memoryview) -> int:
    return int(ffi.cast("uintptr_t", ffi.from_buffer(view)))


@native_settings
@given(st.lists(st.binary(max_size=200) | st.integers(0, 300), max_size=6), metas)
def test_reserved_payloads_are_zero_and_writable(items: list[Any], meta: dict[str, Any]) -> None:
    expected_blobs = [bytes(item) if isinstance(item, int) else item for item in items]
    expected = frames.encode(Kind.BATCH, meta, list(expected_blobs))
    for impl in (c_impl, ref_impl):
        packed = impl.pack(items, meta)
        assert packed == expected
        views = impl.unpack(packed)
        for item, view in zip(items, views, strict=True):
            if isinstance(item, int):
                view[:] = b"\x01" * item  # fill in place, e.g. by collate()
        assert [bytes(v) for v in impl.unpack(packed)] == [
            b"\x01" * item if isinstance(item, int) else item for item in items
        ]


@native_settings
@given(blob_data, metas, st.integers(0, 70), st.integers(0, 70))
def test_pack_into_writes_only_its_range(
    blobs: list[bytes], meta: dict[str, Any], lead: int, spare: int
) -> None:
    expected = frames.encode(Kind.BATCH, meta, list(blobs))
    for impl in (c_impl, ref_impl):
        storage = bytearray([SENTINEL]) * (lead + len(expected) + spare)
        assert impl.pack_into(memoryview(storage)[lead:], blobs, meta) == len(expected)
        assert storage[lead : lead + len(expected)] == expected
        assert storage[:lead] == bytes([SENTINEL]) * lead
        assert storage[lead + len(expected) :] == bytes([SENTINEL]) * spare
        short = bytearray(len(expected) - 1)
        with pytest.raises(CollateError, match="needs"):
            impl.pack_into(short, blobs, meta)
        assert short == bytes(len(short))


@IMPLS
def test_pack_refuses_overlap_and_bad_arguments(impl: Any) -> None:
    storage = bytearray(1024)
    with pytest.raises(CollateError, match="overlaps"):
        impl.pack_into(memoryview(storage)[100:], [memoryview(storage)[:200]])
    with pytest.raises(CollateError, match="overlaps"):
        impl.pack_into(memoryview(storage)[:500], [b"x"], memoryview(storage)[20:30])
    with pytest.raises(TypeError):
        impl.pack(["text"])
    with pytest.raises(TypeError):
        impl.pack(b"one buffer, not a list")
    with pytest.raises(ValueError, match="contiguous"):
        impl.pack([memoryview(b"abcdef")[::2]])
    with pytest.raises(ValueError, match="writable"):
        impl.pack_into(bytes(100), [])
    with pytest.raises(CollateError):
        impl.pack([], kind=0)
    with pytest.raises(CollateError):
        impl.pack([], flags=256)
    with pytest.raises(CollateError):
        impl.pack([-1])


@IMPLS
@pytest.mark.parametrize(
    "payloads",
    [[1 << 32], [(1 << 31), (1 << 31)], [U64], [U64 - 100, 1000], [1 << 64], [(1 << 32) - 16]],
)
def test_frames_beyond_the_format_are_refused(impl: Any, payloads: list[int]) -> None:
    # Reserved sizes stand in for huge payloads: nothing that large is ever allocated.
    with pytest.raises(ValueError, match=r"limits|outside"):
        impl.frame_size(payloads)
    with pytest.raises(ValueError, match=r"limits|outside"):
        impl.pack(payloads)


@IMPLS
def test_empty_frames(impl: Any) -> None:
    packed = impl.pack([])
    assert packed == frames.encode(Kind.BATCH, {}, [])
    assert impl.unpack(packed) == []
    assert impl.unpack_frame(packed).kind is Kind.BATCH
    for blobs in ([b""], [b"", b""]):
        assert [bytes(b) for b in impl.unpack(impl.pack(blobs))] == list(blobs)


# ---- hostile frames ------------------------------------------------------------------------


@st.composite
def corrupted(draw: st.DrawFn) -> bytes:
    """A valid frame with one part broken: table entries, counts, lengths, bytes."""
    blobs = draw(st.lists(st.binary(max_size=100), max_size=5))
    meta = draw(metas)
    frame = bytearray(frames.encode(draw(kinds), meta, list(blobs)))
    (meta_len,) = struct.unpack_from(">I", frame, 8)
    table = 12 + meta_len + 4
    how = draw(st.sampled_from(["entry", "count", "meta", "length", "bytes", "cut", "grow"]))
    u64 = st.integers(0, U64) | HUGE.filter(lambda v: v <= U64) | st.integers(0, len(frame) + 64)
    if how == "entry" and blobs:
        i = draw(st.integers(0, len(blobs) - 1))
        field = draw(st.sampled_from([0, 8]))
        struct.pack_into(">Q", frame, table + 16 * i + field, draw(u64))
    elif how == "count":
        struct.pack_into(">I", frame, table - 4, draw(st.integers(0, (1 << 32) - 1)))
    elif how == "meta":
        struct.pack_into(">I", frame, 8, draw(st.integers(0, (1 << 32) - 1)))
    elif how == "length":
        struct.pack_into(">I", frame, 0, draw(st.integers(0, (1 << 32) - 1)))
    elif how == "bytes" and frame:
        for _ in range(draw(st.integers(1, 4))):
            frame[draw(st.integers(0, len(frame) - 1))] = draw(st.integers(0, 255))
    elif how == "cut":
        del frame[draw(st.integers(0, len(frame))) :]
    else:
        frame += draw(st.binary(min_size=1, max_size=80))
    return bytes(frame)


def _decode_outcome(buf: bytes) -> tuple[str, Any]:
    try:
        frame = frames.decode(buf)
    except FrameError as exc:
        return "error", str(exc)
    return "ok", [bytes(b) for b in frame.blobs]


@native_settings
@given(st.data(), corrupted() | st.binary(max_size=200))
def test_hostile_frames(data: st.DataObject, frame: bytes) -> None:
    buf = data.draw(embedded(frame))
    c_out = outcome(c_impl.unpack_frame, buf)
    ref_out = outcome(ref_impl.unpack_frame, buf)
    assert c_out[0] == ref_out[0]
    if c_out[0] == "error":
        assert c_out[1] == ref_out[1] == "FrameError"
        assert _decode_outcome(frame)[0] == "error"
        return
    c_blobs = [bytes(b) for b in c_out[1].blobs]
    assert c_blobs == [bytes(b) for b in ref_out[1].blobs]
    assert bytes(c_out[1].meta) == bytes(ref_out[1].meta)
    # frames.decode agrees, except that it also parses the metadata as JSON
    status, detail = _decode_outcome(frame)
    if status == "ok":
        assert detail == c_blobs
    else:
        assert "metadata" in detail


@IMPLS
@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (b"", "shorter than the fixed header"),
        (bytes(15), "shorter than the fixed header"),
        (struct.pack(">IBBHI", 100, 3, 0, 0, 0) + bytes(4), "length field says 104 bytes, got 16"),
        (struct.pack(">IBBHI", 12, 3, 0, 0, 1 << 31) + bytes(4), "metadata length"),
        (struct.pack(">IBBHII", 12, 3, 0, 0, 0, 1), "blob count 1 does not fit"),
        (struct.pack(">IBBHIIQQ", 28, 3, 0, 0, 0, 1, 32, 1), r"blob 0 \(offset 32, length 1\)"),
        (struct.pack(">IBBHIIQQ", 28, 3, 0, 0, 0, 1, 0, 0), r"blob 0 \(offset 0"),
        (struct.pack(">IBBHIIQQ", 28, 3, 0, 0, 0, 1, 32, U64), "is outside the frame"),
        (struct.pack(">IBBHIIQQ", 28, 3, 0, 0, 0, 1, U64, 2), "is outside the frame"),
        (struct.pack(">IBBHII", 8 + 4, 99, 0, 0, 0, 0), "unknown frame kind 99"),
    ],
)
def test_malformed_frame_messages(impl: Any, frame: bytes, message: str) -> None:
    with pytest.raises(FrameError, match=message):
        impl.unpack(frame)


def test_blob_at_the_very_end_is_fine() -> None:
    frame = struct.pack(">IBBHIIQQ", 28, 3, 0, 0, 0, 1, 32, 0)
    for impl in (c_impl, ref_impl):
        assert [bytes(b) for b in impl.unpack(frame)] == [b""]
        assert [bytes(b) for b in impl.unpack(embed(frame, 3, 5, "readonly"))] == [b""]
