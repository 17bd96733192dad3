"""``trioserve-archiver``: the ``torch-model-archiver`` command line (spec §6.4)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ._errors import ArchiveError
from ._manifest import RUNTIMES
from ._write import ARCHIVE_FORMATS, write_archive


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trioserve-archiver",
        description="Package a model for trioserve or TorchServe (a .mar archive).",
    )
    parser.add_argument(
        "--model-name",
        required=True,
        help="model name; also the archive's file name (^[A-Za-z0-9][A-Za-z0-9_\\-.]*$)",
    )
    parser.add_argument("-v", "--version", required=True, help="model version, e.g. 1.0")
    parser.add_argument(
        "--handler",
        required=True,
        help="handler file, module:function, or a default handler name such as "
        "base_handler or image_classifier",
    )
    parser.add_argument("--serialized-file", type=Path, help="weights (.pt, .pth, ...)")
    parser.add_argument("--model-file", type=Path, help="Python file defining the model class")
    parser.add_argument(
        "--extra-files",
        help="comma-separated files, directories or glob patterns to package as well",
    )
    parser.add_argument("--runtime", default="python", choices=RUNTIMES)
    parser.add_argument(
        "--export-path",
        type=Path,
        default=None,
        help="where to write the archive (default: the current directory; created if missing)",
    )
    parser.add_argument("--archive-format", default="default", choices=ARCHIVE_FORMATS)
    parser.add_argument("-f", "--force", action="store_true", help="overwrite an existing archive")
    parser.add_argument(
        "-r", "--requirements-file", type=Path, help="pip requirements for the model"
    )
    parser.add_argument("-c", "--config-file", type=Path, help="model-config.yaml")
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="show no progress while writing a large archive (also TRIOSERVE_PROGRESS=0)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the archiver; return 0 on success, 2 on bad input, 1 if writing failed."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse has printed the usage error (or --help)
        return exc.code if isinstance(exc.code, int) else 2
    extra = None
    if args.extra_files is not None:
        extra = [Path(p.strip()) for p in args.extra_files.split(",") if p.strip()]
    try:
        write_archive(
            model_name=args.model_name,
            version=args.version,
            handler=args.handler,
            export_path=args.export_path if args.export_path is not None else Path.cwd(),
            serialized_file=args.serialized_file,
            model_file=args.model_file,
            extra_files=extra,
            runtime=args.runtime,
            archive_format=args.archive_format,
            force=args.force,
            requirements_file=args.requirements_file,
            config_file=args.config_file,
            progress=None if args.quiet else sys.stderr,
        )
    except ArchiveError as exc:
        print(f"{parser.prog}: error: {exc.message}", file=sys.stderr)
        return 1 if exc.status >= 500 else 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
