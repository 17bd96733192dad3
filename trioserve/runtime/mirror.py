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
from collections.abc import Iterable
from dataclasses import dataclass

import trio

from trioserve import archive
from trioserve.core.model_settings import ModelSettings
from trioserve.runtime.forward import forwarded_model
from trioserve.runtime.launcher import Launcher
from trioserve.runtime.manager import ModelManager
from trioserve.runtime.model import ModelVersion

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


@dataclass(frozen=True, slots=True)
class Changes:
    """What a serving process does to match a state (:func:`changes`)."""

    add: tuple[VersionState, ...]  # versions it lacks
    keep: tuple[VersionState, ...]  # versions it has: their workers follow the state's
    drop: tuple[tuple[str, str], ...]  # versions no longer registered
    defaults: tuple[tuple[str, str], ...]  # (name, version) to make the default


def changes(have: Iterable[tuple[str, str]], state: State) -> Changes:
    """From the versions registered here (``have``: (name, version)) to ``state``'s. A
    default is taken only for a version the state registers, and before any drop, so that
    a version stays removable (the registry refuses to drop a default that has siblings)."""
    here = set(have)
    wanted = {version.key for version in state.versions}
    return Changes(
        add=tuple(v for v in state.versions if v.key not in here),
        keep=tuple(v for v in state.versions if v.key in here),
        drop=tuple(sorted(here - wanted)),
        defaults=tuple(d for d in state.defaults if d in wanted),
    )


async def apply_state(
    manager: ModelManager, state: State, launcher: Launcher, *, drain_timeout: float
) -> None:
    """Make this serving process's registry match ``state``."""
    plan = changes(((name, number) for name, number, _ in manager.registry), state)

    async def follow(version: VersionState, model: ModelVersion) -> None:
        if not model.forwarded:
            model.min_workers = len(version.workers)
            await model.sync_workers(version.workers, drain_timeout)

    for version in plan.add:

        async def prepare(model: ModelVersion, version: VersionState = version) -> None:
            model.forwarded = forwarded_model(version.settings)
            await follow(version, model)

        await manager.adopt(version.settings, version.loaded, launcher, prepare)
        log.info("serving model %s version %s", *version.key)
    for version in plan.keep:
        await follow(version, manager.get(*version.key))
    for name, number in plan.defaults:
        manager.registry.set_default(name, number)
    async with trio.open_nursery() as nursery:
        for name, number in plan.drop:
            log.info("model %s version %s unregistered", name, number)
            nursery.start_soon(manager.release, name, number)


__all__ = ["Changes", "State", "VersionState", "WorkerSpec", "apply_state", "changes", "state_of"]
