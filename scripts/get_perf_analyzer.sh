#!/usr/bin/env bash
# Install Triton's perf_analyzer into .tools/perf_analyzer/ (docs/triton.md):
# the binary from tritonclient 2.41.0's manylinux wheel (the last release whose wheel carries
# it) and libcudart.so.12 from the nvidia-cuda-runtime-cu12 wheel, which the binary links
# against even when no GPU is used. It also needs Debian's libb64-0d (libb64.so.0d), which
# .ci/run installs with apt when it runs as root. Idempotent: nothing is done when the
# binary is already there. Usage: scripts/get_perf_analyzer.sh [PYTHON]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${1:-$ROOT/.venv/bin/python}"
DEST="$ROOT/.tools/perf_analyzer"
TRITONCLIENT="tritonclient==2.41.0"
CUDART="nvidia-cuda-runtime-cu12==12.4.127"

if [ -x "$DEST/perf_analyzer" ] && [ -e "$DEST/libcudart.so.12" ]; then
    exit 0
fi
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
    --platform manylinux1_x86_64 --platform manylinux2014_x86_64 --python-version 3 \
    --dest "$TMP" "$TRITONCLIENT" "$CUDART"
mkdir -p "$TMP/unpacked" "$DEST"
for wheel in "$TMP"/*.whl; do
    "$PYTHON" -m zipfile -e "$wheel" "$TMP/unpacked"
done
BIN="$(find "$TMP/unpacked" -path '*/data/bin/perf_analyzer' -type f | head -n 1)"
LIB="$(find "$TMP/unpacked" -name 'libcudart.so.12' -type f | head -n 1)"
if [ -z "$BIN" ] || [ -z "$LIB" ]; then
    echo "get_perf_analyzer: the wheels did not hold perf_analyzer and libcudart.so.12" >&2
    exit 1
fi
cp "$LIB" "$DEST/libcudart.so.12"
cp "$BIN" "$DEST/perf_analyzer.bin"
chmod +x "$DEST/perf_analyzer.bin"
# A wrapper that finds libcudart beside it.
cat > "$DEST/perf_analyzer" <<'SH'
#!/bin/sh
HERE="$(cd "$(dirname "$0")" && pwd)"
LD_LIBRARY_PATH="$HERE${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$HERE/perf_analyzer.bin" "$@"
SH
chmod +x "$DEST/perf_analyzer"
echo "perf_analyzer installed in $DEST"
