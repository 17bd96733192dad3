"""How the configuration becomes each part of the server (wiring).

:func:`trioserve.server.serve` builds the server from these: the worker launcher and its
environment, the model manager's settings (defaults, GPU placement, envelopes), the
management service, the dataplane, CORS, the archive downloader and the token store. Each
reads only the :class:`~trioserve.config.ServerConfig` (and, for GPUs, the environment and
``nvidia-smi``).
"""

from __future__ import annotations

import logging
import os
import shutil
import ssl
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from trioserve.archive import ArchiveError
from trioserve.archive.download import download
from trioserve.auth import TokenStore
from trioserve.config import ConfigError, ServerConfig
from trioserve.core import errors
from trioserve.core.gpus import GpuPlan, visible_gpu_count
from trioserve.core.model_settings import RegisterOptions, ServerDefaults
from trioserve.core.request import InferenceRequest
from trioserve.http.cors import Cors
from trioserve.metrics import ServerMetrics
from trioserve.runtime.dataplane import Dataplane
from trioserve.runtime.jobs import Job
from trioserve.runtime.launcher import SubprocessLauncher, worker_environment
from trioserve.runtime.management import ManagementService
from trioserve.runtime.manager import ManagerSettings, ModelManager
from trioserve.runtime.model_sources import archive_error, expand_load_models
from trioserve.runtime.sequences import SequenceHeaders

log = logging.getLogger("trioserve.server")


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


def make_launcher(config: ServerConfig, listen_dir: Path | None = None) -> SubprocessLauncher:
    """``listen_dir``: each worker also listens there for the other serving processes."""
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
    return SubprocessLauncher(env, listen_dir=listen_dir)


def manager_settings(
    config: ServerConfig, work_root: Path, metrics: ServerMetrics | None = None, gpus: int = 0
) -> ManagerSettings:
    """``gpus``: how many GPUs workers are placed on (:func:`server_gpus`)."""
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
        request_limits=config.request_limits,
        max_unpacked_bytes=config.max_unpacked_archive_bytes,
        unregister_timeout=config.unregister_model_timeout,
        metrics_sink=None if metrics is None else metrics.handler_metrics,
        load_time_sink=None if metrics is None else metrics.worker_loaded,
        sequence_id_header=config.ts_header_key_sequence_id,
        sequence_end_header=config.ts_header_key_sequence_end,
        install_py_deps=config.install_py_dep_per_model,
        default_handler=config.default_service_handler,
        default_envelope=config.service_envelope,
        gpu_plan=GpuPlan(gpus),
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
    config: ServerConfig,
    manager: ModelManager,
    metrics: ServerMetrics | None,
    forward: Callable[[InferenceRequest], Job] | None = None,
) -> Dataplane:
    """The one inference path every protocol adapter submits to (``metrics`` None: one
    that counts nothing, for the requests other serving processes forward, which they count;
    ``forward``: see :class:`Dataplane`)."""
    sequences = SequenceHeaders(
        id_header=config.ts_header_key_sequence_id,
        start_header=config.ts_header_key_sequence_start,
        end_header=config.ts_header_key_sequence_end,
    )
    return Dataplane(
        manager, metrics, sequences=sequences, limits=config.request_limits, forward=forward
    )


async def load_startup_models(
    manager: ModelManager, entries: tuple[str, ...], workers: int
) -> list[str]:
    """Register ``load_models`` entries; returns the problems (one line each)."""
    problems: list[str] = []
    for name, url in expand_load_models(entries, manager.settings.model_store):
        options = RegisterOptions(
            url=url,
            model_name=name,
            initial_workers=workers,
            synchronous=False,
            loaded_at_startup=True,
        )
        try:
            await manager.register(options)
        except errors.ServeError as exc:
            problems.append(f"{url}: {exc.message}")
    return problems


def cors_settings(config: ServerConfig) -> Cors | None:
    """CORS for the HTTP APIs: on when ``cors_allowed_origin`` is set."""
    if config.cors_allowed_origin is None:
        for key in ("cors_allowed_methods", "cors_allowed_headers"):
            if getattr(config, key) is not None:
                log.warning("%s has no effect without cors_allowed_origin", key)
        return None
    return Cors(
        config.cors_allowed_origin, config.cors_allowed_methods, config.cors_allowed_headers
    )


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
    """The server's keys, in memory, unless token authorization is disabled.

    The server writes them to the key file (:meth:`TokenStore.publish`) once it has bound
    every listener.
    """
    if config.disable_token_authorization:
        return None
    path = config.key_file or Path.cwd() / "key_file.json"
    return TokenStore(path, expiration_min=config.token_expiration_min)


def warn_about_settings(config: ServerConfig) -> None:
    """Settings that are read but that trioserve cannot honour as TorchServe does."""
    if config.ts_open_inference_protocol is False:
        log.warning(
            "ts_open_inference_protocol=false: trioserve serves the Open Inference Protocol "
            "(/v2 and inference.GRPCInferenceService) always; it cannot be switched off"
        )


@dataclass(frozen=True)
class ServerTls:
    """What TLS the configuration asks for, loaded once at start (files are read)."""

    files: tuple[Path, Path] | None = None  # certificate, key: for hypercorn's listeners
    front: ssl.SSLContext | None = None  # an https inference address
    grpc: ssl.SSLContext | None = None  # enable_grpc_ssl


def load_tls(config: ServerConfig) -> ServerTls:
    """Read the certificate and key once (blocking: run it in a thread)."""
    if config.certificate_file is None or config.private_key_file is None:
        return ServerTls()
    return ServerTls(
        files=pem_files(config),
        front=tls_context(config, ["http/1.1"]) if config.inference_address.is_tls else None,
        grpc=tls_context(config, ["h2"]) if config.enable_grpc_ssl else None,
    )


def pem_files(config: ServerConfig) -> tuple[Path, Path]:
    """The certificate and private key files (the configuration checked both are set)."""
    if config.certificate_file is None or config.private_key_file is None:
        raise ConfigError("TLS needs certificate_file and private_key_file (PEM)")
    return config.certificate_file, config.private_key_file


def tls_context(config: ServerConfig, alpn: list[str]) -> ssl.SSLContext:
    """A server-side TLS context with the configured certificate and key, offering ``alpn``
    (``h2`` for gRPC, ``http/1.1`` for the inference front)."""
    certificate, key = pem_files(config)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(certificate, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"certificate_file {certificate} / private_key_file {key}: cannot load them: {exc}"
        ) from exc
    context.set_alpn_protocols(alpn)
    return context
