"""The wiring of the whole server: one trio.run, one root nursery, every service in it.

This is the top layer: it is the one module that knows every adapter (HTTP, gRPC), the
runtime they share (the model manager, the :class:`Dataplane`, the management service)
and the configuration. Nursery tree::

    serve()
     └─ root nursery
         ├─ model manager (its own nursery: one per model version, one task per worker)
         ├─ signal watcher (SIGTERM/SIGINT -> drain)
         ├─ system metrics sampler
         └─ listeners nursery
              ├─ HTTP inference   (trioserve's HTTP/1.1 front: fast path + Quart app)
              ├─ HTTP management  (hypercorn)
              ├─ HTTP metrics     (hypercorn)
              └─ gRPC inference + management (grpclib on an asyncio loop thread)

Shutdown: the first SIGTERM/SIGINT (or ``shutdown`` being set) stops the listeners from
accepting; in-flight requests get up to ``shutdown_grace_seconds`` to finish. Then the model
manager is cancelled, and each worker supervisor stops its process (SHUTDOWN frame, SIGTERM,
grace, SIGKILL) in a shielded scope. A second signal skips the drain.
"""

from __future__ import annotations

import logging
import shutil
import signal
import socket
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import trio
from quart_trio import QuartTrio

from trioserve.assembly import (
    ServerTls,
    build_dataplane,
    cors_settings,
    create_tokens,
    load_startup_models,
    load_tls,
    make_launcher,
    management_service,
    manager_settings,
    server_gpus,
    startup_workers,
    warn_about_settings,
)
from trioserve.auth import KeyKind, TokenStore
from trioserve.config import Address, ServerConfig
from trioserve.grpc.bridge import GrpcListener, serve_grpc
from trioserve.grpc.calls import Service
from trioserve.grpc.health import HealthRpcs
from trioserve.grpc.inference import SERVICE as INFERENCE_SERVICE
from trioserve.grpc.inference import InferenceRpcs
from trioserve.grpc.management import ManagementRpcs
from trioserve.grpc.oip import SERVICE as OIP_SERVICE
from trioserve.grpc.oip import oip_service
from trioserve.http.cors import Cors, install_cors
from trioserve.http.fast import fast_path
from trioserve.http.front import FastPath, Front, FrontSettings
from trioserve.http.inference import create_inference_app, error_for_path
from trioserve.http.management import create_management_app
from trioserve.http.metrics import create_metrics_app
from trioserve.http.serve import serve_app
from trioserve.metrics import ServerMetrics, sample_system_forever
from trioserve.processes import Shared, open_shared, other_processes
from trioserve.runtime.dataplane import Dataplane
from trioserve.runtime.launcher import Launcher
from trioserve.runtime.management import ManagementService
from trioserve.runtime.manager import (
    ModelManager,
)
from trioserve.runtime.oip_repository import ModelControl
from trioserve.runtime.serving_control import ServingProcesses

log = logging.getLogger("trioserve.server")


@dataclass(slots=True)
class ServerInfo:
    """What a started server reports: where it listens and what went wrong at start-up."""

    bound: dict[str, list[str]]  # API name ("inference", "management", ...) -> URLs
    manager: ModelManager
    problems: list[str] = field(default_factory=list)
    inference_key: str | None = None  # the key file's inference key; None: tokens are off


# How often CPU, memory and disk gauges are sampled (TorchServe: metric_time_interval, 60 s).
SYSTEM_METRICS_INTERVAL = 60.0


def inference_app(
    config: ServerConfig,
    dataplane: Dataplane,
    control: ModelControl,
    tokens: TokenStore | None,
    metrics: ServerMetrics,
) -> tuple[str, QuartTrio, Address, FastPath | None]:
    """The inference API (every serving process runs one) and its fast path."""
    return (
        "inference",
        create_inference_app(
            dataplane,
            max_request_size=config.max_request_size,
            tokens=tokens,
            metrics=metrics,
            management=control,
        ),
        config.inference_address,
        fast_path(dataplane, tokens=tokens, management=control),
    )


def build_apps(
    config: ServerConfig,
    dataplane: Dataplane,
    management: ManagementService,
    tokens: TokenStore | None,
    metrics: ServerMetrics,
    others: ServingProcesses | None = None,
) -> list[tuple[str, QuartTrio, Address, FastPath | None]]:
    """Each HTTP API with the address it listens on, and the fast path that answers its hot
    routes without Quart (the inference API's predictions), if it has one. ``others``: the
    other serving processes, told of new keys; the metrics API shows their totals too."""
    limit = config.max_request_size
    apps: list[tuple[str, QuartTrio, Address, FastPath | None]] = [
        inference_app(config, dataplane, management, tokens, metrics),
        (
            "management",
            create_management_app(
                management,
                max_request_size=limit,
                tokens=tokens,
                metrics=metrics,
                tokens_changed=None if others is None else others.publish,
            ),
            config.management_address,
            None,
        ),
    ]
    if config.enable_metrics_api:
        apps.append(
            (
                "metrics",
                create_metrics_app(
                    metrics,
                    max_request_size=limit,
                    others=None if others is None else others.metrics,
                ),
                config.metrics_address,
                None,
            )
        )
    return apps


def http_service(
    app: QuartTrio,
    address: Address,
    fast: FastPath | None,
    *,
    config: ServerConfig,
    metrics: ServerMetrics,
    shutdown: trio.Event,
    cors: Cors | None = None,
    tls: ServerTls | None = None,
    opened: tuple[list[trio.SocketListener], list[str]] | None = None,
) -> Callable[..., Awaitable[None]]:
    """The listener of one HTTP API: trioserve's own HTTP/1.1 server where a fast path
    answers the hot routes, hypercorn for the others."""
    if fast is None:
        return partial(
            serve_app,
            app,
            address,
            shutdown_trigger=shutdown.wait,
            graceful_timeout=config.shutdown_grace_seconds,
            tls=tls.files if tls is not None and address.is_tls else None,
        )
    front = Front(
        app,
        fast,
        FrontSettings(
            max_request_size=config.max_request_size,
            graceful_timeout=config.shutdown_grace_seconds,
            ssl_context=tls.front if tls is not None and address.is_tls else None,
        ),
        error_body=error_for_path,
        on_response=metrics.http_status,
        extra_headers=[] if cors is None else cors.answer_headers(),
    )
    return partial(front.serve, address, shutdown_trigger=shutdown.wait, opened=opened)


def grpc_inference(
    config: ServerConfig,
    dataplane: Dataplane,
    control: ModelControl,
    draining: Callable[[], bool] = lambda: False,
    tls: ServerTls | None = None,
    sock: socket.socket | None = None,
) -> GrpcListener:
    """TorchServe's gRPC inference service (7070), with the Open Inference Protocol's
    ``inference.GRPCInferenceService`` and ``grpc.health.v1.Health`` beside it (every
    serving process runs it; ``sock``: its listening socket, opened already)."""
    inference: list[Service] = [
        InferenceRpcs(dataplane),
        oip_service(dataplane, config.oip_grpc_stream_shape, control),
    ]
    names = [INFERENCE_SERVICE, OIP_SERVICE]
    return GrpcListener(
        "grpc_inference",
        (config.grpc_inference_address, config.grpc_inference_port),
        [*inference, HealthRpcs(dataplane, names, draining)],
        None if tls is None else tls.grpc,
        sock,
    )


def grpc_listeners(
    config: ServerConfig,
    dataplane: Dataplane,
    management: ManagementService,
    draining: Callable[[], bool] = lambda: False,
    tls: ServerTls | None = None,
    sock: socket.socket | None = None,
) -> list[GrpcListener]:
    """TorchServe's gRPC inference (7070, see :func:`grpc_inference`) and management
    (7071) services."""
    grpc_tls = None if tls is None else tls.grpc
    return [
        grpc_inference(config, dataplane, management, draining, tls, sock),
        GrpcListener(
            "grpc_management",
            (config.grpc_management_address, config.grpc_management_port),
            [ManagementRpcs(management)],
            grpc_tls,
        ),
    ]


def grpc_service(
    plan: list[GrpcListener],
    config: ServerConfig,
    tokens: TokenStore | None,
    shutdown: trio.Event,
) -> Callable[..., Awaitable[None]]:
    """The task that serves the planned gRPC ports until ``shutdown`` (then drains them)."""
    return partial(
        serve_grpc,
        plan,
        tokens=tokens,
        max_request_size=config.max_request_size,
        limits=config.request_limits,
        shutdown_trigger=shutdown.wait,
        graceful_timeout=config.shutdown_grace_seconds,
    )


async def _watch_signals(shutdown: trio.Event, force: Callable[[], None]) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            if not shutdown.is_set():
                log.info("%s received: draining", signal.Signals(signum).name)
                shutdown.set()
            else:
                log.warning("second signal: stopping without waiting for requests")
                force()


async def _drain_others(
    others: ServingProcesses, shutdown: trio.Event, config: ServerConfig
) -> None:
    """At shutdown the other serving processes drain as this one does; the workers they
    use stop only once they have (or after the grace)."""
    await shutdown.wait()
    others.drain()
    with trio.move_on_after(config.shutdown_grace_seconds + 5):
        await others.stopped.wait()


async def serve(
    config: ServerConfig,
    *,
    launcher: Launcher | None = None,
    shutdown: trio.Event | None = None,
    handle_signals: bool = True,
    task_status: trio.TaskStatus[ServerInfo] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the server until shutdown. ``task_status.started`` fires once it is ready."""
    if shutdown is None:
        shutdown = trio.Event()
    work_root = Path(tempfile.mkdtemp(prefix="trioserve-models-"))
    # With several serving processes, each worker also listens for them (runtime/attach.py).
    listen_dir = work_root / "w" if config.serving_processes > 1 else None
    if listen_dir is not None:
        listen_dir.mkdir(mode=0o700)
    launcher = launcher or make_launcher(config, listen_dir)
    shared: Shared | None = None
    warn_about_settings(config)
    tokens = create_tokens(config)  # in memory; published once every listener is bound
    # Blocking at start (nvidia-smi, reading PEM files): in a thread, once.
    gpus = await trio.to_thread.run_sync(server_gpus, config)
    tls = await trio.to_thread.run_sync(load_tls, config)
    metrics = ServerMetrics(mode=config.metrics_mode)
    try:
        async with trio.open_nursery() as root:
            manager: ModelManager = await root.start(
                ModelManager(manager_settings(config, work_root, metrics, gpus), launcher).run
            )
            metrics.add_gauge_source(
                "ts_open_sequences",
                "Open sequences of a stateful model version (sequenceBatching)",
                ("model_name", "model_version"),
                manager.open_sequences,
            )
            problems = await load_startup_models(
                manager, config.load_models, startup_workers(config)
            )
            for problem in problems:
                log.error("startup model not loaded: %s", problem)
            with trio.move_on_after(max(config.default_startup_timeout, 1)):
                for _name, _version, entry in manager.registry:
                    await entry.model.wait_settled()
            if handle_signals:
                root.start_soon(_watch_signals, shutdown, root.cancel_scope.cancel)
            await root.start(sample_system_forever, metrics, SYSTEM_METRICS_INTERVAL)
            management = management_service(config, manager)
            dataplane = build_dataplane(config, manager, metrics)
            others: ServingProcesses | None = None
            if listen_dir is not None:
                shared = await open_shared(config)
                others = other_processes(
                    config, manager, management, tokens, shared, listen_dir, gpus
                )
                manager.publish = others.publish
                await root.start(others.run)
            async with trio.open_nursery() as listeners:
                if others is not None:
                    listeners.start_soon(_drain_others, others, shutdown, config)
                bound: dict[str, list[str]] = {}
                cors = cors_settings(config)
                for api, app, address, fast in build_apps(
                    config, dataplane, management, tokens, metrics, others
                ):
                    install_cors(app, cors)
                    bound[api] = await listeners.start(
                        http_service(
                            app,
                            address,
                            fast,
                            config=config,
                            metrics=metrics,
                            shutdown=shutdown,
                            cors=cors,
                            tls=tls,
                            opened=shared.http if shared is not None and fast else None,
                        )
                    )
                plan = grpc_listeners(
                    config,
                    dataplane,
                    management,
                    shutdown.is_set,
                    tls,
                    None if shared is None else shared.grpc,
                )
                bound.update(await listeners.start(grpc_service(plan, config, tokens, shutdown)))
                if tokens is not None:  # writes and fsyncs the key file
                    await trio.to_thread.run_sync(tokens.publish)
                    log.info("token authorization is on: keys are in %s", tokens.path)
                task_status.started(
                    ServerInfo(
                        bound=bound,
                        manager=manager,
                        problems=problems,
                        inference_key=None if tokens is None else tokens.key(KeyKind.INFERENCE),
                    )
                )
                log.info(
                    "trioserve ready: %s",
                    "; ".join(f"{api} API on {', '.join(urls)}" for api, urls in bound.items()),
                )
            # Every listener has stopped accepting and drained its requests.
            log.info("listeners closed; stopping workers")
            root.cancel_scope.cancel()
    finally:
        if shared is not None:
            shared.close()
        shutil.rmtree(work_root, ignore_errors=True)
        if tokens is not None:
            tokens.remove_file()
        log.info("trioserve stopped")
