"""Collated batch tensors in BATCH frames (``meta["tensors"]``), on the worker side.

Frames are built the way the server builds them (``trioserve.collate``: ``plan`` the layout,
``pack`` the frame with the tensor blob reserved, ``collate`` straight into it) or, for the
hostile cases, with ``frames.encode``; they go through the real frame loop in-process over a
trio memory stream, into a handler module written to a temporary directory.
"""

from __future__ import annotations

import json
import struct
import sys
import textwrap
from collections import deque
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pytest
import torch
import trio
import trio.testing

from trioserve import collate
from trioserve.core.frames import ALIGN, Frame, FrameDecoder, Kind, encode
from trioserve.core.messages import BatchReply, LoadSpec, decode_reply, encode_load
from trioserve.worker import connection as worker_connection
from trioserve.worker.loop import WorkerLoop
from trioserve.worker.tensors import DTYPES, TensorSpecError, parse_batch_tensors
from trioserve.worker.torchserve import ts_shim
from trioserve.worker.torchserve.context import Context

HANDLER_MODULE = "fx_batch_tensors"
HANDLER = '''
"""Test handler: the ``mode`` header of request 0 picks what it does with the batch tensors."""

import torch

SEEN = []

W = torch.arange(8, dtype=torch.float32).reshape(4, 2) / 8


def handle(data, context):
    if data is None:
        return None
    mode = context.get_request_header(0, "mode") or "describe"
    if mode == "describe":
        names = context.batch_tensor_names()
        found = {
            name: (context.get_batch_tensor(name), context.get_batch_lengths(name))
            for name in names
        }
        out = []
        for idx, row in enumerate(data):
            tensors = {}
            for name, (t, lengths) in found.items():
                tensors[name] = {
                    "dtype": str(t.dtype).removeprefix("torch."),
                    "shape": list(t.shape),
                    "ptr": t.data_ptr(),
                    "contiguous": t.is_contiguous(),
                    "value": t[idx].tolist(),
                    "lengths": None if lengths is None else lengths.tolist(),
                    "lengths_dtype": None if lengths is None else str(lengths.dtype),
                    "lengths_ptr": None if lengths is None else lengths.data_ptr(),
                }
            body = bytes(row["body"]).decode() if "body" in row else None
            out.append({"names": names, "body": body, "tensors": tensors})
        return out
    if mode == "compute":
        x = context.get_batch_tensor("x")  # [N, 4], stacked
        seq = context.get_batch_tensor("seq")  # [N, L, 2], padded
        lengths = context.get_batch_lengths("seq")
        assert context.get_batch_lengths("x") is None
        y = x @ W
        mask = torch.arange(seq.shape[1])[None, :] < lengths[:, None]
        total = (seq * mask[..., None]).sum(dim=1)
        mean = total / lengths.clamp(min=1)[:, None].to(seq.dtype)
        return [{"y": y[i].tolist(), "mean": mean[i].tolist()} for i in range(len(data))]
    if mode == "unknown":
        try:
            context.get_batch_lengths("nope")
        except KeyError as exc:
            return [{"error": exc.args[0]} for _ in data]
        return [{"error": None} for _ in data]
    if mode == "keep":
        SEEN.append((context, context.get_batch_tensor("x")))
        return [{"kept": True} for _ in data]
    raise ValueError(mode)
'''


class Exited(Exception):
    def __init__(self, status: int, why: str) -> None:
        super().__init__(status, why)
        self.status = status


def fake_exit(status: int, why: str) -> NoReturn:
    raise Exited(status, why)


class RecordingDecoder(FrameDecoder):
    """The worker's decoder, keeping every BATCH frame it hands out (and its buffer alive)."""

    batches: list[Frame] = []

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        frames = super().feed(data)
        RecordingDecoder.batches.extend(f for f in frames if f.kind is Kind.BATCH)
        return frames


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(RecordingDecoder, "batches", [])
    monkeypatch.setattr(worker_connection, "FrameDecoder", RecordingDecoder)
    had_shim = ts_shim.installed()
    yield
    sys.modules.pop(HANDLER_MODULE, None)
    if not had_shim:
        ts_shim.uninstall()


def address(view: memoryview | bytearray) -> int:
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


class Session:
    def __init__(self, stream: trio.abc.Stream, model_dir: Path) -> None:
        self.stream = stream
        self.model_dir = model_dir
        self.decoder = FrameDecoder()
        self.frames: deque[Frame] = deque()

    async def send(self, data: bytes | bytearray) -> None:
        await self.stream.send_all(data)

    async def recv(self) -> Frame:
        with trio.fail_after(10):
            while not self.frames:
                data = await self.stream.receive_some(1 << 16)
                assert data, "the worker closed the stream"
                self.frames.extend(self.decoder.feed(data))
        return self.frames.popleft()

    async def reply(self) -> BatchReply:
        """The next RESPONSE (METRICS frames in between are skipped)."""
        while True:
            frame = await self.recv()
            if frame.kind is not Kind.METRICS:
                assert frame.kind is Kind.RESPONSE, frame
                return decode_reply(frame)

    async def answers(self, data: bytes | bytearray) -> list[Any]:
        await self.send(data)
        reply = await self.reply()
        assert (reply.code, reply.final) == (200, True), reply.message
        return [json.loads(bytes(r.body)) for r in reply.replies]


@asynccontextmanager
async def worker_session(tmp_path: Path) -> AsyncIterator[Session]:
    (tmp_path / f"{HANDLER_MODULE}.py").write_text(textwrap.dedent(HANDLER))
    client, server = trio.testing.memory_stream_pair()
    session = Session(client, tmp_path)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(WorkerLoop(server, exit_fn=fake_exit).run)
        spec = LoadSpec("m", "1.0", str(tmp_path), f"{HANDLER_MODULE}.py", batch_size=8)
        await session.send(encode_load(spec))
        loaded = await session.recv()
        assert (loaded.kind, loaded.meta["code"]) == (Kind.LOAD_RESULT, 200), loaded.meta
        try:
            yield session
        finally:
            nursery.cancel_scope.cancel()


# -- building frames as the server does -------------------------------------------------------


def raw(t: torch.Tensor) -> bytes:
    """The row-major bytes of a tensor (little-endian host)."""
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def requests_meta(n: int, mode: str | None) -> tuple[list[dict[str, Any]], list[bytes]]:
    headers = [["mode", mode]] if mode else []
    requests = [
        {"id": f"r{i}", "headers": headers, "params": [{"name": "body", "ct": None, "blob": i}]}
        for i in range(n)
    ]
    return requests, [b"request %d" % i for i in range(n)]


def server_batch(
    batch_id: int, inputs: dict[str, list[torch.Tensor]], mode: str | None = None
) -> bytearray:
    """A BATCH frame with one raw param per request and the inputs collated into it."""
    n = len(next(iter(inputs.values())))
    requests, params = requests_meta(n, mode)
    payloads: list[bytes | int] = list(params)
    tensors: dict[str, dict[str, Any]] = {}
    fills = []
    for name, per_request in inputs.items():
        itemsize = per_request[0].element_size()
        shapes = [tuple(t.shape) for t in per_request]
        layout = collate.plan(shapes, itemsize)
        entry: dict[str, Any] = {
            "dtype": str(per_request[0].dtype).removeprefix("torch."),
            "shape": list(layout.shape),
            "blob": len(payloads),
            "lengths": None,
        }
        payloads.append(layout.nbytes)  # reserved, filled in place below
        if layout.lengths is not None:
            entry["lengths"] = len(payloads)
            payloads.append(struct.pack(f"<{n}q", *layout.lengths))
        tensors[name] = entry
        fills.append((entry["blob"], [raw(t) for t in per_request], shapes, itemsize))
    meta = {"batch_id": batch_id, "requests": requests, "tensors": tensors}
    frame = collate.pack(payloads, meta)
    blobs = collate.unpack(frame)
    for index, data, shapes, itemsize in fills:
        collate.collate(data, shapes, itemsize, out=blobs[index])
    return frame


def blob_address(frame: Frame, index: int) -> int:
    return address(frame.blobs[index])


def frame_range(frame: Frame) -> tuple[int, int]:
    buffer = frame.blobs[0].obj
    assert isinstance(buffer, bytearray)
    start = address(buffer)
    return start, start + len(buffer)


# -- through the frame loop ------------------------------------------------------------------


async def test_stacked_float32_is_a_zero_copy_view_of_the_frame(tmp_path: Path) -> None:
    rows = [torch.arange(4, dtype=torch.float32) + 10 * i for i in range(3)]
    async with worker_session(tmp_path) as s:
        answers = await s.answers(server_batch(1, {"x": rows}))
        frame = RecordingDecoder.batches[-1]
    assert [a["names"] for a in answers] == [["x"]] * 3
    assert [a["body"] for a in answers] == [f"request {i}" for i in range(3)]
    first = answers[0]["tensors"]["x"]
    assert (first["dtype"], first["shape"], first["contiguous"]) == ("float32", [3, 4], True)
    assert first["lengths"] is None and first["lengths_ptr"] is None
    assert [a["tensors"]["x"]["value"] for a in answers] == [r.tolist() for r in rows]
    # The handler's tensor starts exactly at the tensor blob of the received frame.
    blob = frame.meta["tensors"]["x"]["blob"]
    assert first["ptr"] == blob_address(frame, blob)
    start, end = frame_range(frame)
    assert start <= first["ptr"] and first["ptr"] + 3 * 4 * 4 <= end
    # Blobs sit on 64-byte boundaries of the frame, and the worker stores each frame 64-byte
    # aligned, so the tensor is aligned in memory, not only within the frame.
    assert first["ptr"] % ALIGN == 0


async def test_ragged_int64_is_padded_with_lengths(tmp_path: Path) -> None:
    lengths = [2, 5, 0]
    seqs = [
        torch.arange(n * 2, dtype=torch.int64).reshape(n, 2) * (i + 1) - 3
        for i, n in enumerate(lengths)
    ]
    async with worker_session(tmp_path) as s:
        answers = await s.answers(server_batch(2, {"seq": seqs}))
        frame = RecordingDecoder.batches[-1]
    info = [a["tensors"]["seq"] for a in answers]
    assert info[0]["dtype"] == "int64"
    assert info[0]["shape"] == [3, 5, 2]
    assert info[0]["lengths"] == lengths
    assert info[0]["lengths_dtype"] == "torch.int64"
    for seq, row in zip(seqs, info, strict=True):
        padded = torch.zeros(5, 2, dtype=torch.int64)
        padded[: len(seq)] = seq
        assert row["value"] == padded.tolist()
    entry = frame.meta["tensors"]["seq"]
    assert info[0]["ptr"] == blob_address(frame, entry["blob"])
    assert info[0]["lengths_ptr"] == blob_address(frame, entry["lengths"])
    start, end = frame_range(frame)
    assert start <= info[0]["lengths_ptr"] < end


async def test_bfloat16_and_several_inputs(tmp_path: Path) -> None:
    values = [[1.5, -2.25, 0.0], [3.0, 0.125, -8.0], [256.0, -0.5, 7.0]]
    x = [torch.tensor(v, dtype=torch.bfloat16) for v in values]
    mask = [torch.tensor([i % 2 == 0, True]) for i in range(3)]
    async with worker_session(tmp_path) as s:
        answers = await s.answers(server_batch(3, {"x": x, "mask": mask}))
    assert answers[0]["names"] == ["x", "mask"]
    assert [a["tensors"]["x"]["value"] for a in answers] == values
    assert answers[0]["tensors"]["x"]["dtype"] == "bfloat16"
    assert [a["tensors"]["mask"]["value"] for a in answers] == [
        [True, True],
        [False, True],
        [True, True],
    ]


@pytest.mark.parametrize("dtype", list(DTYPES))
async def test_every_dtype_round_trips(tmp_path: Path, dtype: str) -> None:
    torch_dtype = getattr(torch, dtype)
    per_request = [
        (torch.arange(6).reshape(2, 3) + 6 * i - 5).remainder(2 if dtype == "bool" else 100)
        for i in range(3)
    ]
    inputs = [t.to(torch_dtype) for t in per_request]
    async with worker_session(tmp_path) as s:
        answers = await s.answers(server_batch(4, {"t": inputs}))
    assert answers[0]["tensors"]["t"]["dtype"] == dtype
    assert answers[0]["tensors"]["t"]["shape"] == [3, 2, 3]
    assert [a["tensors"]["t"]["value"] for a in answers] == [t.tolist() for t in inputs]


async def test_handler_computes_on_the_batch(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(5)
    xs = [torch.randn(4, generator=gen) for _ in range(4)]
    seqs = [torch.randn(n, 2, generator=gen) for n in (3, 1, 6, 2)]
    async with worker_session(tmp_path) as s:
        answers = await s.answers(server_batch(5, {"x": xs, "seq": seqs}, mode="compute"))
    w = torch.arange(8, dtype=torch.float32).reshape(4, 2) / 8
    for x, seq, answer in zip(xs, seqs, answers, strict=True):
        torch.testing.assert_close(torch.tensor(answer["y"]), x @ w)
        torch.testing.assert_close(torch.tensor(answer["mean"]), seq.mean(dim=0))


async def test_unknown_name_is_a_key_error_naming_the_inputs(tmp_path: Path) -> None:
    xs = [torch.zeros(2) for _ in range(2)]
    async with worker_session(tmp_path) as s:
        answers = await s.answers(server_batch(6, {"x": xs, "y": xs}, mode="unknown"))
    message = answers[0]["error"]
    assert message.startswith("no collated batch tensor named 'nope'; this batch has 'x', 'y'")


async def test_tensors_last_for_the_batch_only(tmp_path: Path) -> None:
    xs = [torch.full((2,), float(i)) for i in range(2)]
    async with worker_session(tmp_path) as s:
        assert await s.answers(server_batch(7, {"x": xs}, mode="keep")) == [{"kept": True}] * 2
        handler = sys.modules[HANDLER_MODULE]
        context, kept = handler.SEEN[-1]
        assert context.batch_tensor_names() == []
        with pytest.raises(KeyError, match="none"):
            context.get_batch_tensor("x")
        # A tensor the handler kept is still valid: it holds the frame's memory.
        assert kept.tolist() == [[0.0, 0.0], [1.0, 1.0]]
        # The next batch, without tensors, sees none.
        requests, params = requests_meta(2, None)
        plain = encode(Kind.BATCH, {"batch_id": 8, "requests": requests}, list(params))
        answers = await s.answers(plain)
    assert [a["names"] for a in answers] == [[], []]


# -- contract violations: 400 for the batch, the worker keeps serving -------------------------

N = 3
X_BLOB = N  # float32 [3, 4]: 48 bytes
SEQ_BLOB = N + 1  # int64 [3, 5, 2]: 240 bytes
LEN_BLOB = N + 2  # lengths (5, 3, 0)
SHORT_BLOB = N + 3  # 47 bytes
TWO_LENGTHS = N + 4  # 16 bytes
TOO_LONG = N + 5  # lengths (5, 6, 0)
NEGATIVE = N + 6  # lengths (5, -1, 0)
HOSTILE_BLOBS = [
    bytes(48),
    bytes(240),
    struct.pack("<3q", 5, 3, 0),
    bytes(47),
    struct.pack("<2q", 5, 3),
    struct.pack("<3q", 5, 6, 0),
    struct.pack("<3q", 5, -1, 0),
]


def x_entry(**change: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"dtype": "float32", "shape": [N, 4], "blob": X_BLOB, "lengths": None}
    entry.update(change)
    return {k: v for k, v in entry.items() if v != "<drop>"}


def seq_entry(**change: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "dtype": "int64",
        "shape": [N, 5, 2],
        "blob": SEQ_BLOB,
        "lengths": LEN_BLOB,
    }
    entry.update(change)
    return entry


def hostile_batch(batch_id: int, tensors: object) -> bytes:
    requests, params = requests_meta(N, None)
    meta = {"batch_id": batch_id, "requests": requests, "tensors": tensors}
    return encode(Kind.BATCH, meta, [*params, *HOSTILE_BLOBS])


BAD_TENSORS: list[tuple[object, str]] = [
    ([], "field 'tensors' must be an object, not list"),
    ("x", "field 'tensors' must be an object, not str"),
    ({"x": 5}, "batch tensor 'x': the entry must be an object, not 5"),
    ({"": x_entry()}, "a batch tensor needs a non-empty name"),
    ({"x": x_entry(dtype="complex64")}, "dtype 'complex64' is not one of float16, bfloat16"),
    ({"x": x_entry(dtype="torch.float32")}, "dtype 'torch.float32' is not one of"),
    ({"x": x_entry(dtype=4)}, "dtype 4 is not one of"),
    ({"x": x_entry(dtype="<drop>")}, "dtype None is not one of"),
    ({"x": x_entry(shape=12)}, "shape must be a non-empty list of integers, not 12"),
    ({"x": x_entry(shape=[])}, "shape must be a non-empty list of integers, not []"),
    ({"x": x_entry(shape="<drop>")}, "shape must be a non-empty list of integers, not None"),
    ({"x": x_entry(shape=[N, -4])}, "shape [3, -4] has -4: dimensions are integers >= 0"),
    ({"x": x_entry(shape=[N, 4.0])}, "shape [3, 4.0] has 4.0"),
    ({"x": x_entry(shape=[N, True])}, "shape [3, True] has True"),
    ({"x": x_entry(shape=[N, "4"])}, "shape [3, '4'] has '4'"),
    ({"x": x_entry(shape=[2, 6])}, "shape [2, 6] starts with 2 but the batch has 3 request(s)"),
    ({"x": x_entry(shape=[4, 3])}, "shape [4, 3] starts with 4 but the batch has 3"),
    ({"x": x_entry(blob=99)}, "blob 99 is out of range: the frame has 10 blob(s)"),
    ({"x": x_entry(blob=-1)}, "blob -1 is out of range"),
    ({"x": x_entry(blob="3")}, "blob must be a blob index (an integer), not '3'"),
    ({"x": x_entry(blob=True)}, "blob must be a blob index (an integer), not True"),
    ({"x": x_entry(blob=3.0)}, "not 3.0"),
    ({"x": x_entry(blob="<drop>")}, "blob must be a blob index (an integer), not None"),
    ({"x": x_entry(blob=SHORT_BLOB)}, "blob 6 has 47 bytes but shape [3, 4] of float32 needs 48"),
    ({"x": x_entry(dtype="float64")}, "blob 3 has 48 bytes but shape [3, 4] of float64 needs 96"),
    ({"x": x_entry(dtype="int8")}, "of int8 needs 12"),
    ({"x": x_entry(shape=[N, 1 << 62, 1 << 62])}, f"needs {3 * 4 << 124}"),
    ({"x": x_entry(shape=[N, 0])}, "blob 3 has 48 bytes but shape [3, 0] of float32 needs 0"),
    ({"seq": seq_entry(lengths=99)}, "batch tensor 'seq': lengths 99 is out of range"),
    ({"seq": seq_entry(lengths="5")}, "lengths must be a blob index (an integer), not '5'"),
    ({"seq": seq_entry(lengths=False)}, "lengths must be a blob index (an integer), not False"),
    ({"seq": seq_entry(lengths=TWO_LENGTHS)}, "lengths blob 7 has 16 bytes, expected 24"),
    ({"seq": seq_entry(lengths=X_BLOB)}, "lengths blob 3 has 48 bytes, expected 24"),
    ({"seq": seq_entry(lengths=TOO_LONG)}, "length 1 is 6, outside [0, 5]"),
    ({"seq": seq_entry(lengths=NEGATIVE)}, "length 1 is -1, outside [0, 5]"),
    (
        {"seq": seq_entry(dtype="int64", shape=[N], blob=LEN_BLOB)},
        "lengths (blob 5) given for shape [3], which has no padded dimension",
    ),
    ({"x": x_entry(), "seq": seq_entry(shape=[N, 4, 2])}, "batch tensor 'seq': blob 4 has 240"),
]


@pytest.mark.parametrize(("tensors", "message"), BAD_TENSORS)
async def test_contract_violation_fails_only_that_batch(
    tmp_path: Path, tensors: object, message: str
) -> None:
    async with worker_session(tmp_path) as s:
        await s.send(hostile_batch(11, tensors))
        failed = await s.reply()
        assert (failed.batch_id, failed.code, failed.final, failed.replies) == (11, 400, True, [])
        assert failed.message.startswith("malformed batch tensors: ")
        assert message in failed.message
        # The same worker serves the next batch, tensors and all.
        good = {"x": x_entry(), "seq": seq_entry()}
        answers = await s.answers(hostile_batch(12, good))
        assert answers[0]["names"] == ["x", "seq"]
        assert answers[1]["tensors"]["seq"]["lengths"] == [5, 3, 0]


async def test_null_tensors_means_none(tmp_path: Path) -> None:
    async with worker_session(tmp_path) as s:
        answers = await s.answers(hostile_batch(13, None))
    assert [a["names"] for a in answers] == [[], [], []]


# -- parse_batch_tensors and Context directly -------------------------------------------------


def test_parse_checks_without_torch_and_keeps_order() -> None:
    blobs = [memoryview(bytearray(b)) for b in HOSTILE_BLOBS]
    meta = {"tensors": {"seq": seq_entry(blob=1, lengths=2), "x": x_entry(blob=0)}}
    parsed = parse_batch_tensors(meta, blobs, N)
    assert list(parsed) == ["seq", "x"]
    assert parsed["seq"].shape == (3, 5, 2) and parsed["seq"].padded
    assert parsed["x"].lengths is None and not parsed["x"].padded
    assert parsed["x"].data.obj is blobs[0].obj  # a view, not a copy
    assert parse_batch_tensors({}, blobs, N) == {}
    with pytest.raises(TensorSpecError, match="starts with 3 but the batch has 2"):
        parse_batch_tensors(meta, blobs, 2)


def context_with(tensors: dict[str, Any], blobs: list[memoryview], n: int) -> Context:
    ctx = Context("m", "/d", None, 8, None, "0.12.0")
    ctx.begin_batch(
        [f"r{i}" for i in range(n)],
        [{} for _ in range(n)],
        tensors=parse_batch_tensors({"tensors": tensors}, blobs, n),
    )
    return ctx


def test_context_outside_a_batch_has_no_tensors() -> None:
    ctx = Context("m", "/d", None, 8, None, "0.12.0")
    assert ctx.batch_tensor_names() == []
    with pytest.raises(KeyError, match=r"no collated batch tensor named 'x'; this batch has none"):
        ctx.get_batch_tensor("x")
    with pytest.raises(KeyError, match=r"model-config\.yaml"):
        ctx.get_batch_lengths("x")


def test_context_views_share_the_frame_memory() -> None:
    frame = bytearray(128)
    blobs = [memoryview(frame)[64:112], memoryview(frame)[0:24]]
    struct.pack_into("<3q", frame, 0, 4, 1, 0)
    ctx = context_with(
        {"x": x_entry(blob=0), "s": seq_entry(dtype="int32", shape=[3, 4], blob=0, lengths=1)},
        blobs,
        3,
    )
    x = ctx.get_batch_tensor("x")
    assert (x.dtype, x.shape) == (torch.float32, (3, 4))
    assert x.data_ptr() == address(blobs[0])
    x[1, 2] = 1.5  # writable, and writes land in the frame
    assert struct.unpack_from("<f", frame, 64 + (4 + 2) * 4) == (1.5,)
    s = ctx.get_batch_tensor("s")
    assert (s.dtype, s.shape) == (torch.int32, (3, 4))
    lengths = ctx.get_batch_lengths("s")
    assert lengths is not None and lengths.tolist() == [4, 1, 0]
    assert lengths.data_ptr() == address(frame)
    assert ctx.get_batch_lengths("x") is None
    assert ctx.get_batch_tensor("x") is not x  # a fresh view each call...
    assert ctx.get_batch_tensor("x").data_ptr() == x.data_ptr()  # ...of the same memory
    ctx.end_batch()
    assert ctx.batch_tensor_names() == []
    assert x[1, 2].item() == 1.5


def test_context_empty_and_read_only_buffers() -> None:
    ctx = context_with(
        {"e": {"dtype": "float16", "shape": [2, 0, 3], "blob": 0}}, [memoryview(b"")], 2
    )
    empty = ctx.get_batch_tensor("e")
    assert (empty.dtype, empty.shape) == (torch.float16, (2, 0, 3))
    ro = memoryview(struct.pack("<2d", 1.0, -2.0))
    ctx = context_with({"r": {"dtype": "float64", "shape": [2], "blob": 0}}, [ro], 2)
    assert ctx.get_batch_tensor("r").tolist() == [1.0, -2.0]  # copied: torch may write


def test_new_batch_replaces_the_tensors() -> None:
    blobs = [memoryview(bytearray(48))]
    ctx = context_with({"x": x_entry(blob=0)}, blobs, 3)
    assert ctx.batch_tensor_names() == ["x"]
    ctx.begin_batch(["a"], [{}])
    assert ctx.batch_tensor_names() == []
