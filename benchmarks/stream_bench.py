"""Streaming tokens from an MLServer-style model, side by side: time to first token, tokens per
second and server CPU per token for C concurrent streams over SSE
(``/v2/models/textgen/generate_stream``) and gRPC (``ModelStreamInfer``), for MLServer 1.7.1
(``parallel_workers`` 0: the model runs in its server process), trioserve from this tree (the
model in one worker process; once as the folder is, once with ``merge_stream_replies`` on),
optionally an older trioserve checkout (``--base-tree DIR``, run with ``PYTHONPATH=DIR``), and
the same model in-process (no server: its ``predict_stream`` called on this process's loop).

The model is the demo folder handlers/textgen (a deterministic word generator, no delay
between words), served unchanged by every server (loopback only, free ports, token auth off).
Each of C client tasks runs R streams of T tokens one after another, with the same client
(httpx for SSE, grpclib for gRPC). Every stream's text is checked against the model's one-shot
answer (``/infer``), so a merged event counts the tokens it carries. The server's CPU (main
process and its children, from /proc via psutil) is read around each phase and printed per
token, with its ratio to MLServer's in the same phase.

    .venv/bin/python benchmarks/stream_bench.py [--clients 1,16,64] [--streams 4]
        [--tokens 64] [--time-limit 60] [--mlserver /tmp/mls-venv] [--base-tree /tmp/base]
        [--servers mlserver,trioserve,trioserve-merge,base]

Bounded by stream count and a time limit per phase; clients and servers share the machine's
CPUs, so compare the rows of one run. (Over 400 lines: the peers, clients and table of one
comparison stay in one script, to be run and read as one.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import socket
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

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "handlers" / "textgen"
PROMPT = {"inputs": [{"name": "prompt", "shape": [1], "datatype": "BYTES", "data": ["hello"]}]}


@dataclass
class Phase:
    firsts: list[float] = field(default_factory=list)  # request sent -> first token, s
    tokens: int = 0
    events: int = 0  # SSE events / gRPC messages (fewer than tokens when merged)
    streams: int = 0
    cut_short: bool = False


@dataclass
class Server:
    name: str
    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    expected: str = ""  # the 64-token text without separators, from /infer

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def copy_model(workdir: Path, merge: bool) -> Path:
    store = workdir / "store"
    shutil.copytree(FOLDER, store / "textgen", ignore=shutil.ignore_patterns("README.md"))
    if merge:
        path = store / "textgen" / "model-settings.json"
        settings = json.loads(path.read_text())
        settings["parameters"]["merge_stream_replies"] = True
        path.write_text(json.dumps(settings))
    return store


def start_trioserve(name: str, workdir: Path, tree: Path, merge: bool) -> Server:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return serve_store(name, workdir, copy_model(workdir, merge), env)


def serve_store(name: str, workdir: Path, store: Path, env: dict[str, str]) -> Server:
    """trioserve serving ``store``'s textgen (one worker) on free ports, from ``workdir``."""
    properties = workdir / "config.properties"
    properties.write_text(
        "inference_address=http://127.0.0.1:0\nmanagement_address=http://127.0.0.1:0\n"
        "metrics_address=http://127.0.0.1:0\ngrpc_inference_port=0\ngrpc_management_port=0\n"
        f"disable_token_authorization=true\nmodel_store={store}\n"
        "load_models=textgen=textgen\ndefault_workers_per_model=1\n"
    )
    command = [sys.executable, "-m", "trioserve", "start", "--foreground", "--ts-config",
               str(properties)]  # fmt: skip
    launched = launch(command, log_path=workdir / "server.log", cwd=workdir, env=env, timeout=120)
    if not launched.ready:
        launched.process.kill()
        raise RuntimeError(f"{name} did not start; see {workdir}/server.log")
    return Server(name, launched.process, launched.port("inference"),
                  launched.port("grpc_inference"))  # fmt: skip


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_mlserver(workdir: Path, venv: Path) -> Server:
    store = copy_model(workdir, merge=False)
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    (store / "settings.json").write_text(json.dumps({
        "host": "127.0.0.1", "http_port": http_port, "grpc_port": grpc_port,
        "metrics_port": metrics_port, "parallel_workers": 0, "debug": False,
    }))  # fmt: skip
    with open(workdir / "mlserver.log", "ab") as log:
        process = subprocess.Popen(
            [str(venv / "bin" / "mlserver"), "start", str(store)],
            cwd=store, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
        )  # fmt: skip
    server = Server("MLServer 1.7.1", process, http_port, grpc_port)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        try:
            ready = httpx.get(f"http://127.0.0.1:{http_port}/v2/models/textgen/ready", timeout=1)
            if ready.status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"MLServer did not start; see {workdir}/mlserver.log")


def cpu_seconds(process: psutil.Process) -> float:
    total = 0.0
    for each in [process, *process.children(recursive=True)]:
        try:
            times = each.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def text_of(outputs: list[dict[str, Any]]) -> str:
    return "".join(str(item) for output in outputs for item in output["data"])


async def sse_stream(client: httpx.AsyncClient, server: Server, tokens: int, phase: Phase) -> None:
    url = f"http://127.0.0.1:{server.http_port}/v2/models/textgen/generate_stream"
    body = {**PROMPT, "parameters": {"max_tokens": tokens}}
    began = time.perf_counter()
    pieces: list[str] = []
    async with client.stream("POST", url, json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                if not pieces:
                    phase.firsts.append(time.perf_counter() - began)
                pieces.append(text_of(json.loads(line[5:])["outputs"]))
    check(server, tokens, pieces)
    phase.tokens += tokens
    phase.events += len(pieces)


def check(server: Server, tokens: int, pieces: list[str]) -> None:
    if tokens == 64:
        assert "".join(pieces) == server.expected, f"{server.name}: wrong text {pieces}"
    else:
        assert pieces, f"{server.name}: no answer"


async def grpc_stream(
    stub: GrpcInferenceServiceStub, server: Server, tokens: int, phase: Phase
) -> None:
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
    pieces: list[str] = []
    async for response in stub.model_stream_infer([message]):
        if not pieces:
            phase.firsts.append(time.perf_counter() - began)
        pieces.append(grpc_text(response))
    check(server, tokens, pieces)
    phase.tokens += tokens
    phase.events += len(pieces)


def grpc_text(response: Any) -> str:
    """The BYTES outputs' text, from ``contents`` or (length-prefixed) raw contents."""
    if response.raw_output_contents:
        return "".join(raw[4:].decode() for raw in response.raw_output_contents)
    return "".join(b.decode() for o in response.outputs for b in o.contents.bytes_contents)


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
    phase.events += got


Stream = Callable[[int, "Phase"], Awaitable[None]]  # (tokens, phase): one stream, counted


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


@dataclass
class Row:
    name: str
    protocol: str
    clients: int
    phase: Phase
    wall: float
    cpu: float | None

    @property
    def per_token(self) -> float | None:
        if self.cpu is None or not self.phase.tokens:
            return None
        return self.cpu / self.phase.tokens * 1e6

    def line(self, reference: float | None) -> str:
        phase = self.phase
        p50 = statistics.median(phase.firsts or [math.nan]) * 1000
        rate = phase.tokens / self.wall if self.wall else 0.0
        per = self.per_token
        ratio = "-" if per is None or not reference else f"{per / reference:.2f}"
        per_text = "-" if per is None else f"{per:.0f}"
        events = phase.tokens / phase.events if phase.events else math.nan
        note = " (cut short)" if phase.cut_short else ""
        return (
            f"| {self.name}{note} | {self.protocol} | {self.clients} | {phase.tokens} | "
            f"{events:.1f} | {rate:,.0f} | {p50:.1f} | {per_text} | {ratio} |"
        )


async def measure(server: Server, args: argparse.Namespace) -> list[Row]:
    rows: list[Row] = []
    watched = psutil.Process(server.process.pid)
    base = f"http://127.0.0.1:{server.http_port}/v2/models/textgen"
    async with httpx.AsyncClient(timeout=60) as http:
        answer = await http.post(f"{base}/infer", json={**PROMPT, "parameters": {"max_tokens": 64}})
        answer.raise_for_status()
        server.expected = text_of(answer.json()["outputs"]).replace(" ", "")

    async def measure(kind: str, clients: int, streams: int, stream: Stream) -> None:
        """A short warm-up (one stream of 8 tokens per client), then the measured phase."""
        await run_phase(clients, 1, args.time_limit, lambda p: stream(8, p))
        before = cpu_seconds(watched)
        phase, wall = await run_phase(
            clients, streams, args.time_limit, lambda p: stream(args.tokens, p)
        )
        rows.append(Row(server.name, kind, clients, phase, wall, cpu_seconds(watched) - before))

    for clients in [int(c) for c in args.clients.split(",")]:
        streams = max(args.streams, math.ceil(args.min_streams / clients))
        limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
        async with httpx.AsyncClient(timeout=60, limits=limits) as http:
            await measure("SSE", clients, streams, lambda n, p, h=http: sse_stream(h, server, n, p))
        channel = Channel("127.0.0.1", server.grpc_port)
        try:
            stub = GrpcInferenceServiceStub(channel)
            await measure(
                "gRPC", clients, streams, lambda n, p, s=stub: grpc_stream(s, server, n, p)
            )
        finally:
            channel.close()
    return rows


def start(kind: str, workdir: Path, args: argparse.Namespace) -> Server:
    if kind == "mlserver":
        return start_mlserver(workdir, Path(args.mlserver))
    if kind == "trioserve":
        return start_trioserve("trioserve", workdir, ROOT, merge=False)
    if kind == "trioserve-merge":
        return start_trioserve("trioserve, merge on", workdir, ROOT, merge=True)
    if kind == "base":
        tree = Path(args.base_tree)
        return start_trioserve(f"trioserve {tree.name}", workdir, tree, merge=False)
    raise ValueError(f"unknown server {kind!r}")


async def in_process_rows(args: argparse.Namespace) -> list[Row]:
    """The same model in this process: what streaming costs without any server."""
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
    rows = []
    for clients in [int(c) for c in args.clients.split(",")]:
        streams = max(args.streams, math.ceil(args.min_streams / clients))
        phase, wall = await run_phase(
            clients, streams, args.time_limit,
            lambda p: in_process_stream(model, mlserver.types, args.tokens, p),
        )  # fmt: skip
        rows.append(Row("in-process (no server)", "-", clients, phase, wall, None))
    return rows


async def main_async(args: argparse.Namespace) -> None:
    kinds = args.servers.split(",")
    rows: list[Row] = []
    for kind in kinds:
        with tempfile.TemporaryDirectory(prefix="trioserve-stream-bench-") as tmp:
            server = start(kind, Path(tmp), args)
            try:
                rows += await measure(server, args)
            finally:
                server.stop()
    rows += await in_process_rows(args)
    reference = {(r.protocol, r.clients): r.per_token for r in rows if r.name.startswith("MLS")}
    print(
        f"textgen, {args.tokens} tokens per stream, at least {args.min_streams} streams per "
        "phase; server CPU = main process + its children (trioserve: + worker), per token; "
        "ratio = to MLServer's, same protocol and concurrency"
    )
    print()
    print("| server | protocol | streams at once | tokens | tokens/event | tokens/s "
          "| first token p50 ms | server CPU µs/token | vs MLServer |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    order = {"SSE": 0, "gRPC": 1, "-": 2}
    for each in sorted(rows, key=lambda r: (order[r.protocol], r.clients)):
        print(each.line(reference.get((each.protocol, each.clients))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,16,64")
    parser.add_argument("--streams", type=int, default=4, help="streams per client, at least")
    parser.add_argument("--min-streams", type=int, default=64, help="streams per phase, at least")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--mlserver", default="/tmp/mls-venv", help="MLServer 1.7.1's venv")
    parser.add_argument("--base-tree", default="", help="an older trioserve checkout to compare")
    parser.add_argument("--servers", default="mlserver,trioserve,trioserve-merge,base")
    args = parser.parse_args()
    kinds = args.servers.split(",")
    if not args.base_tree and "base" in kinds:
        kinds.remove("base")
    if not Path(args.mlserver, "bin", "mlserver").exists() and "mlserver" in kinds:
        print(f"(no MLServer at {args.mlserver}: its rows are left out)", file=sys.stderr)
        kinds.remove("mlserver")
    args.servers = ",".join(kinds)
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
