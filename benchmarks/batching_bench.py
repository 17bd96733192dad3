"""Dynamic batching end to end: the reference batched model through trioserve vs in-process.

Builds the reference model (``handlers/batched``: an MLP 256 -> 2048 -> 2048 -> 10, TorchScript)
into a model store with ``trioserve archive`` (its ``model-config.yaml``: ``batchSize: 16``,
``maxBatchDelay: 50``, one worker), starts a real trioserve process on loopback with token
authorization off, and measures, from one run each:

- serving: HTTP ``POST /predictions/batched`` at concurrency 64 (1024-byte float32 bodies)
  vs the same TorchScript model called in this process on batches of 16. Target: the server
  reaches at least 85% of the in-process throughput.
- light load: concurrency 1 (the window is the config's 50 ms): median and p90 latency through
  the server vs the model's own time for one request in-process. Target: the median within
  2 ms of the model's own time.

    .venv/bin/python benchmarks/batching_bench.py [--requests 20000] [--duration 15]
        [--concurrency 64] [--light-requests 1000] [--light-duration 10]
        [--hidden 2048 [4096 ...]] [--rounds 5] [--keep]

``--hidden`` runs everything again for wider variants of the same MLP (built by the same
``make_model.py``), to show how the ratio depends on the model's cost per request: the server's
own CPU time per request is a fixed cost that a cheap model cannot hide. A second table splits
the serving phase's CPU time per answered request between the server process, its worker and
this process (the load generator), next to the model's own time per request in a batch of 16.

Thread settings are the same on both sides: one intra-op thread (``torch.set_num_threads(1)``
here, ``OMP_NUM_THREADS=1`` / ``MKL_NUM_THREADS=1`` in the server's environment, which its
worker inherits). The machine's speed drifts within minutes, so each model is measured in
``--rounds`` rounds (5): in-process (while the server sits idle), then through the server,
seconds apart; the request counts and durations are split between the rounds, every round is
printed and the verdicts use the median round.

The load generator is a minimal keep-alive HTTP/1.1 client: one thread, one epoll set, one
non-blocking socket per concurrent caller, requests prebuilt, every answer's status and class
checked. It is kept light because it shares the machine's CPUs with the server and its worker
(an asyncio streams client cost about twice its CPU per request; ``wrk`` gave the same
throughput).
The worker appends every batch size it sees to ``TRIOSERVE_BATCH_LOG``; the tables quote the
batches formed in each phase. Every phase is bounded by a request count and a time limit.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import platform
import select
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch

from trioserve.launch import launch, stop

REPO = Path(__file__).resolve().parents[1]
MODEL_DIR = REPO / "handlers" / "batched"
MODEL_NAME = "batched"
BATCH_SIZE = 16
NUM_FEATURES = 256
REFERENCE_HIDDEN = 2048
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


# -- the model ------------------------------------------------------------------------------


def build_model(dest: Path, hidden: int) -> Path:
    """``handlers/batched/make_model.py``'s ``build(dest)`` (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location("batched_make_model", MODEL_DIR / "make_model.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {MODEL_DIR / 'make_model.py'}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path: Path = module.build(dest, hidden)
    return path


def load_scripted(path: Path) -> Any:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, message=r".*torch\.jit")
        model = torch.jit.load(str(path), map_location="cpu")
    return model.eval()


def inputs(count: int) -> torch.Tensor:
    return torch.randn(count, NUM_FEATURES, generator=torch.Generator().manual_seed(0))


@dataclass
class InProcess:
    batch_seconds: float  # median time of one batch of 16
    batches: int
    rate: float  # requests per second on batches of 16
    single_seconds: list[float]  # one request, one call each

    @property
    def single_median(self) -> float:
        return statistics.median(self.single_seconds)


def measure_in_process(model: Any, duration: float, single_calls: int) -> InProcess:
    """The model alone: batches of 16 back to back, then single requests one at a time."""
    batch = inputs(BATCH_SIZE)
    one = inputs(1)
    with torch.inference_mode():
        for _ in range(20):
            model(batch)
            model(one)
        times: list[float] = []
        began = time.perf_counter()
        while time.perf_counter() - began < duration:
            start = time.perf_counter()
            model(batch)
            times.append(time.perf_counter() - start)
        elapsed = time.perf_counter() - began
        single: list[float] = []
        deadline = time.perf_counter() + duration
        while len(single) < single_calls and time.perf_counter() < deadline:
            start = time.perf_counter()
            model(one)
            single.append(time.perf_counter() - start)
    return InProcess(
        statistics.median(times), len(times), len(times) * BATCH_SIZE / elapsed, single
    )


def expected_classes(model: Any, rows: torch.Tensor) -> list[int]:
    with torch.inference_mode():
        return [int(c) for c in model(rows).argmax(dim=1).tolist()]


# -- the server -----------------------------------------------------------------------------


@dataclass
class Server:
    workdir: Path
    process: subprocess.Popen[bytes]
    port: int
    batch_log: Path

    def stop(self) -> None:
        stop(self.process)


def build_store(workdir: Path, hidden: int) -> Path:
    """``batched.mar`` built with the real ``trioserve archive`` command."""
    weights = build_model(workdir / "build", hidden)
    store = workdir / "store"
    store.mkdir()
    subprocess.run(
        [sys.executable, "-m", "trioserve", "archive", "--model-name", MODEL_NAME, "-v", "1.0",
         "--handler", str(MODEL_DIR / "batched_handler.py"),
         "--serialized-file", str(weights),
         "--config-file", str(MODEL_DIR / "model-config.yaml"),
         "--export-path", str(store), "-f"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return store


def start_server(workdir: Path, store: Path, timeout: float = 120) -> Server:
    """``trioserve start --foreground``, as tests/e2e/server.py starts it: every listener on a
    free loopback port, token authorization off, READY reported on a pipe."""
    batch_log = workdir / "batches.log"
    config = workdir / "config.properties"
    config.write_text(
        "inference_address=http://127.0.0.1:0\n"
        "management_address=http://127.0.0.1:0\n"
        "metrics_address=http://127.0.0.1:0\n"
        "grpc_inference_port=0\ngrpc_management_port=0\n"
        "disable_token_authorization=true\n"
        f"model_store={store}\nload_models={MODEL_NAME}={MODEL_NAME}.mar\n"
        "default_workers_per_model=1\ndefault_startup_timeout=60\n"
    )
    launched = launch(
        [sys.executable, "-m", "trioserve", "start", "--foreground", "--ts-config", str(config)],
        log_path=workdir / "server.log",
        cwd=workdir,
        env={**os.environ, **THREAD_ENV, "TRIOSERVE_BATCH_LOG": str(batch_log)},
        timeout=timeout,
    )
    process, report = launched.process, "\n".join(launched.report)
    if not launched.ready:
        Server(workdir, process, 0, batch_log).stop()
        raise RuntimeError(f"server did not start: {report!r}; see {workdir}/server.log")
    return Server(workdir, process, launched.port("inference"), batch_log)


def batch_sizes(server: Server) -> list[int]:
    """Every batch size the worker has logged so far."""
    try:
        text = server.batch_log.read_text()
    except FileNotFoundError:
        return []
    return [int(line) for line in text.split()]


# -- the load generator ---------------------------------------------------------------------


class HttpCaller:
    """POST /predictions/batched over one keep-alive HTTP/1.1 connection, one request at a
    time; the body is one prebuilt float32 row and the answer's class is checked against the
    in-process model. Driven by :func:`run_load`'s epoll loop (non-blocking socket)."""

    def __init__(self, port: int, body: bytes, expected_class: int) -> None:
        self._port = port
        self._request = (
            f"POST /predictions/{MODEL_NAME} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            "Content-Type: application/octet-stream\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        self._expected = expected_class
        self.sock: socket.socket | None = None
        self._buffer = b""
        self.began = 0.0

    def connect(self) -> socket.socket:
        if self.sock is None:
            sock = socket.create_connection(("127.0.0.1", self._port), timeout=10)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            self.sock = sock
        return self.sock

    def send(self) -> None:
        """Send the request (it fits the socket buffer of a connection with nothing queued)."""
        self.began = time.perf_counter()
        self._buffer = b""
        sent = self.connect().send(self._request)
        if sent != len(self._request):
            raise RuntimeError(f"short send: {sent} of {len(self._request)} bytes")

    def receive(self) -> bool:
        """Read what has arrived; True once the whole answer is in and checked."""
        assert self.sock is not None
        data = self.sock.recv(65536)
        if not data:
            raise RuntimeError("the server closed the connection")
        self._buffer += data
        head_end = self._buffer.find(b"\r\n\r\n")
        if head_end < 0:
            return False
        head = self._buffer[:head_end]
        length = -1
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if length < 0:
            raise RuntimeError("response without Content-Length")
        body = self._buffer[head_end + 4 :]
        if len(body) < length:
            return False
        status = head.split(b" ", 2)[1]
        if status != b"200":
            raise RuntimeError(f"HTTP {status.decode()}: {body[:200]!r}")
        answer = json.loads(body[:length])
        if answer.get("class") != self._expected:
            raise RuntimeError(f"wrong answer {answer!r}, expected class {self._expected}")
        return True

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()


@dataclass
class Load:
    name: str
    concurrency: int
    issued: int
    seconds: float
    latencies: list[float]
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    batches: list[int] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else 0.0

    @property
    def median(self) -> float:
        return statistics.median(self.latencies) if self.latencies else float("nan")

    def quantile(self, q: float) -> float:
        return percentile(self.latencies, q)

    def batch_cell(self) -> str:
        """``batches, mean size`` for a table cell."""
        if not self.batches:
            return "none logged"
        return f"{len(self.batches)}, {statistics.fmean(self.batches):.1f}"


def histogram(sizes: list[int]) -> str:
    counts = collections.Counter(sizes)
    return ", ".join(f"{n} x {size}" for size, n in sorted(counts.items(), reverse=True))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def run_load(name: str, callers: list[HttpCaller], requests: int, duration: float) -> Load:
    """Each caller sends its next request as soon as its answer is in, until ``requests``
    were sent or ``duration`` passed; one thread, one epoll set, so the generator costs the
    server's shared CPUs as little as it can. A failed request's connection is reopened."""
    latencies: list[float] = []
    errors: collections.Counter[str] = collections.Counter()
    issued = 0
    began = time.perf_counter()
    deadline = began + duration
    poller = select.epoll()
    waiting: dict[int, HttpCaller] = {}  # by socket: callers with a request out
    registered: set[int] = set()  # sockets stay in the epoll set while they are open

    def drop(call: HttpCaller) -> None:
        if call.sock is not None:
            fd = call.sock.fileno()
            waiting.pop(fd, None)
            if fd in registered:
                registered.discard(fd)
                poller.unregister(fd)
        call.close()

    def issue(call: HttpCaller) -> None:
        nonlocal issued
        while issued < requests and time.perf_counter() < deadline:
            issued += 1
            try:
                call.send()
            except (OSError, RuntimeError) as exc:
                errors[str(exc)[:120] or type(exc).__name__] += 1
                drop(call)
                continue
            assert call.sock is not None
            fd = call.sock.fileno()
            waiting[fd] = call
            if fd not in registered:
                registered.add(fd)
                poller.register(fd, select.EPOLLIN)
            return

    try:
        for call in callers:
            issue(call)
        while waiting:
            left = deadline + 30 - time.perf_counter()  # answers to requests already sent
            events = poller.poll(max(0.0, min(left, 1.0)))
            if not events and left <= 0:
                for call in list(waiting.values()):
                    drop(call)
                    errors["no answer in time"] += 1
                break
            for fd, _ in events:
                if fd not in waiting:  # an idle connection closed by the server
                    drop(next(c for c in callers if c.sock and c.sock.fileno() == fd))
                    continue
                call = waiting.pop(fd)
                try:
                    if not call.receive():
                        waiting[fd] = call
                        continue
                except (OSError, RuntimeError, ValueError) as exc:
                    drop(call)  # the server closes the connection after an error response
                    errors[str(exc)[:120] or type(exc).__name__] += 1
                else:
                    latencies.append(time.perf_counter() - call.began)
                issue(call)
    finally:
        for call in callers:
            if call.sock is not None and call.sock.fileno() in registered:
                poller.unregister(call.sock.fileno())
        poller.close()
    return Load(name, len(callers), issued, time.perf_counter() - began, latencies, errors)


def cpu_seconds(server: Server) -> dict[str, float]:
    """CPU time used so far by the server process, its workers and this process."""
    used = {"trioserve": 0.0, "worker": 0.0, "generator": 0.0}
    try:
        main = psutil.Process(server.process.pid)
        processes = [("trioserve", main)] + [("worker", p) for p in main.children(recursive=True)]
    except psutil.NoSuchProcess:
        processes = []
    for role, process in [*processes, ("generator", psutil.Process())]:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        used[role] += times.user + times.system
    return used


def make_callers(server: Server, model: Any, concurrency: int) -> list[HttpCaller]:
    rows = inputs(concurrency)
    classes = expected_classes(model, rows)
    bodies = [struct.pack(f"<{NUM_FEATURES}f", *row.tolist()) for row in rows]
    return [HttpCaller(server.port, body, cls) for body, cls in zip(bodies, classes, strict=True)]


@dataclass
class Round:
    """One round: the model in-process, then through the server, seconds apart."""

    local: InProcess
    serving: Load
    light: Load
    cpu_us: dict[str, float]  # CPU time per answered request in the serving phase, by process

    @property
    def ratio(self) -> float:
        return self.serving.rate / self.local.rate if self.local.rate else 0.0

    @property
    def extra_ms(self) -> float:
        return (self.light.median - self.local.single_median) * 1e3


def measure_round(
    server: Server, callers: list[HttpCaller], model: Any, args: argparse.Namespace
) -> Round:
    requests = max(1, args.requests // args.rounds)
    duration = args.duration / args.rounds
    light_requests = max(1, args.light_requests // args.rounds)
    light_duration = args.light_duration / args.rounds
    # The server is idle meanwhile (its worker waits on its socket).
    local = measure_in_process(model, min(duration, 3.0), light_requests)
    logged = len(batch_sizes(server))
    before = cpu_seconds(server)
    serving = run_load("serving", callers, requests, duration)
    after = cpu_seconds(server)
    serving.batches = batch_sizes(server)[logged:]
    answered = max(1, len(serving.latencies))
    cpu = {role: (after[role] - before[role]) / answered * 1e6 for role in after}
    logged = len(batch_sizes(server))
    light = run_load("light load", callers[:1], light_requests, light_duration)
    light.batches = batch_sizes(server)[logged:]
    return Round(local, serving, light, cpu)


# -- one model, end to end ----------------------------------------------------------------


@dataclass
class Run:
    hidden: int
    rounds: list[Round]

    @property
    def ratio(self) -> float:
        return statistics.median(r.ratio for r in self.rounds)

    @property
    def extra_ms(self) -> float:
        return statistics.median(r.extra_ms for r in self.rounds)

    def errors(self) -> int:
        return sum(
            sum(r.serving.errors.values()) + sum(r.light.errors.values()) for r in self.rounds
        )

    def batches(self, phase: str) -> list[int]:
        return [size for r in self.rounds for size in getattr(r, phase).batches]


def bench_model(hidden: int, args: argparse.Namespace) -> Run:
    workdir = Path(tempfile.mkdtemp(prefix="trioserve-batching-"))
    try:
        store = build_store(workdir, hidden)
        model = load_scripted(workdir / "build" / "model.pt")
        server = start_server(workdir, store)
        callers: list[HttpCaller] = []
        try:
            callers = make_callers(server, model, args.concurrency)
            # Warm-up: connections, the worker's TorchScript profiling runs, every batch shape.
            run_load("warm-up", callers, max(500, args.concurrency * 8), args.duration)
            run_load("warm-up", callers[:1], 100, args.light_duration)
            rounds = [measure_round(server, callers, model, args) for _ in range(args.rounds)]
        finally:
            for caller in callers:
                caller.close()
            server.stop()
    finally:
        if args.keep:
            print(f"work folder kept: {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return Run(hidden, rounds)


# -- report ---------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def model_name(hidden: int) -> str:
    reference = " (reference)" if hidden == REFERENCE_HIDDEN else ""
    return f"256-{hidden}-{hidden}-10{reference}"


def report(args: argparse.Namespace, runs: list[Run]) -> None:
    ms = 1e3
    print(
        f"handlers/batched MLP (TorchScript, float32), batchSize {BATCH_SIZE}, maxBatchDelay "
        f"50 ms, 1 worker, 1 intra-op thread on both sides; loopback, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, torch {torch.__version__}"
    )
    print(
        f"{args.rounds} rounds per model; each round measures the model in-process and then "
        "through the server, seconds apart, so both see the same machine; verdicts use the "
        "median round"
    )
    print()
    print(
        f"serving: HTTP at concurrency {args.concurrency} (per round at most "
        f"{args.requests // args.rounds} requests or {args.duration / args.rounds:g} s) vs the "
        f"model in-process on batches of {BATCH_SIZE}"
    )
    print(
        "| model                        | round  | in-process req/s | trioserve req/s | ratio  "
        "| p50 ms | p99 ms | batches: n, mean | errors |"
    )
    print(
        "|------------------------------|--------|-----------------:|----------------:|-------:"
        "|-------:|-------:|-----------------:|-------:|"
    )
    for run in runs:
        for index, r in enumerate(run.rounds, 1):
            s = r.serving
            print(
                f"| {model_name(run.hidden):<28} | {index:<6} | {r.local.rate:>16.0f} "
                f"| {s.rate:>15.0f} | {r.ratio:>6.1%} | {s.median * ms:>6.2f} "
                f"| {s.quantile(0.99) * ms:>6.2f} | {s.batch_cell():>16} "
                f"| {sum(s.errors.values()):>6} |"
            )
        print(
            f"| {model_name(run.hidden):<28} | median | {'':>16} | {'':>15} | {run.ratio:>6.1%} "
            f"| {'':>6} | {'':>6} | {'':>16} | {'':>6} |"
        )
    print()
    print(
        "CPU time per answered request in the serving phases (µs), by process; then the CPUs "
        "those three kept busy, and the CPUs they would need at 85% of the in-process rate "
        f"with the same CPU per request (this machine has {os.cpu_count()}):"
    )
    print(
        "| model                        | model alone | trioserve | worker | load generator "
        "| all three | CPUs busy | CPUs at 85% |"
    )
    print(
        "|------------------------------|------------:|----------:|-------:|---------------:"
        "|----------:|----------:|------------:|"
    )
    for run in runs:
        answered = [len(r.serving.latencies) for r in run.rounds]
        total = max(1, sum(answered))

        def mean_cpu(role: str, run: Run = run, answered: list[int] = answered) -> float:
            return sum(r.cpu_us[role] * n for r, n in zip(run.rounds, answered, strict=True))

        alone = statistics.median(r.local.batch_seconds for r in run.rounds) / BATCH_SIZE * 1e6
        roles = ("trioserve", "worker", "generator")
        per_request = {role: mean_cpu(role) / total for role in roles}
        everything = sum(per_request.values())
        busy = everything * statistics.median(r.serving.rate for r in run.rounds) / 1e6
        needed = everything * 0.85 * statistics.median(r.local.rate for r in run.rounds) / 1e6
        print(
            f"| {model_name(run.hidden):<28} | {alone:>11.0f} "
            f"| {per_request['trioserve']:>9.0f} | {per_request['worker']:>6.0f} "
            f"| {per_request['generator']:>14.0f} | {everything:>9.0f} | {busy:>9.2f} "
            f"| {needed:>11.2f} |"
        )
    print()
    print(
        f"light load: concurrency 1 (per round at most {args.light_requests // args.rounds} "
        f"requests or {args.light_duration / args.rounds:g} s) vs one request to the model "
        "in-process"
    )
    print(
        "| model                        | round  | model p50 ms | trioserve p50 ms | p90 ms "
        "| difference | batches: n, mean | errors |"
    )
    print(
        "|------------------------------|--------|-------------:|-----------------:|-------:"
        "|-----------:|-----------------:|-------:|"
    )
    for run in runs:
        for index, r in enumerate(run.rounds, 1):
            light = r.light
            print(
                f"| {model_name(run.hidden):<28} | {index:<6} "
                f"| {r.local.single_median * ms:>12.2f} "
                f"| {light.median * ms:>16.2f} | {light.quantile(0.90) * ms:>6.2f} "
                f"| {r.extra_ms:>+7.2f} ms | {light.batch_cell():>16} "
                f"| {sum(light.errors.values()):>6} |"
            )
        print(
            f"| {model_name(run.hidden):<28} | median | {'':>12} | {'':>16} | {'':>6} "
            f"| {run.extra_ms:>+7.2f} ms | {'':>16} | {'':>6} |"
        )
    print()
    for run in runs:
        ratios = ", ".join(f"{r.ratio:.1%}" for r in run.rounds)
        throughput_ok = run.ratio >= 0.85 and not run.errors()
        extras = ", ".join(f"{r.extra_ms:+.2f}" for r in run.rounds)
        print(
            f"{model_name(run.hidden)}: server / in-process throughput {run.ratio:.1%} "
            f"(rounds: {ratios}; target >= 85%: {verdict(throughput_ok)}); "
            f"light-load median {run.extra_ms:+.2f} ms over the model's own time "
            f"(rounds: {extras} ms; target <= 2 ms: "
            f"{verdict(run.extra_ms <= 2.0 and not run.errors())})"
        )
        for phase, label in (("serving", "serving"), ("light", "light load")):
            sizes = run.batches(phase)
            if sizes:
                print(f"  {label} batch sizes: {histogram(sizes)}")
        errors: collections.Counter[str] = collections.Counter()
        for r in run.rounds:
            errors.update(r.serving.errors)
            errors.update(r.light.errors)
        for message, count in errors.most_common(5):
            print(f"  error x{count}: {message}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000, help="serving phase")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds, serving phase")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--light-requests", type=int, default=1000)
    parser.add_argument("--light-duration", type=float, default=10.0)
    parser.add_argument(
        "--hidden",
        type=int,
        nargs="+",
        default=[REFERENCE_HIDDEN],
        help="hidden widths to run (the reference model is 2048; more show how the ratio "
        "depends on the model's cost per request)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="in-process / server rounds per model; the request counts and durations are split "
        "between them",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work folders (logs)")
    args = parser.parse_args(argv)

    os.environ.update(THREAD_ENV)
    torch.set_num_threads(1)
    runs = [bench_model(hidden, args) for hidden in args.hidden]
    report(args, runs)
    return 0 if not any(run.errors() for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
