"""A serving process's side of its link to the control process: :class:`ControlLink`.

It takes the control process's frames (``core/serving_frames.py``): applies each registry
state in order and says when it has (``runtime/mirror.py``), gives its metrics for a scrape,
hands forwarded requests' replies to the :class:`~trioserve.runtime.forward.Forwarder`, keeps
the forwarded models' ready workers, and sets :attr:`ControlLink.drain` when told to drain.
:class:`RemoteModelControl` makes the inference port's management calls (the Open Inference
Protocol's repository load and unload) in the control process.
"""

from __future__ import annotations

import itertools
import logging
import math
import pickle
from collections.abc import Callable, Mapping
from typing import Any

import trio

from trioserve.core import errors
from trioserve.core.link_frames import Frame
from trioserve.core.serving_frames import (
    ANSWER,
    APPLIED,
    CALL,
    DRAIN,
    FAILED,
    HELLO,
    METRICS,
    PULL_METRICS,
    READY_WORKERS,
    REPLY,
    STATE,
    error_from,
)
from trioserve.runtime.forward import Forwarder
from trioserve.runtime.launcher import Launcher
from trioserve.runtime.manager import ModelManager
from trioserve.runtime.mirror import State, apply_state

log = logging.getLogger("trioserve.serving")


class ControlLink:
    def __init__(self, post: Callable[[Frame], None]) -> None:
        self.post = post
        self.setup: Any = None  # the Setup of the HELLO frame
        self.hello = trio.Event()
        self.drain = trio.Event()
        self.applied = trio.Event()  # the first state is applied: time to take requests
        self.forwarder = Forwarder(post)
        self._states_in, self._states_out = trio.open_memory_channel[tuple[int, bytes]](math.inf)
        self._answers: dict[int, tuple[trio.Event, list[Any]]] = {}
        self._numbers = itertools.count(1)
        self._metrics: Callable[[], bytes] = lambda: b""
        self._manager: ModelManager | None = None

    def on_frame(self, frame: Frame) -> None:
        kind = frame[0]
        if kind in (REPLY, FAILED):
            self.forwarder.on_frame(frame)
        elif kind == STATE:
            self._states_in.send_nowait((frame[1], frame[2]))
        elif kind == PULL_METRICS:
            self.post((METRICS, frame[1], self._metrics()))
        elif kind == ANSWER:
            waiting = self._answers.pop(frame[1], None)
            if waiting is not None:
                waiting[1].append(frame)
                waiting[0].set()
        elif kind == READY_WORKERS:
            self._ready_workers(frame[1])
        elif kind == HELLO:
            self.setup = pickle.loads(frame[1])  # the control process, our parent, wrote it
            self.hello.set()
        elif kind == DRAIN:
            self.drain.set()
        else:
            log.error("the control process sent an unexpected frame (kind %r)", kind)

    def _ready_workers(self, ready: Mapping[tuple[str, str], int]) -> None:
        manager = self._manager
        if manager is None:
            return
        for name, version, entry in manager.registry:
            if entry.model.forwarded:
                entry.model.remote_ready = ready.get((name, version), 0)

    async def apply_states(
        self,
        manager: ModelManager,
        launcher: Launcher,
        *,
        drain_timeout: float,
        metrics: Callable[[], bytes],
        on_tokens: Callable[[dict[str, tuple[str, float | None]]], None],
    ) -> None:
        """Apply each registry state as it comes, in order, and say so (runs forever)."""
        self._manager = manager
        self._metrics = metrics
        async for n, blob in self._states_out:
            state: State = pickle.loads(blob)  # the control process, our parent, wrote it
            if state.tokens is not None:
                on_tokens(state.tokens)
            failure = None
            try:
                await apply_state(manager, state, launcher, drain_timeout=drain_timeout)
            except Exception as exc:
                # This process goes on with what it could apply; the control process is
                # told what failed (it logs it, naming this process) and the traceback is here.
                log.exception("applying the registry's state failed")
                failure = f"{type(exc).__name__}: {exc}"
            self.post((APPLIED, n, failure))
            self.applied.set()

    async def call(self, method: str, *args: Any) -> None:
        """Make management call ``method`` in the control process; raises its error."""
        n = next(self._numbers)
        event = trio.Event()
        answer: list[Any] = []
        self._answers[n] = (event, answer)
        self.post((CALL, n, method, args))
        try:
            await event.wait()
        finally:
            self._answers.pop(n, None)
        if not answer:
            raise errors.shutting_down()
        _kind, _n, ok, error = answer[0]
        if not ok:
            raise error_from(error)

    def closed(self) -> None:
        """The link is gone (the control process ended): nothing more will answer."""
        self.forwarder.close(errors.shutting_down())
        for event, _answer in self._answers.values():
            event.set()


class RemoteModelControl:
    """The management calls of the inference port, made in the control process."""

    def __init__(self, control: ControlLink, *, enable_model_api: bool) -> None:
        self._control = control
        self._enable_model_api = enable_model_api

    @property
    def enable_model_api(self) -> bool:
        return self._enable_model_api

    async def register(self, params: Mapping[str, Any]) -> object:
        await self._control.call("register", dict(params))
        return None

    async def unregister(self, name: str, version: str | None) -> object:
        await self._control.call("unregister", name, version)
        return None


__all__ = ["ControlLink", "RemoteModelControl"]
