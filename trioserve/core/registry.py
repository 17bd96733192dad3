"""Model names, versions and default versions (sans-IO).

A :class:`Registry` maps ``name -> version -> entry`` and keeps one default version per
name. It knows TorchServe's rules (the first registered version is the default; the default
cannot be removed while other versions exist) and raises the matching :class:`ServeError`.
What an entry is (a running model version) is the caller's business.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

from trioserve.core.errors import (
    ErrorKind,
    ServeError,
    excerpt,
    model_not_found,
    version_not_found,
)

T = TypeVar("T")


def version_key(version: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key for versions: numeric parts numerically, others as text."""
    parts: list[tuple[int, int | str]] = []
    for piece in version.replace("-", ".").split("."):
        parts.append((0, int(piece)) if piece.isdigit() else (1, piece))
    return tuple(parts)


class Registry(Generic[T]):
    def __init__(self) -> None:
        self._models: dict[str, dict[str, T]] = {}
        self._default: dict[str, str] = {}

    def add(self, name: str, version: str, entry: T) -> None:
        versions = self._models.setdefault(name, {})
        if version in versions:
            raise ServeError(
                ErrorKind.CONFLICT,
                f"Model version {version} is already registered for model {name}",
            )
        versions[version] = entry
        self._default.setdefault(name, version)

    def get(self, name: str, version: str | None = None) -> T:
        versions = self._models.get(name)
        if not versions:
            raise model_not_found(name)
        if version is None or version == "":
            return versions[self._default[name]]
        if version not in versions:
            raise version_not_found(name, version)
        return versions[version]

    def default_version(self, name: str) -> str:
        if name not in self._default:
            raise model_not_found(name)
        return self._default[name]

    def versions(self, name: str) -> list[tuple[str, T]]:
        versions = self._models.get(name)
        if not versions:
            raise model_not_found(name)
        return sorted(versions.items(), key=lambda kv: version_key(kv[0]))

    def set_default(self, name: str, version: str) -> None:
        versions = self._models.get(name)
        if not versions:
            raise model_not_found(name)
        if version not in versions:
            raise ServeError(
                ErrorKind.NOT_FOUND,
                f"Model version {excerpt(version)} does not exist for model {name}",
                reason="ModelVersionNotFoundException",
            )
        self._default[name] = version

    def check_removable(self, name: str, version: str | None) -> str:
        """The version that :meth:`remove` would remove; raises if it may not be removed."""
        versions = self._models.get(name)
        if not versions:
            raise model_not_found(name)
        default = self._default[name]
        target = default if version is None or version == "" else version
        if target not in versions:
            raise version_not_found(name, target)
        if target == default and len(versions) > 1:
            raise ServeError(
                ErrorKind.FORBIDDEN,
                f"Cannot remove default version for model {name}",
                reason="InvalidModelVersionException",
            )
        return target

    def remove(self, name: str, version: str | None = None) -> T:
        target = self.check_removable(name, version)
        versions = self._models[name]
        entry = versions.pop(target)
        if not versions:
            del self._models[name]
            del self._default[name]
        return entry

    def names(self) -> list[str]:
        return sorted(self._models)

    def __iter__(self) -> Iterator[tuple[str, str, T]]:
        for name in sorted(self._models):
            for version, entry in self.versions(name):
                yield name, version, entry

    def __len__(self) -> int:
        return sum(len(v) for v in self._models.values())
