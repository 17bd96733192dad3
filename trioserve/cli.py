"""The ``trioserve`` command: start, stop, archive.

TorchServe's launcher flags work as they did (``--start``, ``--stop``, ``--foreground``,
``--model-store``, ``--models``, ``--ts-config``, ``--ncs``, ``--disable-token-auth``,
``--enable-model-api``); ``trioserve start`` / ``trioserve stop`` are the same actions.
``--enable-envvars-config`` is trioserve's own: the ``TS_*`` variables apply whatever the
config file says (KServe's runtimes pin their listeners with it).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from trioserve import __version__
from trioserve.config import CliOptions, ConfigError, ServerConfig, load_config
from trioserve.dev import command as dev
from trioserve.foreground import report_ready, run_until_stopped
from trioserve.launch import launch
from trioserve.pythonpath import child_environment

PID_FILE_ENV = "TRIOSERVE_PID_FILE"


def pid_file() -> Path:
    return Path(os.environ.get(PID_FILE_ENV) or Path(tempfile.gettempdir()) / ".trioserve.pid")


def _start_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--foreground", action="store_true", help="run in this process")
    parser.add_argument("--model-store", help="folder that holds model archives")
    parser.add_argument("--models", nargs="+", help="models to load: all, NAME=FILE or FILE")
    parser.add_argument("--ts-config", help="config.properties file")
    parser.add_argument(
        "--ncs",
        "--no-config-snapshots",
        action="store_true",
        help="accepted for compatibility (trioserve writes no config snapshots)",
    )
    parser.add_argument("--disable-token-auth", "--dt", action="store_true")
    parser.add_argument("--enable-model-api", action="store_true")
    parser.add_argument(
        "--enable-envvars-config",
        action="store_true",
        help="apply TS_* environment variables even when the config file does not say "
        "enable_envvars_config=true (a launcher that owns the environment: KServe's runtimes)",
    )
    parser.add_argument(
        "--strict-config",
        action="store_true",
        help="refuse to start when the config file sets a key trioserve does not use",
    )
    parser.add_argument(
        "--serving-processes",
        metavar="N",
        help="serving processes on the inference ports, sharing the workers (serving_processes)",
    )
    parser.add_argument("--log-level", default=os.environ.get("TRIOSERVE_LOG_LEVEL", "INFO"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trioserve", description=__doc__)
    parser.add_argument("-v", "--version", action="version", version=f"trioserve {__version__}")
    actions = parser.add_mutually_exclusive_group()
    actions.add_argument("--start", action="store_true", help="same as 'trioserve start'")
    actions.add_argument("--stop", action="store_true", help="same as 'trioserve stop'")
    _start_parser(parser)
    sub = parser.add_subparsers(dest="command")
    start = sub.add_parser("start", help="start the server")
    _start_parser(start)
    sub.add_parser("stop", help="stop the server started in the background")
    sub.add_parser(
        "archive", help="create a model archive (torch-model-archiver flags)", add_help=False
    )
    demo = sub.add_parser("demo-store", help="write the bundled demo models into a folder")
    demo.add_argument("store", type=Path)
    demo.add_argument("--force", action="store_true")
    dev.add_arguments(sub.add_parser("dev", help=dev.HELP))
    return parser


def _cli_options(args: argparse.Namespace) -> CliOptions:
    return CliOptions(
        ts_config=args.ts_config,
        model_store=args.model_store,
        models=tuple(args.models) if args.models else None,
        ncs=args.ncs,
        disable_token_auth=args.disable_token_auth,
        enable_model_api=args.enable_model_api,
        enable_envvars_config=args.enable_envvars_config,
        foreground=args.foreground,
        strict_config=args.strict_config,
        serving_processes=args.serving_processes,
    )


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def run_foreground(config: ServerConfig) -> int:
    import trio

    from trioserve.server import ServerInfo, serve

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            info: ServerInfo = await nursery.start(serve, config)
            lines = ["READY " + " ".join(f"{k}={','.join(v)}" for k, v in info.bound.items())]
            lines.extend(f"PROBLEM {p}" for p in info.problems)
            report_ready("\n".join(lines))

    return run_until_stopped(main)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_pid() -> int | None:
    try:
        return int(pid_file().read_text().strip())
    except (OSError, ValueError):
        return None


def start_background(argv: list[str], log_dir: Path) -> int:
    pid = _read_pid()
    if pid is not None and _alive(pid):
        print(f"trioserve is already running (pid {pid}, {pid_file()}).", file=sys.stderr)
        return 1
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / "trioserve.log"
    launched = launch(
        [sys.executable, "-m", "trioserve", *argv, "--foreground"],
        log_path=log_path,
        env=child_environment(),
        new_session=True,
    )
    process, lines = launched.process, launched.report
    if not launched.ready:
        process.wait(timeout=30)
        why = lines[0].removeprefix("FAILED ") if lines else f"see {log_path}"
        print(f"trioserve failed to start: {why}", file=sys.stderr)
        return 1
    pid_file().write_text(f"{process.pid}\n")
    print(f"trioserve started (pid {process.pid}); log: {log_path}")
    for line in lines:
        if line.startswith("READY "):
            print("  " + line.removeprefix("READY "))
        elif line.startswith("PROBLEM "):
            print("  warning: " + line.removeprefix("PROBLEM "), file=sys.stderr)
    return 0


def stop_background(timeout: float = 60.0) -> int:
    pid = _read_pid()
    if pid is None or not _alive(pid):
        print("trioserve is not running.", file=sys.stderr)
        pid_file().unlink(missing_ok=True)
        return 1
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        print(f"trioserve (pid {pid}) did not stop within {timeout:g} s.", file=sys.stderr)
        return 1
    pid_file().unlink(missing_ok=True)
    print("trioserve stopped.")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["archive"]:
        from trioserve.archive.cli import main as archive_main

        return archive_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "demo-store":
        from trioserve.demo import DEMO_MODELS, build_demo_store

        names = build_demo_store(args.store, force=args.force)
        print(f"demo models in {args.store}: {', '.join(names)}")
        if left_out := [name for name in DEMO_MODELS if name not in names]:
            print(f"left out, they need PyTorch: {', '.join(left_out)}")
        return 0
    if args.stop or args.command == "stop":
        return stop_background()
    _setup_logging(args.log_level)
    if args.command == "dev":
        return dev.main(args, report_ready)
    try:
        config = load_config(_cli_options(args), os.environ, Path.cwd())
    except ConfigError as exc:
        print(f"trioserve: {exc}", file=sys.stderr)
        report_ready(f"FAILED {exc}")
        return 2
    if args.foreground:
        return run_foreground(config)
    passthrough = [a for a in argv if a not in ("--start", "start")]
    log_dir = Path(os.environ.get("LOG_LOCATION", "logs"))
    del config  # validated here so that a bad config fails before forking
    return start_background(passthrough, log_dir)
