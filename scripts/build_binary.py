#!/usr/bin/env python3
"""Build ``dist/trioserve.pyz``: trioserve and everything it depends on in one file that
runs with nothing but ``python3`` (docs/binary.md).

Steps: build the trioserve wheel from a clean copy of the source (the C collator is compiled
then), install it and its dependencies with pip into a staging site-packages, add the demo
model sources (``handlers/``, for ``trioserve demo-store``), and pack that with shiv into a
zipapp whose entry point is ``trioserve.cli:main``.

The dependency versions are pinned to those of the interpreter running this script (``pip
freeze``), so the zipapp holds what the tests ran against; ``--no-pin`` takes the newest
versions the requirements allow instead. The zipapp holds compiled extensions (the collator,
cffi, pydantic-core, ...), so it runs only on this platform and this Python minor version.

    python scripts/build_binary.py                  # dist/trioserve.pyz, torch from the environment
    python scripts/build_binary.py --extras torch   # torch inside (big)
    python scripts/build_binary.py -o /tmp/ts.pyz --pip-arg=--index-url=...
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENTRY_POINT = "trioserve.cli:main"
SHEBANG = "/usr/bin/env python3"

# What the wheel is built from; a copy, so that neither the checkout's build/ and egg-info
# folders nor the in-place _collate.abi3.so end up in (or get written by) the build.
SOURCE_FILES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md")
SOURCE_DIRS = ("trioserve", "native")
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.o", "_collate.c")
# The demo models' sources, less their tests (trioserve/demo.py finds them beside the
# trioserve package, which in the zipapp is the extracted site-packages).
DEMO_SKIP = shutil.ignore_patterns(
    "__pycache__", "*.pyc", "test_*.py", "conftest.py", ".gitignore", "model.pt"
)


def _run(cmd: list[str], *, quiet: bool) -> None:
    """Run ``cmd``; when ``quiet``, its output shows only if it fails."""
    print("+", " ".join(cmd), flush=True)
    began = time.monotonic()
    if not quiet:
        subprocess.run(cmd, check=True)
    else:
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if done.returncode != 0:
            sys.stdout.write(done.stdout)
            sys.exit(f"failed with status {done.returncode}: {' '.join(cmd)}")
    print(f"  ({time.monotonic() - began:.1f} s)", flush=True)


def _has(python: str, *modules: str) -> bool:
    code = f"import {', '.join(modules)}"
    return subprocess.run([python, "-c", code], capture_output=True).returncode == 0


def _version(python: str) -> str:
    code = "import sys; print('%d.%d' % sys.version_info[:2])"
    return subprocess.run([python, "-c", code], capture_output=True, text=True).stdout.strip()


def build_wheel(python: str, work: Path, *, quiet: bool) -> Path:
    source = work / "src"
    source.mkdir()
    for name in SOURCE_FILES:
        shutil.copy2(REPO / name, source / name)
    for name in SOURCE_DIRS:
        shutil.copytree(REPO / name, source / name, ignore=SKIP)
    wheels = work / "wheel"
    cmd = [python, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(wheels)]
    if _has(python, "setuptools", "wheel", "cffi"):
        # The build requirements are there: no isolated build environment to set up.
        cmd.append("--no-build-isolation")
    _run([*cmd, str(source)], quiet=quiet)
    (wheel,) = wheels.glob("trioserve-*.whl")
    return wheel


def pins(python: str, work: Path) -> Path:
    """A constraints file with the versions installed in ``python`` (trioserve left out)."""
    frozen = subprocess.run(
        [python, "-m", "pip", "freeze", "--exclude-editable"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    keep = [
        line
        for line in frozen
        if line and not line.startswith(("#", "-e ")) and not line.lower().startswith("trioserve")
    ]
    path = work / "constraints.txt"
    path.write_text("\n".join(keep) + "\n")
    return path


def stage(
    python: str,
    wheel: Path,
    work: Path,
    *,
    extras: list[str],
    constraints: Path | None,
    pip_args: list[str],
    other_versions: list[str],
    quiet: bool,
) -> Path:
    site = work / "site-packages"

    def install(target: Path, *what: str) -> None:
        cmd = [python, "-m", "pip", "install", "--target", str(target), "--no-compile"]
        if constraints is not None:
            cmd += ["--constraint", str(constraints)]
        _run([*cmd, *pip_args, *what], quiet=quiet)
        # Console scripts written for the build interpreter: of no use in the zipapp.
        shutil.rmtree(target / "bin", ignore_errors=True)

    install(site, f"{wheel}[{','.join(extras)}]" if extras else str(wheel))
    requires = requirements(site, extras)
    for version in other_versions:
        # The same dependencies' wheels for another Python, merged in: their compiled
        # modules carry the Python version in their file names (cpython-312-...so), so the
        # versions' files sit side by side and each Python imports its own.
        extra = work / f"site-packages-{version}"
        for_version = ("--python-version", version, "--only-binary=:all:", "--implementation=cp")
        install(extra, *for_version, *requires)
        _merge(extra, site, version)
    shutil.copytree(REPO / "handlers", site / "handlers", ignore=DEMO_SKIP)
    return site


def requirements(site: Path, extras: list[str]) -> list[str]:
    """trioserve's own requirements (with ``extras``), from the staged wheel's metadata."""
    (metadata,) = site.glob("trioserve-*.dist-info/METADATA")
    found = []
    for line in metadata.read_text().splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        spec, _, marker = line.removeprefix("Requires-Dist:").strip().partition(";")
        extra = re.fullmatch(r"""\s*extra\s*==\s*["']([^"']+)["']\s*""", marker)
        if extra is None:
            found.append(line.removeprefix("Requires-Dist:").strip())
        elif extra[1] in extras:
            found.append(spec.strip())
    return found


def _merge(extra: Path, site: Path, version: str) -> None:
    """Add ``extra``'s files to ``site``; the same distributions must have the same versions
    (a distribution only one Python needs comes in whole)."""
    ours = {d.name.split("-")[0].lower(): d.name for d in site.glob("*.dist-info")}
    for dist in extra.glob("*.dist-info"):
        mine = ours.get(dist.name.split("-")[0].lower())
        if mine is not None and mine != dist.name:
            sys.exit(f"Python {version} got {dist.name} where the build has {mine}: pin them")
    for path in sorted(extra.rglob("*")):
        target = site / path.relative_to(extra)
        if path.is_dir():
            target.mkdir(exist_ok=True)
        elif not target.exists():
            shutil.copy2(path, target)


PREAMBLE = """\
# Run by shiv's bootstrap before trioserve.cli:main (written by scripts/build_binary.py).
import sys
import sysconfig

VERSIONS = {versions!r}
PLATFORM = {platform!r}
mine = "%d.%d" % sys.version_info[:2]
if mine not in VERSIONS or sysconfig.get_platform() != PLATFORM:
    sys.exit(
        f"trioserve.pyz holds compiled modules for Python {{', '.join(VERSIONS)}} on "
        f"{{PLATFORM}}; {{sys.executable}} is Python {{mine}} on {{sysconfig.get_platform()}}. "
        "Run it with one of those, or build it for this one (docs/binary.md)."
    )
"""


def pack(
    python: str, site: Path, output: Path, work: Path, *, versions: list[str], quiet: bool
) -> None:
    if not _has(python, "shiv"):
        sys.exit(f"shiv is not installed in {python}: pip install shiv (in trioserve's dev extra)")
    output.parent.mkdir(parents=True, exist_ok=True)
    platform = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_platform())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    preamble = work / "check_python.py"
    preamble.write_text(PREAMBLE.format(versions=tuple(versions), platform=platform))
    # Written under another name, then renamed: a half-written file never stands at the
    # output path.
    partial = output.with_name(output.name + ".partial")
    # --site-packages: our staged folder as it is (shiv runs no pip of its own then).
    # The bootstrap extracts it to $SHIV_ROOT or ~/.shiv/<name>_<build id> on first run and
    # puts it on sys.path ahead of the interpreter's site-packages, which stay on the path:
    # torch installed for that python3 is importable. --reproducible: fixed timestamps, so
    # the same inputs give the same file and the same build id (the content hash).
    # --preamble: a clear message, instead of an ImportError later, on the wrong Python.
    cmd = [
        python,
        "-m",
        "shiv",
        "--site-packages",
        str(site),
        "--entry-point",
        ENTRY_POINT,
        "--python",
        SHEBANG,
        "--preamble",
        str(preamble),
        "--reproducible",
        "--output-file",
        str(partial),
    ]
    _run(cmd, quiet=quiet)
    partial.replace(output)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "-o", "--output", type=Path, default=REPO / "dist" / "trioserve.pyz", help="zipapp path"
    )
    parser.add_argument(
        "--extras",
        default="",
        help="comma-separated extras of trioserve to bundle too (torch, vision)",
    )
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="interpreter to build with; its pip, shiv and installed versions are used",
    )
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="newest allowed dependency versions instead of the build interpreter's",
    )
    parser.add_argument(
        "--pip-arg",
        action="append",
        default=[],
        help="extra argument for pip install (repeat; e.g. --pip-arg=--index-url=URL)",
    )
    parser.add_argument(
        "--python-versions",
        default="",
        help="comma-separated X.Y: also bundle the dependencies' compiled modules for these "
        "Pythons (the build interpreter's version is always in)",
    )
    parser.add_argument("--verbose", action="store_true", help="show pip's and shiv's output")
    args = parser.parse_args(argv)
    extras = [name.strip() for name in args.extras.split(",") if name.strip()]
    quiet = not args.verbose
    own = _version(args.python)
    versions = [own, *(v.strip() for v in args.python_versions.split(",") if v.strip())]
    others = sorted(set(versions) - {own}, key=versions.index)
    began = time.monotonic()
    output = args.output.resolve()
    with tempfile.TemporaryDirectory(prefix="trioserve-binary-") as tmp:
        work = Path(tmp)
        wheel = build_wheel(args.python, work, quiet=quiet)
        constraints = None if args.no_pin else pins(args.python, work)
        site = stage(
            args.python,
            wheel,
            work,
            extras=extras,
            constraints=constraints,
            pip_args=args.pip_arg,
            other_versions=others,
            quiet=quiet,
        )
        pack(args.python, site, output, work, versions=[own, *others], quiet=quiet)
    size = output.stat().st_size
    print(
        f"built {output} ({size / 2**20:.1f} MiB, {size} bytes) "
        f"in {time.monotonic() - began:.1f} s; "
        f"it runs on this platform with Python {', '.join([own, *others])}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
