"""Typed, strictly checked readers over the merged raw strings of a configuration.

Booleans are ``true`` or ``false`` in any case; integers are plain decimal; numbers are
finite decimals; addresses and hosts are checked by :mod:`trioserve.config.addresses`. A bad
value raises :class:`ConfigError` naming the key, the value, what was expected and where
the value came from.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trioserve.config.addresses import LOOPBACK, Address, check_host, parse_address
from trioserve.config.errors import bad_value
from trioserve.config.settings import (
    METRICS_MODES,
    OIP_GRPC_STREAM_SHAPES,
    SERVICE_ENVELOPES,
    no_models,
)

__all__ = ["RawValue", "Values"]

_PLAIN_INT = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
# RFC 9110 token characters, for the configurable sequence header names
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


@dataclass(frozen=True)
class RawValue:
    """A setting as written, and where it came from (for error messages)."""

    value: str
    origin: str


class Values:
    """The merged raw strings and typed readers over them."""

    def __init__(self, raw: dict[str, RawValue]) -> None:
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
        raise bad_value(key, item.value, "is not a boolean: expected true or false", item.origin)

    def integer(self, key: str, default: int, *, minimum: int, maximum: int | None = None) -> int:
        item = self.raw.get(key)
        if item is None:
            return default
        value = item.value.strip()
        if _PLAIN_INT.fullmatch(value) is None:
            raise bad_value(key, item.value, "is not an integer", item.origin)
        number = int(value)
        if number < minimum:
            raise bad_value(
                key, item.value, f"is too small: expected at least {minimum}", item.origin
            )
        if maximum is not None and number > maximum:
            raise bad_value(
                key, item.value, f"is too large: expected at most {maximum}", item.origin
            )
        return number

    def number(self, key: str, default: float, *, minimum: float, positive: bool) -> float:
        item = self.raw.get(key)
        if item is None:
            return default
        value = item.value.strip()
        if _DECIMAL.fullmatch(value) is None:
            raise bad_value(key, item.value, "is not a number", item.origin)
        number = float(value)
        if not math.isfinite(number):
            raise bad_value(key, item.value, "is not a finite number", item.origin)
        if positive and number <= 0:
            raise bad_value(key, item.value, "is not a positive number", item.origin)
        if number < minimum:
            raise bad_value(
                key, item.value, f"is too small: expected at least {minimum}", item.origin
            )
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
            return LOOPBACK
        return check_host(item.value.strip(), key=key, value=item.value, origin=item.origin)

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
            raise bad_value(key, item.value, f"cannot be resolved: {exc}", item.origin) from exc

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
                raise bad_value(
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
                raise bad_value(
                    key, pattern, f"is not a valid regular expression: {exc}", item.origin
                ) from exc
        return patterns

    def header_name(self, key: str, default: str) -> str:
        value = self.text(key, default)
        if _HEADER_NAME.fullmatch(value) is None:
            item = self.raw[key]
            raise bad_value(key, item.value, "is not a valid HTTP header name", item.origin)
        return value

    def metrics_mode(self) -> str:
        key = "metrics_mode"
        item = self.raw.get(key)
        if item is None:
            return "prometheus"
        value = item.value.strip().lower()
        if value not in METRICS_MODES:
            raise bad_value(
                key,
                item.value,
                "is not a metrics mode: expected log, prometheus or legacy",
                item.origin,
            )
        return value

    def service_envelope(self) -> str | None:
        key = "service_envelope"
        item = self.raw.get(key)
        value = self.str_or_none(key)
        if item is None or value is None:
            return None
        if value not in SERVICE_ENVELOPES:
            raise bad_value(
                key, item.value, f"is not an envelope: expected {', '.join(SERVICE_ENVELOPES)}",
                item.origin,
            )  # fmt: skip
        return value

    def oip_grpc_stream_shape(self) -> str:
        key = "oip_grpc_stream_shape"
        item = self.raw.get(key)
        if item is None:
            return "mlserver"
        value = item.value.strip().lower()
        if value not in OIP_GRPC_STREAM_SHAPES:
            raise bad_value(
                key,
                item.value,
                "is not a ModelStreamInfer response shape: expected mlserver or triton",
                item.origin,
            )
        return value

    def models_json(self) -> Mapping[str, Any]:
        key = "models"
        item = self.raw.get(key)
        if item is None or not item.value.strip():
            return no_models()
        try:
            parsed = json.loads(item.value)
        except ValueError as exc:
            raise bad_value(key, item.value, f"is not valid JSON: {exc}", item.origin) from exc
        expected = "is not a JSON object of the form {name: {version: {setting: value}}}"
        if not isinstance(parsed, dict):
            raise bad_value(key, item.value, expected, item.origin)
        for versions in parsed.values():
            if not isinstance(versions, dict) or not all(
                isinstance(settings, dict) for settings in versions.values()
            ):
                raise bad_value(key, item.value, expected, item.origin)
        return parsed
