"""Listener addresses: the :class:`Address` type and parsing ``inference_address`` and the
other address keys.

Addresses are ``http://host[:port]``, ``https://host[:port]`` (IPv6 hosts in brackets) or
``unix:/absolute/path``; the scheme is case-insensitive. The caller gives the default ports
for a missing one (TorchServe's: 80 / 443 for inference, 8081 / 8444 for management, 8082 /
8445 for metrics). Host names and IP literals are checked, so nothing odd reaches a bind.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Final

from trioserve.config.errors import bad_value

__all__ = ["LOOPBACK", "Address", "check_host", "parse_address"]

#: where every listener binds unless the configuration says otherwise
LOOPBACK: Final = "127.0.0.1"


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


def check_host(host: str, *, key: str, value: str, origin: str) -> str:
    """Validate a host name or IP literal; returns it without IPv6 brackets.

    ``key``, ``value`` and ``origin`` only go into the :class:`ConfigError` it raises.
    """
    if host.startswith("[") and host.endswith("]"):
        inner = host[1:-1]
        try:
            ipaddress.IPv6Address(inner)
        except ValueError:
            raise bad_value(
                key, value, "is not a valid address: bad IPv6 literal", origin
            ) from None
        return inner
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            pass
        else:
            return host
    if _HOSTNAME.fullmatch(host) is None:
        raise bad_value(
            key, value, "is not a valid address: expected a host name or IP address", origin
        )
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
            raise bad_value(
                key, text, "is not a valid address: a unix socket path must be absolute", origin
            )
        return Address("unix", "", 0, path)
    m = _TCP_ADDRESS.fullmatch(value)
    if m is None:
        raise bad_value(
            key,
            text,
            "is not a valid address: expected http://host[:port], https://host[:port] "
            "or unix:/path",
            origin,
        )
    scheme = m["scheme"].lower()
    if scheme not in ("http", "https"):
        raise bad_value(
            key, text, "is not a valid address: the scheme must be http, https or unix", origin
        )
    host = check_host(m["host"], key=key, value=text, origin=origin)
    if m["port"] is None:
        port = default_https_port if scheme == "https" else default_http_port
    else:
        if not m["port"].isascii() or not m["port"].isdigit():
            raise bad_value(key, text, "is not a valid address: the port is not a number", origin)
        port = int(m["port"])
        if port > 65535:
            raise bad_value(key, text, "is not a valid address: the port is above 65535", origin)
    return Address(scheme, host, port)
