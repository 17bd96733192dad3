"""What grpclib alone costs per unary call: the floor under trioserve's gRPC numbers, what each
way of crossing into Trio adds to it, and trioserve's whole gRPC path beside it, in one run.

Starts a bare grpclib server whose TorchServe ``Predictions`` handler returns its input,
loads it with h2load from ``../shared/bench`` (one connection, C streams, count mode, like a
gRPC channel), and prints calls/s and the server's CPU time per call, read from /proc. The
mode says where the answer comes from:

- ``floor``: the asyncio handler itself (plain asyncio, no Trio);
- ``thread``: a Trio task, through trioserve's ``LoopThread`` (grpclib's loop in a thread of
  its own, Trio in the main thread: a crossing each way per call, two threads on one GIL);
  how the server ran before issue 28, and its fallback now;
- ``driven``: a Trio task, through trioserve's ``DrivenLoop`` (grpclib's loop stepped by a
  Trio task on Trio's thread): how the server runs since issue 28;
- ``guest``: a Trio task, Trio running as a guest on grpclib's loop
  (``trio.lowlevel.start_guest_run``): Trio's tasks run on the loop's thread; only Trio's
  I/O wait stays in a thread of its own;
- ``trioserve``: the real server from this checkout, started by the shared harness's peer
  script (its echo handler, ``--workers`` workers, ``--batch`` 1 or 8), CPU of the server and
  of its workers per call; ``base``: the same from ``--base-tree DIR`` (an older checkout run
  with ``PYTHONPATH=DIR``), for a before/after in the same run.

The last column divides each row's whole CPU per call (server and workers) by the floor's
at the same stream count in the same round.

    .venv/bin/python benchmarks/grpclib_floor.py [--calls 10000] [--concs 16,64]
        [--modes floor,thread,guest,driven,trioserve,base] [--base-tree DIR] [--rounds 1]
        [--workers 2] [--batch 8] [--uvloop]

Loopback only (port 17070; the trioserve rows use the harness's ports, 7070-8082); bounded by
the call count and a timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
from ab_interleaved import cpu as _cpu

BENCH = (Path(__file__).resolve().parent.parent / ".." / "shared" / "bench").resolve()
PORT = 17070
PATH = "/org.pytorch.serve.grpc.inference.InferenceAPIsService/Predictions"


# Where the handler's answer comes from (None: the handler itself); set by the mode.
_ANSWER: Callable[[bytes], Awaitable[bytes]] | None = None


async def _in_trio(data: bytes) -> bytes:
    """The least a Trio rpc implementation does: run as a task, checkpoint, answer."""
    import trio

    await trio.lowlevel.checkpoint()
    return data


async def _grpclib_server() -> None:
    from grpclib.server import Server

    from trioserve._proto.org.pytorch.serve.grpc.inference import (
        InferenceApIsServiceBase,
        PredictionResponse,
    )

    class Echo(InferenceApIsServiceBase):
        async def predictions(self, message: Any) -> PredictionResponse:
            data = message.input["data"]
            if _ANSWER is not None:
                data = await _ANSWER(data)
            return PredictionResponse(prediction=data)

    server = Server([Echo()])
    await server.start("127.0.0.1", PORT)
    await server.wait_closed()


def serve(use_uvloop: bool, mode: str) -> None:
    if mode in ("thread", "driven"):
        import trio

        from trioserve.grpc.driven import DrivenLoop
        from trioserve.grpc.loop_thread import LoopThread

        async def trio_main() -> None:
            global _ANSWER
            async with trio.open_nursery() as nursery:
                kind = LoopThread if mode == "thread" else DrivenLoop
                portal: LoopThread | DrivenLoop = await nursery.start(kind().run)

                def answer(data: bytes) -> Awaitable[bytes]:
                    return portal.run_trio(_in_trio, data)

                _ANSWER = answer
                await portal.run_aio(_grpclib_server())

        trio.run(trio_main)
        return
    if use_uvloop:
        import uvloop  # type: ignore[import-not-found]

        uvloop.install()
    asyncio.run(_guest_main() if mode == "guest" else _grpclib_server())


async def _guest_main() -> None:
    """grpclib's loop as the host, Trio as its guest: the handler's answers come from Trio
    tasks started in the guest's nursery, on the same thread."""
    import outcome
    import trio

    global _ANSWER
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[tuple[Any, Any]] = loop.create_future()

    async def trio_main() -> None:
        async with trio.open_nursery() as nursery:
            ready.set_result((trio.lowlevel.current_trio_token(), nursery))
            await trio.sleep_forever()

    trio.lowlevel.start_guest_run(
        trio_main,
        run_sync_soon_threadsafe=loop.call_soon_threadsafe,
        run_sync_soon_not_threadsafe=loop.call_soon,
        done_callback=lambda result: None,
    )
    token, nursery = await ready

    async def answer(data: bytes) -> bytes:
        future: asyncio.Future[Any] = loop.create_future()

        async def runner() -> None:
            result = await outcome.acapture(_in_trio, data)
            loop.call_soon(future.set_result, result)

        token.run_sync_soon(nursery.start_soon, runner)
        return (await future).unwrap()  # type: ignore[no-any-return]

    _ANSWER = answer
    await _grpclib_server()


def _wait_listening(server: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if server.poll() is not None:
            raise RuntimeError(f"the grpclib server exited with {server.returncode}")
        try:
            socket.create_connection(("127.0.0.1", PORT), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # a plain script: nothing else to run meanwhile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=10000)
    parser.add_argument("--concs", default="16,64")
    parser.add_argument("--uvloop", action="store_true")
    parser.add_argument("--modes", default="floor,thread,guest")
    parser.add_argument("--base-tree", type=Path)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, choices=(1, 8), default=8)
    parser.add_argument("--serve", help=argparse.SUPPRESS)  # the mode, in the server process
    args = parser.parse_args()
    if args.serve:
        serve(args.uvloop, args.serve)
        return
    modes = args.modes.split(",")
    if "base" in modes and args.base_tree is None:
        parser.error("mode base needs --base-tree")
    print(
        "| round | mode | streams | calls/s | server CPU µs/call | workers µs/call "
        "| total µs/call | ratio to floor |\n|---|---|---:|---:|---:|---:|---:|---:|"
    )
    for round_ in range(1, args.rounds + 1):
        rows = [row for mode in modes for row in _measure(mode, args)]
        floors = {conc: total for mode, conc, _rps, _srv, _wrk, total in rows if mode == "floor"}
        for mode, conc, rps, server_us, workers_us, total in rows:
            ratio = f"{total / floors[conc]:.2f}" if conc in floors else "-"
            print(
                f"| {round_} | {mode} | {conc} | {rps:.0f} | {server_us:.0f} | {workers_us:.0f} "
                f"| {total:.0f} | {ratio} |",
                flush=True,
            )


Row = tuple[str, int, float, float, float, float]


def _load(port: int, conc: int, calls: int) -> tuple[int, float]:
    env = dict(os.environ, EXPECT_RESP_BYTES="12", H2_N=str(calls))
    out = subprocess.run(
        [
            str(BENCH / "load/grpc_h2load.sh"),
            f"http://127.0.0.1:{port}{PATH}",
            str(BENCH / "load/bodies/ts_predictions_hello.grpc"),
            str(conc),
            "120",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    n = int(re.search(r"\bn=(\d+)", out).group(1))  # type: ignore[union-attr]
    rps = float(re.search(r"\brps=([0-9.]+)", out).group(1))  # type: ignore[union-attr]
    if re.search(r"\b(failed|errored|grpc_bad)=[1-9]", out):
        raise RuntimeError(f"h2load saw failed calls: {out}")
    return n, rps


def _measure(mode: str, args: argparse.Namespace) -> list[Row]:
    if mode in ("trioserve", "base"):
        return _measure_trioserve(mode, args)
    cmd = [sys.executable, __file__, "--serve", mode] + (["--uvloop"] if args.uvloop else [])
    server = subprocess.Popen(cmd)
    rows: list[Row] = []
    try:
        _wait_listening(server)
        proc = psutil.Process(server.pid)
        for conc in [int(c) for c in args.concs.split(",")]:
            before = _cpu([proc])
            n, rps = _load(PORT, conc, args.calls)
            per_call = (_cpu([proc]) - before) * 1e6 / max(n, 1)
            rows.append((mode, conc, rps, per_call, 0.0, per_call))
    finally:
        server.terminate()
        server.wait(10)
    return rows


def _measure_trioserve(mode: str, args: argparse.Namespace) -> list[Row]:
    """The real server through the harness's peer script: server and worker CPU per call."""
    env = dict(os.environ, WORKERS=str(args.workers), BATCH=str(args.batch))
    env["PROJECT"] = str(Path(__file__).resolve().parents[1])
    if mode == "base":
        env["PYTHONPATH"] = str(args.base_tree.resolve())
    peer = BENCH / "peers/trioserve"
    started = subprocess.run(
        [str(peer / "start.sh")], env=env, capture_output=True, text=True, check=True
    ).stdout
    pid = int(re.search(r"pid=(\d+)", started).group(1))  # type: ignore[union-attr]
    rows: list[Row] = []
    try:
        server = psutil.Process(pid)
        _load(7070, 64, min(args.calls, 3000))  # warm-up
        for conc in [int(c) for c in args.concs.split(",")]:
            workers = server.children(recursive=True)
            before_server, before_workers = _cpu([server]), _cpu(workers)
            n, rps = _load(7070, conc, args.calls)
            server_us = (_cpu([server]) - before_server) * 1e6 / max(n, 1)
            workers_us = (_cpu(workers) - before_workers) * 1e6 / max(n, 1)
            rows.append((mode, conc, rps, server_us, workers_us, server_us + workers_us))
    finally:
        subprocess.run([str(peer / "stop.sh")], env=env, capture_output=True, check=False)
    return rows


if __name__ == "__main__":
    main()
