"""Server CPU per request of two trioserve trees, measured in alternation while both run.

The machines this project is measured on change speed by up to ~1.8x within minutes
(``ts_ratio``'s speed probe), so a before/after taken one tree after the other can show a
"gain" or a "loss" that is only the machine. Here both trees serve at once, on two port
sets, with the same echo model (``../shared/bench``'s handler and ``model-config-b<batch>``)
and workers; the load (wrk for HTTP, h2load for gRPC) goes to one tree, then the other, in
short slices, ``--slices`` times, and the table gives the median and the spread of each
tree's server CPU per request (its main process, not the workers), and the workers' too.

    .venv/bin/python benchmarks/ab_interleaved.py --base-tree DIR [--proto http|grpc]
        [--conc 64] [--slice 3] [--slices 8] [--workers 2] [--batch 8]

``base`` runs the trioserve source in DIR (a checkout with the built ``_collate*.so``) from
this venv with ``PYTHONPATH=DIR``; ``new`` is this checkout. Loopback only (ports 18xxx and
19xxx); every slice is bounded by wrk's duration or h2load's count and a timeout.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
BENCH = (ROOT / ".." / "shared" / "bench").resolve()
TS_PEER = BENCH / "peers" / "torchserve"
PORTS = {"new": 18000, "base": 19000}  # + 80 inference, 81 management, 82 metrics, 70/71 gRPC
GRPC_PATH = "/org.pytorch.serve.grpc.inference.InferenceAPIsService/Predictions"


def start(
    tree: str,
    base: int,
    store: Path,
    workers: int,
    env: dict[str, str],
    extra: tuple[str, ...] = (),
) -> psutil.Process:
    """trioserve serving ``store``'s echo.mar on ports ``base`` + 70/71/80/81/82, with
    ``extra`` arguments to ``start``; returns once ``workers`` workers are READY."""
    folder = Path(tempfile.mkdtemp(prefix=f"ab-{tree}-"))
    config = folder / "config.properties"
    config.write_text(
        f"inference_address=http://127.0.0.1:{base + 80}\n"
        f"management_address=http://127.0.0.1:{base + 81}\n"
        f"metrics_address=http://127.0.0.1:{base + 82}\n"
        "grpc_inference_address=127.0.0.1\ngrpc_management_address=127.0.0.1\n"
        f"grpc_inference_port={base + 70}\ngrpc_management_port={base + 71}\n"
        f"default_workers_per_model={workers}\n"
    )
    cmd = [str(ROOT / ".venv" / "bin" / "trioserve"), "start", "--foreground", "--ncs"]
    cmd += ["--model-store", str(store), "--models", "echo=echo.mar"]
    cmd += ["--ts-config", str(config), "--disable-token-auth", *extra]
    log = (folder / "server.log").open("wb")
    proc = subprocess.Popen(cmd, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{base + 81}/models/echo"
    end = time.monotonic() + 120
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"{tree} exited; see {folder / 'server.log'}")
        out = subprocess.run(["curl", "-s", "-m", "1", url], capture_output=True, text=True)
        if out.stdout.count('"READY"') >= workers:
            return psutil.Process(proc.pid)
        time.sleep(0.2)
    raise SystemExit(f"{tree} not ready; see {folder / 'server.log'}")


def load(proto: str, port: int, conc: int, secs: float, rate: float = 800) -> tuple[int, float]:
    """One slice of load on ``port`` (HTTP: wrk for ``secs``; gRPC: h2load, about ``rate``
    x ``secs`` calls); the requests answered and the rate."""
    if proto == "http":
        cmd = [str(BENCH / "load" / "http_wrk.sh"), f"http://127.0.0.1:{port}/predictions/echo"]
        cmd += [str(BENCH / "load" / "bodies" / "hello.bin"), str(conc), str(int(secs))]
        env = dict(os.environ)
    else:
        cmd = [str(BENCH / "load" / "grpc_h2load.sh"), f"http://127.0.0.1:{port}{GRPC_PATH}"]
        cmd += [str(BENCH / "load" / "bodies" / "ts_predictions_hello.grpc"), str(conc), "60"]
        count = max(100, int(rate * secs))
        env = dict(os.environ, EXPECT_RESP_BYTES="12", H2_N=str(count))
    line = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    fields = dict(part.split("=", 1) for part in line.strip().splitlines()[-1].split())
    bad = fields.get("non2xx", "0") != "0" or fields.get("grpc_bad", "0") not in ("0", "na")
    if bad or fields.get("failed", "0") != "0":
        raise SystemExit(f"bad answers: {line.strip()}")
    return int(fields["n"]), float(fields["rps"])


def port(proto: str, base: int) -> int:
    """The inference port of ``proto`` for a server started with ``base``."""
    return base + (80 if proto == "http" else 70)


def archive(batch: int) -> Path:
    """A model store with the harness's echo handler as ``echo.mar`` (its
    ``model-config-b<batch>.yaml``), made by this checkout's ``trioserve archive``."""
    store = Path(tempfile.mkdtemp(prefix="bench-store-"))
    subprocess.run(
        [
            *(str(ROOT / ".venv" / "bin" / "trioserve"), "archive", "--model-name", "echo"),
            *("--version", "1.0", "--handler", str(TS_PEER / "echo_handler.py")),
            *("--config-file", str(TS_PEER / f"model-config-b{batch}.yaml")),
            *("--export-path", str(store), "-f"),
        ],
        check=True,
        capture_output=True,
    )
    return store


def cpu(procs: list[psutil.Process]) -> float:
    """CPU seconds so far of ``procs`` (user and system; a process gone counts 0)."""
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-tree", type=Path, required=True)
    parser.add_argument("--proto", choices=("http", "grpc"), default="http")
    parser.add_argument("--conc", type=int, default=64)
    parser.add_argument("--slice", type=float, default=3)
    parser.add_argument("--slices", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, choices=(1, 8), default=8)
    args = parser.parse_args()
    store = archive(args.batch)
    envs = {
        "new": dict(os.environ),
        "base": dict(os.environ, PYTHONPATH=str(args.base_tree.resolve())),
    }
    servers = {tree: start(tree, PORTS[tree], store, args.workers, envs[tree]) for tree in PORTS}
    samples: dict[str, list[tuple[float, float, float]]] = {tree: [] for tree in PORTS}
    try:
        for tree in PORTS:
            load(args.proto, port(args.proto, PORTS[tree]), args.conc, 2)  # warm-up
        for index in range(args.slices):
            order = list(PORTS) if index % 2 == 0 else list(PORTS)[::-1]
            for tree in order:
                main_proc = servers[tree]
                workers = main_proc.children(recursive=True)
                s0, w0, t0 = cpu([main_proc]), cpu(workers), time.monotonic()
                n, _ = load(args.proto, port(args.proto, PORTS[tree]), args.conc, args.slice)
                s1, w1, t1 = cpu([main_proc]), cpu(workers), time.monotonic()
                samples[tree].append(((s1 - s0) * 1e6 / n, (w1 - w0) * 1e6 / n, n / (t1 - t0)))
                print(f"  {index} {tree}: {samples[tree][-1][0]:.0f} µs/req", file=sys.stderr)
    finally:
        for proc in servers.values():
            proc.terminate()
        for proc in servers.values():
            try:
                proc.wait(30)
            except psutil.TimeoutExpired:
                proc.kill()
    print(
        f"{args.proto}, c={args.conc}, {args.workers} workers, batch {args.batch}, "
        f"{args.slices} slices of {args.slice:g} s each, alternating"
    )
    print()
    print("| tree | server µs/req median | min-max | workers µs/req median | req/s median |")
    print("|---|---:|---|---:|---:|")
    for tree in PORTS:
        server = [s for s, _, _ in samples[tree]]
        print(
            f"| {tree} | {statistics.median(server):.0f} | {min(server):.0f}-{max(server):.0f} "
            f"| {statistics.median(w for _, w, _ in samples[tree]):.0f} "
            f"| {statistics.median(r for _, _, r in samples[tree]):,.0f} |"
        )
    new = [s for s, _, _ in samples["new"]]
    old = [s for s, _, _ in samples["base"]]
    pairs = [a / b for a, b in zip(new, old, strict=True)]
    print()
    print(
        f"new/base server CPU per request, slice by slice: median {statistics.median(pairs):.2f} "
        f"(min {min(pairs):.2f}, max {max(pairs):.2f})"
    )


if __name__ == "__main__":
    main()
