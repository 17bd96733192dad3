"""Downloading a model archive from an allowed http(s) URL into the model store.

TorchServe's default ``allowed_urls`` lets the management API fetch any URL into the model
store (CVE-2023-43654). Here an empty allow-list refuses every http(s) URL (DECISIONS.md):
a URL must fully match one of the configured regexes before any connection is made.

The body is streamed with a byte limit into a private temporary file (mode 0600, created
exclusively) inside the model store and only linked into place when complete; redirects are
not followed, since their target was never checked against the allow-list. Whatever goes
wrong, including cancellation, nothing is left behind in the store.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import re
import ssl
import sys
import tempfile
import threading
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO, TextIO
from urllib.parse import unquote, urlsplit

import trio

from ._errors import ArchiveError
from ._progress import Progress

__all__ = ["check_allowed", "download"]

_SUFFIXES = (".mar", ".tar.gz", ".tgz")
_UNSAFE_NAME = re.compile(r"[\x00-\x1f\x7f/\\]")
_CHUNK = 64 * 1024
_log = logging.getLogger(__name__)


def check_allowed(url: str, allowed: Sequence[str]) -> None:
    """Refuse ``url`` unless it fully matches one of the ``allowed`` regexes.

    Raises :class:`ArchiveError` 404 when nothing matches; an empty allow-list matches
    nothing. A pattern that is not a valid regex matches nothing either.
    """
    if not allowed:
        raise ArchiveError(
            404,
            f"Given URL {url} does not match any allowed URL(s): allowed_urls is empty, so "
            "only files inside the model store can be registered; set allowed_urls to the "
            "URL patterns models may be downloaded from",
        )
    for pattern in allowed:
        try:
            if re.fullmatch(pattern, url) is not None:
                return
        except re.error:
            continue
    raise ArchiveError(404, f"Given URL {url} does not match any allowed URL(s)")


def _target_name(url: str) -> str:
    """The archive file name a download of ``url`` is stored under, or ArchiveError 400."""
    name = unquote(urlsplit(url).path.rsplit("/", 1)[-1])
    if (
        not name.endswith(_SUFFIXES)
        or name.startswith(".")
        or name != name.strip()
        or _UNSAFE_NAME.search(name) is not None
        or len(name.encode("utf-8", "surrogatepass")) > 255
    ):
        raise ArchiveError(
            400,
            f"Cannot download {url}: the URL path must end in a plain file name ending in "
            f"{', '.join(_SUFFIXES)} (got {name!r})",
        )
    return name


def _unlink(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    if reason is not None:
        return str(reason)
    return str(exc) or type(exc).__name__


def _content_length(response: http.client.HTTPResponse) -> int | None:
    value = response.headers.get("Content-Length")
    if value is None:
        return None
    try:
        length = int(value.strip())
    except ValueError:
        return None
    return length if length >= 0 else None


def _opener() -> urllib.request.OpenerDirector:
    """An opener that does plain http(s) only: no proxies, no redirects, no error raising."""
    opener = urllib.request.OpenerDirector()
    opener.add_handler(urllib.request.HTTPHandler())
    opener.add_handler(urllib.request.HTTPSHandler(context=ssl.create_default_context()))
    return opener


class _Abandoned(Exception):
    """The awaiting task was cancelled; the worker thread stops and cleans up."""


class _Job:
    """One download, run in a worker thread that the awaiting task may abandon.

    The worker thread owns ``fd`` once it starts; the temporary file is linked to ``final``
    under ``_lock`` only if the task has not abandoned the job, and :meth:`abandon` removes
    whatever this job put in the store.
    """

    def __init__(
        self,
        url: str,
        fd: int,
        tmp: Path,
        final: Path,
        max_bytes: int,
        timeout: float,
        stream: TextIO | None,
    ) -> None:
        self.url = url
        self.fd = fd
        self.tmp = tmp
        self.final = final
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.stream = stream  # where a progress bar may be drawn; None: no progress at all
        self._lock = threading.Lock()
        self._cancelled = threading.Event()
        self._started = False
        self._committed = False

    def abandon(self) -> None:
        """Called from the task on cancellation (or any error): undo everything."""
        with self._lock:
            self._cancelled.set()
            if not self._started:
                with contextlib.suppress(OSError):
                    os.close(self.fd)
            if self._committed:
                _unlink(self.final)
            _unlink(self.tmp)

    def run(self) -> Path:
        with self._lock:
            if self._cancelled.is_set():
                raise _Abandoned
            self._started = True
        try:
            with os.fdopen(self.fd, "wb") as out:
                self._fetch(out)
                try:
                    out.flush()
                    os.fsync(out.fileno())
                except OSError as exc:
                    raise ArchiveError(500, f"Cannot write {self.final.name}: {exc}") from None
            with self._lock:
                if self._cancelled.is_set():
                    raise _Abandoned
                self._commit()
                self._committed = True
            return self.final
        finally:
            _unlink(self.tmp)

    def _commit(self) -> None:
        try:
            os.link(self.tmp, self.final)  # unlike rename, never replaces an existing file
        except FileExistsError:
            raise _exists(self.final.name) from None
        except OSError:
            # A file system without hard links: check, then rename (small race window).
            if os.path.lexists(self.final):
                raise _exists(self.final.name) from None
            try:
                os.replace(self.tmp, self.final)
            except OSError as exc:
                raise ArchiveError(500, f"Cannot store {self.final.name}: {exc}") from None

    def _fetch(self, out: BinaryIO) -> None:
        url = self.url
        request = urllib.request.Request(
            url, headers={"User-Agent": "trioserve", "Accept-Encoding": "identity"}
        )
        try:
            response: http.client.HTTPResponse = _opener().open(request, timeout=self.timeout)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise ArchiveError(400, f"Failed to download {url}: {_reason(exc)}") from None
        with response:
            status = response.status
            if 300 <= status < 400:
                location = response.headers.get("Location", "")
                raise ArchiveError(
                    400,
                    f"Failed to download {url}: HTTP {status} redirect to {location!r} is "
                    "not followed; register the final URL (it must match allowed_urls)",
                )
            if status != 200:
                raise ArchiveError(400, f"Failed to download {url}: HTTP {status}")
            declared = _content_length(response)
            if declared is not None and declared > self.max_bytes:
                raise self._too_large(f"Content-Length is {declared} bytes")
            name = self.final.name
            # Lines go to the server's log; a bar only to a terminal (see _progress).
            with Progress.on(
                self.stream, f"downloading {name}", f"downloaded {name}", declared, emit=_log.info
            ) as progress:
                self._copy(response, out, progress)
                if declared is not None and progress.done != declared:
                    raise ArchiveError(
                        400,
                        f"Failed to download {url}: the body ended after {progress.done} of "
                        f"{declared} bytes",
                    )

    def _copy(self, response: http.client.HTTPResponse, out: BinaryIO, progress: Progress) -> None:
        while True:
            if self._cancelled.is_set():
                raise _Abandoned
            try:
                chunk = response.read1(_CHUNK)
            except (OSError, http.client.HTTPException) as exc:
                raise ArchiveError(400, f"Failed to download {self.url}: {_reason(exc)}") from None
            if not chunk:
                return
            progress.advance(len(chunk))
            if progress.done > self.max_bytes:
                raise self._too_large(f"the body is over {self.max_bytes} bytes")
            try:
                out.write(chunk)
            except OSError as exc:
                raise ArchiveError(500, f"Cannot write {self.final.name}: {exc}") from None

    def _too_large(self, detail: str) -> ArchiveError:
        return ArchiveError(
            413,
            f"Model archive at {self.url} exceeds the download limit of {self.max_bytes} "
            f"bytes ({detail})",
        )


def _exists(name: str) -> ArchiveError:
    return ArchiveError(409, f"Model file {name} already exists in the model store")


def _prepare(model_store: Path, name: str) -> tuple[int, Path]:
    """Refuse an existing target, then create the private temporary file next to it."""
    if os.path.lexists(model_store / name):
        raise _exists(name)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=model_store)
    except OSError as exc:
        raise ArchiveError(500, f"Cannot create a file in the model store: {exc}") from None
    return fd, Path(tmp)


async def download(
    url: str,
    model_store: Path,
    allowed: Sequence[str],
    *,
    max_bytes: int,
    timeout: float = 60.0,
    progress: bool = True,
    stream: TextIO | None = None,
) -> Path:
    """Download the archive at http(s) ``url`` into ``model_store`` and return its path.

    ``url`` must fully match one of the ``allowed`` regexes (checked before any network
    access) and its path must end in a ``.mar``, ``.tar.gz`` or ``.tgz`` file name, which is
    the name the archive gets in the store. ``timeout`` bounds connecting and each read.

    Raises :class:`ArchiveError`: 404 for a URL that is not allowed; 400 for a scheme other
    than http(s), a bad file name, an HTTP status other than 200 (redirects included), a
    connection error or a truncated body; 409 when the file is already in the store; 413
    for a body over ``max_bytes``; 500 for a local I/O failure. Nothing is left in the store
    on failure or cancellation.

    With ``progress``, a large download shows its progress: a bar on ``stream`` (by default
    ``sys.stderr``, where the server logs) when that is a terminal, otherwise a line logged
    every 10 % or 10 s; every download logs a final line with its size and time.
    """
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        host = None
    if host is None or parts.scheme.lower() not in ("http", "https"):
        raise ArchiveError(400, f"Cannot download {url}: only http(s) URLs can be downloaded")
    check_allowed(url, allowed)
    name = _target_name(url)

    fd, tmp = await trio.to_thread.run_sync(_prepare, model_store, name)
    shown = (stream if stream is not None else sys.stderr) if progress else None
    job = _Job(url, fd, tmp, model_store / name, max_bytes, timeout, shown)
    try:
        return await trio.to_thread.run_sync(job.run, abandon_on_cancel=True)
    except BaseException:
        job.abandon()
        raise
