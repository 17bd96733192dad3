"""The control process's side of the other serving processes: :class:`ServingProcesses`.

It starts ``count`` serving processes (the control process is serving process 0), each with
the inference ports' listening sockets and one end of a link, and restarts one that dies
after the workers' back-off. Over each link it sends the registry's state after every change
and waits until each process has applied it (:meth:`ServingProcesses.publish`), gathers
their metrics for a scrape (:meth:`ServingProcesses.metrics`), runs the management calls and
the forwarded requests they send, tells the forwarded models' ready workers, and drains them
at shutdown. A serving process that dies takes only its own connections with it: the
requests it forwarded are cancelled, and its workers' batches were its own.
"""

from __future__ import annotations

import itertools
import logging
import pickle
import socket
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio

from trioserve.core.backoff import Backoff
from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.link_frames import Frame
from trioserve.core.serving_frames import (
    ANSWER,
    APPLIED,
    CALL,
    CANCEL,
    DRAIN,
    HELLO,
    INPUT,
    METRICS,
    PULL_METRICS,
    READ,
    READY,
    READY_WORKERS,
    STATE,
    SUBMIT,
    error_tuple,
)
from trioserve.runtime.dataplane import Dataplane
from trioserve.runtime.forward import ForwardedCalls, forwarded_model
from trioserve.runtime.link import Link
from trioserve.runtime.manager import ModelManager
from trioserve.runtime.mirror import State

log = logging.getLogger("trioserve.serving")

# How often the forwarded models' ready workers are checked for a change worth telling.
READY_INTERVAL = 0.25
# The longest a scrape waits for the other processes' metrics.
METRICS_TIMEOUT = 2.0


@dataclass(frozen=True, slots=True)
class Setup:
    """What a new serving process is told first (pickled in its HELLO frame)."""

    index: int
    config: Any  # the server's ServerConfig
    http_fds: tuple[int, ...]  # the inference port's listening sockets
    grpc_fd: int | None  # the gRPC inference port's listening socket
    listen_dir: str  # where the workers' attach sockets are (runtime/attach.py)
    log_level: str
    gpus: int  # how many GPUs the control process places workers on


ModelCall = Callable[[str, tuple[Any, ...]], Awaitable[object]]


class _Member:
    """One serving process as the control process sees it, for one process lifetime."""

    link: Link
    forwarded: ForwardedCalls

    def __init__(self, index: int) -> None:
        self.index = index
        self.ready = False  # its listeners accept connections
        self.waiting: dict[int, trio.Event] = {}  # APPLIED / METRICS answers awaited
        self.metrics: dict[int, bytes] = {}
        self.ready_told: dict[tuple[str, str], int] | None = None


class ServingProcesses:
    def __init__(
        self,
        count: int,
        command: Sequence[str],
        setup: Callable[[int], Setup],
        pass_fds: Sequence[int],
        *,
        manager: ModelManager,
        dataplane: Dataplane,
        state: Callable[[], State],
        model_call: ModelCall,
        apply_timeout: float,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.count = count
        self._command = list(command)
        self._setup = setup
        self._pass_fds = tuple(pass_fds)
        self._manager = manager
        self._dataplane = dataplane  # without metrics: forwarded requests are counted there
        self._state = state
        self._model_call = model_call
        self._apply_timeout = apply_timeout
        self._env = None if env is None else dict(env)
        self._members: dict[int, _Member] = {}
        self._numbers = itertools.count(1)
        self._draining = False
        self.stopped = trio.Event()  # every other serving process has ended
        self.restarts = 0
        self.pids: dict[int, int] = {}  # index -> pid of the running process

    # -- what the rest of the control process asks ---------------------------------------

    async def publish(self) -> None:
        """Send the registry's state to every serving process; return once each has
        applied it (one that dies meanwhile, or takes longer than the timeout, is skipped:
        a process that starts later is sent the state first)."""
        if not self._members:
            return
        blob = pickle.dumps(self._state(), protocol=pickle.HIGHEST_PROTOCOL)
        waits = []
        for member in list(self._members.values()):
            n = next(self._numbers)
            waits.append(self._ask(member, (STATE, n, blob), n))
        with trio.move_on_after(self._apply_timeout) as scope:
            for event in waits:
                await event.wait()
        if scope.cancelled_caught:
            log.warning(
                "a serving process did not apply a registry change within %g s",
                self._apply_timeout,
            )

    async def metrics(self) -> list[bytes]:
        """Every other serving process's metrics exposition (those answering in time)."""
        asked = []
        for member in list(self._members.values()):
            n = next(self._numbers)
            asked.append((member, n, self._ask(member, (PULL_METRICS, n), n)))
        with trio.move_on_after(METRICS_TIMEOUT):
            for _member, _n, event in asked:
                await event.wait()
        return [member.metrics.pop(n) for member, n, _event in asked if n in member.metrics]

    def _ask(self, member: _Member, frame: Frame, n: int) -> trio.Event:
        event = member.waiting[n] = trio.Event()
        member.link.post(frame)
        return event

    def drain(self) -> None:
        """Shutdown: every serving process stops accepting and finishes its requests."""
        self._draining = True
        for member in self._members.values():
            member.link.post((DRAIN,))

    # -- the processes ---------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run serving processes 1 .. count-1 until drained (or cancelled)."""
        try:
            async with trio.open_nursery() as nursery:
                for index in range(1, self.count):
                    nursery.start_soon(self._supervise, index)
                task_status.started()
                await self._tell_ready_workers()
        finally:
            self.stopped.set()

    async def _supervise(self, index: int) -> None:
        backoff = Backoff()
        while not self._draining:
            began = trio.current_time()
            try:
                await self._run_one(index)
            except OSError as exc:
                log.error("serving process %d could not start: %s", index, exc)
            if self._draining:
                return
            backoff.record_uptime(trio.current_time() - began)
            delay = backoff.next_delay()
            log.warning("serving process %d ended; restarting it in %.1f s", index, delay)
            await trio.sleep(delay)
            self.restarts += 1

    async def _run_one(self, index: int) -> None:
        here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            process = await trio.lowlevel.open_process(
                [*self._command, "--link-fd", str(there.fileno())],
                pass_fds=(there.fileno(), *self._pass_fds),
                stdin=subprocess.DEVNULL,
                env=self._env,
            )
        except BaseException:
            here.close()
            raise
        finally:
            there.close()
        self.pids[index] = process.pid
        log.info("serving process %d started (pid %d)", index, process.pid)
        member: _Member | None = None
        try:
            async with trio.open_nursery() as nursery:
                member = _Member(index)
                link = member.link = Link(
                    trio.socket.from_stdlib_socket(here),
                    partial(self._on_frame, member, nursery),
                    f"serving process {index}",
                )
                member.forwarded = ForwardedCalls(self._dataplane, link.post, nursery)
                setup = pickle.dumps(self._setup(index), protocol=pickle.HIGHEST_PROTOCOL)
                link.post((HELLO, setup), more=True)
                link.post((STATE, 0, pickle.dumps(self._state(), protocol=pickle.HIGHEST_PROTOCOL)))
                if self._draining:
                    link.post((DRAIN,))
                self._members[index] = member
                await link.run()
                nursery.cancel_scope.cancel()
        finally:
            self._members.pop(index, None)
            self.pids.pop(index, None)
            if member is not None:
                member.forwarded.close()
                for event in member.waiting.values():
                    event.set()
            with trio.CancelScope(shield=True):
                with trio.move_on_after(5):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()
            log.info("serving process %d exited (%s)", index, process.returncode)

    # -- frames from a serving process ------------------------------------------------------

    def _on_frame(self, member: _Member, nursery: trio.Nursery, frame: Frame) -> None:
        kind = frame[0]
        if kind in (SUBMIT, CANCEL, INPUT, READ):
            member.forwarded.on_frame(frame)
        elif kind == APPLIED:
            if frame[2] is not None:
                log.error(
                    "serving process %d could not apply a registry change: %s",
                    member.index,
                    frame[2],
                )
            self._answered(member, frame[1])
        elif kind == METRICS:
            member.metrics[frame[1]] = frame[2]
            self._answered(member, frame[1])
        elif kind == READY:
            member.ready = True
        elif kind == CALL:
            nursery.start_soon(self._call, member, frame[1], frame[2], frame[3])
        else:
            log.error("serving process %d sent an unexpected frame (kind %r)", member.index, kind)

    @staticmethod
    def _answered(member: _Member, n: int) -> None:
        event = member.waiting.pop(n, None)
        if event is not None:
            event.set()

    async def _call(self, member: _Member, n: int, method: str, args: tuple[Any, ...]) -> None:
        try:
            await self._model_call(method, args)
        except ServeError as error:
            member.link.post((ANSWER, n, False, error_tuple(error)))
        except Exception as exc:
            log.exception("a management call from serving process %d failed", member.index)
            failure = ServeError(ErrorKind.INTERNAL, f"the management call failed: {exc!r}")
            member.link.post((ANSWER, n, False, error_tuple(failure)))
        else:
            member.link.post((ANSWER, n, True, None))

    async def _tell_ready_workers(self) -> None:
        """Tell each serving process how many workers each forwarded model has ready (its
        health and readiness answers use it), when that changes."""
        while not self._draining or self._members:
            ready = {
                (name, version): entry.model.ready_workers
                for name, version, entry in self._manager.registry
                if forwarded_model(entry.model.settings)
            }
            for member in self._members.values():
                if member.ready_told != ready:
                    member.ready_told = ready
                    member.link.post((READY_WORKERS, ready))
            await trio.sleep(READY_INTERVAL)


__all__ = ["ServingProcesses", "Setup"]
