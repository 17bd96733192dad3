"""What a Trio HTTP/1.1 server costs per request at the least: the floor under trioserve's
HTTP numbers, measured beside trioserve in one run.

``floor`` is a bare Trio server: one task per connection that waits for its socket, reads
with ``os.read``, finds the end of each request (head and ``Content-Length`` body, nothing
else checked) and writes a fixed answer carrying the body back with ``os.write``. No
routing, no dataplane, no workers: the Trio scheduler, the socket calls and a minimal parse.
``trioserve`` is the real server from this checkout on the shared harness's echo model
(``--workers`` workers, ``--batch`` 1 or 8), started by the harness's peer script; ``base``
is the same from ``--base-tree DIR`` (an older checkout, run with ``PYTHONPATH=DIR``), for a
before/after in the same run.

Both are loaded with ``../shared/bench``'s wrk script (keep-alive, C connections, one
request in flight each); the table gives requests/s and the server's CPU time per request
(for trioserve its serving process and, apart, its workers), read from /proc around the run.

    .venv/bin/python benchmarks/http_floor.py [--secs 5] [--concs 16,64] [--modes floor,trioserve]
        [--workers 2] [--batch 8] [--rounds 1] [--base-tree DIR]

Loopback only (port 18080 for the floor; the harness's ports for trioserve); every run is
bounded by wrk's duration and a timeout.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
from ab_interleaved import cpu

ROOT = Path(__file__).resolve().parent.parent
BENCH = (ROOT / ".." / "shared" / "bench").resolve()
FLOOR_PORT = 18080


def serve() -> None:
    """The floor server (runs in its own process)."""
    import trio

    async def connection(stream: trio.SocketStream) -> None:
        sock = stream.socket
        fd = sock.fileno()
        buffer = b""
        async with stream:
            while True:
                end = buffer.find(b"\r\n\r\n")
                if end < 0:
                    await trio.lowlevel.wait_readable(sock)
                    try:
                        data = os.read(fd, 65536)
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        return
                    if not data:
                        return
                    buffer += data
                    continue
                head = buffer[:end].lower()
                match = re.search(rb"content-length:\s*(\d+)", head)
                length = int(match.group(1)) if match else 0
                start = end + 4
                while len(buffer) < start + length:
                    await trio.lowlevel.wait_readable(sock)
                    data = os.read(fd, 65536)
                    if not data:
                        return
                    buffer += data
                body = buffer[start : start + length]
                buffer = buffer[start + length :]
                answer = (
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(body), body)
                )
                sent = os.write(fd, answer)
                if sent < len(answer):
                    await stream.send_all(answer[sent:])

    async def main() -> None:
        await trio.serve_tcp(connection, FLOOR_PORT, host="127.0.0.1")

    trio.run(main)


def _wait_listening(port: int, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port} after {timeout} s")


def _load(url: str, conc: int, secs: int) -> tuple[int, float]:
    line = subprocess.run(
        [
            str(BENCH / "load" / "http_wrk.sh"),
            url,
            str(BENCH / "load" / "bodies" / "hello.bin"),
            str(conc),
            str(secs),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=secs + 60,
    ).stdout
    fields = dict(part.split("=", 1) for part in line.split())
    if fields.get("non2xx") != "0" or fields.get("sockerr") != "0":
        raise SystemExit(f"bad answers under load: {line.strip()}")
    return int(fields["n"]), float(fields["rps"])


def _measure(
    url: str, server: list[psutil.Process], workers: list[psutil.Process], conc: int, secs: int
) -> tuple[float, float, float]:
    _load(url, conc, 1)  # warm-up
    s0, w0 = cpu(server), cpu(workers)
    n, rps = _load(url, conc, secs)
    s1, w1 = cpu(server), cpu(workers)
    return rps, (s1 - s0) * 1e6 / n, (w1 - w0) * 1e6 / n


def _rows_floor(args: argparse.Namespace) -> list[tuple[str, int, float, float, float]]:
    proc = subprocess.Popen([sys.executable, __file__, "--serve"])
    try:
        _wait_listening(FLOOR_PORT, proc)
        server = [psutil.Process(proc.pid)]
        url = f"http://127.0.0.1:{FLOOR_PORT}/predictions/echo"
        return [("floor", c, *_measure(url, server, [], c, args.secs)) for c in args.concs]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _rows_trioserve(
    mode: str, args: argparse.Namespace
) -> list[tuple[str, int, float, float, float]]:
    env = dict(os.environ, PROJECT=str(ROOT), WORKERS=str(args.workers), BATCH=str(args.batch))
    if mode == "base":
        env["PYTHONPATH"] = str(args.base_tree.resolve())
    peer = BENCH / "peers" / "trioserve"
    line = (
        subprocess.run(
            [str(peer / "start.sh")],
            check=True,
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=180,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    pid = int(re.search(r"pid=(\d+)", line).group(1))  # type: ignore[union-attr]
    try:
        main = psutil.Process(pid)
        children = main.children(recursive=True)
        # Serving processes are named like the server; workers run the worker module.
        workers = [p for p in children if "trioserve.worker" in " ".join(p.cmdline())]
        server = [main] + [p for p in children if p not in workers]
        url = "http://127.0.0.1:8080/predictions/echo"
        return [(mode, c, *_measure(url, server, workers, c, args.secs)) for c in args.concs]
    finally:
        subprocess.run([str(peer / "stop.sh")], env=env, cwd=ROOT, capture_output=True, timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--secs", type=int, default=5)
    parser.add_argument("--concs", default="16,64")
    parser.add_argument("--modes", default="floor,trioserve")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, choices=(1, 8), default=8)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--base-tree", type=Path)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    args.concs = [int(c) for c in args.concs.split(",")]
    print("| round | mode | c | requests/s | server CPU µs/req | workers µs/req | ratio to floor |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for round_no in range(1, args.rounds + 1):
        rows = []
        for mode in args.modes.split(","):
            rows += _rows_floor(args) if mode == "floor" else _rows_trioserve(mode, args)
        floor = {c: s + w for mode, c, _, s, w in rows if mode == "floor"}
        for mode, c, rps, s, w in rows:
            ratio = f"{(s + w) / floor[c]:.2f}" if c in floor else "-"
            print(
                f"| {round_no} | {mode} | {c} | {rps:,.0f} | {s:.0f} | {w:.0f} | {ratio} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
