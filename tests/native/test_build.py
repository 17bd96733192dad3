"""The extension itself: which build is loaded, its constants, its raw C error codes.

The raw calls bypass the Python wrapper's checks, to show that the C code refuses bad sizes
on its own (with honest pointers: C cannot check a pointer against a size it is told).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trioserve import _collate
from trioserve.core import frames

ffi, lib = _collate.ffi, _collate.lib
U64 = (1 << 64) - 1


def test_loaded_build() -> None:
    build = os.environ.get("TRIOSERVE_NATIVE_BUILD")
    if build:
        assert Path(_collate.__file__).resolve().is_relative_to(Path(build).resolve())
    assert int(os.environ.get("TRIOSERVE_NATIVE_SANITIZED", "0")) == lib.TS_BUILD_SANITIZED
    assert lib.TS_ALIGN == frames.ALIGN


def _arrays(*buffers: bytes) -> tuple[object, object, list[object]]:
    keep = [ffi.from_buffer(b) for b in buffers]
    return ffi.new("void *[]", keep), ffi.new("uint64_t[]", [len(p) for p in keep]), keep


def test_frame_functions_refuse_bad_arguments() -> None:
    size = ffi.new("uint64_t *")
    assert lib.ts_frame_size(0, ffi.NULL, 0, ffi.NULL) == lib.TS_E_ARG
    assert lib.ts_frame_size(1 << 32, ffi.NULL, 0, size) == lib.TS_E_LIMIT
    assert lib.ts_frame_size(0, ffi.NULL, 1 << 32, size) == lib.TS_E_LIMIT
    assert lib.ts_frame_size(0, ffi.NULL, 1, size) == lib.TS_E_ARG
    assert lib.ts_frame_size(0, ffi.new("uint64_t[]", [U64 - 10]), 1, size) == lib.TS_E_OVERFLOW

    ptrs, lens, _keep = _arrays(b"abc", b"de")
    assert lib.ts_frame_size(2, lens, 2, size) == lib.TS_OK
    out = bytearray(size[0])
    written = ffi.new("uint64_t *")
    bad = ffi.new("uint64_t *")
    out_ptr = ffi.from_buffer(out)
    for out_size in (0, 1, size[0] - 1):
        rc = lib.ts_frame_pack(3, 0, b"{}", 2, ptrs, lens, 2, out_ptr, out_size, written, bad)
        assert rc == lib.TS_E_SHORT
    assert out == bytes(len(out))
    args = (ptrs, lens, 2, out_ptr, len(out), written, bad)
    assert lib.ts_frame_pack(3, 0, ffi.NULL, 2, *args) == lib.TS_E_ARG
    assert lib.ts_frame_pack(
        3, 0, b"{}", 2, ffi.NULL, lens, 2, out_ptr, len(out), written, bad
    ) == (lib.TS_E_ARG)
    assert lib.ts_frame_pack(3, 0, b"{}", 2, ptrs, lens, 2, ffi.NULL, 0, written, bad) == (
        lib.TS_E_ARG
    )
    assert lib.ts_frame_pack(3, 0, b"{}", 2, *args) == lib.TS_OK
    assert written[0] == len(out)
    assert bytes(out) == frames.encode(frames.Kind.BATCH, {}, [b"abc", b"de"])

    info = ffi.new("ts_frame_info *")
    assert lib.ts_frame_parse(out_ptr, len(out), ffi.NULL) == lib.TS_E_ARG
    assert lib.ts_frame_parse(ffi.NULL, 16, info) == lib.TS_E_ARG
    assert lib.ts_frame_parse(out_ptr, len(out), info) == lib.TS_OK
    assert (info.kind, info.count, info.meta_length) == (3, 2, 2)
    offsets = ffi.new("uint64_t[]", 2)
    lengths = ffi.new("uint64_t[]", 2)
    # the caller's count must be the frame's
    for n in (0, 1, 3):
        assert lib.ts_frame_blobs(out_ptr, len(out), offsets, lengths, n, bad) == lib.TS_E_ARG
    assert lib.ts_frame_blobs(out_ptr, len(out), ffi.NULL, lengths, 2, bad) == lib.TS_E_ARG
    assert lib.ts_frame_blobs(out_ptr, len(out), offsets, lengths, 2, ffi.NULL) == lib.TS_OK
    assert list(offsets) == [64, 128]
    assert list(lengths) == [3, 2]
    # a buffer one byte shorter than the frame says
    assert lib.ts_frame_parse(out_ptr, len(out) - 1, info) == lib.TS_E_LENGTH


def test_collate_functions_refuse_bad_arguments() -> None:
    plan = ffi.new("ts_plan *")
    bad = ffi.new("uint64_t *")
    shapes = ffi.new("int64_t[]", [2, 3, 2, 3])
    assert lib.ts_collate_plan(shapes, 2, 2, 2, 4, ffi.NULL, bad) == lib.TS_E_ARG
    assert lib.ts_collate_plan(ffi.NULL, 2, 2, 2, 4, plan, bad) == lib.TS_E_ARG
    assert lib.ts_collate_plan(shapes, 0, 0, 2, 4, plan, bad) == lib.TS_E_EMPTY
    for itemsize in (0, 3, 16, U64):
        assert lib.ts_collate_plan(shapes, 2, 2, 2, itemsize, plan, bad) == lib.TS_E_ITEMSIZE
    # one shape per input, or one for all: nothing in between
    for count in (0, 3, U64):
        assert lib.ts_collate_plan(shapes, count, 2, 2, 4, plan, bad) == lib.TS_E_ARG
    assert lib.ts_collate_plan(shapes, U64, U64, 2, 4, plan, bad) == lib.TS_E_OVERFLOW
    assert lib.ts_collate_plan(shapes, 2, 2, 2, 4, plan, ffi.NULL) == lib.TS_OK
    assert (plan.row_bytes, plan.max_rows, plan.nbytes, plan.ragged) == (12, 2, 48, 0)
    assert lib.ts_collate_plan(shapes, 1, 5, 2, 4, plan, ffi.NULL) == lib.TS_OK
    assert (plan.row_bytes, plan.max_rows, plan.nbytes, plan.ragged) == (12, 2, 120, 0)
    huge = ffi.new("int64_t[]", [1 << 62, 1 << 62])
    assert lib.ts_collate_plan(huge, 1, 1, 2, 1, plan, bad) == lib.TS_E_OVERFLOW
    assert lib.ts_collate_plan(huge, 2, 2, 1, 4, plan, bad) == lib.TS_E_OVERFLOW
    assert lib.ts_collate_plan(huge, 1, 5, 1, 1, plan, bad) == lib.TS_E_OVERFLOW

    ptrs, lens, _keep = _arrays(bytes(24), bytes(24))
    out = bytearray(48)
    out_ptr = ffi.from_buffer(out)
    lengths = ffi.new("int64_t[]", 2)
    tail = (shapes, 2, 2, 2, 4)

    def collate(ptrs: object, lens: object, out: object, size: int, plan: object = plan) -> int:
        return int(lib.ts_collate(ptrs, lens, *tail, out, size, lengths, plan, bad))

    assert collate(ffi.NULL, lens, out_ptr, 48) == lib.TS_E_ARG
    assert collate(ptrs, ffi.NULL, out_ptr, 48) == lib.TS_E_ARG
    assert collate(ptrs, lens, out_ptr, 48, ffi.NULL) == lib.TS_E_ARG
    assert collate(ptrs, lens, ffi.NULL, 48) == lib.TS_E_ARG
    assert collate(ptrs, lens, out_ptr, 47) == lib.TS_E_SHORT
    wrong_ptrs, wrong_lens, _keep2 = _arrays(bytes(24), bytes(23))
    assert collate(wrong_ptrs, wrong_lens, out_ptr, 48) == lib.TS_E_SIZE
    assert bad[0] == 1
    null = ffi.new("void *[]", [ffi.NULL, ffi.NULL])
    assert collate(null, lens, out_ptr, 48) == lib.TS_E_ARG
    # out overlapping an input
    storage = bytearray(64)
    inner = ffi.from_buffer(storage)
    overlap = ffi.new("void *[]", [inner + 8, inner + 40])
    assert collate(overlap, lens, inner, 48) == lib.TS_E_OVERLAP
    assert storage == bytes(64)
    assert out == bytes(48)
    assert lib.ts_collate(ptrs, lens, *tail, out_ptr, 48, ffi.NULL, plan, bad) == lib.TS_OK


@pytest.mark.parametrize(
    ("size", "lengths", "row_bytes", "stride", "code"),
    [
        (0, [-1], 1, -1, "TS_E_SHAPE"),
        (0, [3], 1, 2, "TS_E_SHAPE"),
        (0, [1 << 62], 8, -1, "TS_E_OVERFLOW"),
        (0, [1], 4, (1 << 63) - 1, "TS_E_OVERFLOW"),
        (U64, [1 << 62, 1 << 62, 1 << 62, 1 << 62, 1], 4, -1, "TS_E_OVERFLOW"),
        (4, [1, 1], 4, -1, "TS_E_SHORT"),
        (12, [1, 1], 4, -1, "TS_E_SIZE"),
        (8, [1, 1], 4, -1, "TS_OK"),
    ],
)
def test_split_codes(size: int, lengths: list[int], row_bytes: int, stride: int, code: str) -> None:
    n = len(lengths)
    offsets = ffi.new("uint64_t[]", n)
    nbytes = ffi.new("uint64_t[]", n)
    bad = ffi.new("uint64_t *")
    rc = lib.ts_split(size, lengths, n, row_bytes, stride, offsets, nbytes, bad)
    assert rc == getattr(lib, code)
    assert lib.ts_split(size, ffi.NULL, 1, 1, -1, offsets, nbytes, bad) == lib.TS_E_ARG
