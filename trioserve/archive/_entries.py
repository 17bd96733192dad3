"""Checks shared by the zip and tar readers: entry names, target paths, limits.

Each reader first vets every entry's name, type and declared size (:class:`Limits`), then
streams the data through :meth:`Limits.count`, which counts the bytes actually written,
so a header that under-states a size cannot push the total past the limit.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from ._errors import ArchiveError

CHUNK: Final = 1 << 16
_SEPARATORS = re.compile(r"[/\\]")
_DRIVE = re.compile(r"^[A-Za-z]:")


def entry_parts(name: str) -> tuple[str, ...]:
    """Split an archive entry name into path components, refusing unsafe names.

    Empty and ``.`` components are dropped, so ``./a//b/`` is ``("a", "b")``. Backslashes
    count as separators for the checks, as a Windows extractor would read them.
    """
    if "\x00" in name:
        raise ArchiveError(400, f"archive entry {name!r} has a NUL byte in its name")
    if name.startswith(("/", "\\")) or _DRIVE.match(name):
        raise ArchiveError(400, f"archive entry {name!r} has an absolute path")
    parts = tuple(p for p in _SEPARATORS.split(name) if p not in ("", "."))
    if ".." in parts:
        raise ArchiveError(400, f"archive entry {name!r} has a '..' component")
    return parts


def target_path(root: Path, parts: tuple[str, ...], name: str) -> Path:
    """``root`` joined with ``parts``, checked to stay inside ``root`` (``root`` is real)."""
    target = root.joinpath(*parts)
    if not Path(os.path.realpath(target)).is_relative_to(root):
        raise ArchiveError(400, f"archive entry {name!r} resolves outside the model directory")
    return target


@contextmanager
def creating(name: str) -> Iterator[None]:
    """Turn a failure to create entry ``name`` that the archive caused into an ArchiveError.

    Other OS errors (a full disk, permissions) pass through: they are the server's problem.
    """
    try:
        yield
    except (FileExistsError, NotADirectoryError, IsADirectoryError):
        raise ArchiveError(400, f"archive entry {name!r} clashes with another entry") from None
    except OSError as exc:
        if exc.errno not in (errno.ENAMETOOLONG, errno.EILSEQ, errno.EINVAL):
            raise
        raise ArchiveError(400, f"archive entry {name!r} cannot be created: {exc}") from None


class Limits:
    """Entry count and unpacked size limits for one extraction."""

    def __init__(self, max_unpacked_bytes: int, max_entries: int) -> None:
        self.max_unpacked_bytes = max_unpacked_bytes
        self.max_entries = max_entries
        self.written = 0

    def check_entries(self, count: int) -> None:
        if count > self.max_entries:
            raise ArchiveError(
                413, f"archive has more than {self.max_entries} entries (max_entries)"
            )

    def check_declared(self, total: int) -> None:
        if total > self.max_unpacked_bytes:
            raise ArchiveError(
                413,
                f"archive declares {total} unpacked bytes, over the limit of "
                f"{self.max_unpacked_bytes} bytes (max_unpacked_bytes)",
            )

    def count(self, n: int, name: str) -> None:
        """Count ``n`` more bytes written for entry ``name``."""
        self.written += n
        if self.written > self.max_unpacked_bytes:
            raise ArchiveError(
                413,
                f"archive unpacks to more than {self.max_unpacked_bytes} bytes "
                f"(max_unpacked_bytes), reached while extracting {name!r}",
            )
