"""trioserve with 0, 1, 2 ... ingress processes, side by side in one run (HTTP only).

Starts this checkout's trioserve with the shared bench's echo model and configs
(``../shared/bench/peers/torchserve``: same handler, model configs and ports as
``ts_ratio.py``), adding ``ingress_processes=N`` to its config, and loads it with the shared
harness's wrk script. Around each measured run, the CPU time of every process of the server
is read (psutil) and split into the server process (the hub), its ingress processes and the
model's workers, per request served.

    .venv/bin/python benchmarks/ingress_ab.py [--ingress 0,1,2] [--configs w2b8,w1b1]
        [--concs 1,16,64] [--secs 5]

Prints a markdown table: rps, the ratio to ``ingress_processes=0`` and µs of CPU per request
of each part. Loopback only; every load run is bounded by time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ts_ratio import BENCH, CONFIGS, ROOT, _field, run_load

PEER = BENCH / "peers" / "torchserve"  # the echo handler, model configs, config template


@dataclass
class Point:
    ingress: int
    config: str
    conc: int
    rps: float
    hub_us: float
    ingress_us: float
    worker_us: float


def _kind(proc: psutil.Process) -> str:
    cmdline = " ".join(proc.cmdline())
    if "trioserve.http.ingress_process" in cmdline:
        return "ingress"
    if "trioserve.worker" in cmdline:
        return "worker"
    return "hub"


def cpu(pid: int) -> dict[str, float]:
    root = psutil.Process(pid)
    used = {"hub": 0.0, "ingress": 0.0, "worker": 0.0}
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            used[_kind(proc)] += times.user + times.system
        except psutil.Error:
            continue
    return used


def start(run_dir: Path, workers: int, batch: int, ingress: int) -> subprocess.Popen[bytes]:
    store = run_dir / "store"
    store.mkdir(parents=True, exist_ok=True)
    trioserve = str(Path(sys.executable).parent / "trioserve")
    subprocess.run(
        [trioserve, "archive", "--model-name", "echo", "--version", "1.0",
         "--handler", str(PEER / "echo_handler.py"),
         "--config-file", str(PEER / f"model-config-b{batch}.yaml"),
         "--export-path", str(store), "-f"],
        check=True, capture_output=True,
    )  # fmt: skip
    template = (PEER / "config.properties.in").read_text()
    config = run_dir / "config.properties"
    config.write_text(
        template.replace("@WORKERS@", str(workers)) + f"ingress_processes={ingress}\n"
    )
    log = (run_dir / f"server-{ingress}.log").open("wb")
    server = subprocess.Popen(
        [trioserve, "start", "--foreground", "--ncs", "--model-store", str(store),
         "--models", "echo=echo.mar", "--ts-config", str(config), "--disable-token-auth"],
        cwd=run_dir, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"trioserve exited; see {log.name}")
        try:
            ping = httpx.get("http://127.0.0.1:8080/ping", timeout=1)
            models = httpx.get("http://127.0.0.1:8081/models/echo", timeout=1).text
            if ping.status_code == 200 and models.count('"READY"') >= workers:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    server.kill()
    raise RuntimeError("trioserve was not ready in 60 s")


def stop(server: subprocess.Popen[bytes]) -> None:
    server.terminate()
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(10)


def measure(ingress: int, config: str, args: argparse.Namespace, run_dir: Path) -> list[Point]:
    workers, batch = CONFIGS[config]
    server = start(run_dir, workers, batch, ingress)
    points = []
    try:
        run_load("http", 16, 2, None)  # warm-up after start
        for conc in args.concs:
            run_load("http", conc, 1, None)
            before = cpu(server.pid)
            line = run_load("http", conc, args.secs, None)
            after = cpu(server.pid)
            n = max(int(_field(line, "n")), 1)
            per = {k: (after[k] - before[k]) * 1e6 / n for k in after}
            point = Point(
                ingress,
                config,
                conc,
                float(_field(line, "rps")),
                per["hub"],
                per["ingress"],
                per["worker"],
            )
            print(f"  {point}", file=sys.stderr, flush=True)
            points.append(point)
    finally:
        stop(server)
    return points


def table(points: list[Point]) -> str:
    base = {(p.config, p.conc): p.rps for p in points if p.ingress == 0}
    lines = [
        "| config | c | ingress processes | rps | vs 0 | hub µs/req | ingress µs/req "
        "| workers µs/req | total µs/req |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        ratio = p.rps / base[(p.config, p.conc)] if (p.config, p.conc) in base else float("nan")
        total = p.hub_us + p.ingress_us + p.worker_us
        lines.append(
            f"| {p.config} | {p.conc} | {p.ingress} | {p.rps:.0f} | {ratio:.2f} "
            f"| {p.hub_us:.0f} | {p.ingress_us:.0f} | {p.worker_us:.0f} | {total:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ingress", default="0,1,2")
    parser.add_argument("--configs", default="w2b8,w1b1")
    parser.add_argument("--concs", default="1,16,64")
    parser.add_argument("--secs", type=float, default=5)
    args = parser.parse_args()
    args.concs = [int(c) for c in args.concs.split(",")]
    run_dir = Path(tempfile.mkdtemp(prefix="trioserve-ingress-ab-"))
    points: list[Point] = []
    try:
        for config in args.configs.split(","):
            for ingress in (int(n) for n in args.ingress.split(",")):
                points += measure(ingress, config, args, run_dir)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    print(f"trioserve {ROOT.name} on {os.cpu_count()} CPUs, {args.secs:.0f} s per point\n")
    print(table(points))


if __name__ == "__main__":
    main()
