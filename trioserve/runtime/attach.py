"""Attaching to a worker process another serving process started: :class:`AttachLauncher`.

A worker started with ``--listen`` (:class:`~trioserve.runtime.launcher.SubprocessLauncher`
with a ``listen_dir``) accepts more connections at :func:`attach_path`; each is served like
the connection of the process that started it (see :mod:`trioserve.worker.attached`). An
:class:`AttachLauncher` "launches" a worker by connecting there, so an unchanged
:class:`~trioserve.runtime.supervisor.WorkerSupervisor` drives a shared worker: LOAD is
answered once the worker's model is loaded, batches are answered on this connection, and
SHUTDOWN detaches (the worker finishes this connection's batches, closes it and goes on).

The process behind the connection is not this process's child, so :class:`AttachedProcess`
stands in for it: it "exits" when the worker closes the connection (the worker detached it,
ended or died) or when it is terminated or killed here, which shuts the connection down.
While the worker's own supervisor restarts it, :meth:`AttachLauncher.launch` keeps trying to
connect (every :data:`CONNECT_RETRY` seconds, up to ``connect_timeout``).
"""

from __future__ import annotations

import contextlib
import hashlib
import select
import socket
import struct
from collections.abc import Sequence
from pathlib import Path

import trio

from trioserve.runtime.launcher import Launched

CONNECT_RETRY = 0.03  # seconds between attempts to connect while the worker (re)starts
HANGUP_POLL = 0.02  # how often wait() looks at the connection
_HANGUP = select.POLLHUP | select.POLLRDHUP | select.POLLERR | select.POLLNVAL


def attach_path(listen_dir: Path, name: str) -> Path:
    """Where the worker named ``name`` accepts attached connections: short, whatever the
    name, since a Unix socket path holds at most 107 bytes."""
    digest = hashlib.sha1(name.encode(), usedforsecurity=False).hexdigest()[:16]
    return listen_dir / f"w-{digest}.sock"


class AttachedProcess:
    """The worker process at the other end of an attached connection, as a supervisor sees a
    process it started (:class:`~trioserve.runtime.launcher.WorkerProcess`)."""

    def __init__(self, sock: trio.socket.SocketType, pid: int | None) -> None:
        self._socket = sock
        self.pid = pid
        self._returncode: int | None = None
        # What a job failed by the worker's end is told (the supervisor asks for it).
        self.ending = (
            f"The shared worker process{'' if pid is None else f' (pid {pid})'} ended or "
            "closed this serving process's connection to it."
        )

    @property
    def returncode(self) -> int | None:
        """None while the connection is up; 0 once the worker closed it or it was shut down
        here (the worker's own exit status is its parent's to know)."""
        if self._returncode is None and self._hung_up():
            self._returncode = 0
        return self._returncode

    def _hung_up(self) -> bool:
        fd = self._socket.fileno()
        if fd < 0:
            return True
        poller = select.poll()
        poller.register(fd, _HANGUP)
        return bool(poller.poll(0))

    async def wait(self) -> int:
        # Polled: the supervisor's frame reader is waiting on this socket already, and trio
        # lets one task at a time wait for a socket to become readable.
        while (code := self.returncode) is None:  # noqa: ASYNC110
            await trio.sleep(HANGUP_POLL)
        return code

    def terminate(self) -> None:
        """Detach at once: shut the connection down (the worker cancels its requests)."""
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)
        self._returncode = 0

    def kill(self) -> None:
        self.terminate()


class AttachLauncher:
    """Connects to the worker named ``name`` in ``listen_dir`` instead of starting one."""

    def __init__(self, listen_dir: Path, *, connect_timeout: float) -> None:
        self._dir = listen_dir
        self._timeout = connect_timeout

    async def launch(
        self, name: str, cwd: Path, nursery: trio.Nursery, *, python_path: Sequence[Path] = ()
    ) -> Launched:
        """Connect to the worker (``cwd`` and ``python_path`` are its starter's business);
        ``OSError`` naming the path if none accepts within ``connect_timeout``."""
        path = attach_path(self._dir, name)
        sock = await self._connect(path)
        try:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            pid: int | None = struct.unpack("3i", creds)[0] or None
        except OSError:
            pid = None
        return Launched(trio.SocketStream(sock), AttachedProcess(sock, pid))

    async def _connect(self, path: Path) -> trio.socket.SocketType:
        deadline = trio.current_time() + self._timeout
        while True:
            sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                await sock.connect(str(path))
                return sock
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                sock.close()
                # The worker is starting, or being restarted by its own supervisor.
                if trio.current_time() + CONNECT_RETRY > deadline:
                    raise OSError(
                        f"no shared worker accepted a connection at {path} within "
                        f"{self._timeout:g} s ({exc.strerror or exc})"
                    ) from exc
                await trio.sleep(CONNECT_RETRY)
            except BaseException:
                sock.close()
                raise


__all__ = ["AttachLauncher", "AttachedProcess", "attach_path"]
