"""Unary gRPC ``Predictions`` vs HTTP ``POST /predictions`` on the echo model.

Starts a real trioserve process (loopback only) serving the bundled echo handler, then, for
each concurrency level, runs the same request against both APIs in the same run and prints
throughput and latency percentiles as a table. Every run is bounded by a request count and
a time limit.

    .venv/bin/python benchmarks/grpc_vs_http.py [--requests 3000] [--duration 10]
        [--concurrency 1 16 64] [--workers 1] [--payload 64]

Clients run in this process on asyncio: gRPC with grpcio's asyncio API (C core, one
channel, HTTP/2 streams multiplexed), HTTP with a minimal keep-alive HTTP/1.1 client (one
connection per concurrent caller). Client, server and worker share the machine's CPUs, so
compare the two rows of one concurrency level, not absolute numbers across machines.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from trioserve._proto.org.pytorch.serve.grpc.inference import (
    PredictionResponse,
    PredictionsRequest,
)
from trioserve.launch import launch, stop

REPO = Path(__file__).resolve().parents[1]
ECHO_HANDLER = REPO / "handlers" / "echo" / "echo_handler.py"
PREDICTIONS = "/org.pytorch.serve.grpc.inference.InferenceAPIsService/Predictions"


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    how: str

    def stop(self) -> None:
        stop(self.process)


def start_server(workdir: Path, workers: int) -> Server:
    store = workdir / "store"
    store.mkdir()
    subprocess.run(
        [sys.executable, "-m", "trioserve", "archive", "--model-name", "echo", "-v", "1.0",
         "--handler", str(ECHO_HANDLER), "--export-path", str(store), "-f"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    config = workdir / "config.properties"
    config.write_text(
        "inference_address=http://127.0.0.1:0\n"
        "management_address=http://127.0.0.1:0\n"
        "metrics_address=http://127.0.0.1:0\n"
        "grpc_inference_address=127.0.0.1\ngrpc_inference_port=0\n"
        "grpc_management_address=127.0.0.1\ngrpc_management_port=0\n"
        "disable_token_authorization=true\n"
        f"model_store={store}\nload_models=echo=echo.mar\n"
        f"default_workers_per_model={workers}\n"
    )
    command = [sys.executable, "-m", "trioserve", "start", "--foreground", "--ts-config",
               str(config)]  # fmt: skip
    launched = launch(command, log_path=workdir / "server.log", cwd=workdir, timeout=60)
    report = "\n".join(launched.report)
    if not (launched.ready and "grpc_inference=" in report):
        Server(launched.process, 0, 0, "trioserve start").stop()
        raise RuntimeError(f"server did not start: {report!r}; see {workdir}/server.log")
    return Server(
        launched.process,
        launched.port("inference"),
        launched.port("grpc_inference"),
        "trioserve start",
    )


# -- clients --------------------------------------------------------------------------------


class HttpCaller:
    """POST /predictions/echo over one keep-alive HTTP/1.1 connection."""

    def __init__(self, port: int, payload: bytes) -> None:
        self._port = port
        self._request = (
            b"POST /predictions/echo HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/octet-stream\r\n"
            b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload
        )
        self._payload = payload
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def __call__(self) -> None:
        if self._reader is None or self._writer is None:
            self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self._port)
        self._writer.write(self._request)
        head = await self._reader.readuntil(b"\r\n\r\n")
        status = head.split(b" ", 2)[1]
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        body = await self._reader.readexactly(length)
        if status != b"200" or body != self._payload:
            raise RuntimeError(f"HTTP {status!r}: {body[:80]!r}")

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            await self._writer.wait_closed()


@dataclass
class Result:
    api: str
    concurrency: int
    requests: int
    errors: int
    seconds: float
    latencies: list[float]

    def row(self) -> str:
        ordered = sorted(self.latencies)
        p50 = statistics.median(ordered) * 1e3 if ordered else float("nan")
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3 if ordered else 0
        rate = len(ordered) / self.seconds if self.seconds else 0.0
        return (
            f"| {self.api:<17} | {self.concurrency:>11} | {self.requests:>8} | {rate:>8.0f} "
            f"| {p50:>6.2f} | {p99:>6.2f} | {self.errors:>6} |"
        )


async def load(
    api: str,
    callers: list[Callable[[], Awaitable[None]]],
    requests: int,
    duration: float,
) -> Result:
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    errors = 0
    issued = 0
    deadline = loop.time() + duration

    async def caller_loop(call: Callable[[], Awaitable[None]]) -> None:
        nonlocal issued, errors
        while issued < requests and loop.time() < deadline:
            issued += 1
            began = time.perf_counter()
            try:
                await call()
            except Exception:
                errors += 1
                continue
            latencies.append(time.perf_counter() - began)

    began = time.perf_counter()
    await asyncio.gather(*(caller_loop(call) for call in callers))
    return Result(api, len(callers), issued, errors, time.perf_counter() - began, latencies)


async def measure(
    server: Server, levels: list[int], requests: int, duration: float, payload: bytes
) -> list[Result]:
    message = bytes(PredictionsRequest(model_name="echo", input={"data": payload}))
    results = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        predictions = channel.unary_unary(
            PREDICTIONS,
            request_serializer=lambda raw: raw,
            response_deserializer=PredictionResponse.parse,
        )

        async def grpc_call() -> None:
            response = await predictions(message, timeout=30)
            if response.prediction != payload:
                raise RuntimeError(f"gRPC answer {response.prediction[:80]!r}")

        for level in levels:
            http_callers = [HttpCaller(server.http_port, payload) for _ in range(level)]
            try:
                warm = max(50, level * 4)
                await load("warm-up", [grpc_call] * level, warm, duration)
                await load("warm-up", list(http_callers), warm, duration)
                results.append(
                    await load("HTTP /predictions", list(http_callers), requests, duration)
                )
                results.append(
                    await load("gRPC Predictions", [grpc_call] * level, requests, duration)
                )
            finally:
                for caller in http_callers:
                    await caller.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000, help="per API and level")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds, per API and level")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--workers", type=int, default=1, help="echo workers")
    parser.add_argument("--payload", type=int, default=64, help="request bytes")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="trioserve-bench-"))
    server = start_server(workdir, args.workers)
    try:
        payload = os.urandom(args.payload)
        results = asyncio.run(
            measure(server, args.concurrency, args.requests, args.duration, payload)
        )
    finally:
        server.stop()
    print(
        f"echo model, {args.workers} worker(s), {args.payload}-byte payload, loopback; "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, server via {server.how}; "
        f"at most {args.requests} requests or {args.duration:g} s per row"
    )
    print("| API               | concurrency | requests |    req/s | p50 ms | p99 ms | errors |")
    print("|-------------------|------------:|---------:|---------:|-------:|-------:|-------:|")
    for result in results:
        print(result.row())
    shutil.rmtree(workdir, ignore_errors=True)
    return 0 if all(r.errors == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
