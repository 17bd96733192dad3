"""The price of sequence affinity: 32 concurrent sequences against the same clients sending
stateless requests, on the same handler (handlers/stateful), 2 workers, batchSize 4.

Starts a real trioserve process (loopback only) with two archives of the one handler:
``stateful`` (its model-config.yaml: sequenceBatching, maxNumSequence raised to the client
count) and ``stateless`` (same workers and batch size, no sequences; each request carries
the start header itself, so the handler keeps no state across requests). For each, C client
tasks each send R requests one after another, over one keep-alive HTTP/1.1 connection each
(a sequence per task on the stateful model), and the table prints throughput, p50/p99
latency per request and the server's CPU per request (main process, from /proc).

    .venv/bin/python benchmarks/sequence_bench.py [--clients 32] [--requests 50] [--rounds 2]

Bounded by request count and a time limit; clients and server share the machine's CPUs, so
compare the two rows of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from trioserve.launch import launch, stop

REPO = Path(__file__).resolve().parents[1]
HANDLER = REPO / "handlers" / "stateful" / "stateful_handler.py"
CONFIGS = {
    "stateful": "minWorkers: 2\nmaxWorkers: 2\nbatchSize: 4\nmaxBatchDelay: 5\n"
    "sequenceBatching: true\nsequenceMaxIdleMSec: 60000\nmaxNumSequence: {clients}\n"
    "maxSequenceJobQueueSize: 2\nhandler:\n  cache:\n    capacity: {clients}\n",
    "stateless": "minWorkers: 2\nmaxWorkers: 2\nbatchSize: 4\nmaxBatchDelay: 5\n",
}


def start_server(workdir: Path, clients: int) -> tuple[subprocess.Popen[bytes], int]:
    store = workdir / "store"
    store.mkdir()
    for name, config in CONFIGS.items():
        path = workdir / f"{name}.yaml"
        path.write_text(config.format(clients=clients))
        subprocess.run(
            [sys.executable, "-m", "trioserve", "archive", "--model-name", name, "-v", "1.0",
             "--handler", str(HANDLER), "-c", str(path), "--export-path", str(store), "-f"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
    properties = workdir / "config.properties"
    properties.write_text(
        "inference_address=http://127.0.0.1:0\nmanagement_address=http://127.0.0.1:0\n"
        "metrics_address=http://127.0.0.1:0\ngrpc_inference_port=0\ngrpc_management_port=0\n"
        f"disable_token_authorization=true\nmodel_store={store}\n"
        "load_models=stateful=stateful.mar,stateless=stateless.mar\n"
    )
    command = [sys.executable, "-m", "trioserve", "start", "--foreground", "--ts-config",
               str(properties)]  # fmt: skip
    launched = launch(command, log_path=workdir / "server.log", cwd=workdir, timeout=120)
    if not launched.ready:
        stop(launched.process)
        raise RuntimeError(f"server did not start; see {workdir}/server.log")
    return launched.process, launched.port("inference")


async def client(port: int, model: str, requests: int, latencies: list[float]) -> None:
    """R requests over one connection: one sequence (stateful) or independent ones."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    sequence = b""
    try:
        for n in range(requests):
            if model == "stateless":
                extra = b"ts_request_sequence_start: true\r\n"
            else:
                extra = b"ts_request_sequence_id: " + sequence + b"\r\n" if sequence else b""
            # The stateful sequence's last request sends 0, which ends it (freeing its slot
            # for the next round); its answer is the sum so far.
            last = model == "stateful" and n == requests - 1
            writer.write(
                b"POST /predictions/" + model.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: text/plain\r\nContent-Length: 1\r\n"
                + extra
                + (b"\r\n0" if last else b"\r\n1")
            )
            began = time.perf_counter()
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
                elif name.lower() == b"ts_request_sequence_id":
                    sequence = value.strip()
            body = await reader.readexactly(length)
            latencies.append(time.perf_counter() - began)
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"{model}: {head[:60]!r} {body[:200]!r}")
            if model == "stateful" and int(body) != (n if last else n + 1):
                raise RuntimeError(f"wrong running sum {body!r} at step {n + 1}")
    finally:
        writer.close()


async def measure(port: int, model: str, clients: int, requests: int) -> list[float]:
    latencies: list[float] = []
    async with asyncio.timeout(300):
        await asyncio.gather(*(client(port, model, requests, latencies) for _ in range(clients)))
    return latencies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="trioserve-seq-bench-"))
    process, port = start_server(workdir, args.clients)
    server = psutil.Process(process.pid)
    rows = []
    try:
        asyncio.run(measure(port, "stateless", 4, 5))  # warm-up
        for round_ in range(1, args.rounds + 1):
            for model in ("stateful", "stateless"):
                cpu0 = sum(server.cpu_times()[:2])
                began = time.perf_counter()
                latencies = asyncio.run(measure(port, model, args.clients, args.requests))
                wall = time.perf_counter() - began
                cpu = sum(server.cpu_times()[:2]) - cpu0
                n = len(latencies)
                q = statistics.quantiles(latencies, n=100)
                rows.append(
                    f"| {round_} | {model} | {n} | {n / wall:.0f} | {q[49] * 1e3:.1f} | "
                    f"{q[98] * 1e3:.1f} | {cpu / n * 1e6:.0f} |"
                )
    finally:
        stop(process)
    print(f"{args.clients} clients x {args.requests} requests, 2 workers, batchSize 4\n")
    print("| round | model | requests | req/s | p50 ms | p99 ms | server CPU µs/req |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
