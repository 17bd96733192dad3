#!/usr/bin/env bash
# Install Triton's perf_analyzer into .tools/perf_analyzer/ (docs/triton.md):
# the binary from tritonclient 2.41.0's manylinux wheel (the last release whose wheel carries
# it) and libcudart.so.12 from the nvidia-cuda-runtime-cu12 wheel, which the binary links
# against even when no GPU is used. It also needs Debian's libb64-0d (libb64.so.0d), which
# .ci/run installs with apt when it runs as root. Beside it, perf_analyzer_openai: the binary
# of tritonclient 2.48.0's wheel, whose `--service-kind openai` is what genai-perf drives
# against an OpenAI endpoint (2.41.0's has no such kind). Idempotent: nothing is done when
# both are already there. Usage: scripts/get_perf_analyzer.sh [PYTHON]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${1:-$ROOT/.venv/bin/python}"
DEST="$ROOT/.tools/perf_analyzer"
TRITONCLIENT="tritonclient==2.41.0"
OPENAI_TRITONCLIENT="tritonclient==2.48.0"
CUDART="nvidia-cuda-runtime-cu12==12.4.127"

if [ -x "$DEST/perf_analyzer" ] && [ -x "$DEST/perf_analyzer_openai" ] \
    && [ -e "$DEST/libcudart.so.12" ]; then
    exit 0
fi
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
    --platform manylinux1_x86_64 --platform manylinux2014_x86_64 --python-version 3 \
    --dest "$TMP" "$TRITONCLIENT" "$CUDART"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
    --platform manylinux1_x86_64 --python-version 3 --dest "$TMP/openai" "$OPENAI_TRITONCLIENT"
mkdir -p "$TMP/unpacked" "$TMP/unpacked-openai" "$DEST"
for wheel in "$TMP"/*.whl; do
    "$PYTHON" -m zipfile -e "$wheel" "$TMP/unpacked"
done
"$PYTHON" -m zipfile -e "$TMP"/openai/*.whl "$TMP/unpacked-openai"
OPENAI_BIN="$(find "$TMP/unpacked-openai" -path '*/data/bin/perf_analyzer' -type f | head -n 1)"
BIN="$(find "$TMP/unpacked" -path '*/data/bin/perf_analyzer' -type f | head -n 1)"
LIB="$(find "$TMP/unpacked" -name 'libcudart.so.12' -type f | head -n 1)"
if [ -z "$BIN" ] || [ -z "$LIB" ] || [ -z "$OPENAI_BIN" ]; then
    echo "get_perf_analyzer: the wheels did not hold perf_analyzer and libcudart.so.12" >&2
    exit 1
fi
cp "$LIB" "$DEST/libcudart.so.12"
cp "$BIN" "$DEST/perf_analyzer.bin"
cp "$OPENAI_BIN" "$DEST/perf_analyzer_openai.bin"
chmod +x "$DEST/perf_analyzer.bin" "$DEST/perf_analyzer_openai.bin"
# Wrappers that find libcudart beside them.
for name in perf_analyzer perf_analyzer_openai; do
    cat > "$DEST/$name" <<SH
#!/bin/sh
HERE="\$(cd "\$(dirname "\$0")" && pwd)"
LD_LIBRARY_PATH="\$HERE\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$HERE/$name.bin" "\$@"
SH
    chmod +x "$DEST/$name"
done
echo "perf_analyzer installed in $DEST"
