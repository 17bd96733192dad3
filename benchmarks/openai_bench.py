"""What the OpenAI mapping costs: the same streams of the demo ``textgen`` model through the
OpenAI API (``/v1/completions`` and ``/v1/chat/completions``, ``"stream": true``) and through
the Open Inference Protocol's SSE (``/v2/models/textgen/generate_stream``), in one run.

One trioserve from this tree (loopback, free ports, token auth off, one worker). Each of C
client tasks (httpx) runs R streams of T tokens one after another; every stream's text is
checked against the model's one-shot answer. The server's CPU (its process and the worker,
from /proc via psutil) is read around each phase and printed per token, with each phase's
ratio to the OIP phase.

    .venv/bin/python benchmarks/openai_bench.py [--clients 1,16] [--streams 8] [--tokens 64]

Bounded by stream count and a time limit per phase. Clients and server share the machine's
CPUs: compare the rows of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import psutil
from stream_bench import Server, copy_model, cpu_seconds, serve_store

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "hello"

Stream = Callable[[httpx.AsyncClient, str, int], Awaitable[str]]


async def oip_stream(http: httpx.AsyncClient, base: str, tokens: int) -> str:
    body = {"inputs": [{"name": "prompt", "shape": [1], "datatype": "BYTES", "data": [PROMPT]}],
            "parameters": {"max_tokens": tokens}}  # fmt: skip
    words = []
    async with http.stream("POST", f"{base}/v2/models/textgen/generate_stream", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data:"):
                words.append(json.loads(line[5:])["outputs"][0]["data"][0])
    return " ".join(words)


async def _openai_stream(http: httpx.AsyncClient, url: str, body: dict[str, object]) -> str:
    pieces = []
    async with http.stream("POST", url, json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            choice = json.loads(line[5:])["choices"][0]
            pieces.append(
                choice["delta"].get("content") or "" if "delta" in choice else choice["text"]
            )
    return "".join(pieces)


async def completions_stream(http: httpx.AsyncClient, base: str, tokens: int) -> str:
    body = {"model": "textgen", "prompt": PROMPT, "max_tokens": tokens, "stream": True}
    return await _openai_stream(http, f"{base}/v1/completions", body)


async def chat_stream(http: httpx.AsyncClient, base: str, tokens: int) -> str:
    # The template puts the last message as it is, so the prompt is the same as the others'.
    body = {"model": "textgen", "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": tokens, "stream": True}  # fmt: skip
    return await _openai_stream(http, f"{base}/v1/chat/completions", body)


PHASES: dict[str, Stream] = {
    "OIP SSE generate_stream": oip_stream,
    "OpenAI /v1/completions": completions_stream,
    "OpenAI /v1/chat/completions": chat_stream,
}


def start(workdir: Path) -> Server:
    """trioserve serving textgen, its chat template reduced to the last message's text (so
    that a chat and a completion make the same prompt)."""
    store = copy_model(workdir, merge=False)
    settings_path = store / "textgen" / "model-settings.json"
    settings = json.loads(settings_path.read_text())
    settings["parameters"]["extra"]["openai"]["chat_template"] = "{{ messages[-1].content }}"
    settings_path.write_text(json.dumps(settings))
    return serve_store("trioserve", workdir, store, dict(os.environ))


async def phase(
    stream: Stream, base: str, clients: int, streams: int, tokens: int, expected: str,
    watched: psutil.Process, limit: float,
) -> tuple[float, float, int]:  # fmt: skip
    """(seconds, server CPU seconds, tokens) of C clients x R streams."""

    async def client(http: httpx.AsyncClient) -> int:
        for _ in range(streams):
            text = await stream(http, base, tokens)
            if text != expected:
                raise AssertionError(f"unexpected text: {text[:80]!r}")
        return streams * tokens

    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        await stream(http, base, tokens)  # warm up
        cpu0, t0 = cpu_seconds(watched), time.perf_counter()
        async with asyncio.timeout(limit):
            done = await asyncio.gather(*(client(http) for _ in range(clients)))
        return time.perf_counter() - t0, cpu_seconds(watched) - cpu0, sum(done)


async def run(args: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="openai-bench-"))
    server = start(workdir)
    watched = psutil.Process(server.process.pid)
    base = f"http://127.0.0.1:{server.http_port}"
    rows = []
    try:
        async with httpx.AsyncClient(timeout=60) as http:
            expected = await oip_stream(http, base, args.tokens)
        for clients in args.clients:
            baseline = None
            for name, stream in PHASES.items():
                secs, cpu, tokens = await phase(stream, base, clients, args.streams, args.tokens,
                                                expected, watched, args.time_limit)  # fmt: skip
                per_token = cpu / tokens * 1e6
                baseline = per_token if baseline is None else baseline
                # too short a phase reads no CPU tick at all: no ratio then
                ratio = per_token / baseline if baseline else float("nan")
                rows.append((clients, name, tokens / secs, per_token, ratio))
    finally:
        server.process.terminate()
        server.process.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"textgen, {args.tokens} tokens per stream, {args.streams} streams per client, "
          "one worker; server CPU = server process + worker, per token\n")  # fmt: skip
    print("| clients | endpoint | tokens/s | server CPU µs/token | x OIP SSE |")
    print("|---:|---|---:|---:|---:|")
    for clients, name, rate, per_token, ratio in rows:
        print(f"| {clients} | {name} | {rate:,.0f} | {per_token:.1f} | {ratio:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=lambda s: [int(c) for c in s.split(",")], default=[1, 16])
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--time-limit", type=float, default=120)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
