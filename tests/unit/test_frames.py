"""The frame codec: round trips, alignment, and hostile input."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trioserve._collate import ffi
from trioserve.collate import aligned_buffer
from trioserve.core import frames
from trioserve.core.frames import ALIGN, FrameDecoder, FrameError, Kind, decode, encode
from trioserve.core.messages import (
    BatchReply,
    LoadSpec,
    Param,
    Reply,
    WorkItem,
    decode_batch,
    decode_cancel,
    decode_reply,
    encode_batch,
    encode_cancel,
    encode_load_result,
    encode_reply,
    load_result_streams,
)

blob_lists = st.lists(st.binary(max_size=300), max_size=6)


@given(blob_lists, st.dictionaries(st.text(max_size=5), st.integers(), max_size=3))
def test_round_trip_and_alignment(blobs: list[bytes], meta: dict[str, int]) -> None:
    data = encode(Kind.BATCH, meta, list(blobs))
    frame = decode(data)
    assert frame.kind is Kind.BATCH
    assert frame.meta == meta
    assert [bytes(b) for b in frame.blobs] == blobs
    # each blob starts on a 64-byte boundary of the frame
    (count,) = struct.unpack_from(">I", data, 12 + struct.unpack_from(">I", data, 8)[0])
    assert count == len(blobs)
    table = 12 + struct.unpack_from(">I", data, 8)[0] + 4
    for i in range(count):
        off, n = struct.unpack_from(">QQ", data, table + 16 * i)
        assert off % ALIGN == 0
        assert data[off : off + n] == blobs[i]


@given(st.lists(st.binary(max_size=200), max_size=4), st.integers(min_value=1, max_value=50))
def test_decoder_handles_any_chunking(blobs: list[bytes], step: int) -> None:
    stream = encode(Kind.PING, {"n": 1}) + encode(Kind.RESPONSE, {}, list(blobs), flags=1)
    dec = FrameDecoder()
    got = []
    for i in range(0, len(stream), step):
        got.extend(dec.feed(stream[i : i + step]))
    assert [f.kind for f in got] == [Kind.PING, Kind.RESPONSE]
    assert got[1].final
    assert [bytes(b) for b in got[1].blobs] == blobs
    assert dec.pending == 0


def test_decoder_stores_frames_where_allocate_says() -> None:
    """Each frame is copied into storage from ``allocate``: with 64-byte-aligned storage
    (the worker's), every blob is aligned in memory as well as within the frame."""
    given_out: list[memoryview] = []

    def allocate(size: int) -> memoryview:
        given_out.append(aligned_buffer(size))
        return given_out[-1]

    blobs = [b"a" * 3, b"b" * 100, b""]
    stream = encode(Kind.BATCH, {"k": 1}, list(blobs)) + encode(Kind.PING, {})
    assert FrameDecoder(allocate=allocate).feed(stream[:7]) == []
    got = FrameDecoder(allocate=allocate).feed(stream)
    assert [f.kind for f in got] == [Kind.BATCH, Kind.PING]
    assert [bytes(b) for b in got[0].blobs] == blobs
    storage = given_out[-2]  # the second decoder's first frame
    for blob in got[0].blobs:
        address = int(ffi.cast("uintptr_t", ffi.from_buffer(blob)))
        assert address % ALIGN == 0
        base = int(ffi.cast("uintptr_t", ffi.from_buffer(storage)))
        assert base <= address <= base + storage.nbytes


@given(st.binary(max_size=200))
def test_garbage_never_crashes(data: bytes) -> None:
    framed = struct.pack(">I", len(data)) + data
    try:
        decode(framed)
    except FrameError:
        pass


def test_blob_offset_outside_frame_is_rejected() -> None:
    good = bytearray(encode(Kind.BATCH, {}, [b"abc"]))
    meta_len = struct.unpack_from(">I", good, 8)[0]
    table = 12 + meta_len + 4
    struct.pack_into(">QQ", good, table, 8, 10_000)
    with pytest.raises(FrameError, match="outside the frame"):
        decode(good)


def test_blob_count_too_large_is_rejected() -> None:
    good = bytearray(encode(Kind.BATCH, {}, []))
    meta_len = struct.unpack_from(">I", good, 8)[0]
    struct.pack_into(">I", good, 12 + meta_len, 1 << 30)
    with pytest.raises(FrameError, match="does not fit"):
        decode(good)


def test_oversized_frame_is_rejected_before_buffering() -> None:
    dec = FrameDecoder(max_frame=100)
    with pytest.raises(FrameError, match="exceeds the limit"):
        dec.feed(struct.pack(">I", 1000))


def test_unknown_kind_and_bad_meta() -> None:
    data = bytearray(encode(Kind.PING, {}))
    data[4] = 200
    with pytest.raises(FrameError, match="unknown frame kind"):
        decode(data)
    bad = frames._PREFIX.pack(frames._PREFIX.size + 3 + 4 - 4, 6, 0, 0, 3) + b"[1]" + bytes(4)
    with pytest.raises(FrameError, match="not a JSON object"):
        decode(bad)


def test_batch_round_trip() -> None:
    items = [
        WorkItem("r1", [("Content-Type", "text/plain")], [Param("body", b"hello", "text/plain")]),
        WorkItem("r2", [], [Param("a", b"1"), Param("b", b"\x00" * 100, "application/x")]),
    ]
    batch_id, got = decode_batch(decode(encode_batch(7, items)))
    assert batch_id == 7
    assert [(i.request_id, i.headers) for i in got] == [(i.request_id, i.headers) for i in items]
    assert [[(p.name, bytes(p.value), p.content_type) for p in i.params] for i in got] == [
        [(p.name, bytes(p.value), p.content_type) for p in i.params] for i in items
    ]


def test_reply_round_trip() -> None:
    reply = BatchReply(3, 200, "", [Reply("r1", b"out", 201, "Created", {"x": "y"}, "a/b")], True)
    got = decode_reply(decode(encode_reply(reply)))
    assert got.final and got.batch_id == 3 and got.code == 200
    r = got.replies[0]
    assert (r.request_id, bytes(r.body), r.status, r.reason, r.headers, r.content_type) == (
        "r1",
        b"out",
        201,
        "Created",
        {"x": "y"},
        "a/b",
    )


def test_reply_with_bad_blob_index_is_rejected() -> None:
    data = encode(
        Kind.RESPONSE,
        {
            "batch_id": 1,
            "code": 200,
            "message": "",
            "items": [
                {"id": "a", "status": 200, "reason": "", "headers": {}, "ct": None, "blob": 3}
            ],
        },
    )
    with pytest.raises(FrameError, match="out of range"):
        decode_reply(decode(data))


def test_cancel_and_load_spec() -> None:
    assert decode_cancel(decode(encode_cancel(["a", "b"]))) == ["a", "b"]
    spec = LoadSpec("m", "1.0", "/tmp/x", "h.py", batch_size=4, manifest={"a": 1})
    assert LoadSpec.from_meta(spec.to_meta()) == spec


def test_a_load_result_says_whether_the_model_streams_only_when_known() -> None:
    unknown = decode(encode_load_result(200, "loaded"))
    assert unknown.meta == {"code": 200, "message": "loaded"}
    assert load_result_streams(unknown) is None
    for streams in (True, False):
        assert load_result_streams(decode(encode_load_result(200, "loaded", streams))) is streams
    assert load_result_streams(decode(encode(Kind.LOAD_RESULT, {"streams": "yes"}))) is None


def test_decoded_blobs_are_writable_views_of_one_frame_buffer() -> None:
    dec = FrameDecoder()
    (frame,) = dec.feed(encode(Kind.BATCH, {}, [b"abcd", b"ef"]))
    assert not frame.blobs[0].readonly
    frame.blobs[0][0:1] = b"z"
    assert frame.blobs[0].obj is frame.blobs[1].obj
    assert bytes(frame.blobs[0]) == b"zbcd"


def test_many_small_frames_in_one_read() -> None:
    stream = b"".join(encode(Kind.PING, {"n": i}) for i in range(2000))
    frames = FrameDecoder().feed(stream)
    assert [f.meta["n"] for f in frames] == list(range(2000))
