"""trioserve against TorchServe 0.12 with both running at once and the load alternating
between them in short slices: ratios that the machine's changes of speed do not bend.

``ts_ratio.py`` measures one server, then the other, a minute or more apart. On this
project's shared 2-core machines a plain Python loop runs at ~34 or ~60 ns a step and
switches between the two within minutes (``ts_ratio``'s speed probe, 2026-11-28), so one
block can be measured fast and the next slow, and a ratio moves by 2x for no reason of
either server's. Here, for each configuration, TorchServe (``../shared/bench``'s peer script,
its ports) and trioserve (the same echo handler and model config, ports 18070-18082) are
started together; for each protocol and concurrency the load (the harness's wrk and h2load
scripts) goes to one, then the other, ``--slices`` times, the order swapped every slice.
Each slice pair gives a ratio (trioserve's rate over TorchServe's, measured seconds apart);
the table gives their median and range, the median rates, and each side's CPU per request
(server side and workers, from /proc).

    .venv/bin/python benchmarks/ts_interleaved.py [--configs w2b8,w1b1,w2b1]
        [--protos http,grpc] [--concs 1,16,64] [--slice 4] [--slices 6]
        [--serving-processes 1] [--tsv OUT]

``GRPC_CONNS=4`` in the environment spreads each gRPC load over four connections (the
harness's h2load script reads it). Needs /tmp/ts-venv (../shared/bench/README.md), wrk and
h2load. Loopback only; every slice is bounded by wrk's duration or h2load's count.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import psutil
from ab_interleaved import archive, load, port, start
from ts_ratio import CONFIGS, LABELS, cpu_split, speed_probe
from ts_ratio import start as start_peer
from ts_ratio import stop as stop_peer

TRIO_BASE = 18000
TS_BASE = 8000  # the harness's TorchServe: HTTP 8080; its gRPC port is 7070
TS_GRPC = 7070


def _ts_port(proto: str) -> int:
    return TS_BASE + 80 if proto == "http" else TS_GRPC


def _slice(
    peer: str, pid: int, proto: str, conc: int, secs: float, rate: float
) -> tuple[float, float, float]:
    """One slice: rate, server µs and worker µs per request."""
    kind = "ts" if peer == "ts" else "trio"
    s0, w0, _ = cpu_split(pid, kind)
    n, rps = load(proto, _ts_port(proto) if peer == "ts" else port(proto, TRIO_BASE), conc, secs,
                  rate)  # fmt: skip
    s1, w1, _ = cpu_split(pid, kind)
    return rps, (s1 - s0) * 1e6 / max(n, 1), (w1 - w0) * 1e6 / max(n, 1)


def measure(config: str, args: argparse.Namespace) -> list[str]:
    workers, batch = CONFIGS[config]
    ts_pid = start_peer("ts", workers, batch, None)
    trio = None
    rows: list[str] = []
    try:
        extra = ("--serving-processes", str(args.serving_processes))
        trio = start("trio", TRIO_BASE, archive(batch), workers, dict(os.environ), extra)
        pids = {"ts": ts_pid, "trio": trio.pid}
        for proto in args.protos:
            rate = {"ts": 800.0, "trio": 800.0}
            for peer in pids:  # warm-up after start
                rate[peer] = _slice(peer, pids[peer], proto, 16, 8, rate[peer])[0]
            for conc in args.concs:
                samples: dict[str, list[tuple[float, float, float]]] = {"ts": [], "trio": []}
                probes = []
                for peer in pids:
                    rate[peer] = _slice(peer, pids[peer], proto, conc, 2, rate[peer])[0]
                for index in range(args.slices):
                    probes.append(speed_probe())
                    order = ["ts", "trio"] if index % 2 == 0 else ["trio", "ts"]
                    for peer in order:
                        got = _slice(peer, pids[peer], proto, conc, args.slice, rate[peer])
                        rate[peer] = got[0]
                        samples[peer].append(got)
                ratios = [t[0] / s[0] for t, s in zip(samples["trio"], samples["ts"], strict=True)]

                def med(peer: str, i: int) -> float:
                    return statistics.median(v[i] for v in samples[peer])  # noqa: B023

                row = (
                    f"| {LABELS[config]} | {'HTTP' if proto == 'http' else 'gRPC'} | {conc} "
                    f"| {med('ts', 0):.0f} | {med('trio', 0):.0f} "
                    f"| {statistics.median(ratios):.2f} | {min(ratios):.2f}-{max(ratios):.2f} "
                    f"| {med('trio', 1):.0f} | {med('trio', 2):.0f} "
                    f"| {med('ts', 1):.0f} | {med('ts', 2):.0f} "
                    f"| {min(probes):.0f}-{max(probes):.0f} |"
                )
                print(row, file=sys.stderr, flush=True)
                rows.append(row)
    finally:
        if trio is not None:
            trio.terminate()
            try:
                trio.wait(30)
            except psutil.TimeoutExpired:
                trio.kill()
        stop_peer("ts")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--protos", default="http,grpc")
    parser.add_argument("--concs", default="1,16,64")
    parser.add_argument("--slice", type=float, default=4)
    parser.add_argument("--slices", type=int, default=6)
    parser.add_argument("--serving-processes", type=int, default=1)
    args = parser.parse_args()
    args.protos = args.protos.split(",")
    args.concs = [int(c) for c in args.concs.split(",")]
    rows: list[str] = []
    for config in args.configs.split(","):
        rows += measure(config, args)
    conns = os.environ.get("GRPC_CONNS", "1")
    print(
        f"trioserve ({args.serving_processes} serving process(es)) and TorchServe, both "
        f"running, load alternating in {args.slices} slice pairs of {args.slice:g} s; "
        f"gRPC over {conns} connection(s)"
    )
    print()
    print(
        "| config | proto | c | TS rps | trio rps | ratio (median) | ratio range "
        "| trio server µs/req | trio worker µs/req | TS server µs/req | TS worker µs/req "
        "| speed probe ns |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
