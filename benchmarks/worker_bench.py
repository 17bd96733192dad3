"""The worker subprocess alone: CPU time per request outside the model, no HTTP server.

Builds the reference batched model (``handlers/batched``: MLP 256 -> 2048 -> 2048 -> 10,
TorchScript) into a ``.mar`` with the real ``trioserve archive`` command, unpacks it as the
server does, starts ``python -m trioserve.worker --fd N`` on one end of a Unix socket pair with
the environment the server gives it (``OMP_NUM_THREADS=1`` / ``MKL_NUM_THREADS=1``), sends the
LOAD frame the runtime sends, then N prebuilt BATCH frames of 16 requests, each built by the
runtime's own frame builder for a model with ``tensorInputs`` (per-request 1024-byte float32
bodies plus the collated ``[16, 256]`` tensor). One batch is in flight at a time, as the
runtime does it. The worker's CPU time (user + system, all threads, from psutil) over the
measured batches is divided by the answered requests and compared with:

- model alone: the same TorchScript model called in this process on batches of 16 with
  ``torch.set_num_threads(1)`` (CPU time per request);
- handler in-process: the handler's ``handle(data, context)`` called in this process on the
  same batches with a worker ``Context`` (model + the handler's pre/postprocessing).

    .venv/bin/python benchmarks/worker_bench.py [--batches 600] [--warmup 100]
        [--batch-size 16] [--hidden 2048] [--rounds 3] [--keep]

``--rounds`` repeats the worker measurement (same worker) and reports the median round; the
machine may be shared, so look at the spread too. Every answer is checked against the model
called in-process.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import psutil
import torch

# The model, its archive and the thread settings are batching_bench's (this folder is on
# sys.path when a benchmark runs as a script).
from batching_bench import (
    MODEL_NAME,
    NUM_FEATURES,
    REPO,
    THREAD_ENV,
    build_store,
    load_scripted,
)

from trioserve.archive import unpack_archive
from trioserve.core.frames import Frame, FrameDecoder, Kind, encode
from trioserve.core.messages import LoadSpec, Param, decode_reply, encode_load
from trioserve.core.request import InferenceRequest
from trioserve.core.tensor_inputs import parse_tensor_inputs
from trioserve.runtime.jobs import Job
from trioserve.runtime.tensor_frames import tensor_frame_builder

OCTET = "application/octet-stream"


# -- the model and its archive ------------------------------------------------------------------


def build_archive(workdir: Path, hidden: int) -> Path:
    """``batched.mar`` made with the real ``trioserve archive`` command (as batching_bench)."""
    return build_store(workdir, hidden) / f"{MODEL_NAME}.mar"


# -- batches ------------------------------------------------------------------------------------


class _FakeJob:
    """What the runtime's frame builder reads of a job (``Job`` needs a running trio loop)."""

    __slots__ = ("request",)

    def __init__(self, request: InferenceRequest) -> None:
        self.request = request


def request_for(body: bytes) -> InferenceRequest:
    """One request as the HTTP adapter builds it: the raw body, header names as ASGI has them."""
    headers = [
        ("host", "127.0.0.1:8080"),
        ("content-type", OCTET),
        ("content-length", str(len(body))),
    ]
    return InferenceRequest(
        model=MODEL_NAME,
        version=None,
        params=[Param("body", body, OCTET)],
        headers=headers,
        request_id=str(uuid.uuid4()),
    )


def build_frames(
    config: dict[str, Any], rows: torch.Tensor, batches: int, batch_size: int
) -> list[bytes | bytearray]:
    """``batches`` BATCH frames as the runtime builds them for this model config."""
    tensors = parse_tensor_inputs(config.get("tensorInputs"))
    build = tensor_frame_builder(tensors)
    bodies = [struct.pack(f"<{NUM_FEATURES}f", *row.tolist()) for row in rows]
    frames = []
    for batch_id in range(1, batches + 1):
        jobs = [
            _FakeJob(request_for(bodies[(batch_id * batch_size + i) % len(bodies)]))
            for i in range(batch_size)
        ]
        frames.append(build(batch_id, cast(list[Job], jobs)))
    return frames


# -- the worker process -------------------------------------------------------------------------


class WorkerClient:
    """A worker subprocess started the way the runtime's SubprocessLauncher starts it."""

    def __init__(self, model_dir: Path, extra_env: dict[str, str] | None = None) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = {**os.environ, **THREAD_ENV, **(extra_env or {})}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(model_dir), str(REPO), env.get("PYTHONPATH", "")) if p
        )
        env["TRIOSERVE_WORKER_NAME"] = "bench-worker"
        env.pop("TRIOSERVE_BATCH_LOG", None)
        self.log = open(model_dir.parent / "worker.log", "wb")  # noqa: SIM115
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "trioserve.worker", "--fd", str(child.fileno())],
                pass_fds=(child.fileno(),),
                cwd=str(model_dir),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=self.log,
                stderr=self.log,
            )
        finally:
            child.close()
        self.sock = parent
        self.decoder = FrameDecoder()
        self.pending: list[Frame] = []
        self.ps = psutil.Process(self.process.pid)

    def send(self, data: bytes | bytearray) -> None:
        self.sock.sendall(data)

    def next_frame(self) -> Frame:
        while not self.pending:
            data = self.sock.recv(1 << 20)
            if not data:
                raise RuntimeError("the worker closed the connection (see worker.log)")
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    def load(self, spec: LoadSpec, timeout: float = 120) -> None:
        self.sock.settimeout(timeout)
        self.send(encode_load(spec))
        while True:
            frame = self.next_frame()
            if frame.kind is Kind.LOAD_RESULT:
                if frame.meta.get("code") != 200:
                    raise RuntimeError(f"load failed: {frame.meta}")
                return

    def run_batch(self, frame: bytes | bytearray) -> list[bytes]:
        """Send one batch, return its final reply's bodies (metrics frames are skipped)."""
        self.send(frame)
        while True:
            got = self.next_frame()
            if got.kind is Kind.RESPONSE and got.final:
                reply = decode_reply(got)
                if reply.code != 200:
                    raise RuntimeError(
                        f"batch {reply.batch_id} failed: {reply.code} {reply.message}"
                    )
                return [bytes(r.body) for r in reply.replies]

    def drain_metrics(self) -> None:
        """Read the METRICS frame that follows the last final reply (with a short timeout)."""
        self.sock.settimeout(0.5)
        try:
            while True:
                frame = self.next_frame()
                if frame.kind is Kind.METRICS:
                    break
        except TimeoutError:
            pass
        finally:
            self.sock.settimeout(60)

    def cpu(self) -> float:
        times = self.ps.cpu_times()
        return times.user + times.system

    def close(self) -> None:
        try:
            self.send(encode(Kind.SHUTDOWN, {}))
            self.process.wait(20)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait(10)
        finally:
            self.sock.close()
            self.log.close()


# -- measurements -------------------------------------------------------------------------------


@dataclass
class Round:
    model_us: float  # CPU per request, model alone on batches of the batch size (in-process)
    handler_us: float  # CPU per request, the handler's handle() in-process
    path_us: float  # CPU per request, the worker's whole batch path in-process, no socket
    worker_us: float  # CPU per request in the worker subprocess, all threads
    trio_us: float  # ... of which its main (trio) thread
    wall_us: float  # wall time per request while driving the worker
    driver_us: float  # this process's CPU per request while driving the worker

    @property
    def overhead_us(self) -> float:
        return self.worker_us - self.model_us


def cpu_per_call(fn: Any, calls: int) -> float:
    """CPU seconds (this thread) per call of ``fn``."""
    start = time.thread_time()
    for _ in range(calls):
        fn()
    return (time.thread_time() - start) / calls


def handler_in_process(
    model_dir: Path, spec: LoadSpec, frames: list[bytes | bytearray]
) -> tuple[Any, Any]:
    """The handler's entry point, loaded in this process as the worker loads it; returns two
    functions: one runs one decoded batch through it the way the worker does, the other runs
    the worker's whole per-batch path (context and ``data``, the handler, the replies, the
    RESPONSE and METRICS frames) without the socket."""
    from trioserve.core.frames import Kind, decode, encode
    from trioserve.core.messages import decode_batch, encode_reply
    from trioserve.worker.tensors import parse_batch_tensors
    from trioserve.worker.torchserve.batch import prepare, run_batch
    from trioserve.worker.torchserve.context import Context
    from trioserve.worker.torchserve.loader import load_handler
    from trioserve.worker.torchserve.metrics import MetricsCache

    context = Context(
        spec.model_name,
        spec.model_dir,
        spec.manifest,
        spec.batch_size,
        None,
        "bench",
        metrics=MetricsCache(spec.model_name),
        model_yaml_config=spec.model_yaml_config,
    )
    entry = load_handler(spec.handler, str(model_dir), context, spec.envelope)
    frame = decode(bytearray(frames[0]))
    _, items = decode_batch(frame)
    tensors = parse_batch_tensors(frame.meta, frame.blobs, len(items))
    data = prepare(context, items, tensors=tensors)

    def call() -> None:
        entry(data, context)
        cast(MetricsCache, context.metrics).drain()

    def whole() -> None:
        # What the worker's handler thread does per batch, minus the socket write.
        batch = prepare(context, items, tensors=tensors)
        reply = run_batch(entry, context, 0, items, batch)
        context.end_batch()
        records = cast(MetricsCache, context.metrics).drain()
        encode_reply(reply) + encode(Kind.METRICS, {"metrics": records})

    return call, whole


def thread_cpu(client: WorkerClient) -> dict[int, float]:
    return {t.id: t.user_time + t.system_time for t in client.ps.threads()}


def start_py_spy(output: str, pid: int) -> subprocess.Popen[bytes]:
    """``py-spy record`` of the worker (not a dependency: ``pip install py-spy``), as collapsed
    stacks in ``output``; it adds its own sampling cost to the worker's CPU time."""
    spy = subprocess.Popen(
        [str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(pid),
         "--rate", "500", "--format", "raw", "--output", output, "--threads"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(1.0)
    return spy


def measure(args: argparse.Namespace, workdir: Path) -> list[Round]:
    mar = build_archive(workdir, args.hidden)
    loaded = unpack_archive(mar, workdir / "models")
    model_dir = loaded.model_dir
    config = dict(loaded.config.raw)
    spec = LoadSpec(
        model_name=MODEL_NAME,
        model_version="1.0",
        model_dir=str(model_dir),
        handler=loaded.manifest.handler or "batched_handler.py",
        batch_size=args.batch_size,
        envelope=loaded.manifest.envelope,
        manifest=loaded.manifest.raw or None,
        model_yaml_config=config,
    )
    rows = torch.randn(64, NUM_FEATURES, generator=torch.Generator().manual_seed(0))
    total = args.warmup + 1 + args.batches * args.rounds
    frames = build_frames(config, rows, total, args.batch_size)

    model = load_scripted(workdir / "build" / "model.pt")
    batch = rows[: args.batch_size].contiguous()
    with torch.inference_mode():
        expected = [int(c) for c in model(rows).argmax(dim=1).tolist()]

    def run_model() -> None:
        with torch.inference_mode():
            model(batch)

    call, whole = handler_in_process(model_dir, spec, frames)
    in_process_calls = max(20, args.batches // 4)
    cpu_per_call(run_model, 20)
    cpu_per_call(call, 20)
    cpu_per_call(whole, 20)

    client = WorkerClient(model_dir)
    rounds: list[Round] = []
    per = args.batch_size
    try:
        client.load(spec)
        client.sock.settimeout(60)
        position = 0
        for _ in range(args.warmup):
            client.run_batch(frames[position])
            position += 1
        bodies = client.run_batch(frames[position])
        position += 1  # that frame's batch id: its rows start at batch id * batch size
        for i, body in enumerate(bodies):
            answer = json.loads(body)
            want = expected[(position * per + i) % len(rows)]
            if answer.get("class") != want:
                raise RuntimeError(f"wrong answer {answer!r} to request {i}: class {want}")
        spy = start_py_spy(args.py_spy, client.process.pid) if args.py_spy else None
        for _ in range(args.rounds):
            # The model and the handler alone, right before the worker round: the machine
            # may be shared, so each round is compared with its own in-process figures.
            model_us = cpu_per_call(run_model, in_process_calls) / per * 1e6
            handler_us = cpu_per_call(call, in_process_calls) / per * 1e6
            path_us = cpu_per_call(whole, in_process_calls) / per * 1e6
            client.drain_metrics()
            threads0 = thread_cpu(client)
            cpu0, wall0, own0 = client.cpu(), time.perf_counter(), time.process_time()
            for _ in range(args.batches):
                client.run_batch(frames[position])
                position += 1
            client.drain_metrics()
            cpu1, wall1, own1 = client.cpu(), time.perf_counter(), time.process_time()
            threads1 = thread_cpu(client)
            requests = args.batches * per
            main_thread = client.process.pid
            trio_s = threads1.get(main_thread, 0.0) - threads0.get(main_thread, 0.0)
            rounds.append(
                Round(
                    model_us=model_us,
                    handler_us=handler_us,
                    path_us=path_us,
                    worker_us=(cpu1 - cpu0) / requests * 1e6,
                    trio_us=trio_s / requests * 1e6,
                    wall_us=(wall1 - wall0) / requests * 1e6,
                    driver_us=(own1 - own0) / requests * 1e6,
                )
            )
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
    finally:
        client.close()
    return rounds


def report(args: argparse.Namespace, rounds: list[Round]) -> None:
    print(
        f"handlers/batched MLP 256-{args.hidden}-{args.hidden}-10 (TorchScript), batches of "
        f"{args.batch_size} x 1024-byte float32 bodies (tensorInputs), 1 intra-op thread; "
        f"{args.rounds} rounds of {args.batches} batches after {args.warmup} warm-up; "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, torch {torch.__version__}"
    )
    print()
    print("CPU time per request (µs); the last row is the median of each column:")
    print(
        "| round  | model alone | handler in-process | batch path in-process | worker "
        "| of which trio thread | worker - model | wall / request | driver CPU |"
    )
    print(
        "|--------|------------:|-------------------:|----------------------:|-------:"
        "|--------------------:|---------------:|---------------:|-----------:|"
    )

    def row(name: str, r: Round) -> None:
        print(
            f"| {name:<6} | {r.model_us:>11.0f} | {r.handler_us:>18.0f} | {r.path_us:>21.0f} "
            f"| {r.worker_us:>6.0f} "
            f"| {r.trio_us:>19.0f} | {r.overhead_us:>14.0f} | {r.wall_us:>14.0f} "
            f"| {r.driver_us:>10.0f} |"
        )

    for i, r in enumerate(rounds, 1):
        row(str(i), r)
    med = statistics.median
    row(
        "median",
        Round(
            med(r.model_us for r in rounds),
            med(r.handler_us for r in rounds),
            med(r.path_us for r in rounds),
            med(r.worker_us for r in rounds),
            med(r.trio_us for r in rounds),
            med(r.wall_us for r in rounds),
            med(r.driver_us for r in rounds),
        ),
    )
    overhead = med(r.overhead_us for r in rounds)
    print()
    print(
        f"worker CPU outside the model: {overhead:.0f} µs per request (median of the rounds' "
        f"differences), {overhead * args.batch_size / 1000:.2f} ms per batch"
    )
    ceiling = med(r.model_us / r.path_us for r in rounds)
    print(
        f"model alone / batch path in-process: {ceiling:.1%} (median of the rounds): the "
        "share of the model's own throughput that the worker's per-batch Python leaves, "
        "before any socket, server or client"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=300, help="batches per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--py-spy", metavar="FILE", help="profile the worker into FILE")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (worker.log)")
    args = parser.parse_args(argv)

    os.environ.update(THREAD_ENV)
    torch.set_num_threads(1)
    workdir = Path(tempfile.mkdtemp(prefix="trioserve-worker-bench-"))
    try:
        rounds = measure(args, workdir)
    finally:
        if args.keep:
            print(f"work folder kept: {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    report(args, rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
