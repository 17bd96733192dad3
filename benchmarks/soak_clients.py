"""The clients of ``benchmarks/soak.py``: one asyncio task per connection, each paced, bounded
by a deadline, and checking every reply.

Kinds (``KINDS``): HTTP echo (raw HTTP/1.1 keep-alive, reconnecting now and then), gRPC
``Predictions`` on echo (one grpclib channel, i.e. one HTTP/2 connection, per client, remade
now and then), SSE streams of ``textgen`` read to the end, SSE and gRPC ``ModelStreamInfer``
streams abandoned after a few events, and sequences of the ``stateful`` model over HTTP (the
sequence header; one client opens a new connection per request) and over gRPC
``StreamPredictions2``. An abandoned stream's own failures (at or after the close) go to
``Tally.own``; anything else wrong is an error.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from grpclib.client import Channel
from grpclib.const import Cardinality

from trioserve._proto.inference import (
    InferParameter,
    InferTensorContents,
    ModelInferRequest,
    ModelInferRequestInferInputTensor,
    ModelInferResponse,
)
from trioserve._proto.org.pytorch.serve.grpc.inference import (
    InferenceApIsServiceStub,
    PredictionResponse,
    PredictionsRequest,
)

ABANDONED = ("sse-abandon", "grpc-abandon")
KINDS = ("http-echo", "grpc-echo", "sse-full", *ABANDONED, "seq-http", "seq-grpc")
TIMEOUT = 30.0  # one request, stream or sequence
KEEP_TEXTS = 5
PROMPTS = ("hello", "the quick model", "soak test", "one more stream")
FULL_TOKENS, ABANDON_TOKENS, ABANDON_MOST = 16, 256, 4  # abandoned after 0 to 4 events
TS = "/org.pytorch.serve.grpc.inference.InferenceAPIsService/"
MODEL_STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"


class Wrong(Exception):
    """A reply that is not what the model defines."""


@dataclass
class Tally:
    done: int = 0
    errors: int = 0
    own: int = 0  # an abandoned stream's own failures
    texts: list[str] = field(default_factory=list)
    own_texts: list[str] = field(default_factory=list)

    def fail(self, error: BaseException, own: bool = False) -> None:
        text = f"{time.strftime('%H:%M:%S')} {type(error).__name__}: {error}"[:300]
        if own:
            self.own += 1
        else:
            self.errors += 1
        if len(kept := self.own_texts if own else self.texts) < KEEP_TEXTS:
            kept.append(text)


@dataclass
class Target:
    http_port: int
    grpc_port: int
    metrics_port: int
    management_port: int
    rate: float  # scales every client's pace
    expected: dict[tuple[str, int], list[str]] = field(default_factory=dict)  # textgen words
    tallies: dict[str, Tally] = field(default_factory=lambda: {k: Tally() for k in KINDS})


def oip_body(prompt: str, tokens: int, delay: float = 0.0) -> dict[str, Any]:
    parameters: dict[str, Any] = {"max_tokens": tokens}
    if delay:
        parameters["delay"] = delay
    inputs = [{"name": "prompt", "shape": [1], "datatype": "BYTES", "data": [prompt]}]
    return {"inputs": inputs, "parameters": parameters}


async def learn_expected(target: Target) -> None:
    """textgen's whole answer (``/infer``) for every prompt and length the streams use."""
    url = f"http://127.0.0.1:{target.http_port}/v2/models/textgen/infer"
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        for prompt in PROMPTS:
            for tokens in (FULL_TOKENS, ABANDON_TOKENS):
                reply = await client.post(url, json=oip_body(prompt, tokens))
                reply.raise_for_status()
                text = reply.json()["outputs"][0]["data"][0]
                target.expected[prompt, tokens] = text.split(" ")


class HttpConn:
    """One keep-alive HTTP/1.1 connection, opened when needed, remade every ``reuse`` requests."""

    def __init__(self, port: int, reuse: int) -> None:
        self.port, self.reuse, self.used = port, reuse, 0
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def request(
        self, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        if self.streams is None or self.used >= self.reuse:
            self.close()
            self.streams = await asyncio.open_connection("127.0.0.1", self.port)
            self.used = 0
        reader, writer = self.streams
        self.used += 1
        head = f"POST {path} HTTP/1.1\r\nHost: soak\r\nContent-Length: {len(body)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        writer.write(head.encode() + body)
        lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        got = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            got[name.strip().lower()] = value.strip()
        if "content-length" in got:
            data = await reader.readexactly(int(got["content-length"]))
        elif got.get("transfer-encoding") == "chunked":
            data = b""
            while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
                data += (await reader.readexactly(size + 2))[:-2]
            await reader.readuntil(b"\r\n")
        else:
            raise Wrong(f"reply without a length: {lines[0]}")
        if got.get("connection", "").lower() == "close":
            self.close()
        return status, got, data

    def close(self) -> None:
        if self.streams is not None:
            self.streams[1].close()
            self.streams = None


async def paced(
    deadline: float,
    period: float,
    tally: Tally,
    once: Callable[[], Awaitable[None]],
    reset: Callable[[], None],
) -> None:
    """``once()`` every ``period`` seconds until ``deadline``; each bounded by ``TIMEOUT``."""
    due = time.monotonic() + random.uniform(0, period)
    while True:
        pause = due - time.monotonic()
        if pause > 0:
            await asyncio.sleep(pause)
        if time.monotonic() >= deadline:
            return
        try:
            async with asyncio.timeout(min(TIMEOUT, max(1.0, deadline + 10 - time.monotonic()))):
                await once()
            tally.done += 1
        except Exception as error:  # every failure is counted, then the client goes on
            tally.fail(error)
            reset()
        due = max(due + period, time.monotonic())


async def http_echo(target: Target, deadline: float, n: int) -> None:
    conn, count = HttpConn(target.http_port, reuse=500), 0
    headers = {"Content-Type": "application/octet-stream"}

    async def once() -> None:
        nonlocal count
        count += 1
        body = f"soak {n} {count} ".encode() * (1 + count % 7)
        status, _, data = await conn.request("/predictions/echo", body, headers)
        if status != 200 or data != body:
            raise Wrong(f"echo: {status} {data[:120]!r}")

    try:
        await paced(deadline, 0.125 / target.rate, target.tallies["http-echo"], once, conn.close)
    finally:
        conn.close()


async def grpc_echo(target: Target, deadline: float, n: int, callers: int = 2) -> None:
    """``callers`` concurrent callers on one channel; the channel is remade every minute."""
    channel = Channel("127.0.0.1", target.grpc_port)
    made, count, channels = time.monotonic(), 0, [channel]

    async def once() -> None:
        nonlocal channel, made, count
        if time.monotonic() - made > 60:  # the old one closes once its calls are over
            asyncio.get_running_loop().call_later(TIMEOUT + 5, channel.close)
            channel, made = Channel("127.0.0.1", target.grpc_port), time.monotonic()
            channels.append(channel)
        count += 1
        payload = f"grpc {n} {count}".encode()
        stub = InferenceApIsServiceStub(channel)
        reply = await stub.predictions(
            PredictionsRequest(model_name="echo", input={"data": payload})
        )
        if reply.prediction != payload:
            raise Wrong(f"grpc echo: {reply.prediction[:120]!r}")

    tally = target.tallies["grpc-echo"]
    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(callers):
                group.create_task(paced(deadline, 0.2 / target.rate, tally, once, lambda: None))
    finally:
        for each in channels:
            each.close()


async def sse(target: Target, deadline: float, abandon: bool) -> None:
    kind = "sse-abandon" if abandon else "sse-full"
    tally = target.tallies[kind]
    url = f"http://127.0.0.1:{target.http_port}/v2/models/textgen/generate_stream"
    tokens = ABANDON_TOKENS if abandon else FULL_TOKENS
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:

        async def once() -> None:
            prompt, leaving = random.choice(PROMPTS), False
            words: list[str] = []
            want = target.expected[prompt, tokens]
            stop = random.randint(0, ABANDON_MOST) if abandon else None  # events read
            try:
                body = oip_body(prompt, tokens, 0.02 if abandon else 0.0)
                async with client.stream("POST", url, json=body) as response:
                    if response.status_code != 200:
                        raise Wrong(f"{kind}: {response.status_code} {await response.aread()!r}")
                    async for line in response.aiter_lines():
                        if len(words) == stop:
                            leaving = True  # the client goes away mid-stream
                            break
                        if line.startswith("data:"):
                            event = json.loads(line[5:])
                            if "error" in event:
                                raise Wrong(f"{kind}: error event {line[:200]}")
                            words.append(event["outputs"][0]["data"][0])
            except Exception as error:
                if not leaving:
                    raise
                tally.fail(error, own=True)  # raised by the close: the stream's own
            if words != want[:stop]:
                raise Wrong(f"{kind}: {words[:20]} != {want[:20]}")

        await paced(deadline, 0.5 / target.rate, tally, once, lambda: None)


def grpc_words(reply: ModelInferResponse) -> list[str]:
    if reply.raw_output_contents:
        return [raw[4:].decode() for raw in reply.raw_output_contents]
    return [
        b.decode()
        for o in reply.outputs
        for b in (o.contents or InferTensorContents()).bytes_contents
    ]


async def grpc_abandon(target: Target, deadline: float) -> None:
    """``ModelStreamInfer`` on textgen, cancelled after a few messages (a new channel each)."""
    tally = target.tallies["grpc-abandon"]

    async def once() -> None:
        prompt = random.choice(PROMPTS)
        request = ModelInferRequest(
            model_name="textgen",
            parameters={
                "max_tokens": InferParameter(int64_param=ABANDON_TOKENS),
                "delay": InferParameter(double_param=0.02),
            },
            inputs=[
                ModelInferRequestInferInputTensor(
                    name="prompt",
                    datatype="BYTES",
                    shape=[1],
                    contents=InferTensorContents(bytes_contents=[prompt.encode()]),
                )
            ],
        )
        channel, leaving = Channel("127.0.0.1", target.grpc_port), False
        stop = random.randint(0, ABANDON_MOST)  # messages read before the cancel
        words: list[str] = []
        try:
            async with channel.request(
                MODEL_STREAM_INFER, Cardinality.STREAM_STREAM, ModelInferRequest, ModelInferResponse
            ) as stream:
                await stream.send_message(request, end=True)
                while len(words) < stop:
                    if (reply := await stream.recv_message()) is None:
                        raise Wrong(f"grpc-abandon: the stream ended after {words}")
                    words += grpc_words(reply)
                leaving = True
                await stream.cancel()
        except Exception as error:
            if not leaving:
                raise
            tally.fail(error, own=True)
        finally:
            channel.close()
        if words[:stop] != (want := target.expected[prompt, ABANDON_TOKENS][:stop]):
            raise Wrong(f"grpc-abandon: {words} != {want}")

    await paced(deadline, 1.0 / target.rate, tally, once, lambda: None)


def sequence_values() -> list[int]:
    return [random.randint(1, 9) for _ in range(random.randint(3, 8))]


async def seq_http(target: Target, deadline: float, n: int, hop: bool) -> None:
    """Sequences over HTTP; ``hop``: a new connection per request (so, with several serving
    processes, the requests of one sequence land on different ones). Every 5th sequence checks
    that its id is refused once ended."""
    conn, count = HttpConn(target.http_port, reuse=1 if hop else 1000), 0

    async def once() -> None:
        nonlocal count
        count += 1
        own_id = count % 2 == 0  # half name their own id, half take the server's
        sequence = f"soak-{n}-{count}-{random.getrandbits(32):08x}" if own_id else ""
        total = 0
        for value in [*sequence_values(), 0]:
            headers = {"Content-Type": "text/plain"}
            if sequence:
                headers["ts_request_sequence_id"] = sequence
            status, got, data = await conn.request(
                "/predictions/stateful", str(value).encode(), headers
            )
            total += value
            if status != 200 or data != str(total).encode():
                raise Wrong(f"seq-http {sequence}: {status} {data[:200]!r}, want {total}")
            named = got.get("ts_request_sequence_id", "")
            if not named or named != (sequence or named):
                raise Wrong(f"seq-http: the answer names sequence {named!r}, not {sequence!r}")
            sequence = named
            await asyncio.sleep(0.02)
        if got.get("ts_request_sequence_end") != sequence:
            raise Wrong(f"seq-http {sequence}: no end header on the last answer")
        if count % 5 == 0:
            headers = {"Content-Type": "text/plain", "ts_request_sequence_id": sequence}
            status, _, data = await conn.request("/predictions/stateful", b"1", headers)
            if status != 400:
                raise Wrong(f"seq-http {sequence}: ended, yet {status} {data[:200]!r}")

    try:
        await paced(deadline, 0.5 / target.rate, target.tallies["seq-http"], once, conn.close)
    finally:
        conn.close()


async def seq_grpc(target: Target, deadline: float) -> None:
    """One sequence per ``StreamPredictions2`` stream, the server minting its id."""
    channel = Channel("127.0.0.1", target.grpc_port)

    async def once() -> None:
        async with channel.request(
            TS + "StreamPredictions2",
            Cardinality.STREAM_STREAM,
            PredictionsRequest,
            PredictionResponse,
        ) as stream:
            await stream.send_request()
            total, sequence = 0, None
            for value in [*sequence_values(), 0]:
                request = PredictionsRequest(
                    model_name="stateful", input={"data": str(value).encode()}
                )
                await stream.send_message(request, end=value == 0)
                reply = await stream.recv_message()
                total += value
                if reply is None or (reply.status is not None and reply.status.code != 0):
                    raise Wrong(f"seq-grpc {sequence}: {reply}")
                if reply.prediction != str(total).encode() or reply.sequence_id in ("", None):
                    raise Wrong(f"seq-grpc {sequence}: {reply.prediction[:100]!r}, want {total}")
                if sequence not in (None, reply.sequence_id):
                    raise Wrong(f"seq-grpc: id {reply.sequence_id} != {sequence}")
                sequence = reply.sequence_id
            if (extra := await stream.recv_message()) is not None:
                raise Wrong(f"seq-grpc {sequence}: a reply after the last: {extra}")

    def reset() -> None:
        nonlocal channel
        channel.close()
        channel = Channel("127.0.0.1", target.grpc_port)

    try:
        await paced(deadline, 0.5 / target.rate, target.tallies["seq-grpc"], once, reset)
    finally:
        channel.close()


async def run_all(target: Target, seconds: float, http_conns: int, grpc_conns: int) -> None:
    """Every client at once, until ``seconds`` from now (each stops by itself)."""
    deadline = time.monotonic() + seconds
    async with asyncio.TaskGroup() as group:
        for n in range(http_conns):
            group.create_task(http_echo(target, deadline, n))
        for n in range(grpc_conns):
            group.create_task(grpc_echo(target, deadline, n))
        for _ in range(2):
            group.create_task(sse(target, deadline, abandon=False))
        for _ in range(3):
            group.create_task(sse(target, deadline, abandon=True))
        group.create_task(grpc_abandon(target, deadline))
        for n, hop in enumerate((False, False, True)):
            group.create_task(seq_http(target, deadline, n, hop))
        for _ in range(2):
            group.create_task(seq_grpc(target, deadline))
