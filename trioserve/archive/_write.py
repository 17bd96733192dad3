"""Writing a model archive the way ``torch-model-archiver`` 0.12 does (spec §6.1, §6.2).

The artifacts go to the archive root under their base names, the contents of extra
directories keep their layout below the root, and ``MAR-INF/MANIFEST.json`` describes the
model. The output is written to a temporary name in the export folder and renamed into
place, so a failure never leaves a half-written archive and ``force`` never removes the
old output before the new one is complete.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import re
import shutil
import tarfile
import time
import uuid
import zipfile
from datetime import datetime
from io import BytesIO
from pathlib import Path
from typing import IO, Final, TextIO

from ._errors import ArchiveError
from ._manifest import MANIFEST_PATH, RUNTIMES
from ._progress import Mode, Progress

_log = logging.getLogger(__name__)

ARCHIVER_VERSION: Final = "0.12.0"
ARCHIVE_FORMATS: Final = ("default", "zip-store", "tgz", "no-archive")
# Handlers the server provides itself; the archiver records them without a file.
DEFAULT_HANDLERS: Final = (
    "base_handler",
    "image_classifier",
    "text_classifier",
    "object_detector",
    "image_segmenter",
    "dali_image_classifier",
    "vllm_handler",
    "trt_llm_handler",
)
_SUFFIXES: Final = {"default": ".mar", "zip-store": ".mar", "tgz": ".tar.gz", "no-archive": ""}
_MODEL_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-.]*")
_SKIPPED_DIRS: Final = ("__pycache__", "__MACOSX")
_GLOB_CHARS: Final = re.compile(r"[*?\[]")
_COPY_CHUNK: Final = 1024 * 1024


def write_archive(
    *,
    model_name: str,
    version: str,
    handler: str,
    export_path: Path,
    serialized_file: Path | None = None,
    model_file: Path | None = None,
    extra_files: list[Path] | None = None,
    runtime: str = "python",
    archive_format: str = "default",
    force: bool = False,
    requirements_file: Path | None = None,
    config_file: Path | None = None,
    progress: TextIO | None = None,
) -> Path:
    """Package a model and return the path of the archive (or directory) written.

    ``handler`` is a handler file (``my_handler.py``, or ``my_handler`` for
    ``my_handler.py``), ``module:function`` (``module.py`` is packaged; ``file.py:fn`` is
    refused, as upstream), or one of :data:`DEFAULT_HANDLERS`. ``extra_files`` may name
    files, directories (their contents are copied below the archive root, keeping their
    layout; ``__pycache__`` and hidden folders are left out) and glob patterns.

    ``archive_format``: ``default`` (``<name>.mar``, deflated zip), ``zip-store``
    (``<name>.mar``, stored zip), ``tgz`` (``<name>.tar.gz``, everything under ``<name>/``)
    or ``no-archive`` (the directory ``<export_path>/<name>/``). An existing output is
    replaced only with ``force``.

    ``progress``: the stream to show the progress of a large archive on (a bar on a
    terminal, plain lines otherwise; see :mod:`._progress`); ``None`` shows nothing.

    Raises :class:`ArchiveError` on bad input (400), a missing input file (404), an
    existing output without ``force`` (409) and a failure to write (500).
    """
    if not _MODEL_NAME.fullmatch(model_name):
        raise ArchiveError(
            400,
            f"model name {model_name!r} is not allowed: it must match "
            r"^[A-Za-z0-9][A-Za-z0-9_\-.]*$",
        )
    if not version:
        raise ArchiveError(400, "model version must not be empty")
    if runtime not in RUNTIMES:
        raise ArchiveError(400, f"runtime {runtime!r} is not one of {', '.join(RUNTIMES)}")
    if archive_format not in ARCHIVE_FORMATS:
        raise ArchiveError(
            400,
            f"archive format {archive_format!r} is not one of {', '.join(ARCHIVE_FORMATS)}",
        )

    files = _Contents()
    model: dict[str, str] = {"modelName": model_name}
    if serialized_file is not None:
        model["serializedFile"] = files.add_input(serialized_file, "serialized file")
    model["handler"] = _add_handler(files, handler)
    if model_file is not None:
        model["modelFile"] = files.add_input(model_file, "model file")
    model["modelVersion"] = version
    if requirements_file is not None:
        model["requirementsFile"] = files.add_input(requirements_file, "requirements file")
    if config_file is not None:
        model["configFile"] = files.add_input(config_file, "config file")
    for extra in extra_files or []:
        files.add_extra(extra)

    manifest = {
        "createdOn": datetime.now().strftime("%d/%m/%Y %H:%M:%S"),
        "runtime": runtime,
        "model": model,
        "archiverVersion": ARCHIVER_VERSION,
    }
    manifest_bytes = json.dumps(manifest, indent=2).encode()
    return _write_output(
        files.entries, manifest_bytes, model_name, export_path, archive_format, force, progress
    )


class _Contents:
    """The files to package: archive name -> source path, with clashes refused."""

    def __init__(self) -> None:
        self.entries: dict[str, Path] = {}
        self._folders: set[str] = {"MAR-INF"}

    def add(self, arcname: str, source: Path) -> None:
        if arcname == MANIFEST_PATH:
            _log.warning("not packaging %s: the archiver writes its own %s", source, arcname)
            return
        known = self.entries.get(arcname)
        if known is not None:
            if known.resolve() == source.resolve():
                return
            raise ArchiveError(
                400, f"two files would be stored as {arcname!r}: {known} and {source}"
            )
        parents = arcname.split("/")[:-1]
        prefixes = ["/".join(parents[: i + 1]) for i in range(len(parents))]
        if arcname in self._folders or any(p in self.entries for p in prefixes):
            raise ArchiveError(
                400, f"{source} would be stored as {arcname!r}, clashing with a folder or file"
            )
        self.entries[arcname] = source
        self._folders.update(prefixes)

    def add_input(self, path: Path, what: str) -> str:
        """Add a file given by a flag; return its base name for the manifest."""
        if not path.is_file():
            raise ArchiveError(404, f"{what} not found: {path}")
        self.add(path.name, path)
        return path.name

    def add_extra(self, entry: Path) -> None:
        pattern = str(entry)
        if _GLOB_CHARS.search(pattern):
            paths = [Path(p) for p in sorted(glob.glob(pattern, recursive=True))]
            if not paths:
                raise ArchiveError(404, f"extra files pattern {pattern!r} matches nothing")
        elif entry.exists():
            paths = [entry]
        else:
            raise ArchiveError(404, f"extra file not found: {entry}")
        for path in paths:
            if path.is_dir():
                self._add_folder(path)
            elif path.is_file():
                self.add(path.name, path)
            else:
                raise ArchiveError(400, f"extra file {path} is not a regular file or directory")

    def _add_folder(self, folder: Path) -> None:
        for top, dirs, names in os.walk(folder):
            here = Path(top)
            for name in [d for d in dirs if (here / d).is_symlink()]:
                _log.warning("not following the symbolic link %s in extra files", here / name)
            dirs[:] = sorted(
                d
                for d in dirs
                if not d.startswith(".") and d not in _SKIPPED_DIRS and not (here / d).is_symlink()
            )
            for name in sorted(names):
                path = here / name
                if not path.is_file():
                    raise ArchiveError(
                        400, f"extra file {path} is not a regular file (a broken link?)"
                    )
                self.add(path.relative_to(folder).as_posix(), path)


def _add_handler(files: _Contents, handler: str) -> str:
    """Add the handler's file if it has one; return the manifest's handler value."""
    module, colon, function = handler.partition(":")
    if colon:
        if module.endswith(".py"):
            raise ArchiveError(
                400,
                f"handler {handler!r}: write module:function without '.py' "
                f"({module[:-3]}:{function})",
            )
        if not function.isidentifier():
            raise ArchiveError(400, f"handler {handler!r}: {function!r} is not a function name")
    elif handler in DEFAULT_HANDLERS:
        return handler
    if not module:
        raise ArchiveError(400, "handler must not be empty")
    path = Path(module if module.endswith(".py") else module + ".py")
    if not path.is_file():
        hint = "" if colon else f" (or use a default handler: {', '.join(DEFAULT_HANDLERS)})"
        raise ArchiveError(404, f"handler file not found: {path}{hint}")
    files.add(path.name, path)
    return Path(module).name + colon + function


def _write_output(
    entries: dict[str, Path],
    manifest: bytes,
    model_name: str,
    export_path: Path,
    archive_format: str,
    force: bool,
    stream: TextIO | None = None,
) -> Path:
    output = export_path / (model_name + _SUFFIXES[archive_format])
    if export_path.exists() and not export_path.is_dir():
        raise ArchiveError(400, f"export path {export_path} is not a directory")
    try:
        export_path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ArchiveError(500, f"cannot create export path {export_path}: {exc}") from exc
    exists = output.exists() or output.is_symlink()
    if exists and not force:
        raise ArchiveError(409, f"{output} already exists; use --force/-f to overwrite it")
    temp = export_path / f".{model_name}.{uuid.uuid4().hex}.tmp"
    try:
        total = sum(source.stat().st_size for source in entries.values())
        # A small archive shows nothing, as torch-model-archiver does.
        with Progress.on(
            stream, f"archiving {output.name}", f"archived {output.name}", total, small=Mode.OFF
        ) as progress:
            if archive_format == "no-archive":
                _write_folder(temp, entries, manifest, progress)
            elif archive_format == "tgz":
                _write_tgz(temp, entries, manifest, model_name, progress)
            else:
                compression = (
                    zipfile.ZIP_STORED if archive_format == "zip-store" else zipfile.ZIP_DEFLATED
                )
                _write_zip(temp, entries, manifest, compression, progress)
        if exists and (temp.is_dir() or output.is_dir()):
            _remove(output)  # a file replaces a file atomically; folders need room
        os.replace(temp, output)
    except OSError as exc:
        _remove(temp)
        raise ArchiveError(500, f"cannot write {output}: {exc}") from exc
    except BaseException:
        _remove(temp)
        raise
    return output


def _copy(source: IO[bytes], target: IO[bytes], progress: Progress) -> None:
    while chunk := source.read(_COPY_CHUNK):
        target.write(chunk)
        progress.advance(len(chunk))


class _CountingReader:
    """A file that tells ``progress`` how much was read from it (for tarfile.addfile)."""

    def __init__(self, file: IO[bytes], progress: Progress) -> None:
        self._file = file
        self._progress = progress

    def read(self, size: int = -1) -> bytes:
        data = self._file.read(size)
        self._progress.advance(len(data))
        return data


def _write_zip(
    temp: Path, entries: dict[str, Path], manifest: bytes, compression: int, progress: Progress
) -> None:
    with zipfile.ZipFile(temp, "w", compression, strict_timestamps=False) as archive:
        for arcname, source in entries.items():
            # What ZipFile.write does, with the bytes counted.
            info = zipfile.ZipInfo.from_file(source, arcname, strict_timestamps=False)
            info.compress_type = compression
            with source.open("rb") as src, archive.open(info, "w") as dest:
                _copy(src, dest, progress)
        archive.writestr(MANIFEST_PATH, manifest)


def _write_tgz(
    temp: Path, entries: dict[str, Path], manifest: bytes, model_name: str, progress: Progress
) -> None:
    with tarfile.open(temp, "w:gz", dereference=True) as archive:
        for arcname, source in entries.items():
            # What TarFile.add does for a file, with the bytes counted.
            member = archive.gettarinfo(source, arcname=f"{model_name}/{arcname}")
            with source.open("rb") as src:
                archive.addfile(member, _CountingReader(src, progress))
        info = tarfile.TarInfo(f"{model_name}/{MANIFEST_PATH}")
        info.size = len(manifest)
        info.mtime = int(time.time())
        info.mode = 0o644
        archive.addfile(info, BytesIO(manifest))


def _write_folder(
    temp: Path, entries: dict[str, Path], manifest: bytes, progress: Progress
) -> None:
    temp.mkdir()
    for arcname, source in entries.items():
        target = temp / arcname
        target.parent.mkdir(parents=True, exist_ok=True)
        with source.open("rb") as src, target.open("wb") as dest:
            _copy(src, dest, progress)
        shutil.copymode(source, target)  # what shutil.copy does after the data
    (temp / "MAR-INF").mkdir(exist_ok=True)
    (temp / MANIFEST_PATH).write_bytes(manifest)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
