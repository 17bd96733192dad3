"""Extracting a ``.tar.gz`` / ``.tgz`` model with every entry checked.

Only regular files and directories are accepted: symbolic links, hard links, devices and
FIFOs are refused outright, whatever they point at. When every entry lies under a single
top folder (the layout ``torch-model-archiver --archive-format tgz`` writes) that folder
is stripped, so the model files land at the root of the model directory.
"""

from __future__ import annotations

import gzip
import lzma
import tarfile
import zlib
from pathlib import Path

from ._entries import CHUNK, Limits, creating, entry_parts, target_path
from ._errors import ArchiveError

_CORRUPT = (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, lzma.LZMAError)


def extract_tar(source: Path, root: Path, limits: Limits) -> None:
    """Extract the tar archive ``source`` into the empty real directory ``root``."""
    try:
        with tarfile.open(source, "r:*") as archive:
            plan: list[tuple[tarfile.TarInfo, tuple[str, ...]]] = []
            for member in archive:  # read lazily: stop at the entry limit
                limits.check_entries(len(plan) + 1)
                plan.append((member, _vet(member)))
            limits.check_declared(sum(m.size for m, _ in plan if m.isreg()))
            strip = 1 if _single_top_folder(plan) else 0
            for member, parts in plan:
                _extract_member(archive, member, parts[strip:], root, limits)
    except _CORRUPT as exc:
        raise ArchiveError(400, f"{source.name} is not a valid tar archive: {exc}") from None


def _vet(member: tarfile.TarInfo) -> tuple[str, ...]:
    name = member.name
    parts = entry_parts(name)
    if member.issym():
        raise ArchiveError(
            400,
            f"archive entry {name!r} is a symbolic link to {member.linkname!r}; "
            "links are not allowed",
        )
    if member.islnk():
        raise ArchiveError(
            400,
            f"archive entry {name!r} is a hard link to {member.linkname!r}; links are not allowed",
        )
    if member.ischr() or member.isblk():
        raise ArchiveError(400, f"archive entry {name!r} is a device file")
    if member.isfifo():
        raise ArchiveError(400, f"archive entry {name!r} is a FIFO")
    if not (member.isreg() or member.isdir()):
        raise ArchiveError(400, f"archive entry {name!r} is not a regular file or directory")
    if member.isreg() and not parts:
        raise ArchiveError(400, f"archive entry {name!r} has no file name")
    return parts


def _single_top_folder(plan: list[tuple[tarfile.TarInfo, tuple[str, ...]]]) -> bool:
    """True when everything sits in one folder: no file at the top level, one name there."""
    named = [(member, parts) for member, parts in plan if parts]
    tops = {parts[0] for _, parts in named}
    if len(tops) != 1 or tops == {"MAR-INF"}:
        return False
    return all(len(parts) > 1 or member.isdir() for member, parts in named)


def _extract_member(
    archive: tarfile.TarFile,
    member: tarfile.TarInfo,
    parts: tuple[str, ...],
    root: Path,
    limits: Limits,
) -> None:
    name = member.name
    with creating(name):
        if member.isdir():
            if parts:
                target_path(root, parts, name).mkdir(parents=True, exist_ok=True)
            return
        target = target_path(root, parts, name)
        target.parent.mkdir(parents=True, exist_ok=True)
        data = archive.extractfile(member)
        if data is None:  # cannot happen for a regular file; vetted above
            raise ArchiveError(400, f"archive entry {name!r} has no data")
        with data, open(target, "xb") as out:
            while chunk := data.read(CHUNK):
                limits.count(len(chunk), name)
                out.write(chunk)
