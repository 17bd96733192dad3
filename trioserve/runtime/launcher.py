"""Starting worker processes.

The worker supervisor does not spawn processes itself: it asks a :class:`Launcher`. The real
one starts ``python -m trioserve.worker`` on one end of a Unix socket pair; tests use fake
launchers that run a worker in-process over a memory stream. A process's
:class:`~trioserve.runtime.attach.AttachLauncher` connects to a worker another serving
process started instead (one started with a ``listen_dir``).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import trio

from trioserve.pythonpath import child_python_path

log = logging.getLogger("trioserve.worker")


class WorkerProcess(Protocol):
    @property
    def pid(self) -> int | None: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


@dataclass(slots=True)
class Launched:
    stream: trio.abc.Stream
    process: WorkerProcess


class Launcher(Protocol):
    async def launch(
        self, name: str, cwd: Path, nursery: trio.Nursery, *, python_path: Sequence[Path] = ()
    ) -> Launched:
        """Start one worker. Helper tasks (output pumps) go in ``nursery``.

        ``python_path``: directories the worker imports from after ``cwd`` and before
        anything else (a model's own dependencies, ``install_py_dep_per_model``).
        """
        ...


@dataclass(frozen=True, slots=True)
class WithPythonPath:
    """A launcher whose workers also import from ``paths``: the one a model version gets
    when it has dependencies of its own."""

    inner: Launcher
    paths: tuple[Path, ...]

    async def launch(
        self, name: str, cwd: Path, nursery: trio.Nursery, *, python_path: Sequence[Path] = ()
    ) -> Launched:
        paths = (*self.paths, *python_path)
        return await self.inner.launch(name, cwd, nursery, python_path=paths)


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


async def _pump_lines(stream: trio.abc.ReceiveStream, name: str, level: int) -> None:
    logger = logging.getLogger(f"trioserve.worker.{name}")
    pending = b""
    async for chunk in stream:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            logger.log(level, "%s", line.decode(errors="replace").rstrip())
    if pending:
        logger.log(level, "%s", pending.decode(errors="replace").rstrip())


class SubprocessLauncher:
    """Runs ``python -m trioserve.worker --fd N`` with one end of a socket pair; with a
    ``listen_dir``, the worker also accepts serving processes that attach to it there
    (``--listen``, at :func:`~trioserve.runtime.attach.attach_path`)."""

    def __init__(
        self,
        env: Mapping[str, str],
        python: str = sys.executable,
        *,
        listen_dir: Path | None = None,
    ) -> None:
        self._env = dict(env)
        self._python = python
        self._listen_dir = listen_dir

    async def launch(
        self, name: str, cwd: Path, nursery: trio.Nursery, *, python_path: Sequence[Path] = ()
    ) -> Launched:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            env = dict(self._env)
            # The model's folder, its own dependencies, then what this trioserve is imported
            # from when the interpreter would not find it by itself (the zipapp).
            paths = (str(cwd), *map(str, python_path), *child_python_path())
            env["PYTHONPATH"] = os.pathsep.join(p for p in (*paths, env.get("PYTHONPATH", "")) if p)
            env["TRIOSERVE_WORKER_NAME"] = name
            command = [self._python, "-m", "trioserve.worker", "--fd", str(child.fileno())]
            if self._listen_dir is not None:
                from trioserve.runtime.attach import attach_path  # (which imports this module)

                command += ["--listen", str(attach_path(self._listen_dir, name))]
            process = await trio.lowlevel.open_process(
                command,
                pass_fds=(child.fileno(),),
                cwd=str(cwd),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        assert process.stdout is not None and process.stderr is not None
        nursery.start_soon(_pump_lines, process.stdout, name, logging.INFO)
        nursery.start_soon(_pump_lines, process.stderr, name, logging.WARNING)
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(parent))
        return Launched(stream, process)


def worker_environment(
    base: Mapping[str, str],
    *,
    blacklist: str | None,
    decode_input_request: bool,
    sequence_headers: tuple[str, str, str],
) -> dict[str, str]:
    """The environment every worker process starts with."""
    env = dict(base)
    if blacklist:
        pattern = re.compile(blacklist)
        env = {k: v for k, v in env.items() if not pattern.fullmatch(k)}
    env["TS_DECODE_INPUT_REQUEST"] = "true" if decode_input_request else "false"
    seq_id, seq_start, seq_end = sequence_headers
    env["TS_REQUEST_SEQUENCE_ID"] = seq_id
    env["TS_REQUEST_SEQUENCE_START"] = seq_start
    env["TS_REQUEST_SEQUENCE_END"] = seq_end
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env
