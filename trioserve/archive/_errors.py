"""The one error type of the archive package."""

from __future__ import annotations


class ArchiveError(Exception):
    """A model archive, manifest, config file or model URL was refused.

    ``status`` is the HTTP status a server should answer with: 400 for a bad archive,
    manifest or config, 404 for a model that is not there or a URL that is not allowed,
    413 for an archive over a size or entry limit, 409 for an archiver output that already
    exists, 500 for a local I/O failure. ``message`` says exactly what was wrong: which
    entry, which key, which limit.
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def __repr__(self) -> str:
        return f"ArchiveError({self.status}, {self.message!r})"
