"""What grpclib alone costs per unary call: the floor under trioserve's gRPC numbers.

Starts a bare grpclib server (plain asyncio, one process, no Trio) whose TorchServe
``Predictions`` handler returns its input and does nothing else, loads it with h2load from
``../shared/bench`` (one connection, C streams, count mode, like a gRPC channel), and prints
calls/s and the server's CPU time per call, read from /proc.

    .venv/bin/python benchmarks/grpclib_floor.py [--calls 10000] [--concs 16,64] [--uvloop]

Loopback only (port 17070); bounded by the call count and a timeout.
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
from pathlib import Path
from typing import Any

import psutil

BENCH = (Path(__file__).resolve().parent.parent / ".." / "shared" / "bench").resolve()
PORT = 17070
PATH = "/org.pytorch.serve.grpc.inference.InferenceAPIsService/Predictions"


def serve(use_uvloop: bool) -> None:
    from grpclib.server import Server

    from trioserve._proto.org.pytorch.serve.grpc.inference import (
        InferenceApIsServiceBase,
        PredictionResponse,
    )

    class Echo(InferenceApIsServiceBase):
        async def predictions(self, message: Any) -> PredictionResponse:
            return PredictionResponse(prediction=message.input["data"])

    async def main() -> None:
        server = Server([Echo()])
        await server.start("127.0.0.1", PORT)
        await server.wait_closed()

    if use_uvloop:
        import uvloop  # type: ignore[import-not-found]

        uvloop.install()
    asyncio.run(main())


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
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.uvloop)
        return
    cmd = [sys.executable, __file__, "--serve"] + (["--uvloop"] if args.uvloop else [])
    server = subprocess.Popen(cmd)
    try:
        _wait_listening(server)
        proc = psutil.Process(server.pid)
        print("| streams | calls/s | server CPU µs/call |\n|---:|---:|---:|")
        for conc in [int(c) for c in args.concs.split(",")]:
            before = proc.cpu_times()
            env = dict(os.environ, EXPECT_RESP_BYTES="12", H2_N=str(args.calls))
            out = subprocess.run(
                [
                    str(BENCH / "load/grpc_h2load.sh"),
                    f"http://127.0.0.1:{PORT}{PATH}",
                    str(BENCH / "load/bodies/ts_predictions_hello.grpc"),
                    str(conc),
                    "120",
                ],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            after = proc.cpu_times()
            n = int(re.search(r"\bn=(\d+)", out).group(1))  # type: ignore[union-attr]
            rps = float(re.search(r"\brps=([0-9.]+)", out).group(1))  # type: ignore[union-attr]
            used = (after.user + after.system) - (before.user + before.system)
            print(f"| {conc} | {rps:.0f} | {used * 1e6 / max(n, 1):.0f} |")
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
