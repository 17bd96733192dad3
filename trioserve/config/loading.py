"""Resolving the configuration: which file, and how the file, the command line and the
``TS_*`` environment variables combine into one :class:`ServerConfig`.

trioserve reads the same ``config.properties`` files as TorchServe and resolves them the
same way. Where a value comes from, highest priority first:

1. the environment, as ``TS_<NAME>`` -- only when the config file itself says
   ``enable_envvars_config=true`` or the command line says ``--enable-envvars-config``
   (trioserve's own flag, for launchers that own the environment, such as KServe's
   runtimes; the switch is never read from the environment). The
   variable names are TorchServe's: ``TS_`` plus the key in upper case, except
   ``TS_TOKEN_EXPIRATION_TIME_MIN`` (``TS_TOKEN_EXPIRATION_MIN`` is accepted too),
   ``TS_OPEN_INFERENCE_PROTOCOL`` and ``TS_HEADER_KEY_SEQUENCE_ID/_START/_END``.
   ``TS_ALLOWED_URLS`` is honoured only when the file also says
   ``use_env_allowed_urls=true``; ``models`` cannot come from the environment.
   As in TorchServe, a non-empty ``TS_OPEN_INFERENCE_PROTOCOL`` always applies, even
   without ``enable_envvars_config``: ``oip`` or ``true`` enables the protocol, anything
   else disables it.
2. the command line: ``--model-store``, ``--models`` (entries may also be comma-separated),
   ``--disable-token-auth`` (can only disable) and ``--enable-model-api`` (can only enable);
3. ``config.properties``, where values may contain ``$$NAME$$`` references to environment
   variables (substituted once; a reference to an unset variable is an error);
4. the defaults.

The config file is ``$TS_CONFIG_FILE``, else ``--ts-config``, else ``./config.properties``
when it exists. TorchServe would also look for its latest config snapshot; trioserve
writes no snapshots, so ``--ncs`` changes nothing. A file named explicitly that cannot be
read is an error (TorchServe silently starts with defaults).

Values are checked strictly (:mod:`trioserve.config.values`) and a bad one raises
:class:`ConfigError` naming the key, the value, what was expected and where the value came
from. Without a port, the inference address uses 80 / 443, the management address 8081 /
8444 and the metrics address 8082 / 8445 (http / https), as in TorchServe.

Keys TorchServe defines but trioserve does not use (thread counts, GPU count, worker
ports, TLS key stores, JVM and Intel launcher options, snapshots, workflow store, metric
collector settings, ...) and keys nobody knows are ignored with
one warning each and listed in :attr:`ServerConfig.unknown_keys`, so existing TorchServe
config files keep loading.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from trioserve.config.errors import ConfigError, bad_value
from trioserve.config.properties import parse_properties
from trioserve.config.settings import CliOptions, ServerConfig
from trioserve.config.values import RawValue, Values
from trioserve.core.limits import LIMIT_SETTINGS, RequestLimits

__all__ = ["CONFIG_FILE_NAME", "TORCHSERVE_UNUSED_KEYS", "find_config_file", "load_config"]

# the package's name, as before it was split into modules
log = logging.getLogger("trioserve.config")

CONFIG_FILE_NAME: Final = "config.properties"

# Keys trioserve reads, with the environment variable names that may override them.
# An empty tuple means the key cannot come from the environment.
_ENV_NAMES: Final[Mapping[str, tuple[str, ...]]] = {
    "inference_address": ("TS_INFERENCE_ADDRESS",),
    "management_address": ("TS_MANAGEMENT_ADDRESS",),
    "metrics_address": ("TS_METRICS_ADDRESS",),
    "grpc_inference_address": ("TS_GRPC_INFERENCE_ADDRESS",),
    "grpc_inference_port": ("TS_GRPC_INFERENCE_PORT",),
    "grpc_management_address": ("TS_GRPC_MANAGEMENT_ADDRESS",),
    "grpc_management_port": ("TS_GRPC_MANAGEMENT_PORT",),
    "model_store": ("TS_MODEL_STORE",),
    "load_models": ("TS_LOAD_MODELS",),
    "default_workers_per_model": ("TS_DEFAULT_WORKERS_PER_MODEL",),
    "job_queue_size": ("TS_JOB_QUEUE_SIZE",),
    "max_request_size": ("TS_MAX_REQUEST_SIZE",),
    "max_response_size": ("TS_MAX_RESPONSE_SIZE",),
    "default_response_timeout": ("TS_DEFAULT_RESPONSE_TIMEOUT",),
    "default_startup_timeout": ("TS_DEFAULT_STARTUP_TIMEOUT",),
    "unregister_model_timeout": ("TS_UNREGISTER_MODEL_TIMEOUT",),
    "enable_envvars_config": (),
    "disable_token_authorization": ("TS_DISABLE_TOKEN_AUTHORIZATION",),
    "token_expiration_min": ("TS_TOKEN_EXPIRATION_TIME_MIN", "TS_TOKEN_EXPIRATION_MIN"),
    "enable_model_api": ("TS_ENABLE_MODEL_API",),
    "enable_metrics_api": ("TS_ENABLE_METRICS_API",),
    "metrics_mode": ("TS_METRICS_MODE",),
    "allowed_urls": ("TS_ALLOWED_URLS",),  # only with use_env_allowed_urls=true
    "use_env_allowed_urls": (),
    "decode_input_request": ("TS_DECODE_INPUT_REQUEST",),
    "limit_max_image_pixels": ("TS_LIMIT_MAX_IMAGE_PIXELS",),
    "blacklist_env_vars": ("TS_BLACKLIST_ENV_VARS",),
    "default_service_handler": ("TS_DEFAULT_SERVICE_HANDLER",),
    "service_envelope": ("TS_SERVICE_ENVELOPE",),
    "cors_allowed_origin": ("TS_CORS_ALLOWED_ORIGIN",),
    "cors_allowed_methods": ("TS_CORS_ALLOWED_METHODS",),
    "cors_allowed_headers": ("TS_CORS_ALLOWED_HEADERS",),
    "ts_header_key_sequence_id": ("TS_HEADER_KEY_SEQUENCE_ID",),
    "ts_header_key_sequence_start": ("TS_HEADER_KEY_SEQUENCE_START",),
    "ts_header_key_sequence_end": ("TS_HEADER_KEY_SEQUENCE_END",),
    "models": (),
    "ts_open_inference_protocol": ("TS_OPEN_INFERENCE_PROTOCOL",),
    "install_py_dep_per_model": ("TS_INSTALL_PY_DEP_PER_MODEL",),
    "shutdown_grace_seconds": ("TS_SHUTDOWN_GRACE_SECONDS",),
    "worker_stop_grace_seconds": ("TS_WORKER_STOP_GRACE_SECONDS",),
    "key_file": ("TS_KEY_FILE",),
    "max_unpacked_archive_bytes": ("TS_MAX_UNPACKED_ARCHIVE_BYTES",),
    "max_workers_per_model": ("TS_MAX_WORKERS_PER_MODEL",),
    "serving_processes": ("TS_SERVING_PROCESSES",),
    "number_of_gpu": ("TS_NUMBER_OF_GPU",),
    "certificate_file": ("TS_CERTIFICATE_FILE",),
    "private_key_file": ("TS_PRIVATE_KEY_FILE",),
    "enable_grpc_ssl": ("TS_ENABLE_GRPC_SSL",),
    "oip_grpc_stream_shape": ("TS_OIP_GRPC_STREAM_SHAPE",),
    # what one request may expand to (trioserve.core.limits): max_request_inputs, ...
    **{name: (f"TS_{name.upper()}",) for name in LIMIT_SETTINGS},
}

#: TorchServe settings that trioserve accepts in a file and ignores.
TORCHSERVE_UNUSED_KEYS: Final = frozenset(
    {
        "async_logging",
        "cpp_log_config",
        "cpu_launcher_args",
        "cpu_launcher_enable",
        "debug",
        "disable_system_metrics",
        "grpc_inference_max_connection_age_grace_ms",
        "grpc_inference_max_connection_age_ms",
        "grpc_management_max_connection_age_grace_ms",
        "grpc_management_max_connection_age_ms",
        "initial_distribution_port",
        "initial_worker_port",
        "io_ratio",
        "ipex_enable",
        "ipex_gpu_enable",
        "keystore_pass",
        "keystore_type",
        "metric_time_interval",
        "metrics_config",
        "model_metrics_auto_detect",
        "model_server_home",
        "model_snapshot",
        "netty_client_threads",
        "number_of_netty_threads",
        "plugins_path",
        "prefer_direct_buffer",
        "snapshot_store",
        "system_metrics_cmd",
        "use_native_io",
        "vmargs",
        "workflow_store",
    }
)

#: TorchServe's Java keystore: trioserve reads PEM files (certificate_file, private_key_file)
#: only, and refuses to start rather than serve plaintext where TLS was asked for.
KEYSTORE_KEYS: Final = frozenset({"keystore"})

_ENV_REF = re.compile(r"\$\$([^$]+)\$\$")


def find_config_file(cli: CliOptions, env: Mapping[str, str], cwd: Path) -> Path | None:
    """Which config file to read: ``$TS_CONFIG_FILE``, else ``--ts-config``, else
    ``./config.properties`` if it exists, else none.

    Relative paths are taken from ``cwd``. A file named by the environment or the command
    line is returned whether or not it exists (:func:`load_config` reports it). TorchServe
    would also consider its latest config snapshot; trioserve writes no snapshots.
    """
    named = env.get("TS_CONFIG_FILE") or cli.ts_config
    if named:
        return cwd / named
    default = cwd / CONFIG_FILE_NAME
    return default if default.is_file() else None


def _check_tls(config: ServerConfig) -> None:
    """TLS asked for (an https address, enable_grpc_ssl) needs both PEM files."""
    wanting = [
        key
        for key, address in (
            ("inference_address", config.inference_address),
            ("management_address", config.management_address),
            ("metrics_address", config.metrics_address),
        )
        if address.is_tls
    ]
    if config.enable_grpc_ssl:
        wanting.append("enable_grpc_ssl")
    missing = [
        key for key in ("certificate_file", "private_key_file") if getattr(config, key) is None
    ]
    if wanting and missing:
        raise ConfigError(
            f"{', '.join(wanting)} asks for TLS, which needs {' and '.join(missing)} (PEM)"
        )


def _read_file(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(f"cannot read config file {path}: {reason}") from exc
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")  # what Java's Properties.load assumes


def _substitute(key: str, raw: RawValue, env: Mapping[str, str]) -> RawValue:
    def replace(match: re.Match[str]) -> str:
        name = match[1]
        if name not in env:
            raise bad_value(
                key,
                raw.value,
                f"refers to environment variable {name}, which is not set",
                raw.origin,
            )
        return env[name]

    return RawValue(_ENV_REF.sub(replace, raw.value), raw.origin)


def load_config(cli: CliOptions, env: Mapping[str, str], cwd: Path) -> ServerConfig:
    """Resolve the configuration from the config file, the command line and ``env``.

    Relative paths (config file, model store, key file) are taken from ``cwd``.
    Raises :class:`ConfigError` for anything malformed.
    """
    config_file = find_config_file(cli, env, cwd)
    file_values = parse_properties(_read_file(config_file)) if config_file else {}

    raw: dict[str, RawValue] = {}
    unknown: list[str] = []
    for key, value in file_values.items():
        if key in KEYSTORE_KEYS and value.strip():
            raise ConfigError(
                f"config key {key}: trioserve does not read Java keystores; give the "
                "certificate and its private key as PEM files with certificate_file and "
                "private_key_file (it refuses to start rather than serve plaintext)"
            )
        if key in _ENV_NAMES:
            raw[key] = _substitute(key, RawValue(value, f"in {config_file}"), env)
            continue
        unknown.append(key)
        if key in TORCHSERVE_UNUSED_KEYS:
            log.warning(
                "config key %s is a TorchServe setting that trioserve does not use; ignoring it",
                key,
            )
        else:
            log.warning("config key %r is not a known setting; ignoring it", key)

    # the command line
    if cli.model_store is not None:
        raw["model_store"] = RawValue(cli.model_store, "by --model-store")
    if cli.models is not None:
        raw["load_models"] = RawValue(",".join(cli.models), "by --models")
    if cli.disable_token_auth:
        raw["disable_token_authorization"] = RawValue("true", "by --disable-token-auth")
    if cli.enable_model_api:
        raw["enable_model_api"] = RawValue("true", "by --enable-model-api")
    if cli.enable_envvars_config:
        raw["enable_envvars_config"] = RawValue("true", "by --enable-envvars-config")
    if cli.serving_processes is not None:
        raw["serving_processes"] = RawValue(cli.serving_processes, "by --serving-processes")

    # the environment; the switches themselves only come from the file
    from_file = Values(raw)
    if from_file.boolean("enable_envvars_config", False):
        env_allowed_urls = from_file.boolean("use_env_allowed_urls", False)
        for key, names in _ENV_NAMES.items():
            if key == "allowed_urls" and not env_allowed_urls:
                continue
            for name in names:
                if name in env:
                    raw[key] = RawValue(env[name], f"by environment variable {name}")
                    break
    oip = env.get("TS_OPEN_INFERENCE_PROTOCOL", "")
    if oip:
        enabled = oip.strip().lower() in ("oip", "true")
        raw["ts_open_inference_protocol"] = RawValue(
            "true" if enabled else "false", "by environment variable TS_OPEN_INFERENCE_PROTOCOL"
        )

    v = Values(raw)
    config = ServerConfig(
        inference_address=v.address("inference_address", ServerConfig.inference_address, 80, 443),
        management_address=v.address(
            "management_address", ServerConfig.management_address, 8081, 8444
        ),
        metrics_address=v.address("metrics_address", ServerConfig.metrics_address, 8082, 8445),
        grpc_inference_address=v.host("grpc_inference_address"),
        grpc_inference_port=v.integer("grpc_inference_port", 7070, minimum=0, maximum=65535),
        grpc_management_address=v.host("grpc_management_address"),
        grpc_management_port=v.integer("grpc_management_port", 7071, minimum=0, maximum=65535),
        model_store=v.path("model_store", cwd, resolve=True),
        load_models=v.comma_list("load_models"),
        default_workers_per_model=v.integer("default_workers_per_model", 0, minimum=0),
        job_queue_size=v.integer("job_queue_size", 100, minimum=1),
        max_request_size=v.integer("max_request_size", 6553500, minimum=1),
        max_response_size=v.integer("max_response_size", ServerConfig.max_response_size, minimum=1),
        request_limits=RequestLimits(
            **{
                name: v.integer(name, default, minimum=1)
                for name, default in LIMIT_SETTINGS.items()
            }
        ),
        default_response_timeout=v.integer("default_response_timeout", 120, minimum=1),
        default_startup_timeout=v.integer("default_startup_timeout", 120, minimum=1),
        unregister_model_timeout=v.integer("unregister_model_timeout", 120, minimum=1),
        enable_envvars_config=v.boolean("enable_envvars_config", False),
        disable_token_authorization=v.boolean("disable_token_authorization", False),
        token_expiration_min=v.number("token_expiration_min", 60.0, minimum=0, positive=True),
        enable_model_api=v.boolean("enable_model_api", False),
        enable_metrics_api=v.boolean("enable_metrics_api", True),
        metrics_mode=v.metrics_mode(),
        allowed_urls=v.regex_list("allowed_urls"),
        decode_input_request=v.boolean("decode_input_request", True),
        limit_max_image_pixels=v.boolean("limit_max_image_pixels", True),
        blacklist_env_vars=v.regex("blacklist_env_vars"),
        default_service_handler=v.str_or_none("default_service_handler"),
        service_envelope=v.service_envelope(),
        cors_allowed_origin=v.str_or_none("cors_allowed_origin"),
        cors_allowed_methods=v.str_or_none("cors_allowed_methods"),
        cors_allowed_headers=v.str_or_none("cors_allowed_headers"),
        ts_header_key_sequence_id=v.header_name(
            "ts_header_key_sequence_id", "ts_request_sequence_id"
        ),
        ts_header_key_sequence_start=v.header_name(
            "ts_header_key_sequence_start", "ts_request_sequence_start"
        ),
        ts_header_key_sequence_end=v.header_name(
            "ts_header_key_sequence_end", "ts_request_sequence_end"
        ),
        models=v.models_json(),
        ts_open_inference_protocol=(
            None
            if "ts_open_inference_protocol" not in raw
            else v.boolean("ts_open_inference_protocol", False)
        ),
        install_py_dep_per_model=v.boolean("install_py_dep_per_model", False),
        shutdown_grace_seconds=v.number("shutdown_grace_seconds", 30.0, minimum=0, positive=False),
        worker_stop_grace_seconds=v.number(
            "worker_stop_grace_seconds", 5.0, minimum=0, positive=False
        ),
        key_file=v.path("key_file", cwd, resolve=False),
        max_unpacked_archive_bytes=v.integer("max_unpacked_archive_bytes", 4 << 30, minimum=1),
        oip_grpc_stream_shape=v.oip_grpc_stream_shape(),
        max_workers_per_model=v.integer("max_workers_per_model", 0, minimum=0),
        serving_processes=v.integer("serving_processes", 1, minimum=1, maximum=256),
        number_of_gpu=(
            None
            if v.str_or_none("number_of_gpu") is None
            else v.integer("number_of_gpu", 0, minimum=0)
        ),
        certificate_file=v.path("certificate_file", cwd, resolve=False),
        private_key_file=v.path("private_key_file", cwd, resolve=False),
        enable_grpc_ssl=v.boolean("enable_grpc_ssl", False),
        config_file=config_file,
        unknown_keys=tuple(unknown),
    )
    _check_tls(config)
    if cli.strict_config and unknown:
        raise ConfigError(
            f"--strict-config: {config_file} sets keys that trioserve does not use: "
            f"{', '.join(unknown)} (see docs/usage.md for the keys it reads)"
        )
    return config
