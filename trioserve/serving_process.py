"""``python -m trioserve.serving_process --link-fd N``: one of the other serving processes.

The control process (``trioserve``, serving process 0) starts ``serving_processes - 1`` of
these with the inference ports' listening sockets and one end of a link as open file
descriptors. Each serves HTTP (the inference API: TorchServe's, the Open Inference
Protocol's and KServe v1's routes) and gRPC (TorchServe's inference service, the OIP's and
health) on those sockets with its own dataplane (admission, queues, batch forming,
deadlines, cancellation, metrics), attached to the control process's workers. Its registry
follows the control process's (``runtime/mirror.py``); requests for the models the control
process serves for everyone go over the link (``runtime/forward.py``); the OIP repository's
load and unload are made there. It ignores SIGINT and SIGTERM (sent to a whole process
group, they reach it too; the control process decides), drains when told to, and exits when
the link closes: the control process is gone.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import socket
import sys
import tempfile
from functools import partial
from pathlib import Path

import trio

from trioserve.assembly import (
    build_dataplane,
    cors_settings,
    create_tokens,
    load_tls,
    manager_settings,
)
from trioserve.auth import TokenStore
from trioserve.config import ServerConfig
from trioserve.core.serving_frames import READY
from trioserve.http.cors import install_cors
from trioserve.metrics import ServerMetrics
from trioserve.runtime.attach import AttachLauncher
from trioserve.runtime.link import Link
from trioserve.runtime.manager import ModelManager
from trioserve.runtime.serving_control import Setup
from trioserve.runtime.serving_member import ControlLink, RemoteModelControl
from trioserve.server import grpc_inference, grpc_service, http_service, inference_app

log = logging.getLogger("trioserve.serving")


def _listener(fd: int) -> trio.SocketListener:
    return trio.SocketListener(trio.socket.from_stdlib_socket(socket.socket(fileno=fd)))


async def serve_member(link_fd: int) -> None:
    link_socket = trio.socket.from_stdlib_socket(socket.socket(fileno=link_fd))
    # The link's frames go to the control side's handler, built before the link runs.
    control = ControlLink(lambda frame: link.post(frame))
    link = Link(link_socket, control.on_frame, "control process")
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:

        async def run_link() -> None:
            await link.run()
            control.closed()
            if not control.drain.is_set():
                log.warning("the control process is gone: stopping")
                nursery.cancel_scope.cancel()

        nursery.start_soon(run_link)
        await control.hello.wait()
        setup: Setup = control.setup
        _configure_logging(setup)
        work_root = Path(tempfile.mkdtemp(prefix="trioserve-serving-"))
        try:
            await _serve(setup, control, link, shutdown, work_root)
        finally:
            shutil.rmtree(work_root, ignore_errors=True)
        nursery.cancel_scope.cancel()


async def _serve(
    setup: Setup, control: ControlLink, link: Link, shutdown: trio.Event, work_root: Path
) -> None:
    config: ServerConfig = setup.config
    metrics = ServerMetrics(mode=config.metrics_mode)
    tokens = create_tokens(config)
    tls = await trio.to_thread.run_sync(load_tls, config)
    launcher = AttachLauncher(
        Path(setup.listen_dir), connect_timeout=max(config.default_startup_timeout, 1) + 5
    )
    async with trio.open_nursery() as root:
        manager: ModelManager = await root.start(
            ModelManager(manager_settings(config, work_root, metrics, setup.gpus), launcher).run
        )
        root.start_soon(
            partial(
                control.apply_states,
                manager,
                launcher,
                drain_timeout=config.unregister_model_timeout,
                metrics=metrics.exposition,
                on_tokens=partial(_adopt, tokens),
            )
        )
        dataplane = build_dataplane(config, manager, metrics, control.forwarder.submit)
        model_control = RemoteModelControl(control, enable_model_api=config.enable_model_api)

        async def drain_when_told() -> None:
            await control.drain.wait()
            log.info("serving process %d: draining", setup.index)
            shutdown.set()

        root.start_soon(drain_when_told)
        await control.applied.wait()  # the models first: no request finds them missing
        async with trio.open_nursery() as listeners:
            api, app, address, fast = inference_app(
                config, dataplane, model_control, tokens, metrics
            )
            cors = cors_settings(config)
            install_cors(app, cors)
            http = setup.http_fds
            urls = [f"fd:{fd}" for fd in http]
            await listeners.start(
                http_service(
                    app,
                    address,
                    fast,
                    config=config,
                    metrics=metrics,
                    shutdown=shutdown,
                    cors=cors,
                    tls=tls,
                    opened=([_listener(fd) for fd in http], urls),
                )
            )
            if setup.grpc_fd is not None:
                grpc = grpc_inference(
                    config,
                    dataplane,
                    model_control,
                    shutdown.is_set,
                    tls,
                    socket.socket(fileno=setup.grpc_fd),
                )
                await listeners.start(grpc_service([grpc], config, tokens, shutdown))
            link.post((READY,))
            log.info("serving process %d (%s) ready", setup.index, api)
        root.cancel_scope.cancel()


def _adopt(tokens: TokenStore | None, keys: dict[str, tuple[str, float | None]]) -> None:
    if tokens is not None:
        tokens.adopt(keys)


def _configure_logging(setup: Setup) -> None:
    logging.basicConfig(
        level=setup.log_level,
        format=f"%(asctime)s %(levelname)s %(name)s [serving {setup.index}]: %(message)s",
        stream=sys.stderr,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m trioserve.serving_process", description=__doc__
    )
    parser.add_argument(
        "--link-fd", type=int, required=True, help="the link to the control process"
    )
    args = parser.parse_args(argv)
    # A terminal's Ctrl-C, or a service manager's SIGTERM to the whole group, reaches every
    # process: the control process decides, and drains this one over the link.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    trio.run(serve_member, args.link_fd)


if __name__ == "__main__":
    main()
