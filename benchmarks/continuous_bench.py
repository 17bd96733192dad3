"""What a step of continuous batching costs: C concurrent streams of S steps each against the
same clients sending S whole (non-streaming) requests, on the same model.

For each step time M (``--step-ms``, default ``0,5``) it starts a real trioserve process
(loopback only) with one archive of the demo handler handlers/stateful_stream: 2 workers,
batchSize 4, sequenceBatching + continuousBatching, maxNumSequence twice the client count,
``handler.stream_steps`` = S and ``handler.step_ms`` = M. Each of C client tasks opens a
sequence over its own keep-alive HTTP/1.1 connection (an even value without the sequence
header), then:

* ``stream``: R times, posts an odd value on its sequence and reads the chunked answer chunk
  by chunk (one chunk per step of the running batch), timestamping each chunk;
* ``request``: R x S times, posts an even value on its sequence and reads the whole answer
  (the baseline: as many answers as the streams had steps, each a request of its own).

Opening and closing the sequences (a ``0`` ends each) lie outside the measured window. The
server's CPU is read from /proc (psutil) before and after the window: the main process and
its child processes (the workers) apart.

    .venv/bin/python benchmarks/continuous_bench.py [--clients 8] [--streams 4] [--steps 50]
        [--step-ms 0,5] [--rounds 1] [--time-limit 120]

Bounded by request count and a time limit per phase (a phase cut short says so in its row);
clients and server share the machine's CPUs, so compare the rows of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from trioserve.launch import launch, stop

REPO = Path(__file__).resolve().parents[1]
HANDLER = REPO / "handlers" / "stateful_stream" / "stream_sum_handler.py"
MODEL = "streamsum"
HEADER = b"ts_request_sequence_id"
CONFIG = (
    "minWorkers: 2\nmaxWorkers: 2\nbatchSize: 4\nmaxBatchDelay: 5\n"
    "sequenceBatching: true\ncontinuousBatching: true\nsequenceMaxIdleMSec: 60000\n"
    "maxNumSequence: {sequences}\nmaxSequenceJobQueueSize: 4\n"
    "handler:\n  cache:\n    capacity: {sequences}\n  stream_steps: {steps}\n"
    "  step_ms: {step_ms}\n"
)


def start_server(workdir: Path, clients: int, steps: int, step_ms: float) -> tuple[
    subprocess.Popen[bytes], int
]:  # fmt: skip
    store = workdir / "store"
    store.mkdir()
    config = workdir / "model-config.yaml"
    config.write_text(CONFIG.format(sequences=2 * clients, steps=steps, step_ms=step_ms))
    subprocess.run(
        [sys.executable, "-m", "trioserve", "archive", "--model-name", MODEL, "-v", "1.0",
         "--handler", str(HANDLER), "-c", str(config), "--export-path", str(store), "-f"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    properties = workdir / "config.properties"
    properties.write_text(
        "inference_address=http://127.0.0.1:0\nmanagement_address=http://127.0.0.1:0\n"
        "metrics_address=http://127.0.0.1:0\ngrpc_inference_port=0\ngrpc_management_port=0\n"
        f"disable_token_authorization=true\nmodel_store={store}\n"
        f"load_models={MODEL}={MODEL}.mar\n"
    )
    command = [sys.executable, "-m", "trioserve", "start", "--foreground", "--ts-config",
               str(properties)]  # fmt: skip
    launched = launch(command, log_path=workdir / "server.log", cwd=workdir, timeout=120)
    if not launched.ready:
        stop(launched.process)
        raise RuntimeError(f"server did not start; see {workdir}/server.log")
    return launched.process, launched.port("inference")


@dataclass
class Sample:
    """What the clients of one phase saw (shared by its tasks)."""

    gaps: list[float] = field(default_factory=list)  # between chunks of one stream, s
    firsts: list[float] = field(default_factory=list)  # request sent -> first chunk / answer, s
    answers: int = 0  # chunks (stream) or whole answers (request)
    step_batch: Counter[str] = field(default_factory=Counter)  # x-step-batch of the head


class Connection:
    """One client's keep-alive connection and sequence."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.sequence = b""
        self.total = 0  # the sequence's running sum, as the handler keeps it

    @classmethod
    async def open(cls, port: int) -> Connection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    def send(self, value: int) -> None:
        body = str(value).encode()
        extra = HEADER + b": " + self.sequence + b"\r\n" if self.sequence else b""
        self.writer.write(
            b"POST /predictions/" + MODEL.encode() + b" HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: text/plain\r\nContent-Length: " + str(len(body)).encode() + b"\r\n"
            + extra + b"\r\n" + body
        )  # fmt: skip
        self.total += value

    async def head(self) -> tuple[bytes, dict[bytes, bytes]]:
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw.split(b"\r\n")
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        return lines[0], headers

    async def whole(self, value: int) -> tuple[dict[bytes, bytes], bytes]:
        """Post ``value`` and read its one answer (Content-Length or chunked)."""
        self.send(value)
        status, headers = await self.head()
        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            body = b"".join([chunk async for chunk in self.chunks()])
        else:
            body = await self.reader.readexactly(int(headers.get(b"content-length", b"0")))
        if not status.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"{status!r} {body[:200]!r}")
        if HEADER in headers:
            self.sequence = headers[HEADER]
        return headers, body

    async def chunks(self):  # type: ignore[no-untyped-def]
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await self.reader.readuntil(b"\r\n")
                return
            data = await self.reader.readexactly(size + 2)
            yield data[:size]

    async def close(self) -> None:
        try:
            if self.sequence:
                await self.whole(0)  # ends the sequence
        finally:
            self.writer.close()


async def stream_phase(conn: Connection, streams: int, steps: int, sample: Sample) -> None:
    for _ in range(streams):
        conn.send(1)
        sent = time.perf_counter()
        status, headers = await conn.head()
        if not status.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"stream: {status!r}")
        sample.step_batch[headers.get(b"x-step-batch", b"?").decode()] += 1
        last = sent
        count = 0
        async for chunk in conn.chunks():
            now = time.perf_counter()
            if count == 0:
                sample.firsts.append(now - sent)
            else:
                sample.gaps.append(now - last)
            last = now
            count += 1
            sample.answers += 1
            if int(chunk) != conn.total:
                raise RuntimeError(f"stream: sum {chunk!r}, expected {conn.total}")
        if count != steps:
            raise RuntimeError(f"stream: {count} chunks, expected {steps}")


async def request_phase(conn: Connection, requests: int, sample: Sample) -> None:
    for _ in range(requests):
        sent = time.perf_counter()
        headers, body = await conn.whole(2)
        sample.firsts.append(time.perf_counter() - sent)
        sample.answers += 1
        sample.step_batch[headers.get(b"x-step-batch", b"?").decode()] += 1
        if int(body) != conn.total:
            raise RuntimeError(f"request: sum {body!r}, expected {conn.total}")


def cpu_snapshot(server: psutil.Process) -> tuple[float, dict[int, float]]:
    """The main process's CPU seconds and each child process's (user + system)."""
    main = sum(server.cpu_times()[:2])
    children = {}
    for child in server.children(recursive=True):
        try:
            children[child.pid] = sum(child.cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return main, children


async def phase(port: int, kind: str, args: argparse.Namespace, server: psutil.Process) -> str:
    """Open C sequences, run one measured phase over them, close them; one table row."""
    conns = await asyncio.wait_for(
        asyncio.gather(*(Connection.open(port) for _ in range(args.clients))), 30
    )
    sample = Sample()
    timed_out = False
    try:
        await asyncio.wait_for(asyncio.gather(*(c.whole(2) for c in conns)), 30)
        main0, children0 = cpu_snapshot(server)
        began = time.perf_counter()
        if kind == "stream":
            jobs = [stream_phase(c, args.streams, args.steps, sample) for c in conns]
        else:
            jobs = [request_phase(c, args.streams * args.steps, sample) for c in conns]
        try:
            async with asyncio.timeout(args.time_limit):
                await asyncio.gather(*jobs)
        except TimeoutError:
            timed_out = True
        wall = time.perf_counter() - began
        main1, children1 = cpu_snapshot(server)
    finally:
        if timed_out:  # connections mid-answer: drop them; their sequences idle out
            for c in conns:
                c.writer.close()
        else:
            await asyncio.wait_for(asyncio.gather(*(c.close() for c in conns)), 30)
    main = main1 - main0
    workers = sum(cpu - children0.get(pid, 0.0) for pid, cpu in children1.items())
    n = max(sample.answers, 1)
    first = quantiles(sample.firsts)
    gap = quantiles(sample.gaps)
    batches = " ".join(f"{k}:{v}" for k, v in sorted(sample.step_batch.items()))
    name = kind + (" (timed out)" if timed_out else "")
    return (
        f"{name} | {sample.answers} | {sample.answers / wall:.0f} | {gap[0]} | {gap[1]} | "
        f"{first[0]} | {first[1]} | {main / n * 1e6:.0f} | {workers / n * 1e6:.0f} | "
        f"{batches} |"
    )


def quantiles(values: list[float]) -> tuple[str, str]:
    """p50 and p99 in ms, or dashes when there is nothing to rank."""
    if len(values) < 2:
        return "-", "-"
    q = statistics.quantiles(values, n=100)
    return f"{q[49] * 1e3:.2f}", f"{q[98] * 1e3:.2f}"


async def warm_up(port: int) -> None:
    conn = await Connection.open(port)
    try:
        async with asyncio.timeout(30):
            await conn.whole(2)
            await conn.whole(2)
    finally:
        await conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--streams", type=int, default=4, help="streams per client")
    parser.add_argument("--steps", type=int, default=50, help="steps (chunks) per stream")
    parser.add_argument("--step-ms", default="0,5", help="handler.step_ms values, comma-separated")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--time-limit", type=float, default=120.0, help="seconds per phase")
    args = parser.parse_args(argv)
    step_ms = [float(v) for v in args.step_ms.split(",") if v.strip()]
    rows = []
    for m in step_ms:
        workdir = Path(tempfile.mkdtemp(prefix="trioserve-cont-bench-"))
        process, port = start_server(workdir, args.clients, args.steps, m)
        try:
            server = psutil.Process(process.pid)
            asyncio.run(warm_up(port))
            for round_ in range(1, args.rounds + 1):
                for kind in ("stream", "request"):
                    row = asyncio.run(phase(port, kind, args, server))
                    rows.append(f"| {round_} | {m:g} | {row}")
        finally:
            stop(process)
    print(
        f"{args.clients} clients x {args.streams} streams x {args.steps} steps "
        f"(request rows: {args.streams * args.steps} requests per client), 2 workers, "
        "batchSize 4, continuousBatching\n"
    )
    print(
        "| round | step ms | phase | answers | answers/s | step gap p50 ms | "
        "step gap p99 ms | first p50 ms | first p99 ms | main CPU µs/answer | "
        "workers CPU µs/answer | x-step-batch (head) |"
    )
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    print("\n".join(rows))
    print(
        "\n- step ms: handler.step_ms, the time each step of the running batch sleeps\n"
        "- phase: `stream` = odd values streamed in chunks, one per step; `request` = the "
        "baseline, even values answered whole, one request each\n"
        "- answers: chunks (stream) or whole answers (request) received in the window\n"
        "- answers/s: answers across all clients per second of wall time\n"
        "- step gap p50/p99: time between consecutive chunks of one stream (stream only)\n"
        "- first p50/p99: request sent to its first chunk (stream) or to its whole answer "
        "(request: the per-request latency)\n"
        "- main CPU µs/answer: server main process user+system CPU over the window / answers\n"
        "- workers CPU µs/answer: the same for the server's child processes (the workers)\n"
        "- x-step-batch (head): the handler's step batch size header, value:count, as seen "
        "in each response head (a stream's head carries its first step's value only)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
