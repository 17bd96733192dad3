"""The typed settings: :class:`ServerConfig` (frozen, with trioserve's defaults) and
:class:`CliOptions` (what the command line said).

:func:`trioserve.config.load_config` builds a ``ServerConfig`` from the config file, the
command line and the environment; ``ServerConfig()`` is the all-defaults configuration.
trioserve's defaults are safer than TorchServe's (see ``docs/compat.md``):

* every HTTP and gRPC listener binds ``127.0.0.1``;
* ``metrics_mode`` defaults to ``prometheus``, so ``/metrics`` has content out of the box;
* ``allowed_urls`` defaults to *nothing but files inside the model store* (an empty tuple
  here); fetching archives over http(s) needs an explicit list of regexes;
* token authorization is on and the model API (register / unregister) is off.

trioserve-only keys:

``shutdown_grace_seconds`` (30.0)
    After SIGTERM, how long the server waits for in-flight requests before it stops.
``worker_stop_grace_seconds`` (5.0)
    How long a worker process has to exit after SIGTERM before it gets SIGKILL.
``key_file`` (unset)
    Path of the token file (TorchServe's ``key_file.json``); unset means
    ``key_file.json`` in the current directory, as in TorchServe.
``max_unpacked_archive_bytes`` (4 GiB)
    The most a model archive may expand to when it is extracted.
``max_workers_per_model`` (0 = four per CPU)
    The most workers one model version may be scaled to; a register or scale call asking
    for more is refused with 400 instead of starting that many processes.
``serving_processes`` (1)
    How many serving processes answer the inference ports (HTTP 8080, gRPC 7070) on the same
    listening sockets, each with its own dataplane, all sharing the workers; the first is
    also the control plane (``docs/design.md``, "Serving processes").
``max_request_inputs`` (2048), ``max_request_instances`` (10000), ``max_request_elements`` (2**25)
    What one inference request may expand to: its inputs, its KServe v1 instances, its
    tensor elements (:mod:`trioserve.core.limits`, held together as ``request_limits``); a
    request beyond one is refused with 413 / RESOURCE_EXHAUSTED naming the setting.
``oip_grpc_stream_shape`` (``mlserver``)
    The messages the gRPC ``inference.GRPCInferenceService/ModelStreamInfer`` answers with:
    ``mlserver`` (``ModelInferResponse``, what MLServer's stubs decode; an error ends the
    stream with its status) or ``triton`` (``ModelStreamInferResponse``, what tritonclient's
    ``start_stream`` decodes; an error is answered in-band and the stream stays open).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from trioserve.config.addresses import LOOPBACK, Address
from trioserve.core.limits import DEFAULT_LIMITS, RequestLimits
from trioserve.core.messages import DEFAULT_MAX_RESPONSE_SIZE

__all__ = [
    "METRICS_MODES",
    "OIP_GRPC_STREAM_SHAPES",
    "SERVICE_ENVELOPES",
    "CliOptions",
    "ServerConfig",
    "no_models",
]

METRICS_MODES: Final = ("log", "prometheus", "legacy")
OIP_GRPC_STREAM_SHAPES: Final = ("mlserver", "triton")
SERVICE_ENVELOPES: Final = ("body", "json", "kserve", "kservev2")


@dataclass(frozen=True)
class CliOptions:
    """What the command line said; ``None`` / ``False`` mean "not given"."""

    ts_config: str | None = None
    model_store: str | None = None
    models: tuple[str, ...] | None = None
    ncs: bool = False
    disable_token_auth: bool = False
    enable_model_api: bool = False
    enable_envvars_config: bool = False  # TS_* variables apply whatever the file says
    foreground: bool = False
    strict_config: bool = False  # a key the server does not use is an error, not a warning
    serving_processes: str | None = None  # --serving-processes N


_INFERENCE_ADDRESS: Final = Address("http", LOOPBACK, 8080)
_MANAGEMENT_ADDRESS: Final = Address("http", LOOPBACK, 8081)
_METRICS_ADDRESS: Final = Address("http", LOOPBACK, 8082)


def no_models() -> Mapping[str, Any]:
    """The ``models`` setting when the config file has none."""
    return {}


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """The resolved configuration. ``ServerConfig()`` is the all-defaults configuration."""

    inference_address: Address = _INFERENCE_ADDRESS
    management_address: Address = _MANAGEMENT_ADDRESS
    metrics_address: Address = _METRICS_ADDRESS
    grpc_inference_address: str = LOOPBACK
    grpc_inference_port: int = 7070
    grpc_management_address: str = LOOPBACK
    grpc_management_port: int = 7071
    model_store: Path | None = None
    #: raw entries: () for none, ("all",), or ("a.mar", "name=b.mar", ...)
    load_models: tuple[str, ...] = ()
    #: 0 means "one per CPU" for models loaded at startup (the server resolves it)
    default_workers_per_model: int = 0
    job_queue_size: int = 100
    max_request_size: int = 6553500
    max_response_size: int = DEFAULT_MAX_RESPONSE_SIZE
    #: max_request_inputs, max_request_instances, max_request_elements
    request_limits: RequestLimits = DEFAULT_LIMITS
    default_response_timeout: int = 120
    default_startup_timeout: int = 120
    unregister_model_timeout: int = 120
    enable_envvars_config: bool = False
    disable_token_authorization: bool = False
    token_expiration_min: float = 60.0
    enable_model_api: bool = False
    enable_metrics_api: bool = True
    metrics_mode: str = "prometheus"
    #: regexes a model URL must match; () means only files inside the model store
    allowed_urls: tuple[str, ...] = ()
    decode_input_request: bool = True
    limit_max_image_pixels: bool = True
    blacklist_env_vars: str | None = None
    default_service_handler: str | None = None
    service_envelope: str | None = None
    cors_allowed_origin: str | None = None
    cors_allowed_methods: str | None = None
    cors_allowed_headers: str | None = None
    ts_header_key_sequence_id: str = "ts_request_sequence_id"
    ts_header_key_sequence_start: str = "ts_request_sequence_start"
    ts_header_key_sequence_end: str = "ts_request_sequence_end"
    #: parsed JSON of the ``models`` key: {name: {version: {minWorkers: ..., ...}}}
    models: Mapping[str, Any] = field(default_factory=no_models, hash=False)
    ts_open_inference_protocol: bool | None = None  # None: not set (OIP is always served)
    #: pip-install each archive's requirements file for its own workers
    install_py_dep_per_model: bool = False
    # trioserve-only
    shutdown_grace_seconds: float = 30.0
    max_workers_per_model: int = 0
    serving_processes: int = 1
    number_of_gpu: int | None = None  # None: every GPU the machine shows
    certificate_file: Path | None = None  # PEM; with https:// addresses and enable_grpc_ssl
    private_key_file: Path | None = None  # PEM
    enable_grpc_ssl: bool = False
    worker_stop_grace_seconds: float = 5.0
    key_file: Path | None = None
    max_unpacked_archive_bytes: int = 4 << 30
    #: ModelStreamInfer's response messages: "mlserver" or "triton"
    oip_grpc_stream_shape: str = "mlserver"
    # provenance
    config_file: Path | None = None
    unknown_keys: tuple[str, ...] = ()
