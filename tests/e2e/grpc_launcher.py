"""Run a real trioserve server with its gRPC listeners, for end-to-end tests.

Usage: python tests/e2e/grpc_launcher.py CONFIG_PROPERTIES

Until ``trioserve.runtime.server.serve`` starts the gRPC listeners itself, this runs
``serve()`` and :func:`trioserve.grpc.serve_grpc` side by side in one ``trio.run``, with the
same manager, token store and configuration. Once ``serve()`` reports gRPC listeners of its
own, this only runs ``serve()``. It reports ``READY ...`` on ``TRIOSERVE_READY_FD`` like
``trioserve start --foreground``, and drains gRPC before HTTP on SIGTERM/SIGINT.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

import trio

from trioserve.auth import TokenStore
from trioserve.config import CliOptions, ServerConfig, load_config
from trioserve.grpc import serve_grpc
from trioserve.runtime import server as server_module
from trioserve.runtime.management import ManagementService


class _Trigger:
    """A trio.Event that serve() accepts: it tests ``shutdown or trio.Event()``, and a
    trio.Event refuses to be a bool."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def __bool__(self) -> bool:
        return True

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        await self._event.wait()


def _report(message: str) -> None:
    fd = os.environ.pop("TRIOSERVE_READY_FD", None)
    if fd is not None:
        with os.fdopen(int(fd), "w") as pipe:
            pipe.write(message + "\n")


async def _run(config: ServerConfig) -> None:
    stores: list[TokenStore | None] = []
    create_tokens = server_module.create_tokens

    def capture_tokens(cfg: ServerConfig) -> TokenStore | None:
        store = create_tokens(cfg)
        stores.append(store)
        return store

    server_module.create_tokens = capture_tokens  # type: ignore[assignment]
    http_shutdown = _Trigger()
    grpc_shutdown = trio.Event()
    async with trio.open_nursery() as nursery:

        async def watch_signals() -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    if grpc_shutdown.is_set():
                        nursery.cancel_scope.cancel()
                    grpc_shutdown.set()

        async def run_server(*, task_status: trio.TaskStatus[server_module.ServerInfo]) -> None:
            await server_module.serve(
                config,
                shutdown=http_shutdown,  # type: ignore[arg-type]
                handle_signals=False,
                task_status=task_status,
            )
            nursery.cancel_scope.cancel()  # the server has stopped: end the signal watcher

        nursery.start_soon(watch_signals)
        info = await nursery.start(run_server)
        bound = dict(info.bound)
        if not any(api.startswith("grpc") for api in bound):
            management = ManagementService(
                info.manager,
                enable_model_api=config.enable_model_api,
                download=server_module.downloader(config),
                max_workers=config.max_workers_per_model or 4 * (os.cpu_count() or 1),
            )

            async def grpc_then_http(*, task_status: trio.TaskStatus[dict[str, list[str]]]) -> None:
                try:
                    await serve_grpc(
                        inference=(config.grpc_inference_address, config.grpc_inference_port),
                        management=(config.grpc_management_address, config.grpc_management_port),
                        manager=info.manager,
                        management_service=management,
                        tokens=stores[0] if stores else None,
                        max_request_size=config.max_request_size,
                        shutdown_trigger=grpc_shutdown.wait,
                        graceful_timeout=config.shutdown_grace_seconds,
                        sequence_id_header=config.ts_header_key_sequence_id,
                        task_status=task_status,
                    )
                finally:
                    http_shutdown.set()

            bound.update(await nursery.start(grpc_then_http))
        else:
            nursery.start_soon(_forward, grpc_shutdown, http_shutdown)
        lines = ["READY " + " ".join(f"{k}={','.join(v)}" for k, v in bound.items())]
        lines.extend(f"PROBLEM {p}" for p in info.problems)
        _report("\n".join(lines))


async def _forward(source: trio.Event, target: _Trigger) -> None:
    await source.wait()
    target.set()


def main(argv: list[str]) -> int:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    config = load_config(CliOptions(ts_config=argv[0], foreground=True), os.environ, Path.cwd())
    try:
        trio.run(_run, config)
    except Exception as exc:
        logging.getLogger("trioserve").exception("trioserve failed")
        _report(f"FAILED {type(exc).__name__}: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
