"""``trioserve-client``: call trioserve's (or TorchServe's) gRPC APIs from a shell.

Predictions are written to stdout as raw bytes; management answers as the server's text.
A failed call prints ``error: <STATUS>: <message>`` to stderr and exits with 1; a failed
request inside ``infer-stream2`` does the same after the other answers are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any, BinaryIO

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from trioserve.client.client import DEFAULT_INFERENCE_PORT, DEFAULT_MANAGEMENT_PORT, Client


def _value(text: str) -> bytes:
    """``@path`` reads a file (``@-``: stdin); anything else is the text itself."""
    if text.startswith("@"):
        if text == "@-":
            return sys.stdin.buffer.read()
        return Path(text[1:]).read_bytes()
    return text.encode()


def _named(text: str) -> tuple[str, bytes]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE or NAME=@FILE, got {text!r}")
    return name, _value(value)


def _inputs(args: argparse.Namespace) -> dict[str, bytes]:
    inputs: dict[str, bytes] = dict(args.input or [])
    if args.data is not None:
        inputs["data"] = _value(args.data)
    return inputs


def _keys(path: str | None) -> dict[str, str]:
    """The inference and management keys of a ``key_file.json``."""
    if path is None:
        return {}
    document = json.loads(Path(path).read_text())
    return {kind: document[kind]["key"] for kind in ("inference", "management") if kind in document}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trioserve-client", description="Call trioserve's gRPC inference and management APIs."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_INFERENCE_PORT, help="inference port")
    parser.add_argument(
        "--management-port", type=int, default=DEFAULT_MANAGEMENT_PORT, help="management port"
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("TRIOSERVE_INFERENCE_TOKEN"),
        help="inference key (default: $TRIOSERVE_INFERENCE_TOKEN)",
    )
    parser.add_argument(
        "--management-token",
        default=os.environ.get("TRIOSERVE_MANAGEMENT_TOKEN"),
        help="management key (default: $TRIOSERVE_MANAGEMENT_TOKEN)",
    )
    parser.add_argument("--key-file", help="read both keys from the server's key_file.json")
    parser.add_argument("--timeout", type=float, help="deadline of each call, in seconds")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("ping", help="server health")

    def infer_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("model")
        p.add_argument("data", nargs="?", help="the input 'data': text, @FILE or @- (stdin)")
        p.add_argument("--version", dest="model_version")
        p.add_argument(
            "-i", "--input", type=_named, action="append", metavar="NAME=VALUE",
            help="a named input (VALUE may be @FILE); repeatable",
        )  # fmt: skip

    infer_args(sub.add_parser("infer", help="one prediction (Predictions)"))
    infer_args(sub.add_parser("infer-stream", help="a streamed prediction (StreamPredictions)"))
    stream2 = sub.add_parser(
        "infer-stream2", help="one sequence of requests on one stream (StreamPredictions2)"
    )
    stream2.add_argument("model")
    stream2.add_argument("inputs", nargs="+", metavar="DATA", help="one request per DATA/@FILE")
    stream2.add_argument("--sequence-id", required=True)
    stream2.add_argument("--version", dest="model_version")

    register = sub.add_parser("register", help="register a model archive")
    register.add_argument("url", help="archive in the model store, or an allowed URL")
    register.add_argument("--model-name")
    register.add_argument("--handler")
    register.add_argument("--runtime")
    for name in (
        "batch-size",
        "max-batch-delay",
        "initial-workers",
        "response-timeout",
        "startup-timeout",
    ):
        register.add_argument(f"--{name}", type=int, default=0)
    register.add_argument("--synchronous", action="store_true")

    unregister = sub.add_parser("unregister", help="unregister a model (version)")
    unregister.add_argument("model")
    unregister.add_argument("model_version", nargs="?")

    listing = sub.add_parser("list", help="list models")
    listing.add_argument("--limit", type=int, default=0)
    listing.add_argument("--next-page-token", type=int, default=0)

    describe = sub.add_parser("describe", help="describe a model (version, or 'all')")
    describe.add_argument("model")
    describe.add_argument("model_version", nargs="?")
    describe.add_argument("--customized", action="store_true")

    scale = sub.add_parser("scale", help="scale a model's workers")
    scale.add_argument("model")
    scale.add_argument("model_version", nargs="?")
    scale.add_argument("--min-worker", type=int, default=0)
    scale.add_argument("--max-worker", type=int, default=0)
    scale.add_argument("--synchronous", action="store_true")
    scale.add_argument("--worker-timeout", type=int, default=0, help="drain timeout (s)")

    default = sub.add_parser("set-default", help="make a version the default")
    default.add_argument("model")
    default.add_argument("model_version")
    return parser


def _write(out: BinaryIO, data: bytes) -> None:
    out.write(data)
    out.flush()


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


async def run(args: argparse.Namespace, out: BinaryIO) -> int:
    """Run one command; returns the exit status. GRPCError propagates."""
    keys = _keys(args.key_file)
    client = Client(
        args.host,
        inference_port=args.port,
        management_port=args.management_port,
        inference_token=args.token or keys.get("inference"),
        management_token=args.management_token or keys.get("management"),
        timeout=args.timeout,
    )
    try:
        return await _command(client, args, out)
    finally:
        client.close()


async def _command(client: Client, args: argparse.Namespace, out: BinaryIO) -> int:
    command: str = args.command
    if command == "ping":
        print(await client.ping())
    elif command == "infer":
        _write(out, await client.predictions(args.model, _inputs(args), version=args.model_version))
    elif command == "infer-stream":
        async for part in client.stream_predictions(
            args.model, _inputs(args), version=args.model_version
        ):
            _write(out, part)
    elif command == "infer-stream2":
        failed = 0
        async for response in client.sequence(
            args.model,
            args.sequence_id,
            [_value(item) for item in args.inputs],
            version=args.model_version,
        ):
            if response.status is not None:
                failed += 1
                print(f"error: {_status_name(response.status.code)}: "
                      f"{response.status.message}", file=sys.stderr)  # fmt: skip
            else:
                _write(out, response.prediction + b"\n")
        return 1 if failed else 0
    elif command == "register":
        print(
            await client.register_model(
                args.url,
                model_name=args.model_name,
                handler=args.handler,
                runtime=args.runtime,
                batch_size=args.batch_size,
                max_batch_delay=args.max_batch_delay,
                initial_workers=args.initial_workers,
                response_timeout=args.response_timeout,
                startup_timeout=args.startup_timeout,
                synchronous=args.synchronous,
            )
        )
    elif command == "unregister":
        print(await client.unregister_model(args.model, args.model_version))
    elif command == "list":
        _print_json(
            await client.list_models(limit=args.limit, next_page_token=args.next_page_token)
        )
    elif command == "describe":
        _print_json(
            await client.describe_model(args.model, args.model_version, customized=args.customized)
        )
    elif command == "scale":
        print(
            await client.scale_worker(
                args.model,
                args.model_version,
                min_worker=args.min_worker,
                max_worker=args.max_worker,
                synchronous=args.synchronous,
                worker_timeout=args.worker_timeout,
            )
        )
    elif command == "set-default":
        print(await client.set_default(args.model, args.model_version))
    return 0


def _status_name(code: int) -> str:
    try:
        return Status(code).name
    except ValueError:
        return str(code)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command in ("infer", "infer-stream") and args.data is None and not args.input:
        parser.error(f"{args.command}: give the input as DATA, @FILE or --input NAME=VALUE")
    try:
        return asyncio.run(run(args, sys.stdout.buffer))
    except GRPCError as error:
        print(f"error: {error.status.name}: {error.message}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"error: cannot reach {args.host}: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
