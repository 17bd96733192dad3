"""Where a model URL given to the server points, limited to the model store (DECISIONS.md)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

from ._errors import ArchiveError

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")


def resolve_url(model_store: Path, url: str) -> Path:
    """Return the real path of the model ``url`` names inside ``model_store``.

    ``url`` is a file or directory name in the store, a relative path inside it, or a
    ``file://`` URL (or absolute path) that lies inside it. Symlinks are resolved before
    the containment check, so a link in the store that points elsewhere is refused.

    Raises :class:`ArchiveError`: 404 for an empty URL, a ``..`` component, a path outside
    the store, a scheme other than ``file``, or a model that is not there; 400 for http(s)
    URLs, which this server does not download.
    """
    if not url:
        raise ArchiveError(404, "empty url")
    if "\x00" in url:
        raise ArchiveError(404, f"Model not found at: {url!r} (the url contains a NUL byte)")

    match = _SCHEME.match(url)
    if match is None:
        path_text = url
    else:
        scheme = match.group(1).lower()
        if scheme in ("http", "https"):
            raise ArchiveError(
                400,
                f"Cannot register {url}: http(s) downloads are not supported here; "
                "copy the archive into the model store and register it by file name",
            )
        if scheme != "file":
            raise ArchiveError(
                404,
                f"Given URL {url} does not match any allowed URL: only files inside the "
                "model store can be registered",
            )
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise ArchiveError(404, f"file URL {url} names a host; only local files are allowed")
        path_text = unquote(parts.path)
        if "\x00" in path_text:
            raise ArchiveError(404, f"Model not found at: {url} (the url contains a NUL byte)")

    if ".." in path_text.split("/"):
        raise ArchiveError(404, f"'..' is not allowed in a model url: {url}")

    store = model_store.resolve()
    real = (store / path_text).resolve()
    if real == store or not real.is_relative_to(store):
        raise ArchiveError(404, f"{url} is not inside the model store {store}")
    if not real.exists():
        raise ArchiveError(404, f"Model not found at: {url}")
    return real
