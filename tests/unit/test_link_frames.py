"""The framing of the links between a server's processes (sans-IO)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trioserve.core.link_frames import FrameError, FrameReader, encode

REQUEST, DATA, END = 1, 6, 7

REQUEST_FRAME = (
    REQUEST,
    7,
    "POST",
    "/predictions/echo?x=1",
    "1.1",
    [(b"content-type", b"application/json"), (b"x-a", b"\xff")],
    b'{"a": 1}',
    True,
    ("127.0.0.1", 51000),
    None,
)


def test_frames_round_trip_in_one_blob() -> None:
    frames = [REQUEST_FRAME, (DATA, 7, b"HTTP/1.1 200 OK\r\n\r\n"), (END, 7, False)]
    assert FrameReader().feed(encode(frames)) == frames


def test_a_blob_split_anywhere_arrives_whole_and_once() -> None:
    blob = encode([REQUEST_FRAME]) + encode([(END, 7, True)])
    for cut in range(len(blob) + 1):
        reader = FrameReader()
        got = reader.feed(blob[:cut]) + reader.feed(blob[cut:])
        assert got == [REQUEST_FRAME, (END, 7, True)], cut
        assert reader.buffered == 0


@given(st.lists(st.binary(max_size=300), max_size=8), st.integers(1, 64))
def test_any_data_frames_survive_any_read_sizes(payloads: list[bytes], step: int) -> None:
    frames = [(DATA, n, payload) for n, payload in enumerate(payloads)]
    blob = encode(frames[:3]) + encode(frames[3:])
    reader = FrameReader()
    got = []
    for at in range(0, len(blob), step):
        got += reader.feed(blob[at : at + step])
    assert got == frames


@pytest.mark.parametrize(
    "blob",
    [
        struct.pack("<I", 3) + b"\xff\xff\xff",  # not marshal data
        struct.pack("<I", 2) + b"i\x01",  # truncated marshal data
        struct.pack("<I", 5) + b"i\x01\x00\x00\x00",  # an int, not a list of frames
        encode([()]),  # an empty frame
        encode([[1, 2]]),  # a frame that is not a tuple
        struct.pack("<I", 0xFFFFFFFF),  # a length past the limit
    ],
)
def test_anything_but_a_list_of_frames_is_refused(blob: bytes) -> None:
    with pytest.raises(FrameError):
        FrameReader().feed(blob)
