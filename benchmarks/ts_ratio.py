"""trioserve against TorchServe 0.12, the six configurations of issue 17, one run.

Uses ``../shared/bench`` as it is: its peer scripts (same echo handler, model configs and
ports for both servers) and its load tools (wrk for HTTP/1.1, h2load for gRPC, one
connection with C streams). For each configuration, TorchServe then trioserve: start,
warm up, then for each protocol and concurrency a short warm-up and a measured run. Around
each measured run the CPU time of the server's process tree is read from ``/proc`` (psutil),
split into the server (the main process, plus for trioserve its other serving processes) and the
workers (the model's worker processes), and divided by the requests served.

    .venv/bin/python benchmarks/ts_ratio.py [--secs 5] [--concs 1,16,64] [--configs w2b8,w1b1]
        [--peers ts,trio] [--tsv OUT.tsv] [--compare OLD.tsv] [--base-tree DIR]

Prints a markdown table: rps of both, the ratio (trioserve / TorchServe) and the CPU per
request of each side's server and workers. ``--base-tree DIR`` adds the peer ``base``: the
trioserve source in DIR (an older checkout, e.g. ``git worktree add /tmp/base <commit>`` with
the built ``_collate*.so`` copied in) run from this venv with ``PYTHONPATH=DIR``, so that a
"ratio before" column comes from the same run (``--peers ts,base,trio``). ``--compare`` reads
an earlier ``--tsv`` and takes that column from its trioserve rows instead.
Peer ``trioN`` (``trio2``, ``trio4``...) is trioserve with ``serving_processes = N`` (started
through a wrapper that adds ``--serving-processes N``), so that one run compares one
serving process, N of them and TorchServe (``--peers ts,trio,trio2``).
Needs /tmp/ts-venv (see ../shared/bench/README.md), wrk and h2load. Loopback only; every
run is bounded by time (wrk -d) or count (h2load -n) and a timeout.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
BENCH = (ROOT / ".." / "shared" / "bench").resolve()
LOAD = BENCH / "load"
HTTP_URL = "http://127.0.0.1:8080/predictions/echo"
GRPC_URL = "http://127.0.0.1:7070/org.pytorch.serve.grpc.inference.InferenceAPIsService/Predictions"
CONFIGS = {  # id -> (workers, batch)
    "w2b8": (2, 8),
    "w1b1": (1, 1),
    "w2b1": (2, 1),
}
LABELS = {
    "w2b8": "2 workers, batchSize 8 / 5 ms",
    "w1b1": "1 worker, batchSize 1",
    "w2b1": "2 workers, batchSize 1",
}
PEERS = {"ts": "torchserve", "trio": "trioserve", "base": "trioserve"}


def _script_peer(peer: str) -> str:
    """The ../shared/bench peer that runs ``peer`` (``trioN``: trioserve)."""
    return "trioserve" if re.fullmatch(r"trio\d+", peer) else PEERS[peer]


def _is_trioserve(peer: str) -> bool:
    return _script_peer(peer) == "trioserve"


def _wrapper(count: int) -> Path:
    """A venv-like folder whose ``bin/trioserve`` is this venv's, with
    ``--serving-processes`` added to ``start`` (the harness's start script is used as is)."""
    folder = Path(f"/tmp/bench/trio{count}-venv")
    (folder / "bin").mkdir(parents=True, exist_ok=True)
    real = ROOT / ".venv" / "bin" / "trioserve"
    script = folder / "bin" / "trioserve"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = start ]; then shift; exec {real} start --serving-processes {count} "$@"; fi\n'
        f'exec {real} "$@"\n'
    )
    script.chmod(0o755)
    return folder


@dataclass
class Row:
    config: str
    proto: str
    conc: int
    peer: str
    rps: float
    n: int
    server_us: float
    worker_us: float
    cores: float
    rss_mb: float
    round: int = 1
    probe_ns: float = 0.0  # the machine-speed probe before this peer's block (speed_probe)


def speed_probe() -> float:
    """Nanoseconds per step of a plain Python loop, best of three: the machine's speed for
    Python code at this moment. On this project's shared machines it moved ~1.8x within
    twenty minutes (2026-11-28), so each peer's block records it beside its numbers."""

    def loop(n: int) -> int:
        total = 0
        for i in range(n):
            total += i
        return total

    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        loop(1_000_000)
        best = min(best, time.perf_counter() - t0)
    return best * 1e9 / 1_000_000


def _field(line: str, name: str) -> str:
    match = re.search(rf"\b{name}=([0-9.]+)", line)
    if match is None:
        raise RuntimeError(f"no {name}= in load output: {line!r}")
    return match.group(1)


def _is_worker(proc: psutil.Process, peer: str) -> bool:
    try:
        cmdline = " ".join(proc.cmdline())
    except psutil.Error:
        return False
    if _is_trioserve(peer):
        return "trioserve.worker" in cmdline
    return "model_service_worker" in cmdline


def cpu_split(pid: int, peer: str) -> tuple[float, float, int]:
    """CPU seconds so far of (server side, workers) and the tree's RSS in bytes."""
    root = psutil.Process(pid)
    server = workers = 0.0
    rss = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            used = times.user + times.system
            rss += proc.memory_info().rss
        except psutil.Error:
            continue
        if _is_worker(proc, peer):
            workers += used
        else:
            server += used
    return server, workers, rss


def run_load(proto: str, conc: int, secs: float, rate_hint: float | None) -> str:
    env = dict(os.environ)
    if proto == "http":
        cmd = [str(LOAD / "http_wrk.sh"), HTTP_URL, str(LOAD / "bodies/hello.bin"), str(conc)]
        cmd.append(str(int(secs)))
    else:
        env["EXPECT_RESP_BYTES"] = "12"
        # Count mode: no stream left in flight at the end (the harness's default).
        env["H2_N"] = str(max(200, int((rate_hint or 300) * secs)))
        frame = LOAD / "bodies/ts_predictions_hello.grpc"
        cmd = [str(LOAD / "grpc_h2load.sh"), GRPC_URL, str(frame), str(conc), str(int(secs * 4))]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return out.strip().splitlines()[-1]


def start(peer: str, workers: int, batch: int, base_tree: Path | None) -> int:
    script = BENCH / "peers" / _script_peer(peer) / "start.sh"
    env = dict(os.environ, WORKERS=str(workers), BATCH=str(batch), PROJECT=str(ROOT))
    if re.fullmatch(r"trio\d+", peer):
        env["TRIOSERVE_VENV"] = str(_wrapper(int(peer[4:])))
    if peer == "base":
        if base_tree is None:
            raise SystemExit("the peer 'base' needs --base-tree")
        env["PYTHONPATH"] = str(base_tree)
    out = subprocess.run([str(script)], env=env, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"{peer} did not start: {out.stderr[-2000:]}")
    return int(_field(out.stdout, "pid"))


def stop(peer: str) -> None:
    script = BENCH / "peers" / _script_peer(peer) / "stop.sh"
    subprocess.run([str(script)], env=dict(os.environ, PROJECT=str(ROOT)), capture_output=True)


def measure(peer: str, config: str, args: argparse.Namespace, round_no: int = 1) -> list[Row]:
    workers, batch = CONFIGS[config]
    probe = speed_probe()
    pid = start(peer, workers, batch, args.base_tree)
    rows: list[Row] = []
    try:
        for proto in ("http", "grpc"):
            hint = None
            line = run_load(proto, 16, args.peer_warmup, hint)  # warm-up after start
            hint = float(_field(line, "rps"))
            for conc in args.concs:
                line = run_load(proto, conc, args.warmup, hint)
                hint = float(_field(line, "rps"))
                s0, w0, _ = cpu_split(pid, peer)
                t0 = time.monotonic()
                line = run_load(proto, conc, args.secs, hint)
                wall = time.monotonic() - t0
                s1, w1, rss = cpu_split(pid, peer)
                n = int(_field(line, "n"))
                rps = float(_field(line, "rps"))
                hint = rps
                row = Row(
                    config,
                    proto,
                    conc,
                    peer,
                    rps,
                    n,
                    server_us=(s1 - s0) * 1e6 / max(n, 1),
                    worker_us=(w1 - w0) * 1e6 / max(n, 1),
                    cores=((s1 - s0) + (w1 - w0)) / wall,
                    rss_mb=rss / 2**20,
                    round=round_no,
                    probe_ns=probe,
                )
                print(
                    f"  [{round_no}] {peer} {config} {proto} c={conc}: {rps:.0f} rps, server "
                    f"{row.server_us:.0f} µs/req, workers {row.worker_us:.0f} µs/req, "
                    f"{row.cores:.2f} cores, probe {probe:.1f} ns",
                    file=sys.stderr,
                    flush=True,
                )
                rows.append(row)
    finally:
        stop(peer)
    return rows


def read_tsv(path: Path) -> list[Row]:
    with path.open() as f:
        return [
            Row(
                r["config"],
                r["proto"],
                int(r["conc"]),
                r["peer"],
                float(r["rps"]),
                int(r["n"]),
                float(r["server_us"]),
                float(r["worker_us"]),
                float(r["cores"]),
                float(r["rss_mb"]),
                int(r.get("round") or 1),
                float(r.get("probe_ns") or 0.0),
            )
            for r in csv.DictReader(f, delimiter="\t")
        ]


def write_tsv(path: Path, rows: list[Row]) -> None:
    names = list(Row.__dataclass_fields__)
    with path.open("w") as f:
        f.write("\t".join(names) + "\n")
        for row in rows:
            f.write("\t".join(str(getattr(row, name)) for name in names) + "\n")


def median_rows(rows: list[Row]) -> list[Row]:
    """One row per (config, proto, conc, peer): the median of each number over the rounds."""
    groups: dict[tuple[str, str, int, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.config, r.proto, r.conc, r.peer), []).append(r)
    out = []
    for (config, proto, conc, peer), group in groups.items():
        med = {
            name: statistics.median(getattr(r, name) for r in group)
            for name in ("rps", "server_us", "worker_us", "cores", "rss_mb", "probe_ns")
        }
        n = int(statistics.median(r.n for r in group))
        out.append(Row(config, proto, conc, peer, n=n, round=0, **med))
    return out


def round_ratios(rows: list[Row], peer: str) -> dict[tuple[str, str, int], str]:
    """Each round's ratio of ``peer`` to TorchServe, per point (``0.91/1.04``)."""
    index = {(r.config, r.proto, r.conc, r.peer, r.round): r for r in rows}
    out: dict[tuple[str, str, int], list[str]] = {}
    for r in sorted(rows, key=lambda r: r.round):
        if r.peer != peer:
            continue
        ts = index.get((r.config, r.proto, r.conc, "ts", r.round))
        if ts is not None:
            out.setdefault((r.config, r.proto, r.conc), []).append(f"{r.rps / ts.rps:.2f}")
    return {key: "/".join(values) for key, values in out.items()}


def render_probes(rows: list[Row]) -> str:
    """The machine-speed probe of each peer's blocks, per round."""
    seen: dict[tuple[int, str, str], float] = {}
    for r in rows:
        seen[(r.round, r.config, r.peer)] = r.probe_ns
    parts = [f"r{k[0]} {k[1]} {k[2]} {v:.1f}" for k, v in sorted(seen.items())]
    return "Speed probe (ns per Python loop step, lower is faster): " + ", ".join(parts)


def render(rows: list[Row], before: list[Row] | None) -> str:
    rounds = len({r.round for r in rows}) > 1
    per_round = round_ratios(rows, "trio") if rounds else {}
    rows = median_rows(rows) if rounds else rows
    index = {(r.config, r.proto, r.conc, r.peer): r for r in rows}
    old = {(r.config, r.proto, r.conc, r.peer): r for r in before or []}
    if before is None and any(r.peer == "base" for r in rows):
        old = {(r.config, r.proto, r.conc, "trio"): r for r in rows if r.peer == "base"}
        old.update({k: r for k, r in index.items() if k[3] == "ts"})
        before = rows
    head = (
        "| config | proto | c | TorchServe rps | trioserve rps | ratio |"
        + (" ratio per round |" if rounds else "")
        + (" ratio before |" if before else "")
        + " trio server µs/req | trio worker µs/req | TS server µs/req | TS worker µs/req |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    keys = sorted(
        {(r.config, r.proto, r.conc) for r in rows},
        key=lambda k: (list(CONFIGS).index(k[0]), k[1] != "http", k[2]),
    )
    for config, proto, conc in keys:
        ts = index.get((config, proto, conc, "ts"))
        trio = index.get((config, proto, conc, "trio"))
        ratio = f"{trio.rps / ts.rps:.2f}" if ts and trio else "-"
        cells = [
            LABELS[config],
            "HTTP" if proto == "http" else "gRPC",
            str(conc),
            f"{ts.rps:.0f}" if ts else "-",
            f"{trio.rps:.0f}" if trio else "-",
            ratio,
        ]
        if rounds:
            cells.append(per_round.get((config, proto, conc), "-"))
        otrio = old.get((config, proto, conc, "trio"))
        if before:
            ots = old.get((config, proto, conc, "ts"))
            cells.append(f"{otrio.rps / ots.rps:.2f}" if ots and otrio else "-")
        for r, was in ((trio, otrio), (ts, None)):
            if r is None:
                cells += ["-", "-"]
            elif was is None:
                cells += [f"{r.server_us:.0f}", f"{r.worker_us:.0f}"]
            else:  # after (before)
                cells += [
                    f"{r.server_us:.0f} ({was.server_us:.0f})",
                    f"{r.worker_us:.0f} ({was.worker_us:.0f})",
                ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_peers(rows: list[Row]) -> str:
    """Every trioserve peer against TorchServe: rps, ratio, CPU per request, cores, RSS
    (medians over the rounds, with each round's ratio when there are several)."""
    rounds = len({r.round for r in rows}) > 1
    per_round = {p: round_ratios(rows, p) for p in {r.peer for r in rows}} if rounds else {}
    rows = median_rows(rows) if rounds else rows
    peers = sorted({r.peer for r in rows if r.peer != "ts"})
    head = "| config | proto | c | TS rps | TS cores | TS RSS MB |" + "".join(
        f" {p} rps | {p}/TS |"
        + (f" {p}/TS per round |" if rounds else "")
        + f" {p} server µs | {p} worker µs | {p} cores | {p} RSS MB |"
        for p in peers
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    index = {(r.config, r.proto, r.conc, r.peer): r for r in rows}
    keys = sorted(
        {(r.config, r.proto, r.conc) for r in rows},
        key=lambda k: (list(CONFIGS).index(k[0]), k[1] != "http", k[2]),
    )
    for config, proto, conc in keys:
        ts = index.get((config, proto, conc, "ts"))
        cells = [LABELS[config], "HTTP" if proto == "http" else "gRPC", str(conc)]
        cells += [f"{ts.rps:.0f}", f"{ts.cores:.2f}", f"{ts.rss_mb:.0f}"] if ts else ["-"] * 3
        for peer in peers:
            r = index.get((config, proto, conc, peer))
            if r is None:
                cells += ["-"] * (7 if rounds else 6)
                continue
            ratio = f"{r.rps / ts.rps:.2f}" if ts else "-"
            cells += [f"{r.rps:.0f}", ratio]
            if rounds:
                cells.append(per_round[peer].get((config, proto, conc), "-"))
            cells += [f"{r.server_us:.0f}", f"{r.worker_us:.0f}"]
            cells += [f"{r.cores:.2f}", f"{r.rss_mb:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--secs", type=float, default=5)
    parser.add_argument("--warmup", type=float, default=2)
    parser.add_argument("--peer-warmup", type=float, default=6)
    parser.add_argument("--concs", default="1,16,64")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--peers", default="ts,trio")
    parser.add_argument("--tsv", type=Path, default=None)
    parser.add_argument("--compare", type=Path, default=None)
    parser.add_argument("--reuse", type=Path, default=None, help="rows of peers not run now")
    parser.add_argument("--base-tree", type=Path, default=None)
    parser.add_argument(
        "--rounds", type=int, default=1, help="repeat, peers in reverse order every other round"
    )
    args = parser.parse_args()
    args.concs = [int(c) for c in args.concs.split(",")]
    rows: list[Row] = []
    if args.reuse:
        wanted = set(args.peers.split(","))
        rows += [r for r in read_tsv(args.reuse) if r.peer not in wanted]
    peers = args.peers.split(",")
    for round_no in range(1, args.rounds + 1):
        order = peers if round_no % 2 else peers[::-1]
        for config in args.configs.split(","):
            for peer in order:
                print(f"[{round_no}] {peer} {config}", file=sys.stderr, flush=True)
                rows += measure(peer, config, args, round_no)
    if args.tsv:
        write_tsv(args.tsv, rows)
    before = read_tsv(args.compare) if args.compare else None
    if any(re.fullmatch(r"trio\d+", r.peer) for r in rows):
        print(render_peers(rows))
    else:
        print(render(rows, before))
    print()
    print(render_probes(rows))


if __name__ == "__main__":
    main()
