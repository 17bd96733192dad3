"""The real worker subprocess (``python -m trioserve.worker --fd N``) over a socketpair.

Plain ``subprocess`` and blocking sockets with timeouts; every process started here is
killed and reaped at teardown.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import warnings
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trioserve.core.frames import Frame, FrameDecoder, Kind, encode
from trioserve.core.messages import (
    BatchReply,
    LoadSpec,
    Param,
    WorkItem,
    decode_reply,
    encode_batch,
    encode_cancel,
    encode_load,
)

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "worker"
TIMEOUT = 20.0


class WorkerProcess:
    def __init__(self, model_dir: Path, log_dir: Path) -> None:
        server_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        self.stdout_path = log_dir / "worker.stdout"
        self.stderr_path = log_dir / "worker.stderr"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "trioserve.worker", "--fd", str(worker_end.fileno())],
                pass_fds=[worker_end.fileno()],
                cwd=model_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
            )
        worker_end.close()
        self.sock = server_end
        self.sock.settimeout(TIMEOUT)
        self.decoder = FrameDecoder()
        self.frames: deque[Frame] = deque()
        self.model_dir = model_dir

    # -- frames -------------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, timeout: float = TIMEOUT) -> Frame:
        deadline = time.monotonic() + timeout
        while not self.frames:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no frame from the worker in time")
            self.sock.settimeout(left)
            data = self.sock.recv(1 << 20)
            if not data:
                raise EOFError(f"worker closed the socket; stderr:\n{self.stderr()}")
            self.frames.extend(self.decoder.feed(data))
        return self.frames.popleft()

    def reply(self, timeout: float = TIMEOUT) -> BatchReply:
        frame = self.recv(timeout)
        assert frame.kind is Kind.RESPONSE, frame
        return decode_reply(frame)

    def final(self) -> BatchReply:
        """The next final RESPONSE, skipping METRICS frames of earlier batches."""
        while True:
            frame = self.recv()
            if frame.kind is Kind.METRICS:
                continue
            assert frame.kind is Kind.RESPONSE, frame
            reply = decode_reply(frame)
            assert reply.final
            return reply

    def load(self, handler: str, **spec: Any) -> dict[str, Any]:
        load = LoadSpec("model", "1.0", str(self.model_dir), handler, **spec)
        self.send(encode_load(load))
        frame = self.recv(60)
        assert frame.kind is Kind.LOAD_RESULT, frame
        return frame.meta

    def wait(self, timeout: float = TIMEOUT) -> int:
        return self.proc.wait(timeout)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def close(self) -> None:
        self.sock.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(TIMEOUT)


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Any]:
    started: list[WorkerProcess] = []

    def start(model_dir: Path | None = None) -> WorkerProcess:
        log_dir = tmp_path / f"logs{len(started)}"
        log_dir.mkdir()
        directory = model_dir or tmp_path
        worker = WorkerProcess(directory, log_dir)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.close()


def fixture(name: str) -> str:
    return str(FIXTURES / name)


def item(rid: str, params: list[Param], **headers: str) -> WorkItem:
    return WorkItem(rid, list(headers.items()), params)


def body(value: bytes, content_type: str | None = "application/json") -> list[Param]:
    return [Param("body", value, content_type)]


# -- loading ----------------------------------------------------------------------------------


def test_load_ok_and_ping(spawn: Any) -> None:
    worker = spawn()
    assert worker.load(fixture("fx_echo.py")) == {"code": 200, "message": "loaded"}
    worker.send(encode(Kind.PING, {"n": 3}))
    pong = worker.recv()
    assert (pong.kind, pong.meta) == (Kind.PONG, {"n": 3})


def test_load_failure_reports_and_exits_1(spawn: Any) -> None:
    worker = spawn()
    result = worker.load(fixture("fx_bad_init.py"))
    assert result["code"] == 500
    assert result["message"] == "RuntimeError: boom at load"
    assert worker.wait() == 1
    assert "Traceback" in worker.stderr()


def test_load_out_of_memory_is_507(spawn: Any) -> None:
    worker = spawn()
    assert worker.load(fixture("fx_oom_init.py")) == {
        "code": 507,
        "message": "System out of memory",
    }
    assert worker.wait() == 1


def test_load_with_unsupported_envelope(spawn: Any) -> None:
    worker = spawn()
    result = worker.load(fixture("fx_echo.py"), envelope="kservev3")
    assert result["code"] == 500
    assert "envelope 'kservev3' is not supported" in result["message"]
    assert worker.wait() == 1


# -- batches ----------------------------------------------------------------------------------


def test_batch_of_three_with_json_text_and_bytes(spawn: Any) -> None:
    worker = spawn()
    worker.load(fixture("fx_echo.py"), batch_size=3)
    items = [
        item("r-json", body(b'{"x": [1, 2]}'), **{"Content-Type": "application/json"}),
        item("r-text", [Param("data", "h\u00e9".encode(), "text/plain; charset=utf-8")]),
        item("r-bytes", [Param("file", b"\x00\xff", "application/octet-stream")], custom="v"),
    ]
    worker.send(encode_batch(1, items))
    reply = worker.reply()
    assert (reply.batch_id, reply.code, reply.message, reply.final) == (
        1,
        200,
        "Prediction success",
        True,
    )
    answers = [json.loads(bytes(r.body)) for r in reply.replies]
    assert [r.request_id for r in reply.replies] == ["r-json", "r-text", "r-bytes"]
    assert [a["request_id"] for a in answers] == ["r-json", "r-text", "r-bytes"]
    assert answers[0]["params"] == {"body": {"type": "dict", "value": {"x": [1, 2]}}}
    assert answers[1]["params"] == {"data": {"type": "str", "value": "h\u00e9"}}
    assert answers[2]["params"] == {"file": {"type": "bytearray", "value": "00ff"}}
    assert answers[0]["headers"] == {
        "body": {"content-type": "application/json"},
        "Content-Type": "application/json",
    }
    assert answers[2]["headers"] == {
        "file": {"content-type": "application/octet-stream"},
        "custom": "v",
    }
    assert [a["cancelled"] for a in answers] == [False, False, False]

    metrics = worker.recv()
    assert metrics.kind is Kind.METRICS
    names = {m["name"]: m for m in metrics.meta["metrics"]}
    assert set(names) == {"EchoCount", "PredictionTime"}
    assert names["EchoCount"]["value"] == 3
    assert names["EchoCount"]["request_id"] == "r-json,r-text,r-bytes"


def test_metrics_of_batches_queued_back_to_back_share_a_frame_and_none_is_lost(
    spawn: Any,
) -> None:
    worker = spawn()
    worker.load(fixture("fx_echo.py"))
    # Batch 1 sleeps; batches 2..7 queue behind it in the handler thread meanwhile.
    worker.send(encode_batch(1, [item("slow", body(b"1"), mode="sleep", seconds="0.3")]))
    for n in range(2, 8):
        worker.send(encode_batch(n, [item(f"r{n}", body(b"1"))]))
    answered: list[int] = []
    counted: list[str] = []  # the request ids of every EchoCount record
    metrics_frames = 0
    while len(answered) < 7 or worker.frames or metrics_frames == 0:
        frame = worker.recv()
        if frame.kind is Kind.METRICS:
            metrics_frames += 1
            counted += [m["request_id"] for m in frame.meta["metrics"] if m["name"] == "EchoCount"]
            if len(answered) == 7:
                break
        else:
            answered.append(decode_reply(frame).batch_id)
    assert answered == list(range(1, 8))
    assert counted == ["slow"] + [f"r{n}" for n in range(2, 8)]  # each batch's, once
    # Not one frame per batch: the six quick ones were answered while others were queued.
    assert metrics_frames <= 3


def test_raw_answers_carry_status_headers_and_content_type(spawn: Any) -> None:
    worker = spawn()
    worker.load(fixture("fx_echo.py"))
    items = [
        item("a", body(b'{"k": 1}'), mode="raw"),
        item("b", body(b"text", "text/plain")),
        item("c", body(b"\x01\x02", None)),
    ]
    worker.send(encode_batch(2, items))
    reply = worker.reply()
    assert [bytes(r.body) for r in reply.replies] == [b'{\n  "k": 1\n}', b"text", b"\x01\x02"]
    assert [(r.status, r.reason) for r in reply.replies] == [
        (201, "made 0"),
        (202, "made 1"),
        (203, "made 2"),
    ]
    assert [r.content_type for r in reply.replies] == ["test/0", "test/1", "test/2"]
    assert [r.headers for r in reply.replies] == [{"x-idx": "0"}, {"x-idx": "1"}, {"x-idx": "2"}]


def test_streaming_frames_arrive_before_the_final(spawn: Any) -> None:
    worker = spawn()
    worker.load(fixture("fx_stream.py"))
    worker.send(encode_batch(5, [item("s0", body(b"1")), item("s1", body(b"2"))]))
    chunks = []
    for _ in range(3):
        frame = worker.reply()
        assert not frame.final
        assert (frame.batch_id, frame.code, frame.message) == (5, 200, "Intermediate")
        assert [r.content_type for r in frame.replies] == ["text/plain", "text/plain"]
        chunks.append([(r.request_id, bytes(r.body)) for r in frame.replies])
    assert chunks == [
        [("s0", b"chunk0-0"), ("s1", b"chunk0-1")],
        [("s0", b"chunk1-0"), ("s1", b"chunk1-1")],
        [("s0", b"chunk2-0"), ("s1", b"chunk2-1")],
    ]
    final = worker.reply()
    assert final.final
    assert [bytes(r.body) for r in final.replies] == [b"last-0", b"last-1"]


def test_handler_exception_is_503_and_worker_survives(spawn: Any) -> None:
    worker = spawn()
    worker.load(fixture("fx_echo.py"))
    worker.send(encode_batch(1, [item("x", body(b"1"), mode="fail"), item("y", body(b"2"))]))
    failed = worker.final()
    assert (failed.code, failed.message, failed.replies) == (503, "Prediction failed", [])
    worker.send(encode_batch(2, [item("z", body(b"3"))]))
    ok = worker.final()
    assert (ok.batch_id, ok.code, len(ok.replies)) == (2, 200, 1)
    stderr = worker.stderr()
    assert "Traceback" in stderr
    assert "RuntimeError: boom in handle" in stderr


@pytest.mark.parametrize(
    ("mode", "code", "message"),
    [
        ("predexc", 418, "teapot says no"),
        ("short", 503, "number of batch response mismatched"),
        ("notlist", 503, "Invalid model predict output"),
        ("oom", 507, "Out of resources"),
        ("cuda", 507, "Out of resources"),
        ("unserializable", 503, "Unsupported model output data type."),
    ],
)
def test_batch_level_error_codes(spawn: Any, mode: str, code: int, message: str) -> None:
    worker = spawn()
    worker.load(fixture("fx_echo.py"))
    worker.send(encode_batch(1, [item("a", body(b"1"), mode=mode), item("b", body(b"2"))]))
    reply = worker.final()
    assert (reply.batch_id, reply.code, reply.message, reply.replies) == (1, code, message, [])


def test_cancel_is_seen_by_is_cancelled(spawn: Any) -> None:
    worker = spawn()
    worker.load(fixture("fx_stream.py"))
    worker.send(encode_batch(1, [item("c0", body(b"1"), mode="cancel")]))
    started = worker.reply()
    assert not started.final
    worker.send(encode_cancel(["c0"]))
    final = worker.reply()
    assert final.final
    assert [bytes(r.body) for r in final.replies] == [b"cancelled"]


def test_a_batch_cancelled_before_it_starts_never_reaches_the_handler(spawn: Any) -> None:
    """A batch sent behind a running one (prefetch) whose requests are all cancelled while it
    waits is answered without running the handler; one partly cancelled still runs."""
    worker = spawn()
    worker.load(fixture("fx_echo.py"))
    worker.send(encode_batch(1, [item("s", body(b"1"), mode="sleep", seconds="0.5")]))
    worker.send(encode_batch(2, [item("gone", body(b"2"), mode="fail")]))
    worker.send(encode_batch(3, [item("kept", body(b"3")), item("half", body(b"4"))]))
    worker.send(encode_cancel(["gone", "half"]))
    first, second, third = worker.final(), worker.final(), worker.final()
    assert (first.batch_id, first.code) == (1, 200)
    # "fail" would have made the handler raise (a 503 naming the error); it never ran
    assert (second.batch_id, second.code) == (2, 503)
    assert second.message == "every request was cancelled before it ran"
    assert (third.batch_id, third.code) == (3, 200)
    described = [json.loads(bytes(r.body)) for r in third.replies]
    assert [(d["request_id"], d["cancelled"]) for d in described] == [
        ("kept", False),
        ("half", True),
    ]
    assert "boom" not in worker.stderr()


def test_ping_is_answered_while_the_handler_is_busy(spawn: Any) -> None:
    worker = spawn()
    worker.load(fixture("fx_echo.py"))
    worker.send(encode_batch(1, [item("s", body(b"1"), mode="sleep", seconds="3")]))
    time.sleep(0.2)
    start = time.monotonic()
    worker.send(encode(Kind.PING, {"n": 9}))
    pong = worker.recv(timeout=2)
    assert (pong.kind, pong.meta) == (Kind.PONG, {"n": 9})
    assert time.monotonic() - start < 1.5
    assert worker.final().code == 200


def test_shutdown_finishes_the_batch_and_exits_0(spawn: Any) -> None:
    worker = spawn()
    worker.load(fixture("fx_echo.py"))
    worker.send(encode_batch(1, [item("s", body(b"1"), mode="sleep", seconds="0.5")]))
    worker.send(encode(Kind.SHUTDOWN, {}))
    reply = worker.reply()
    assert (reply.code, [bytes(r.body) for r in reply.replies]) == (200, [b"slept"])
    assert worker.wait() == 0


def test_closing_the_socket_ends_the_worker_even_mid_handler(spawn: Any) -> None:
    worker = spawn()
    worker.load(fixture("fx_echo.py"))
    worker.send(encode_batch(1, [item("s", body(b"1"), mode="sleep", seconds="60")]))
    time.sleep(0.3)
    assert worker.proc.poll() is None
    start = time.monotonic()
    worker.sock.close()
    assert worker.wait(timeout=5) == 0
    assert time.monotonic() - start < 3


def test_torchscript_model_through_base_handler(spawn: Any, tmp_path: Path) -> None:
    import torch

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    torch.manual_seed(0)
    linear = torch.nn.Linear(3, 2).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit is deprecated
        torch.jit.save(torch.jit.script(linear), str(model_dir / "model.pt"))
    rows = [[1.0, 2.0, 3.0], [-1.0, 0.0, 0.5]]
    with torch.no_grad():
        want = linear(torch.tensor(rows)).tolist()

    worker = spawn(model_dir)
    manifest = {"model": {"modelName": "tiny", "serializedFile": "model.pt", "handler": "x"}}
    assert worker.load("base_handler", manifest=manifest, batch_size=2)["code"] == 200
    items = [item(f"t{i}", body(json.dumps(row).encode())) for i, row in enumerate(rows)]
    worker.send(encode_batch(1, items))
    reply = worker.reply()
    assert reply.code == 200, reply.message
    got = [json.loads(bytes(r.body)) for r in reply.replies]
    for got_row, want_row in zip(got, want, strict=True):
        assert got_row == pytest.approx(want_row)
    metrics = worker.recv()
    assert {m["name"] for m in metrics.meta["metrics"]} == {"HandlerTime", "PredictionTime"}


# -- parent death ------------------------------------------------------------------------------

PR_SET_CHILD_SUBREAPER = 36


def _set_subreaper(on: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def test_worker_exits_when_its_parent_dies(tmp_path: Path) -> None:
    """A middle process starts the worker and dies; the worker must notice and exit.

    This test process is made a child subreaper, so the orphaned worker is re-parented to
    it (its parent pid changes) and can be reaped here rather than left to init.
    """
    server_end, worker_end = socket.socketpair()
    server_end.settimeout(TIMEOUT)
    launcher = textwrap.dedent(
        f"""
        import subprocess, sys
        proc = subprocess.Popen(
            [sys.executable, "-m", "trioserve.worker", "--fd", "{worker_end.fileno()}"],
            pass_fds=[{worker_end.fileno()}], cwd={str(tmp_path)!r},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        print(proc.pid, flush=True)
        sys.stdin.read()  # exit (orphaning the worker) when the test closes stdin
        """
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    _set_subreaper(True)
    middle = None
    worker_pid = None
    try:
        middle = subprocess.Popen(
            [sys.executable, "-c", launcher],
            pass_fds=[worker_end.fileno()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        worker_end.close()
        assert middle.stdout is not None and middle.stdin is not None
        worker_pid = int(middle.stdout.readline().strip())
        # Make sure the worker is up (and has seen its first parent) before orphaning it.
        server_end.sendall(encode_load(LoadSpec("m", "1", str(tmp_path), fixture("fx_echo.py"))))
        decoder = FrameDecoder()
        frames: list[Frame] = []
        while not frames:
            frames = decoder.feed(server_end.recv(1 << 16))
        assert frames[0].meta["code"] == 200
        middle.stdin.close()
        assert middle.wait(TIMEOUT) == 0
        # The server end stays open: only the parent's death can end the worker.
        deadline = time.monotonic() + 10
        status = None
        while time.monotonic() < deadline:
            pid, status = os.waitpid(worker_pid, os.WNOHANG)
            if pid == worker_pid:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the worker outlived its parent by more than 10 s")
        assert status is not None
        assert os.waitstatus_to_exitcode(status) == 1
        worker_pid = None
    finally:
        if middle is not None:
            if middle.poll() is None:
                middle.kill()
                middle.wait(TIMEOUT)
            for pipe in (middle.stdin, middle.stdout):
                if pipe is not None:
                    pipe.close()
        if worker_pid is not None:
            try:
                os.kill(worker_pid, 9)
                os.waitpid(worker_pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        _set_subreaper(False)
        server_end.close()
