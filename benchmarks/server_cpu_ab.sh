#!/usr/bin/env bash
# Server CPU per request of two trioserve trees, interleaved rounds, with ../shared/bench's
# peer scripts and load tools (wrk, h2load) on the echo model (2 workers, batchSize 8).
#
#   benchmarks/server_cpu_ab.sh A_TREE B_TREE [ROUNDS]
#   (each tree: a checkout with its own .venv, e.g. `git worktree add /tmp/base <commit>`
#    and `python3 -m venv /tmp/base/.venv && /tmp/base/.venv/bin/pip install -e /tmp/base`)
#
# Prints one markdown row per round, tree and protocol: rps, and the CPU time the server's
# main process (not its workers) spent per request, read from /proc during the measured run.
# Loopback only; every run is bounded by time (wrk -d) or count (h2load -n) and a timeout.
set -euo pipefail
A=${1:?A tree}; B_TREE=${2:?B tree}; ROUNDS=${3:-3}
BENCH=$(cd "$(dirname "$0")/../../shared/bench" && pwd)
URL_GRPC=http://127.0.0.1:7070/org.pytorch.serve.grpc.inference.InferenceAPIsService/Predictions
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
measure() {  # PROTO -> "rps n"
  if [ "$1" = http ]; then
    "$BENCH/load/http_wrk.sh" http://127.0.0.1:8080/predictions/echo "$BENCH/load/bodies/hello.bin" 64 8 | tail -1
  else
    EXPECT_RESP_BYTES=12 H2_N=5000 "$BENCH/load/grpc_h2load.sh" "$URL_GRPC" \
      "$BENCH/load/bodies/ts_predictions_hello.grpc" 64 30 | tail -1
  fi
}
echo "| round | tree | protocol (c=64) | rps | server CPU µs/request |"
echo "|---:|---|---|---:|---:|"
for round in $(seq "$ROUNDS"); do
  for tree in "$A" "$B_TREE"; do
    line=$(cd "$tree" && PROJECT=$tree WORKERS=2 BATCH=8 "$BENCH/peers/trioserve/start.sh" | tail -1)
    pid=$(echo "$line" | sed -n 's/.*pid=\([0-9]*\).*/\1/p')
    for proto in http grpc; do
      measure "$proto" > /dev/null  # warm-up
      t0=$(ticks "$pid"); res=$(measure "$proto"); t1=$(ticks "$pid")
      n=$(echo "$res" | sed -n 's/.* n=\([0-9]*\).*/\1/p')
      rps=$(echo "$res" | sed -n 's/.*rps=\([0-9.]*\).*/\1/p')
      us=$(python3 -c "print(round(($t1 - $t0) * 1e6 / $hz / $n, 1))")
      echo "| $round | $tree | $proto | $rps | $us |"
    done
    (cd "$tree" && PROJECT=$tree "$BENCH/peers/trioserve/stop.sh" > /dev/null 2>&1)
    sleep 1
  done
done
