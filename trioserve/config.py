"""Server configuration: ``config.properties``, command line and environment.

trioserve reads the same ``config.properties`` files as TorchServe and resolves them the
same way, with trioserve's safer defaults (see ``docs/compat.md``):

* every HTTP and gRPC listener binds ``127.0.0.1``;
* ``metrics_mode`` defaults to ``prometheus``, so ``/metrics`` has content out of the box;
* ``allowed_urls`` defaults to *nothing but files inside the model store* (an empty tuple
  here); fetching archives over http(s) needs an explicit list of regexes;
* token authorization is on and the model API (register / unregister) is off.

Where a value comes from, highest priority first:

1. the environment, as ``TS_<NAME>`` -- only when the config file itself says
   ``enable_envvars_config=true`` (the flag is never read from the environment). The
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

Values are checked strictly and a bad one raises :class:`ConfigError` naming the key, the
value, what was expected and where the value came from. Booleans are ``true`` or
``false`` in any case; integers are plain decimal; addresses are ``http://host[:port]``,
``https://host[:port]`` (IPv6 hosts in brackets) or ``unix:/absolute/path``. Without a
port, the inference address uses 80 / 443, the management address 8081 / 8444 and the
metrics address 8082 / 8445 (http / https), as in TorchServe.

Keys TorchServe defines but trioserve does not use (thread counts, GPU count, worker
ports, TLS key stores, JVM and Intel launcher options, per-model pip installs, snapshots,
workflow store, metric collector settings, ...) and keys nobody knows are ignored with
one warning each and listed in :attr:`ServerConfig.unknown_keys`, so existing TorchServe
config files keep loading.

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
"""

from __future__ import annotations

import ipaddress
import json
import logging
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

__all__ = [
    "Address",
    "CliOptions",
    "ConfigError",
    "ServerConfig",
    "find_config_file",
    "load_config",
    "parse_address",
    "parse_properties",
]

log = logging.getLogger(__name__)

CONFIG_FILE_NAME: Final = "config.properties"
METRICS_MODES: Final = ("log", "prometheus", "legacy")


class ConfigError(Exception):
    """A configuration value, file or reference that cannot be used.

    ``key`` and ``value`` name the offending setting when there is one.
    """

    def __init__(self, message: str, *, key: str | None = None, value: str | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.value = value


# --------------------------------------------------------------------------------------
# Addresses


@dataclass(frozen=True)
class Address:
    """A listener address: TCP (``http`` / ``https``) or a Unix socket (``unix``)."""

    scheme: str
    host: str
    port: int
    path: str | None = None

    @property
    def is_unix(self) -> bool:
        return self.scheme == "unix"

    @property
    def is_tls(self) -> bool:
        return self.scheme == "https"

    def url(self) -> str:
        """The address written back the way the config file spells it."""
        if self.scheme == "unix":
            return f"unix:{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    def __str__(self) -> str:
        return self.url()


_TCP_ADDRESS = re.compile(
    r"(?P<scheme>[A-Za-z]+)://(?P<host>\[[^\]]*\]|[^:/\[\]]*)(?::(?P<port>[^/]*))?",
)
_HOSTNAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?\.?")
_PLAIN_INT = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _check_host(host: str, *, key: str, value: str, origin: str) -> str:
    """Validate a host name or IP literal; returns it without IPv6 brackets."""
    if host.startswith("[") and host.endswith("]"):
        inner = host[1:-1]
        try:
            ipaddress.IPv6Address(inner)
        except ValueError:
            raise _bad(key, value, "is not a valid address: bad IPv6 literal", origin) from None
        return inner
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            pass
        else:
            return host
    if _HOSTNAME.fullmatch(host) is None:
        raise _bad(key, value, "is not a valid address: expected a host name or IP address", origin)
    return host


def parse_address(
    text: str,
    *,
    key: str = "address",
    default_http_port: int = 80,
    default_https_port: int = 443,
    origin: str = "",
) -> Address:
    """Parse ``http(s)://host[:port]`` or ``unix:/path`` (scheme case-insensitive)."""
    value = text.strip()
    if value[:5].lower() == "unix:":
        path = value[5:]
        if not path.startswith("/"):
            raise _bad(
                key, text, "is not a valid address: a unix socket path must be absolute", origin
            )
        return Address("unix", "", 0, path)
    m = _TCP_ADDRESS.fullmatch(value)
    if m is None:
        raise _bad(
            key,
            text,
            "is not a valid address: expected http://host[:port], https://host[:port] "
            "or unix:/path",
            origin,
        )
    scheme = m["scheme"].lower()
    if scheme not in ("http", "https"):
        raise _bad(
            key, text, "is not a valid address: the scheme must be http, https or unix", origin
        )
    host = _check_host(m["host"], key=key, value=text, origin=origin)
    if m["port"] is None:
        port = default_https_port if scheme == "https" else default_http_port
    else:
        if not m["port"].isascii() or not m["port"].isdigit():
            raise _bad(key, text, "is not a valid address: the port is not a number", origin)
        port = int(m["port"])
        if port > 65535:
            raise _bad(key, text, "is not a valid address: the port is above 65535", origin)
    return Address(scheme, host, port)


# --------------------------------------------------------------------------------------
# Java .properties


_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_WS: Final = " \t\f"
_HEX: Final = frozenset("0123456789abcdefABCDEF")
_SIMPLE_ESCAPES: Final = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """Yield (first line number, logical line) with comments and blank lines dropped."""
    lines = _LINE_BREAK.split(text)
    i = 0
    while i < len(lines):
        lineno = i + 1
        line = lines[i].lstrip(_WS)
        i += 1
        if not line or line[0] in "#!":
            continue
        parts: list[str] = []
        while True:
            backslashes = len(line) - len(line.rstrip("\\"))
            if backslashes % 2 == 0:
                parts.append(line)
                break
            parts.append(line[:-1])
            if i >= len(lines):
                break
            line = lines[i].lstrip(_WS)
            i += 1
        yield lineno, "".join(parts)


def _unescape(raw: str, lineno: int, *, trim_end: bool) -> str:
    out: list[str] = []
    significant = 0  # length of `out` up to the last non-blank or escaped character
    i = 0
    n = len(raw)
    while i < n:
        c = raw[i]
        i += 1
        if c != "\\":
            out.append(c)
            if c not in _WS:
                significant = len(out)
            continue
        if i >= n:
            break  # a lone trailing backslash is dropped, as Java does
        c = raw[i]
        i += 1
        if c == "u":
            digits = raw[i : i + 4]
            if len(digits) != 4 or not _HEX.issuperset(digits):
                raise ConfigError(
                    f"config file line {lineno}: malformed \\uXXXX escape {raw[i - 2 : i + 4]!r}"
                )
            out.append(chr(int(digits, 16)))
            i += 4
        else:
            out.append(_SIMPLE_ESCAPES.get(c, c))
        significant = len(out)
    if trim_end:
        del out[significant:]
    text = "".join(out)
    if any("\ud800" <= ch <= "\udfff" for ch in text):
        # \uD83D\uDE00 style pairs become one character; lone halves stay as they are
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    return text


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java ``.properties`` text into a dict (a later duplicate key wins).

    Handles ``#`` / ``!`` comment lines, ``key=value``, ``key:value`` and ``key value``,
    backslash line continuation (leading blanks of the next line are dropped), the
    escapes ``\\t \\n \\r \\f \\uXXXX`` and ``\\<any char>`` (e.g. ``\\\\``, ``\\=``,
    ``\\ ``), and ``\\n``, ``\\r\\n`` or ``\\r`` line ends. Unlike Java, unescaped
    blanks at the end of a value are removed too. A malformed ``\\u`` escape raises
    :class:`ConfigError`.
    """
    result: dict[str, str] = {}
    for lineno, line in _logical_lines(text):
        n = len(line)
        i = 0
        while i < n:
            c = line[i]
            if c == "\\":
                i += 2
                continue
            if c in "=:" or c in _WS:
                break
            i += 1
        key_end = min(i, n)
        j = key_end
        while j < n and line[j] in _WS:
            j += 1
        if j < n and line[j] in "=:":
            j += 1
        while j < n and line[j] in _WS:
            j += 1
        key = _unescape(line[:key_end], lineno, trim_end=False)
        result[key] = _unescape(line[j:], lineno, trim_end=True)
    return result


# --------------------------------------------------------------------------------------
# The configuration


@dataclass(frozen=True)
class CliOptions:
    """What the command line said; ``None`` / ``False`` mean "not given"."""

    ts_config: str | None = None
    model_store: str | None = None
    models: tuple[str, ...] | None = None
    ncs: bool = False
    disable_token_auth: bool = False
    enable_model_api: bool = False
    foreground: bool = False


_LOOPBACK: Final = "127.0.0.1"


def _no_models() -> Mapping[str, Any]:
    return {}


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """The resolved configuration. ``ServerConfig()`` is the all-defaults configuration."""

    inference_address: Address = Address("http", _LOOPBACK, 8080)
    management_address: Address = Address("http", _LOOPBACK, 8081)
    metrics_address: Address = Address("http", _LOOPBACK, 8082)
    grpc_inference_address: str = _LOOPBACK
    grpc_inference_port: int = 7070
    grpc_management_address: str = _LOOPBACK
    grpc_management_port: int = 7071
    model_store: Path | None = None
    #: raw entries: () for none, ("all",), or ("a.mar", "name=b.mar", ...)
    load_models: tuple[str, ...] = ()
    #: 0 means "one per CPU" for models loaded at startup (the server resolves it)
    default_workers_per_model: int = 0
    job_queue_size: int = 100
    max_request_size: int = 6553500
    max_response_size: int = 6553500
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
    models: Mapping[str, Any] = field(default_factory=_no_models, hash=False)
    ts_open_inference_protocol: bool = False
    # trioserve-only
    shutdown_grace_seconds: float = 30.0
    max_workers_per_model: int = 0
    worker_stop_grace_seconds: float = 5.0
    key_file: Path | None = None
    max_unpacked_archive_bytes: int = 4 << 30
    # provenance
    config_file: Path | None = None
    unknown_keys: tuple[str, ...] = ()


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
    "shutdown_grace_seconds": ("TS_SHUTDOWN_GRACE_SECONDS",),
    "worker_stop_grace_seconds": ("TS_WORKER_STOP_GRACE_SECONDS",),
    "key_file": ("TS_KEY_FILE",),
    "max_unpacked_archive_bytes": ("TS_MAX_UNPACKED_ARCHIVE_BYTES",),
    "max_workers_per_model": ("TS_MAX_WORKERS_PER_MODEL",),
}

#: TorchServe settings that trioserve accepts in a file and ignores.
TORCHSERVE_UNUSED_KEYS: Final = frozenset(
    {
        "async_logging",
        "certificate_file",
        "cpp_log_config",
        "cpu_launcher_args",
        "cpu_launcher_enable",
        "debug",
        "disable_system_metrics",
        "enable_grpc_ssl",
        "grpc_inference_max_connection_age_grace_ms",
        "grpc_inference_max_connection_age_ms",
        "grpc_management_max_connection_age_grace_ms",
        "grpc_management_max_connection_age_ms",
        "initial_distribution_port",
        "initial_worker_port",
        "install_py_dep_per_model",
        "io_ratio",
        "ipex_enable",
        "ipex_gpu_enable",
        "keystore",
        "keystore_pass",
        "keystore_type",
        "metric_time_interval",
        "metrics_config",
        "model_metrics_auto_detect",
        "model_server_home",
        "model_snapshot",
        "netty_client_threads",
        "number_of_gpu",
        "number_of_netty_threads",
        "plugins_path",
        "prefer_direct_buffer",
        "private_key_file",
        "snapshot_store",
        "system_metrics_cmd",
        "use_native_io",
        "vmargs",
        "workflow_store",
    }
)

_ENV_REF = re.compile(r"\$\$([^$]+)\$\$")
# RFC 9110 token characters, for the configurable sequence header names
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def _bad(key: str, value: str, problem: str, origin: str = "") -> ConfigError:
    where = f" (set {origin})" if origin else ""
    shown = value if len(value) <= 200 else value[:200] + "..."
    return ConfigError(f"config key {key}: {shown!r} {problem}{where}", key=key, value=value)


@dataclass(frozen=True)
class _Raw:
    value: str
    origin: str


class _Values:
    """The merged raw strings and typed readers over them."""

    def __init__(self, raw: dict[str, _Raw]) -> None:
        self.raw = raw

    def str_or_none(self, key: str) -> str | None:
        item = self.raw.get(key)
        if item is None:
            return None
        value = item.value.strip()
        return value or None

    def text(self, key: str, default: str) -> str:
        value = self.str_or_none(key)
        return default if value is None else value

    def boolean(self, key: str, default: bool) -> bool:
        item = self.raw.get(key)
        if item is None:
            return default
        value = item.value.strip().lower()
        if value == "true":
            return True
        if value == "false":
            return False
        raise _bad(key, item.value, "is not a boolean: expected true or false", item.origin)

    def integer(self, key: str, default: int, *, minimum: int, maximum: int | None = None) -> int:
        item = self.raw.get(key)
        if item is None:
            return default
        value = item.value.strip()
        if _PLAIN_INT.fullmatch(value) is None:
            raise _bad(key, item.value, "is not an integer", item.origin)
        number = int(value)
        if number < minimum:
            raise _bad(key, item.value, f"is too small: expected at least {minimum}", item.origin)
        if maximum is not None and number > maximum:
            raise _bad(key, item.value, f"is too large: expected at most {maximum}", item.origin)
        return number

    def number(self, key: str, default: float, *, minimum: float, positive: bool) -> float:
        item = self.raw.get(key)
        if item is None:
            return default
        value = item.value.strip()
        if _DECIMAL.fullmatch(value) is None:
            raise _bad(key, item.value, "is not a number", item.origin)
        number = float(value)
        if not math.isfinite(number):
            raise _bad(key, item.value, "is not a finite number", item.origin)
        if positive and number <= 0:
            raise _bad(key, item.value, "is not a positive number", item.origin)
        if number < minimum:
            raise _bad(key, item.value, f"is too small: expected at least {minimum}", item.origin)
        return number

    def address(self, key: str, default: Address, http_port: int, https_port: int) -> Address:
        item = self.raw.get(key)
        if item is None:
            return default
        return parse_address(
            item.value,
            key=key,
            default_http_port=http_port,
            default_https_port=https_port,
            origin=item.origin,
        )

    def host(self, key: str) -> str:
        item = self.raw.get(key)
        if item is None:
            return _LOOPBACK
        return _check_host(item.value.strip(), key=key, value=item.value, origin=item.origin)

    def path(self, key: str, cwd: Path, *, resolve: bool) -> Path | None:
        value = self.str_or_none(key)
        if value is None:
            return None
        path = cwd / value
        if not resolve:
            return path
        try:
            return path.resolve()
        except (OSError, RuntimeError) as exc:
            item = self.raw[key]
            raise _bad(key, item.value, f"cannot be resolved: {exc}", item.origin) from exc

    def comma_list(self, key: str) -> tuple[str, ...]:
        item = self.raw.get(key)
        if item is None:
            return ()
        return tuple(p for p in (part.strip() for part in item.value.split(",")) if p)

    def regex(self, key: str) -> str | None:
        value = self.str_or_none(key)
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                item = self.raw[key]
                raise _bad(
                    key, item.value, f"is not a valid regular expression: {exc}", item.origin
                ) from exc
        return value

    def regex_list(self, key: str) -> tuple[str, ...]:
        patterns = self.comma_list(key)
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                item = self.raw[key]
                raise _bad(
                    key, pattern, f"is not a valid regular expression: {exc}", item.origin
                ) from exc
        return patterns

    def header_name(self, key: str, default: str) -> str:
        value = self.text(key, default)
        if _HEADER_NAME.fullmatch(value) is None:
            item = self.raw[key]
            raise _bad(key, item.value, "is not a valid HTTP header name", item.origin)
        return value

    def metrics_mode(self) -> str:
        key = "metrics_mode"
        item = self.raw.get(key)
        if item is None:
            return "prometheus"
        value = item.value.strip().lower()
        if value not in METRICS_MODES:
            raise _bad(
                key,
                item.value,
                "is not a metrics mode: expected log, prometheus or legacy",
                item.origin,
            )
        return value

    def models_json(self) -> Mapping[str, Any]:
        key = "models"
        item = self.raw.get(key)
        if item is None or not item.value.strip():
            return _no_models()
        try:
            parsed = json.loads(item.value)
        except ValueError as exc:
            raise _bad(key, item.value, f"is not valid JSON: {exc}", item.origin) from exc
        expected = "is not a JSON object of the form {name: {version: {setting: value}}}"
        if not isinstance(parsed, dict):
            raise _bad(key, item.value, expected, item.origin)
        for versions in parsed.values():
            if not isinstance(versions, dict) or not all(
                isinstance(settings, dict) for settings in versions.values()
            ):
                raise _bad(key, item.value, expected, item.origin)
        return parsed


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


def _substitute(key: str, raw: _Raw, env: Mapping[str, str]) -> _Raw:
    def replace(match: re.Match[str]) -> str:
        name = match[1]
        if name not in env:
            raise _bad(
                key,
                raw.value,
                f"refers to environment variable {name}, which is not set",
                raw.origin,
            )
        return env[name]

    return _Raw(_ENV_REF.sub(replace, raw.value), raw.origin)


def load_config(cli: CliOptions, env: Mapping[str, str], cwd: Path) -> ServerConfig:
    """Resolve the configuration from the config file, the command line and ``env``.

    Relative paths (config file, model store, key file) are taken from ``cwd``.
    Raises :class:`ConfigError` for anything malformed.
    """
    config_file = find_config_file(cli, env, cwd)
    file_values = parse_properties(_read_file(config_file)) if config_file else {}

    raw: dict[str, _Raw] = {}
    unknown: list[str] = []
    for key, value in file_values.items():
        if key in _ENV_NAMES:
            raw[key] = _substitute(key, _Raw(value, f"in {config_file}"), env)
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
        raw["model_store"] = _Raw(cli.model_store, "by --model-store")
    if cli.models is not None:
        raw["load_models"] = _Raw(",".join(cli.models), "by --models")
    if cli.disable_token_auth:
        raw["disable_token_authorization"] = _Raw("true", "by --disable-token-auth")
    if cli.enable_model_api:
        raw["enable_model_api"] = _Raw("true", "by --enable-model-api")

    # the environment; the switches themselves only come from the file
    from_file = _Values(raw)
    if from_file.boolean("enable_envvars_config", False):
        env_allowed_urls = from_file.boolean("use_env_allowed_urls", False)
        for key, names in _ENV_NAMES.items():
            if key == "allowed_urls" and not env_allowed_urls:
                continue
            for name in names:
                if name in env:
                    raw[key] = _Raw(env[name], f"by environment variable {name}")
                    break
    oip = env.get("TS_OPEN_INFERENCE_PROTOCOL", "")
    if oip:
        enabled = oip.strip().lower() in ("oip", "true")
        raw["ts_open_inference_protocol"] = _Raw(
            "true" if enabled else "false", "by environment variable TS_OPEN_INFERENCE_PROTOCOL"
        )

    v = _Values(raw)
    return ServerConfig(
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
        max_response_size=v.integer("max_response_size", 6553500, minimum=1),
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
        service_envelope=v.str_or_none("service_envelope"),
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
        ts_open_inference_protocol=v.boolean("ts_open_inference_protocol", False),
        shutdown_grace_seconds=v.number("shutdown_grace_seconds", 30.0, minimum=0, positive=False),
        worker_stop_grace_seconds=v.number(
            "worker_stop_grace_seconds", 5.0, minimum=0, positive=False
        ),
        key_file=v.path("key_file", cwd, resolve=False),
        max_unpacked_archive_bytes=v.integer("max_unpacked_archive_bytes", 4 << 30, minimum=1),
        max_workers_per_model=v.integer("max_workers_per_model", 0, minimum=0),
        config_file=config_file,
        unknown_keys=tuple(unknown),
    )
