"""Per-model Python dependencies: TorchServe's ``install_py_dep_per_model``.

An archive made with ``-r requirements.txt`` names that file in its manifest
(``model.requirementsFile``). With the setting on, the model manager asks a
:class:`DependencyInstaller` for a directory holding those requirements before the model's
workers start, and the workers find it on their import path.

The directory is ``<root>/<sha256 of the file's bytes>``: two models (or two registrations of
one model) with the same requirements file share one install for the server's lifetime.
pip runs as ``python -m pip install --target <temporary dir> -r <file>`` with the server's
own interpreter and environment (so the index, proxies and credentials are whatever pip is
configured with), in the model's directory (so relative paths in the file resolve against
the archive, as in TorchServe). Only a complete install is renamed into place, after a
marker file is written into it; a failed, cancelled or half-written one is removed. One lock
per hash keeps two registrations from installing the same requirements at once: the second
waits and reuses the first's directory.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import sys
import uuid
from pathlib import Path
from typing import Final

import trio

from trioserve.core import errors

__all__ = ["COMPLETE_MARKER", "DependencyInstaller", "pip_failed"]

log = logging.getLogger("trioserve.runtime.pydeps")

#: Written into an install directory last; a directory without it is not used.
COMPLETE_MARKER: Final = ".trioserve-complete"

# How much of pip's output a failed registration quotes.
_TAIL_LINES: Final = 12
_TAIL_CHARS: Final = 2000


class DependencyInstaller:
    """Installs requirements files into ``root/<sha256>`` directories, each at most once."""

    def __init__(self, root: Path, *, python: str = sys.executable) -> None:
        self.root = root
        self._python = python
        self._locks: dict[str, trio.Lock] = {}
        #: how many times pip has been run (cache hits do not count)
        self.pip_runs = 0

    async def install(self, requirements: Path, *, cwd: Path, model: str) -> Path:
        """The directory holding ``requirements``, installed now unless it already is.

        ``cwd`` is where pip runs (the model's directory); ``model`` names the model in
        messages. Raises :class:`~trioserve.core.errors.ServeError` when pip fails, with
        the end of pip's own output in the message.
        """
        digest = hashlib.sha256(await trio.Path(requirements).read_bytes()).hexdigest()
        target = self.root / digest
        lock = self._locks.setdefault(digest, trio.Lock())
        async with lock:
            if await trio.Path(target / COMPLETE_MARKER).is_file():
                log.info("model %s: reusing Python dependencies in %s", model, target)
                return target
            await trio.to_thread.run_sync(_prepare, self.root, target)
            staging = self.root / f".{digest}.{uuid.uuid4().hex}"
            try:
                await self._pip(requirements, staging, cwd, model)
                await trio.to_thread.run_sync(_finish, staging, target, requirements.name)
            finally:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(_remove, staging)
        log.info("model %s: installed Python dependencies into %s", model, target)
        return target

    async def _pip(self, requirements: Path, staging: Path, cwd: Path, model: str) -> None:
        command = [
            self._python,
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--no-input",
            "--target",
            str(staging),
            "-r",
            str(requirements),
        ]
        log.info("model %s: %s", model, " ".join(command))
        self.pip_runs += 1
        try:
            done = await trio.run_process(
                command,
                cwd=str(cwd),
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                stdin=b"",
            )
        except OSError as exc:
            raise pip_failed(model, f"cannot run {self._python} -m pip: {exc}") from None
        stdout = done.stdout.decode(errors="replace")
        stderr = done.stderr.decode(errors="replace")
        if done.returncode == 0:
            log.debug("model %s: pip output:\n%s", model, stdout)
            return
        log.error(
            "model %s: pip exited with status %d\nstdout:\n%s\nstderr:\n%s",
            model,
            done.returncode,
            stdout,
            stderr,
        )
        raise pip_failed(model, _tail(stderr) or _tail(stdout) or f"exit status {done.returncode}")


def pip_failed(model: str, detail: str) -> errors.ServeError:
    """The registration error for requirements that could not be installed (TorchServe
    answers 400 ``ModelException``; trioserve adds what pip said)."""
    return errors.ServeError(
        errors.ErrorKind.BAD_INPUT,
        f"Custom pip package installation failed for model {model}: {detail}",
        reason="ModelException",
    )


def _tail(text: str) -> str:
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    tail = "\n".join(lines[-_TAIL_LINES:])
    return tail if len(tail) <= _TAIL_CHARS else "..." + tail[-_TAIL_CHARS:]


def _prepare(root: Path, target: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    # An install directory without its marker was left half-done (nothing renames one
    # into place before the marker is written, but a person may have touched it).
    if target.exists():
        shutil.rmtree(target, ignore_errors=True)


def _finish(staging: Path, target: Path, source: str) -> None:
    staging.mkdir(parents=True, exist_ok=True)  # pip makes none for an empty file
    (staging / COMPLETE_MARKER).write_text(f"installed from {source}\n")
    staging.rename(target)


def _remove(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path, ignore_errors=True)
