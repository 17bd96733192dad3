#!/bin/sh
# Run tests/native against the C collator built with AddressSanitizer + UBSan.
#
#   sh native/sanitize.sh [pytest args...]      (from anywhere; CI: `make asan`)
#
# 1. Builds a separate copy of trioserve._collate with -fsanitize=address,undefined and no
#    recovery into build/asan/trioserve/ (the normal build in trioserve/ is untouched).
# 2. Runs pytest on tests/native with that copy loaded first (TRIOSERVE_NATIVE_BUILD, read by
#    tests/native/conftest.py; test_build.py checks the sanitized build is the one in use).
#    Python itself is not instrumented, so the ASan runtime is preloaded; PYTHONMALLOC=malloc
#    sends every Python allocation through ASan's malloc, so a read or write past the end of
#    a bytes/bytearray/cffi buffer hits a redzone instead of a neighbouring pymalloc block.
#    Leak detection is off: the interpreter keeps memory until exit by design.
# Any sanitizer report aborts the run with a non-zero status. pytest captures only sys-level
# output (--capture=sys) so that the report, written to file descriptor 2, is not swallowed
# with the aborted process's captured output.
#
# Environment: PYTHON (default .venv/bin/python), CC (default gcc: must be the compiler whose
# libasan the build links against).
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-.venv/bin/python}
CC=${CC:-gcc}
OUT=build/asan

TRIOSERVE_NATIVE_SANITIZE=1 CC="$CC" "$PYTHON" native/build_collate.py --out "$OUT" >/dev/null

ASAN_RUNTIME=$("$CC" -print-file-name=libasan.so)
if [ ! -e "$ASAN_RUNTIME" ]; then
    echo "sanitize.sh: $CC has no libasan.so (install libasan for $CC)" >&2
    exit 2
fi

export LD_PRELOAD="$ASAN_RUNTIME${LD_PRELOAD:+ $LD_PRELOAD}"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export PYTHONMALLOC=malloc
export TRIOSERVE_NATIVE_BUILD="$OUT"
export TRIOSERVE_NATIVE_SANITIZED=1

exec "$PYTHON" -m pytest -p no:cacheprovider --capture=sys tests/native "$@"
