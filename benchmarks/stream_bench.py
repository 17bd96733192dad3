"""Streaming tokens from an MLServer-style model: time to first token and tokens per second for
C concurrent streams over SSE (``/v2/models/textgen/generate_stream``) and gRPC
(``ModelStreamInfer``), against the same model run in-process (no server: its
``predict_stream`` called directly on this process's event loop), in one run.

The model is the demo folder handlers/textgen (a deterministic word generator, no delay
between words). It starts a real trioserve process (loopback only, one worker, token auth
off) with that folder; each of C client tasks runs R streams of T tokens one after another.
The server's CPU (main process and worker, from /proc via psutil) is read around each
phase and printed per token.

    .venv/bin/python benchmarks/stream_bench.py [--clients 1,16,64] [--streams 4]
        [--tokens 64] [--time-limit 120]

Bounded by stream count and a time limit per phase; clients and server share the machine's
CPUs, so compare the rows of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from grpclib.client import Channel

from trioserve._proto.inference import (
    GrpcInferenceServiceStub,
    InferParameter,
    InferTensorContents,
    ModelInferRequest,
    ModelInferRequestInferInputTensor,
)
from trioserve.launch import launch

FOLDER = Path(__file__).resolve().parents[1] / "handlers" / "textgen"


@dataclass
class Phase:
    firsts: list[float] = field(default_factory=list)  # request sent -> first token, s
    tokens: int = 0
    streams: int = 0
    cut_short: bool = False


def start_server(workdir: Path) -> tuple[subprocess.Popen[bytes], int, int]:
    store = workdir / "store"
    shutil.copytree(FOLDER, store / "textgen", ignore=shutil.ignore_patterns("README.md"))
    properties = workdir / "config.properties"
    properties.write_text(
        "inference_address=http://127.0.0.1:0\nmanagement_address=http://127.0.0.1:0\n"
        "metrics_address=http://127.0.0.1:0\ngrpc_inference_port=0\ngrpc_management_port=0\n"
        f"disable_token_authorization=true\nmodel_store={store}\n"
        "load_models=textgen=textgen\ndefault_workers_per_model=1\n"
    )
    command = [sys.executable, "-m", "trioserve", "start", "--foreground", "--ts-config",
               str(properties)]  # fmt: skip
    launched = launch(command, log_path=workdir / "server.log", cwd=workdir, timeout=120)
    if not launched.ready:
        launched.process.kill()
        raise RuntimeError(f"server did not start; see {workdir}/server.log")
    return launched.process, launched.port("inference"), launched.port("grpc_inference")


def cpu_seconds(process: psutil.Process) -> float:
    total = 0.0
    for each in [process, *process.children(recursive=True)]:
        try:
            times = each.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


async def sse_stream(client: httpx.AsyncClient, url: str, tokens: int, phase: Phase) -> None:
    body = {
        "inputs": [{"name": "prompt", "shape": [1], "datatype": "BYTES", "data": ["hello"]}],
        "parameters": {"max_tokens": tokens},
    }
    began = time.perf_counter()
    got = 0
    async with client.stream("POST", url, json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                if got == 0:
                    phase.firsts.append(time.perf_counter() - began)
                got += 1
    assert got == tokens, f"{got} events for {tokens} tokens"
    phase.tokens += got


async def grpc_stream(stub: GrpcInferenceServiceStub, tokens: int, phase: Phase) -> None:
    message = ModelInferRequest(
        model_name="textgen",
        parameters={"max_tokens": InferParameter(int64_param=tokens)},
        inputs=[
            ModelInferRequestInferInputTensor(
                name="prompt", datatype="BYTES", shape=[1],
                contents=InferTensorContents(bytes_contents=[b"hello"]),
            )
        ],
    )  # fmt: skip
    began = time.perf_counter()
    got = 0
    async for _response in stub.model_stream_infer([message]):
        if got == 0:
            phase.firsts.append(time.perf_counter() - began)
        got += 1
    assert got == tokens, f"{got} responses for {tokens} tokens"
    phase.tokens += got


async def in_process_stream(model: Any, types: Any, tokens: int, phase: Phase) -> None:
    from mlserver.codecs import StringCodec

    request = types.InferenceRequest(
        inputs=[StringCodec.encode_input("prompt", ["hello"], use_bytes=False)],
        parameters=types.Parameters(max_tokens=tokens),
    )

    async def once() -> Any:
        yield request

    began = time.perf_counter()
    got = 0
    async for response in model.predict_stream(once()):
        response.model_dump_json()  # what a server would at least do with it
        if got == 0:
            phase.firsts.append(time.perf_counter() - began)
        got += 1
    phase.tokens += got


async def run_phase(
    clients: int, streams: int, limit: float, one: Callable[[Phase], Awaitable[None]]
) -> tuple[Phase, float]:
    phase = Phase()

    async def client() -> None:
        for _ in range(streams):
            await one(phase)
            phase.streams += 1

    began = time.perf_counter()
    try:
        await asyncio.wait_for(asyncio.gather(*(client() for _ in range(clients))), limit)
    except TimeoutError:
        phase.cut_short = True
    return phase, time.perf_counter() - began


def row(name: str, clients: int, phase: Phase, wall: float, cpu: float | None) -> str:
    firsts = sorted(phase.firsts) or [float("nan")]
    p50 = statistics.median(firsts) * 1000
    p99 = firsts[min(len(firsts) - 1, int(len(firsts) * 0.99))] * 1000
    rate = phase.tokens / wall if wall else 0.0
    per_token = "-" if cpu is None or not phase.tokens else f"{cpu / phase.tokens * 1e6:.0f}"
    note = " (cut short)" if phase.cut_short else ""
    return (
        f"| {name}{note} | {clients} | {phase.streams} | {phase.tokens} | {rate:,.0f} | "
        f"{p50:.1f} | {p99:.1f} | {per_token} |"
    )


async def main_async(args: argparse.Namespace) -> None:
    concurrency = [int(c) for c in args.clients.split(",")]
    rows: list[str] = []
    with tempfile.TemporaryDirectory(prefix="trioserve-stream-bench-") as tmp:
        process, http_port, grpc_port = start_server(Path(tmp))
        server = psutil.Process(process.pid)
        try:
            url = f"http://127.0.0.1:{http_port}/v2/models/textgen/generate_stream"
            for clients in concurrency:
                limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
                async with httpx.AsyncClient(timeout=60, limits=limits) as http:
                    await sse_stream(http, url, 4, Phase())  # warm-up
                    before = cpu_seconds(server)
                    phase, wall = await run_phase(
                        clients, args.streams, args.time_limit,
                        lambda p, h=http: sse_stream(h, url, args.tokens, p),
                    )  # fmt: skip
                    rows.append(row("trioserve SSE", clients, phase, wall,
                                    cpu_seconds(server) - before))  # fmt: skip
                channel = Channel("127.0.0.1", grpc_port)
                try:
                    stub = GrpcInferenceServiceStub(channel)
                    await grpc_stream(stub, 4, Phase())  # warm-up
                    before = cpu_seconds(server)
                    phase, wall = await run_phase(
                        clients, args.streams, args.time_limit,
                        lambda p, s=stub: grpc_stream(s, args.tokens, p),
                    )  # fmt: skip
                    rows.append(row("trioserve gRPC", clients, phase, wall,
                                    cpu_seconds(server) - before))  # fmt: skip
                finally:
                    channel.close()
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
    # The same model in this process: what streaming costs without any server.
    sys.path.insert(0, str(FOLDER))
    from trioserve.worker.mlserver import mlserver_shim

    mlserver_shim.install()
    import mlserver.settings
    import mlserver.types
    import textgen

    settings = mlserver.settings.ModelSettings.model_validate(
        {**json.loads((FOLDER / "model-settings.json").read_text()),
         "implementation": textgen.TextGenerator}
    )  # fmt: skip
    model = textgen.TextGenerator(settings)
    await model.load()
    for clients in concurrency:
        phase, wall = await run_phase(
            clients, args.streams, args.time_limit,
            lambda p: in_process_stream(model, mlserver.types, args.tokens, p),
        )  # fmt: skip
        rows.append(row("in-process (no server)", clients, phase, wall, None))
    print(
        f"textgen, {args.tokens} tokens per stream, {args.streams} streams per client, "
        "one worker; server CPU = main process + worker, per token"
    )
    print()
    print("| path | streams at once | streams | tokens | tokens/s | first token p50 ms "
          "| p99 ms | server CPU µs/token |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for line in rows:
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,16,64")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--time-limit", type=float, default=120.0)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
