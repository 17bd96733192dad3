"""The dev loop: one server, one model served from its files, one worker, reloaded on edits.

Nursery tree::

    trio.run(_main)
     └─ nursery
         ├─ serve()                       the whole server (trioserve/server.py), model-less
         └─ DevLoop.run
              ├─ _watch                   watchfiles.awatch on the model's folder (anyio on
              │                           trio; its blocking wait runs in a thread)
              └─ _reloads                 one reload at a time; edits made meanwhile are
                                          gathered into the next one

A reload unregisters the model version (queued requests fail with 503, the running batch
finishes within ``unregister_model_timeout``, then the worker process stops), reads the
folder again and registers it anew, so the new process imports the edited code. A model
whose load fails stays registered with its failing worker, so a request is answered 503
with the failure, and the next edit tries again. The first SIGINT/SIGTERM stops watching
and drains the server as ``trioserve start`` does.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import trio
import watchfiles

from trioserve import archive
from trioserve.config import ServerConfig
from trioserve.core.errors import ServeError
from trioserve.core.model_settings import RegisterOptions
from trioserve.dev import announce
from trioserve.dev.target import (
    DevError,
    DevTarget,
    TargetKind,
    lasting_changes,
    resolve_target,
    triggers_reload,
)
from trioserve.foreground import run_until_stopped
from trioserve.runtime.manager import ModelManager
from trioserve.runtime.model import ModelVersion
from trioserve.server import ServerInfo, serve

log = logging.getLogger("trioserve.dev")

# watchfiles: gather changes until none came for STEP_MS (at most DEBOUNCE_MS); wake up at
# least every RUST_TIMEOUT_MS so that a cancellation is never held up for long.
STEP_MS = 200
DEBOUNCE_MS = 1600
RUST_TIMEOUT_MS = 1000


@dataclass(frozen=True)
class DevOptions:
    """The ``trioserve dev`` command line, less what went into the server's configuration."""

    path: Path
    model_name: str | None = None
    ignore: tuple[str, ...] = ()


def inspect(options: DevOptions) -> DevTarget:
    """What ``options.path`` is, from a look at the file system (:func:`resolve_target`)."""
    path = options.path.resolve()
    if not path.exists():
        raise DevError(f"{options.path} does not exist")
    folder = path if path.is_dir() else path.parent
    try:
        names = set(os.listdir(folder))
    except OSError as exc:
        raise DevError(f"cannot read {folder}: {exc}") from None
    return resolve_target(path, is_dir=path.is_dir(), names=names, model_name=options.model_name)


def read_model(target: DevTarget) -> archive.LoadedArchive:
    """The model to register, read from its folder in place (nothing is copied), with one
    worker whatever ``minWorkers`` / ``maxWorkers`` say."""
    folder = Path(target.folder)
    if target.kind is TargetKind.HANDLER:
        manifest = archive.parse_manifest(json.dumps(target.manifest()).encode())
        config = archive.ModelConfig()
        if target.config_file is not None:
            config = archive.parse_model_config((folder / target.config_file).read_bytes())
        loaded = archive.LoadedArchive(folder, folder, manifest, config, extracted=False)
    else:
        loaded = archive.unpack_archive(folder, folder)
    one = dataclasses.replace(loaded.config, min_workers=1, max_workers=1)
    return dataclasses.replace(loaded, config=one)


def dev_config(config: ServerConfig) -> ServerConfig:
    """The server's configuration for dev: no models of its own at start."""
    return dataclasses.replace(config, load_models=())


class DevLoop:
    """Serves one model from its folder and reloads it when a file there changes."""

    def __init__(
        self,
        options: DevOptions,
        target: DevTarget,
        manager: ModelManager,
        *,
        bound: str,
        key: str | None,
        say: Callable[[str], None],
    ) -> None:
        self.options = options
        self.folder = Path(target.folder)
        self._manager = manager
        self._bound = bound
        self._key = key
        self._say = say
        self._current: tuple[str, str] | None = None  # the registered (name, version)
        self._announced: str | None = None  # the curl line printed last
        self._settling: trio.CancelScope | None = None  # the wait for a load to end
        self._stale = False  # edits came since this reload began

    async def run(self, shutdown: trio.Event, first_load_done: Callable[[], None]) -> None:
        """Load the model (then call ``first_load_done``, loaded or not), then reload it on
        every edit, until ``shutdown`` is set, which also ends a load in progress."""
        send, receive = trio.open_memory_channel[set[str]](math.inf)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_when_set, shutdown, nursery.cancel_scope)
            nursery.start_soon(self._watch, send, shutdown)
            await self.reload(first=True)
            first_load_done()
            nursery.start_soon(self._reloads, receive)

    async def _watch(self, send: trio.MemorySendChannel[set[str]], stop: trio.Event) -> None:
        def wanted(_change: watchfiles.Change, path: str) -> bool:
            return triggers_reload(self._relative(path), self.options.ignore)

        async for changes in watchfiles.awatch(
            self.folder,
            watch_filter=wanted,
            step=STEP_MS,
            debounce=DEBOUNCE_MS,
            rust_timeout=RUST_TIMEOUT_MS,
            stop_event=stop,
        ):
            paths = lasting_changes((change.name, self._relative(path)) for change, path in changes)
            if paths:
                send.send_nowait(paths)
                self._stale = True
                if self._settling is not None:  # a load in progress is out of date
                    self._settling.cancel()

    def _relative(self, path: str) -> str:
        return os.path.relpath(path, self.folder)

    async def _reloads(self, receive: trio.MemoryReceiveChannel[set[str]]) -> None:
        async for changed in receive:
            while True:  # the edits made during the last reload go into this one
                try:
                    changed |= receive.receive_nowait()
                except trio.WouldBlock:
                    break
            self._say(announce.changed(changed))
            await self.reload()

    async def reload(self, *, first: bool = False) -> ModelVersion | None:
        """Stop the model's worker, read the folder again, start a new worker; say how it
        went. Returns the model version registered (None if its files were refused)."""
        began = trio.current_time()
        self._stale = False
        if self._current is not None:
            name, version = self._current
            self._current = None
            try:
                await self._manager.unregister(name, version)
            except ServeError as exc:  # gone already (the management API unregistered it)
                log.info("model %s was not registered: %s", name, exc.message)
        try:
            target = await trio.to_thread.run_sync(inspect, self.options)
            loaded = await trio.to_thread.run_sync(read_model, target)
            model = await self._manager.register_loaded(
                RegisterOptions(url=str(self.folder), model_name=target.name, synchronous=False),
                loaded,
            )
        except (DevError, archive.ArchiveError, ServeError, OSError) as exc:
            self._say(
                announce.load_failed(exc.message if isinstance(exc, ServeError) else str(exc))
            )
            return None
        self._current = (model.name, model.version)
        self._announce(target, model, loaded)
        settling = self._settling = trio.CancelScope()
        if self._stale:
            settling.cancel()
        with settling:
            await model.wait_settled()
        self._settling = None
        if settling.cancelled_caught:
            self._say(announce.superseded(model.name))
            return model
        if model.ready_workers == 0:
            reason = next((w.last_error for w in model.workers if w.last_error), "unknown error")
            self._say(announce.load_failed(reason))
            return model
        seconds = trio.current_time() - began
        self._say((announce.loaded if first else announce.reloaded)(model.name, seconds))
        return model

    def _announce(
        self, target: DevTarget, model: ModelVersion, loaded: archive.LoadedArchive
    ) -> None:
        """The serving and curl lines, when they differ from the last ones printed."""
        mlserver = loaded.mlserver
        curl = announce.curl_command(
            self._bound,
            model.name,
            key=self._key,
            oip=mlserver is not None,
            sample=None if target.sample is None else target.folder / target.sample,
            inputs=() if mlserver is None else mlserver.inputs,
        )
        if curl != self._announced:
            self._announced = curl
            kind = target.kind.value
            if target.handler is not None:
                kind = f"{kind} {target.handler}"
            self._say(announce.serving(model.name, kind, target.folder))
            self._say(curl)


async def _cancel_when_set(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


def say(line: str) -> None:
    print(line, file=sys.stdout, flush=True)


async def _serve_dev(
    config: ServerConfig, options: DevOptions, target: DevTarget, ready: Callable[[str], None]
) -> None:
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        info: ServerInfo = await nursery.start(partial(serve, config, shutdown=shutdown))
        bound = info.bound["inference"][0]
        loop = DevLoop(options, target, info.manager, bound=bound, key=info.inference_key, say=say)
        report = "READY " + " ".join(f"{k}={','.join(v)}" for k, v in info.bound.items())
        await loop.run(shutdown, partial(ready, report))


def run_dev(
    config: ServerConfig, options: DevOptions, ready: Callable[[str], None] = lambda _l: None
) -> int:
    """Run ``trioserve dev`` until SIGINT/SIGTERM; returns the exit status. ``ready`` is told
    ``trioserve start``'s report (``READY api=url ...`` once the model's first load is over,
    or ``FAILED reason``) for launchers and tests."""
    try:
        target = inspect(options)
    except DevError as exc:
        print(f"trioserve dev: {exc}", file=sys.stderr)
        ready(f"FAILED {exc}")
        return 2
    return run_until_stopped(
        _serve_dev, dev_config(config), options, target, ready, ready=ready, command="trioserve dev"
    )


__all__ = ["DevLoop", "DevOptions", "dev_config", "inspect", "read_model", "run_dev"]
