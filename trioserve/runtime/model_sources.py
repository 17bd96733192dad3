"""Where models come from: ``load_models`` entries, the model store's folders, archive
errors as serving errors, and the files an extracted archive leaves behind."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from trioserve import archive
from trioserve.core import errors
from trioserve.core.model_settings import ModelSettings

# The archive package reports refusals with the HTTP status its CLI and docs name.
_ARCHIVE_KINDS = {
    400: errors.ErrorKind.BAD_INPUT,
    404: errors.ErrorKind.NOT_FOUND,
    409: errors.ErrorKind.CONFLICT,
    413: errors.ErrorKind.TOO_LARGE,
}


def archive_error(exc: archive.ArchiveError) -> errors.ServeError:
    kind = _ARCHIVE_KINDS.get(exc.status, errors.ErrorKind.INTERNAL)
    missing = kind is errors.ErrorKind.NOT_FOUND
    reason = "ModelNotFoundException" if missing else "BadRequestException"
    return errors.ServeError(kind, str(exc), reason=reason)


def model_stem(path: Path) -> str:
    name = path.name
    for suffix in (".mar", ".tar.gz", ".tgz"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def mlserver_settings(
    settings: ModelSettings, loaded: archive.LoadedArchive
) -> dict[str, Any] | None:
    """An MLServer model's ``model-settings.json`` as its worker gets it: the registered
    name and version win over the file's."""
    if loaded.mlserver is None:
        return None
    raw = dict(loaded.mlserver.raw)
    raw["name"] = settings.name
    parameters = raw.get("parameters")
    raw["parameters"] = {**(parameters if isinstance(parameters, dict) else {}),
                         "version": settings.version}  # fmt: skip
    return raw


def remove_extracted(loaded: archive.LoadedArchive) -> None:
    if loaded.extracted:
        shutil.rmtree(loaded.model_dir, ignore_errors=True)


ARCHIVE_SUFFIXES = (".mar", ".tar.gz", ".tgz")


def expand_load_models(
    entries: tuple[str, ...], model_store: Path | None
) -> list[tuple[str | None, str]]:
    """``load_models`` entries as (name override, url) pairs; ``all`` = everything in the store."""
    result: list[tuple[str | None, str]] = []
    for raw in entries:
        for entry in (e.strip() for e in raw.split(",")):
            if not entry:
                continue
            if entry == "all":
                if model_store is not None and model_store.is_dir():
                    for path in sorted(model_store.iterdir()):
                        if path.name.endswith(ARCHIVE_SUFFIXES) or is_model_folder(path):
                            result.append((None, path.name))
                continue
            name, sep, url = entry.partition("=")
            result.append((name.strip(), url.strip()) if sep else (None, entry))
    return result


def is_model_folder(path: Path) -> bool:
    """A folder of the store that is a model: an unpacked archive (its manifest) or an
    MLServer model (``model-settings.json``)."""
    return path.is_dir() and (
        (path / "MAR-INF" / "MANIFEST.json").is_file() or (path / "model-settings.json").is_file()
    )


__all__ = [
    "ARCHIVE_SUFFIXES",
    "archive_error",
    "expand_load_models",
    "is_model_folder",
    "mlserver_settings",
    "model_stem",
    "remove_extracted",
]
