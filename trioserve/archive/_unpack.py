"""Turning a model in the store (``.mar``, ``.tar.gz`` or directory) into a model directory."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ._entries import Limits
from ._errors import ArchiveError
from ._manifest import MANIFEST_PATH, Manifest, parse_manifest
from ._model_config import ModelConfig, parse_model_config
from ._model_settings import MODEL_SETTINGS_PATH, MlserverSettings, parse_model_settings
from ._tar import extract_tar
from ._zip import extract_zip

_MAX_METADATA_BYTES: Final = 4 << 20
_EXTRACTORS: Final[dict[str, Callable[[Path, Path, Limits], None]]] = {
    ".mar": extract_zip,
    ".tar.gz": extract_tar,
    ".tgz": extract_tar,
}


@dataclass(frozen=True)
class LoadedArchive:
    """A model ready to load: its directory, manifest and model-config.yaml settings.

    ``extracted`` is True when ``model_dir`` is a fresh extraction that belongs to the
    caller, who deletes it when the model is unloaded; a directory model is used in place
    and ``extracted`` is False. ``mlserver`` holds the settings of an MLServer model (no
    manifest, a ``model-settings.json``), whose manifest and config are derived from them.
    """

    source: Path
    model_dir: Path
    manifest: Manifest
    config: ModelConfig
    extracted: bool
    mlserver: MlserverSettings | None = None


def unpack_archive(
    source: Path,
    work_root: Path,
    *,
    max_unpacked_bytes: int = 4 << 30,
    max_entries: int = 100_000,
) -> LoadedArchive:
    """Prepare the model at ``source`` for loading.

    A ``.mar`` (zip) or ``.tar.gz`` / ``.tgz`` is extracted into a new folder
    ``work_root/<uuid4 hex>/``; a single top folder in a tar archive is stripped. A
    directory is used in place. Every entry is checked (no absolute names, no ``..``, no
    links or special files, at most ``max_entries`` entries and ``max_unpacked_bytes``
    bytes, both as declared and as actually written) and on any failure the partial
    folder is removed before :class:`ArchiveError` is raised.

    A missing ``MAR-INF/MANIFEST.json`` gives an empty :class:`Manifest`. The manifest's
    ``configFile``, when set, is read from the model directory.
    """
    if source.is_dir():
        model_dir = source.resolve()
        return _loaded(source, model_dir, extracted=False)
    if not source.is_file():
        raise ArchiveError(404, f"Model not found at: {source}")
    extract = _extractor_for(source)

    try:
        work_root.mkdir(parents=True, exist_ok=True)
        model_dir = work_root.resolve() / uuid.uuid4().hex
        model_dir.mkdir()
    except OSError as exc:
        raise ArchiveError(500, f"cannot create a folder in {work_root}: {exc}") from exc
    try:
        try:
            extract(source, model_dir, Limits(max_unpacked_bytes, max_entries))
            return _loaded(source, model_dir, extracted=True)
        except OSError as exc:
            raise ArchiveError(500, f"cannot unpack {source.name}: {exc}") from exc
    except BaseException:
        shutil.rmtree(model_dir, ignore_errors=True)
        raise


def _loaded(source: Path, model_dir: Path, *, extracted: bool) -> LoadedArchive:
    """The model in ``model_dir``: a TorchServe model (manifest, or none at all) or, with no
    manifest and a ``model-settings.json``, an MLServer model."""
    if _read_inside(model_dir, MANIFEST_PATH, "manifest") is None:
        data = _read_inside(model_dir, MODEL_SETTINGS_PATH, MODEL_SETTINGS_PATH)
        if data is not None:
            settings = parse_model_settings(data)
            return LoadedArchive(
                source, model_dir, settings.manifest(), settings.model_config(), extracted,
                settings,
            )  # fmt: skip
    manifest, config = _read_metadata(model_dir)
    return LoadedArchive(source, model_dir, manifest, config, extracted)


def _extractor_for(source: Path) -> Callable[[Path, Path, Limits], None]:
    name = source.name.lower()
    for suffix, extract in _EXTRACTORS.items():
        if name.endswith(suffix):
            return extract
    raise ArchiveError(
        400,
        f"{source.name} is not a model archive: expected a .mar, .tar.gz or .tgz file "
        "or a directory",
    )


def _read_metadata(model_dir: Path) -> tuple[Manifest, ModelConfig]:
    data = _read_inside(model_dir, MANIFEST_PATH, "manifest")
    manifest = Manifest() if data is None else parse_manifest(data)
    if manifest.config_file is None:
        return manifest, ModelConfig()
    text = _read_inside(model_dir, manifest.config_file, "configFile")
    if text is None:
        raise ArchiveError(
            400,
            f"configFile {manifest.config_file!r} named in {MANIFEST_PATH} is not in the "
            "model directory",
        )
    return manifest, parse_model_config(text)


def _read_inside(root: Path, relative: str, label: str) -> bytes | None:
    """The bytes of the file ``relative`` under the real directory ``root``, or None.

    Refuses a name or a symlink that leads outside ``root``, something that is not a
    regular file, and a file over the metadata size limit.
    """
    parts = relative.replace("\\", "/").split("/")
    real = Path(os.path.realpath(root.joinpath(*parts)))
    if relative.startswith(("/", "\\")) or ".." in parts or not real.is_relative_to(root):
        raise ArchiveError(400, f"{label} {relative!r} points outside the model directory")
    if not real.exists():
        return None
    if not real.is_file():
        raise ArchiveError(400, f"{label} {relative!r} is not a regular file")
    size = real.stat().st_size
    if size > _MAX_METADATA_BYTES:
        raise ArchiveError(
            413, f"{label} {relative!r} is {size} bytes, over the {_MAX_METADATA_BYTES} limit"
        )
    return real.read_bytes()
