"""``trioserve dev``'s command line: its flags and what it runs (see docs/dev.md)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from trioserve.config import CliOptions, ConfigError, load_config

HELP = "serve a handler file or model folder in place, reloading it on every edit"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "path",
        type=Path,
        help="a handler file (handler.py), a folder with model-settings.json or "
        "MAR-INF/MANIFEST.json, or a folder holding a handler",
    )
    parser.add_argument(
        "--model-name", help="the model's name (default: the file's stem or the folder's name)"
    )
    parser.add_argument("--ts-config", help="config.properties file (ports, timeouts, tokens)")
    parser.add_argument("--disable-token-auth", "--dt", action="store_true")
    parser.add_argument(
        "--ignore",
        action="append",
        default=[],
        metavar="GLOB",
        help="changes to matching files do not reload (repeatable; e.g. 'outputs/*')",
    )
    parser.add_argument(
        "--strict-config",
        action="store_true",
        help="refuse to start when the config file sets a key trioserve does not use",
    )
    parser.add_argument("--log-level", default=os.environ.get("TRIOSERVE_LOG_LEVEL", "INFO"))


def main(args: argparse.Namespace, ready: Callable[[str], None]) -> int:
    """Run ``trioserve dev`` as ``args`` say; ``ready`` is told the READY (or FAILED) line."""
    options = CliOptions(
        ts_config=args.ts_config,
        disable_token_auth=args.disable_token_auth,
        foreground=True,
        strict_config=args.strict_config,
    )
    try:
        config = load_config(options, os.environ, Path.cwd())
    except ConfigError as exc:
        print(f"trioserve dev: {exc}", file=sys.stderr)
        ready(f"FAILED {exc}")
        return 2
    from trioserve.dev.loop import DevOptions, run_dev

    dev = DevOptions(path=args.path, model_name=args.model_name, ignore=tuple(args.ignore))
    return run_dev(config, dev, ready)
