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
              ├─ HTTP inference   (trioserve's HTTP/1.1 front: fast path + Quart app;
              │                    its connections in ingress processes, one task each)
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
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import trio
from quart_trio import QuartTrio

from trioserve.archive import ArchiveError
from trioserve.archive.download import download
from trioserve.auth import TokenStore
from trioserve.config import Address, ServerConfig
from trioserve.core.gpus import GpuPlan, visible_gpu_count
from trioserve.core.model_settings import ServerDefaults
from trioserve.grpc.bridge import GrpcListener, serve_grpc
from trioserve.grpc.calls import Service
from trioserve.grpc.health import HealthRpcs
from trioserve.grpc.inference import SERVICE as INFERENCE_SERVICE
from trioserve.grpc.inference import InferenceRpcs
from trioserve.grpc.management import ManagementRpcs
from trioserve.grpc.oip import SERVICE as OIP_SERVICE
from trioserve.grpc.oip import oip_service
from trioserve.http.front import FastPath, Front, FrontSettings
from trioserve.http.inference import create_inference_app, error_for_path, fast_path
from trioserve.http.ingress import Ingress
from trioserve.http.management import create_management_app
from trioserve.http.metrics import create_metrics_app
from trioserve.http.serve import serve_app
from trioserve.metrics import ServerMetrics, sample_system_forever
from trioserve.runtime.dataplane import Dataplane
from trioserve.runtime.launcher import Launcher, SubprocessLauncher
from trioserve.runtime.management import ManagementService
from trioserve.runtime.manager import (
    ManagerSettings,
    ModelManager,
    archive_error,
    worker_environment,
)
from trioserve.runtime.sequences import SequenceHeaders

log = logging.getLogger("trioserve.server")


@dataclass(slots=True)
class ServerInfo:
    """What a started server reports: where it listens and what went wrong at start-up."""

    bound: dict[str, list[str]]  # API name ("inference", "management", ...) -> URLs
    manager: ModelManager
    problems: list[str] = field(default_factory=list)


# How often CPU, memory and disk gauges are sampled (TorchServe: metric_time_interval, 60 s).
SYSTEM_METRICS_INTERVAL = 60.0


def nvidia_smi_gpus() -> int | None:
    """How many GPUs ``nvidia-smi`` lists (None: no such tool, or it failed)."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return None
    try:
        out = subprocess.run(
            [tool, "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("nvidia-smi failed (%s): workers run on the CPU", exc)
        return None
    return sum(1 for line in out.stdout.splitlines() if line.strip())


def server_gpus(config: ServerConfig) -> int:
    """The GPUs workers are spread over: ``number_of_gpu``, at most what is visible."""
    visible = visible_gpu_count(os.environ, nvidia_smi_gpus)
    gpus = visible if config.number_of_gpu is None else min(config.number_of_gpu, visible)
    if config.number_of_gpu is not None and config.number_of_gpu > visible:
        log.warning("number_of_gpu is %d but %d GPUs are visible", config.number_of_gpu, visible)
    if gpus:
        log.info("workers are placed round-robin on %d GPU(s)", gpus)
    return gpus


def startup_workers(config: ServerConfig) -> int:
    return config.default_workers_per_model or (os.cpu_count() or 1)


def make_launcher(config: ServerConfig) -> SubprocessLauncher:
    env = worker_environment(
        os.environ,
        blacklist=config.blacklist_env_vars,
        decode_input_request=config.decode_input_request,
        sequence_headers=(
            config.ts_header_key_sequence_id,
            config.ts_header_key_sequence_start,
            config.ts_header_key_sequence_end,
        ),
    )
    return SubprocessLauncher(env)


def manager_settings(
    config: ServerConfig, work_root: Path, metrics: ServerMetrics | None = None
) -> ManagerSettings:
    return ManagerSettings(
        model_store=config.model_store,
        work_root=work_root,
        defaults=ServerDefaults(
            default_workers=config.default_workers_per_model,
            job_queue_size=config.job_queue_size,
            response_timeout=config.default_response_timeout,
            startup_timeout=config.default_startup_timeout,
            models_setting=dict(config.models),
        ),
        stop_grace=config.worker_stop_grace_seconds,
        max_response_size=config.max_response_size,
        max_unpacked_bytes=config.max_unpacked_archive_bytes,
        unregister_timeout=config.unregister_model_timeout,
        metrics_sink=None if metrics is None else metrics.handler_metrics,
        load_time_sink=None if metrics is None else metrics.worker_loaded,
        sequence_id_header=config.ts_header_key_sequence_id,
        sequence_end_header=config.ts_header_key_sequence_end,
        install_py_deps=config.install_py_dep_per_model,
        default_handler=config.default_service_handler,
        default_envelope=config.service_envelope,
        gpu_plan=GpuPlan(server_gpus(config)),
    )


def management_service(config: ServerConfig, manager: ModelManager) -> ManagementService:
    """The one management service that HTTP and gRPC share."""
    return ManagementService(
        manager,
        enable_model_api=config.enable_model_api,
        download=downloader(config),
        max_workers=config.max_workers_per_model or 4 * (os.cpu_count() or 1),
    )


def build_dataplane(
    config: ServerConfig, manager: ModelManager, metrics: ServerMetrics
) -> Dataplane:
    """The one inference path every protocol adapter submits to."""
    sequences = SequenceHeaders(
        id_header=config.ts_header_key_sequence_id,
        start_header=config.ts_header_key_sequence_start,
        end_header=config.ts_header_key_sequence_end,
    )
    return Dataplane(manager, metrics, sequences=sequences)


def build_apps(
    config: ServerConfig,
    dataplane: Dataplane,
    management: ManagementService,
    tokens: TokenStore | None,
    metrics: ServerMetrics,
) -> list[tuple[str, QuartTrio, Address, FastPath | None]]:
    """Each HTTP API with the address it listens on, and the fast path that answers its hot
    routes without Quart (the inference API's predictions), if it has one."""
    limit = config.max_request_size
    apps: list[tuple[str, QuartTrio, Address, FastPath | None]] = [
        (
            "inference",
            create_inference_app(
                dataplane,
                max_request_size=limit,
                tokens=tokens,
                metrics=metrics,
                management=management,
            ),
            config.inference_address,
            fast_path(dataplane, tokens=tokens, management=management),
        ),
        (
            "management",
            create_management_app(
                management, max_request_size=limit, tokens=tokens, metrics=metrics
            ),
            config.management_address,
            None,
        ),
    ]
    if config.enable_metrics_api:
        apps.append(
            (
                "metrics",
                create_metrics_app(metrics, max_request_size=limit),
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
        )
    front = Front(
        app,
        fast,
        FrontSettings(
            max_request_size=config.max_request_size,
            graceful_timeout=config.shutdown_grace_seconds,
        ),
        error_body=error_for_path,
        on_response=metrics.http_status,
    )
    count = config.ingress_processes
    if count == 0 or address.is_tls:
        return partial(front.serve, address, shutdown_trigger=shutdown.wait)
    ingress = Ingress(count, log_level=logging.getLevelName(log.getEffectiveLevel()))
    return partial(front.serve, address, shutdown_trigger=shutdown.wait, accept=ingress.accept)


def grpc_listeners(
    config: ServerConfig,
    dataplane: Dataplane,
    management: ManagementService,
    draining: Callable[[], bool] = lambda: False,
) -> list[GrpcListener]:
    """TorchServe's gRPC inference (7070) and management (7071) services; the Open
    Inference Protocol's ``inference.GRPCInferenceService`` and ``grpc.health.v1.Health``
    beside the inference one."""
    inference: list[Service] = [
        InferenceRpcs(dataplane),
        oip_service(dataplane, config.oip_grpc_stream_shape, management),
    ]
    names = [INFERENCE_SERVICE, OIP_SERVICE]
    return [
        GrpcListener(
            "grpc_inference",
            (config.grpc_inference_address, config.grpc_inference_port),
            [*inference, HealthRpcs(dataplane, names, draining)],
        ),
        GrpcListener(
            "grpc_management",
            (config.grpc_management_address, config.grpc_management_port),
            [ManagementRpcs(management)],
        ),
    ]


def downloader(config: ServerConfig) -> Callable[[str], Awaitable[Path]] | None:
    """Fetches http(s) model URLs that match ``allowed_urls`` into the model store."""
    store = config.model_store
    if store is None:
        return None

    async def fetch(url: str) -> Path:
        try:
            return await download(
                url,
                store,
                config.allowed_urls,
                max_bytes=config.max_unpacked_archive_bytes,
            )
        except ArchiveError as exc:
            raise archive_error(exc) from None

    return fetch


def create_tokens(config: ServerConfig) -> TokenStore | None:
    """The key file (mode 0600), unless token authorization is disabled."""
    if config.disable_token_authorization:
        return None
    path = config.key_file or Path.cwd() / "key_file.json"
    store = TokenStore.create(path, expiration_min=config.token_expiration_min)
    log.info("token authorization is on: keys are in %s", path)
    return store


async def _watch_signals(shutdown: trio.Event, force: Callable[[], None]) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            if not shutdown.is_set():
                log.info("%s received: draining", signal.Signals(signum).name)
                shutdown.set()
            else:
                log.warning("second signal: stopping without waiting for requests")
                force()


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
    launcher = launcher or make_launcher(config)
    work_root = Path(tempfile.mkdtemp(prefix="trioserve-models-"))
    tokens = await trio.to_thread.run_sync(create_tokens, config)  # writes and fsyncs a file
    metrics = ServerMetrics(mode=config.metrics_mode)
    try:
        async with trio.open_nursery() as root:
            manager: ModelManager = await root.start(
                ModelManager(manager_settings(config, work_root, metrics), launcher).run
            )
            metrics.add_gauge_source(
                "ts_open_sequences",
                "Open sequences of a stateful model version (sequenceBatching)",
                ("model_name", "model_version"),
                manager.open_sequences,
            )
            problems = await manager.load_startup_models(
                config.load_models, startup_workers(config)
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
            async with trio.open_nursery() as listeners:
                bound: dict[str, list[str]] = {}
                for api, app, address, fast in build_apps(
                    config, dataplane, management, tokens, metrics
                ):
                    bound[api] = await listeners.start(
                        http_service(
                            app, address, fast, config=config, metrics=metrics, shutdown=shutdown
                        )
                    )
                bound.update(
                    await listeners.start(
                        partial(
                            serve_grpc,
                            grpc_listeners(config, dataplane, management, shutdown.is_set),
                            tokens=tokens,
                            max_request_size=config.max_request_size,
                            shutdown_trigger=shutdown.wait,
                            graceful_timeout=config.shutdown_grace_seconds,
                        )
                    )
                )
                task_status.started(ServerInfo(bound=bound, manager=manager, problems=problems))
                log.info(
                    "trioserve ready: %s",
                    "; ".join(f"{api} API on {', '.join(urls)}" for api, urls in bound.items()),
                )
            # Every listener has stopped accepting and drained its requests.
            log.info("listeners closed; stopping workers")
            root.cancel_scope.cancel()
    finally:
        shutil.rmtree(work_root, ignore_errors=True)
        if tokens is not None:
            tokens.remove_file()
        log.info("trioserve stopped")
