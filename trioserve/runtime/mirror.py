"""The registry as every serving process sees it: :class:`State`, taken in the control
process and applied in each other serving process.

The control process owns the registry: management calls change it there, and it starts the
worker processes. After each change it sends the whole :class:`State` to every other serving
process, which makes its own registry match (:func:`apply_state`): it adds the model
versions it lacks (the control process's extracted files, read in place), attaches a
supervisor to each worker the control process lists (``runtime/attach.py``: the worker
takes batches from every serving process), detaches from workers no longer listed, drops
versions no longer registered and takes the default versions. The management call answers
once every serving process has applied the new state, so a change is seen everywhere
before its caller hears of it.

Models the control process serves for everyone (stateful and continuous-batching ones,
``runtime/forward.py``) are added without workers and marked forwarded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import trio

from trioserve import archive
from trioserve.core.errors import ServeError
from trioserve.core.model_settings import ModelSettings
from trioserve.runtime.forward import forwarded_model
from trioserve.runtime.launcher import Launcher
from trioserve.runtime.manager import ModelManager

log = logging.getLogger("trioserve.serving")

WorkerSpec = tuple[int, str, int | None]  # (worker id, name, gpu id)


@dataclass(frozen=True, slots=True)
class VersionState:
    settings: ModelSettings
    loaded: archive.LoadedArchive
    workers: tuple[WorkerSpec, ...]

    @property
    def key(self) -> tuple[str, str]:
        return (self.settings.name, self.settings.version)


@dataclass(frozen=True, slots=True)
class State:
    versions: tuple[VersionState, ...]
    defaults: tuple[tuple[str, str], ...]  # (name, default version)
    # The server's keys as TokenStore.export() gives them; None: token authorization is off.
    tokens: dict[str, tuple[str, float | None]] | None = None


def state_of(
    manager: ModelManager, tokens: dict[str, tuple[str, float | None]] | None = None
) -> State:
    """The control process's registry now."""
    versions = []
    for _name, _version, entry in manager.registry:
        model = entry.model
        workers = tuple((w.id, w.name, w.gpu_id) for w in model.shared_workers)
        versions.append(VersionState(model.settings, entry.loaded, workers))
    defaults = tuple(
        (name, manager.registry.default_version(name)) for name in manager.registry.names()
    )
    return State(tuple(versions), defaults, tokens)


async def apply_state(
    manager: ModelManager, state: State, launcher: Launcher, *, drain_timeout: float
) -> None:
    """Make this serving process's registry match ``state``."""
    wanted = {version.key: version for version in state.versions}
    for version in state.versions:
        name, number = version.key
        try:
            model = manager.get(name, number)
        except ServeError:
            model = await manager.adopt(version.settings, version.loaded, launcher)
            model.forwarded = forwarded_model(version.settings)
            log.info("serving model %s version %s", name, number)
        if not model.forwarded:
            model.min_workers = len(version.workers)
            await model.sync_workers(version.workers, drain_timeout)
    for name, number in state.defaults:
        if (name, number) in wanted:
            manager.registry.set_default(name, number)
    gone = [
        (name, number) for name, number, _entry in manager.registry if (name, number) not in wanted
    ]
    async with trio.open_nursery() as nursery:
        for name, number in gone:
            log.info("model %s version %s unregistered", name, number)
            nursery.start_soon(manager.release, name, number)


__all__ = ["State", "VersionState", "WorkerSpec", "apply_state", "state_of"]
