"""cffi builder of trioserve's C collator: the private module ``trioserve._collate``.

``setup.py`` names ``ffibuilder`` in ``cffi_modules``, so ``pip install .`` (and
``pip install -e .``) compiles the extension with the ordinary setuptools build. The cdef is
``collate.h`` read verbatim; the code is ``collate.c``. Out-of-line API mode: calls through
``lib`` release the GIL.

Environment switch (read when the builder runs):

``TRIOSERVE_NATIVE_SANITIZE=1``
    compile and link with ``-fsanitize=address,undefined`` (no recovery: the first report
    aborts), frame pointers and debug info. Load such a build into an uninstrumented
    Python with ``LD_PRELOAD=$(gcc -print-file-name=libasan.so)``; ``native/sanitize.sh``
    does all of it.

Run directly, the builder compiles without setuptools::

    python native/build_collate.py             # into trioserve/ (an in-place build)
    python native/build_collate.py --out DIR   # into DIR/trioserve/ (e.g. a sanitizer build)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from cffi import FFI

MODULE = "trioserve._collate"
# Relative when cffi's setuptools hook runs this file from the project root (setuptools
# wants relative source paths there); absolute when run from anywhere else.
HERE = Path(__file__).parent
SANITIZE = os.environ.get("TRIOSERVE_NATIVE_SANITIZE", "") not in ("", "0")

SANITIZE_COMPILE = [
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
    # Python's CFLAGS carry -fwrapv, which defines signed overflow and so hides it from UBSan.
    "-fno-wrapv",
    "-fno-omit-frame-pointer",
    "-g",
    "-O1",
]
SANITIZE_LINK = ["-fsanitize=address,undefined"]

ffibuilder = FFI()
ffibuilder.cdef((HERE / "collate.h").read_text())
# Lets a test check which build it loaded.
ffibuilder.cdef("#define TS_BUILD_SANITIZED ...")
ffibuilder.set_source(
    MODULE,
    "#include <stddef.h>\n"
    "#include <stdint.h>\n"
    '#include "collate.h"\n'
    f"#define TS_BUILD_SANITIZED {int(SANITIZE)}\n",
    sources=[str(HERE / "collate.c")],
    include_dirs=[str(HERE)],
    depends=[str(HERE / "collate.h")],
    extra_compile_args=SANITIZE_COMPILE if SANITIZE else [],
    extra_link_args=SANITIZE_LINK if SANITIZE else [],
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        help="put the module in OUT/trioserve/ instead of the source tree's trioserve/",
    )
    args = parser.parse_args(argv)
    root = HERE.resolve().parent
    tmpdir = root / "build" / ("native-sanitize" if SANITIZE else "native")
    # cffi's generated code uses the limited API on a release CPython, and setuptools names
    # the module it builds *.abi3.so; use the same name so that one build replaces the other.
    built = Path(ffibuilder.compile(tmpdir=str(tmpdir), target="_collate.abi3.so", verbose=False))
    dest = (args.out.resolve() if args.out else root) / "trioserve"
    dest.mkdir(parents=True, exist_ok=True)
    for stale in dest.glob("_collate.*.so"):  # another variant would shadow this one
        stale.unlink()
    target = dest / built.name
    shutil.copy2(built, target)
    print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
