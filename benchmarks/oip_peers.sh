#!/usr/bin/env bash
# The Open Inference Protocol side by side: POST /v2/models/echo/infer (one FP32 [1,3] tensor,
# ../shared/bench/load/bodies/oip_fp32x3.json) and gRPC ModelInfer (the same tensor,
# oip_modelinfer_fp32x3.grpc), the same clients for every server (wrk and h2load through the
# shared harness's load/ scripts), one server at a time on the same ports (HTTP 18080, gRPC
# 18081). Prints a markdown table and writes it to $OUT (default /tmp/bench/oip.md).
#
# Peers (PEERS, default all five):
#   mls_pw1    MLServer 1.7.1, parallel_workers 1 (the echo runtime in one worker process)
#   mls_pw0    MLServer 1.7.1, parallel_workers 0 (the runtime in the server process)
#   trio_mls   trioserve, the same MLServer runtime (peers/mlserver/runtime.py, unchanged) as a
#              model folder, one worker process
#   trio_ts    trioserve, a TorchServe handler answering OIP rows (benchmarks/oip_echo_handler.py),
#              one worker process
#   ts_kv2     TorchServe 0.12 with service_envelope=kservev2 and the same handler, one worker
#              (HTTP only: TorchServe has no OIP gRPC service)
# Knobs: CONCS (default "1 16 64"), SECS (measured seconds, default 8), WARMUP (default 2),
# BENCH (default ../shared/bench), TRIOSERVE (default .venv/bin/trioserve),
# MLS_VENV (/tmp/mls-venv), TS_VENV (/tmp/ts-venv).
# Each row: requests/s, p50/p99, errors (non-2xx, socket errors, failed gRPC calls), the server
# process tree's CPU (cores busy, from /proc utime+stime) and CPU per request; the ratio column
# is rps / MLServer pw1's rps at the same protocol and concurrency.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${BENCH:-$ROOT/../shared/bench}
B=$(cd "$B" && pwd)
L=$B/load
. "$B/lib/common.sh"
PEERS=${PEERS:-"mls_pw1 mls_pw0 trio_mls trio_ts ts_kv2"}
CONCS=${CONCS:-"1 16 64"}
SECS=${SECS:-8}
WARMUP=${WARMUP:-2}
TRIOSERVE=${TRIOSERVE:-$ROOT/.venv/bin/trioserve}
PY=${PY:-$ROOT/.venv/bin/python}
TS_VENV=${TS_VENV:-/tmp/ts-venv}
WORK=${WORK:-/tmp/bench/oip-peers}
OUT=${OUT:-/tmp/bench/oip.md}
HTTP_URL=http://127.0.0.1:18080/v2/models/echo/infer
GRPC_URL=http://127.0.0.1:18081/inference.GRPCInferenceService/ModelInfer
HZ=$(getconf CLK_TCK)
mkdir -p "$WORK" /tmp/bench
ROWS=$WORK/rows.tsv
: > "$ROWS"
PID=""

log() { echo "[$(date +%T)] $*" >&2; }

ready_loop() {  # URL PID: wait until URL answers 200 (120 s)
  local end=$(( $(now_ms) + 120000 ))
  while [ "$(now_ms)" -lt "$end" ]; do
    is_alive "$2" || { log "server (pid $2) exited"; return 1; }
    [ "$(curl -s -o /dev/null -m 1 -w '%{http_code}' "$1")" = 200 ] && return 0
    sleep 0.05
  done
  return 1
}

start_trioserve() {  # KIND: mls | ts
  local run=$WORK/trio-$1
  rm -rf "$run"; mkdir -p "$run/store"
  if [ "$1" = mls ]; then
    mkdir "$run/store/echo"
    cp "$B/peers/mlserver/model-settings.json" "$B/peers/mlserver/runtime.py" "$run/store/echo/"
    models=echo=echo
  else
    "$TRIOSERVE" archive --model-name echo --version 1.0 --handler "$ROOT/benchmarks/oip_echo_handler.py" \
      --export-path "$run/store" -f > /dev/null
    models=echo=echo.mar
  fi
  cat > "$run/config.properties" <<EOF
inference_address=http://127.0.0.1:18080
management_address=http://127.0.0.1:18085
metrics_address=http://127.0.0.1:18082
grpc_inference_port=18081
grpc_management_port=18086
default_workers_per_model=1
EOF
  cd "$run"
  setsid "$TRIOSERVE" start --foreground --ncs --model-store "$run/store" --models "$models" \
    --ts-config "$run/config.properties" --disable-token-auth > "$run/server.log" 2>&1 < /dev/null &
  PID=$!
  cd "$ROOT"
  ready_loop http://127.0.0.1:18080/v2/models/echo/ready "$PID"
}

start_torchserve() {
  local run=$WORK/ts
  [ -x "$TS_VENV/bin/torchserve" ] || { log "missing $TS_VENV"; return 1; }
  rm -rf "$run"; mkdir -p "$run/store" "$run/logs"
  "$TS_VENV/bin/torch-model-archiver" --model-name echo --version 1.0 \
    --handler "$ROOT/benchmarks/oip_echo_handler.py" --export-path "$run/store" -f
  cat > "$run/config.properties" <<EOF
inference_address=http://127.0.0.1:18080
management_address=http://127.0.0.1:18085
metrics_address=http://127.0.0.1:18082
grpc_inference_port=18081
grpc_management_port=18086
default_workers_per_model=1
service_envelope=kservev2
EOF
  cd "$run"
  PATH="$TS_VENV/bin:$PATH" LOG_LOCATION="$run/logs" METRICS_LOCATION="$run/logs" \
    torchserve --start --ncs --model-store "$run/store" --models echo=echo.mar \
    --ts-config "$run/config.properties" --disable-token-auth > "$run/start.out" 2>&1
  PID=$(cat /tmp/.model_server.pid)
  cd "$ROOT"
  ready_loop http://127.0.0.1:18085/models/echo "$PID" || return 1
  local end=$(( $(now_ms) + 120000 ))
  while [ "$(now_ms)" -lt "$end" ]; do
    curl -s -m 1 http://127.0.0.1:18085/models/echo | grep -q '"status": "READY"' && return 0
    sleep 0.1
  done
  return 1
}

start_peer() {
  case $1 in
    mls_pw1|mls_pw0)
      out=$(PW=${1#mls_pw} "$B/peers/mlserver/start.sh") || return 1
      PID=$(kv pid "$out") ;;
    trio_mls) start_trioserve mls ;;
    trio_ts)  start_trioserve ts ;;
    ts_kv2)   start_torchserve ;;
  esac
}

stop_peer() {
  case $1 in
    mls_pw*) "$B/peers/mlserver/stop.sh" ;;
    ts_kv2) PATH="$TS_VENV/bin:$PATH" torchserve --stop > /dev/null 2>&1 || true
            stop_pid_tree torchserve "$PID" 30 ;;
    *) stop_pid_tree trioserve "$PID" 30 ;;
  esac
}

check_http() {  # the reply carries the input's values
  curl -s -m 10 -H 'Content-Type: application/json' --data-binary @"$L/bodies/oip_fp32x3.json" "$HTTP_URL" |
    python3 -c 'import json,sys; r=json.load(sys.stdin); d=r["outputs"][0]["data"]; d=d[0] if d and isinstance(d[0],list) else d; assert [float(v) for v in d]==[1.0,2.0,3.0], r; print("http check ok:", r["outputs"][0]["name"], r["outputs"][0]["datatype"], r["outputs"][0]["shape"])'
}

grpc_reply_bytes() {  # bytes of one good ModelInfer reply frame (h2load's DATA check), checked
  "$PY" - "$L/bodies/oip_modelinfer_fp32x3.grpc" <<'PY'
import struct, sys
import numpy as np
import tritonclient.grpc as t
from tritonclient.grpc import service_pb2
c = t.InferenceServerClient("127.0.0.1:18081")
x = t.InferInput("x", [1, 3], "FP32"); x.set_data_from_numpy(np.array([[1, 2, 3]], np.float32))
r = c.infer("echo", [x])
got = r.as_numpy("x")
assert got is not None and got.reshape(-1).tolist() == [1.0, 2.0, 3.0], got
# the harness's frame, sent as is: its reply's size
frame = open(sys.argv[1], "rb").read()
req = service_pb2.ModelInferRequest.FromString(frame[5:])
reply = c._client_stub.ModelInfer(req)
print(5 + reply.ByteSize())
PY
}

measure() {  # PEER PROTO CONC
  local peer=$1 proto=$2 c=$3 line t0 t1 w0 w1 cores rps per err
  if [ "$proto" = HTTP ]; then
    CONTENT_TYPE=application/json "$L/http_wrk.sh" "$HTTP_URL" "$L/bodies/oip_fp32x3.json" "$c" "$WARMUP" > /dev/null
    t0=$(cpu_ticks_tree "$PID"); w0=$(now_ms)
    line=$(CONTENT_TYPE=application/json "$L/http_wrk.sh" "$HTTP_URL" "$L/bodies/oip_fp32x3.json" "$c" "$SECS")
    t1=$(cpu_ticks_tree "$PID"); w1=$(now_ms)
    err=$(( $(kv non2xx "$line") + $(kv sockerr "$line") ))
  else
    EXPECT_RESP_BYTES=$REPLY_BYTES "$L/grpc_h2load.sh" "$GRPC_URL" "$L/bodies/oip_modelinfer_fp32x3.grpc" "$c" "$WARMUP" > /dev/null
    t0=$(cpu_ticks_tree "$PID"); w0=$(now_ms)
    line=$(EXPECT_RESP_BYTES=$REPLY_BYTES "$L/grpc_h2load.sh" "$GRPC_URL" "$L/bodies/oip_modelinfer_fp32x3.grpc" "$c" "$SECS")
    t1=$(cpu_ticks_tree "$PID"); w1=$(now_ms)
    err=$(( $(kv failed "$line") + $(kv errored "$line") + $(kv grpc_bad "$line") ))
  fi
  rps=$(kv rps "$line")
  cores=$(awk -v a="$t0" -v b="$t1" -v hz="$HZ" -v ms=$((w1 - w0)) 'BEGIN { printf "%.2f", (b - a) / hz / (ms / 1000) }')
  per=$(awk -v c="$cores" -v r="$rps" 'BEGIN { if (r > 0) printf "%.0f", c * 1e6 / r; else print "–" }')
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$peer" "$proto" "$c" "$rps" "$(kv p50_ms "$line")" \
    "$(kv p99_ms "$line")" "$err" "$cores" "$per" >> "$ROWS"
  log "$peer $proto c=$c: $line cpu=$cores per_req_us=$per"
}

for peer in $PEERS; do
  log "starting $peer"
  if ! start_peer "$peer"; then log "$peer did not start; skipped"; [ -n "$PID" ] && stop_peer "$peer"; PID=""; continue; fi
  check_http
  protos="HTTP gRPC"
  [ "$peer" = ts_kv2 ] && protos=HTTP
  for proto in $protos; do
    if [ "$proto" = gRPC ]; then REPLY_BYTES=$(grpc_reply_bytes); log "gRPC reply frame: $REPLY_BYTES bytes"; fi
    for c in $CONCS; do measure "$peer" "$proto" "$c"; done
  done
  stop_peer "$peer"
  PID=""
done

python3 - "$ROWS" "$OUT" "$SECS" <<'PY'
import sys
rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1]) if line.strip()]
base = {(r[1], r[2]): float(r[3]) for r in rows if r[0] == "mls_pw1"}
names = {"mls_pw1": "MLServer 1.7.1, parallel_workers 1", "mls_pw0": "MLServer 1.7.1, parallel_workers 0",
         "trio_mls": "trioserve, MLServer runtime folder, 1 worker", "trio_ts": "trioserve, TorchServe handler, 1 worker",
         "ts_kv2": "TorchServe 0.12, kservev2 envelope, 1 worker"}
out = [f"OIP echo, one FP32 [1,3] tensor; {sys.argv[3]} s per row; server CPU from /proc; ratio = rps / MLServer pw1 rps (same protocol, concurrency)", "",
       "| server | proto | conc | rps | p50 ms | p99 ms | errors | server cores | CPU µs/req | × MLServer pw1 |",
       "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
for peer, proto, c, rps, p50, p99, err, cores, per in rows:
    b = base.get((proto, c))
    ratio = f"{float(rps) / b:.2f}" if b else "–"
    out.append(f"| {names.get(peer, peer)} | {proto} | {c} | {float(rps):.0f} | {p50} | {p99} | {err} | {cores} | {per} | {ratio} |")
text = "\n".join(out) + "\n"
open(sys.argv[2], "w").write(text)
print(text)
PY
