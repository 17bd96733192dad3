"""The one error type of configuration loading, and how messages about a value read."""

from __future__ import annotations

__all__ = ["ConfigError", "bad_value"]


class ConfigError(Exception):
    """A configuration value, file or reference that cannot be used.

    ``key`` and ``value`` name the offending setting when there is one.
    """

    def __init__(self, message: str, *, key: str | None = None, value: str | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.value = value


def bad_value(key: str, value: str, problem: str, origin: str = "") -> ConfigError:
    """A :class:`ConfigError` naming the key, the value (shortened), what is wrong and where
    the value came from (``origin``, e.g. ``in /etc/config.properties``)."""
    where = f" (set {origin})" if origin else ""
    shown = value if len(value) <= 200 else value[:200] + "..."
    return ConfigError(f"config key {key}: {shown!r} {problem}{where}", key=key, value=value)
