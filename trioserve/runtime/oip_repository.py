"""The Open Inference Protocol's model repository extension, sans protocol.

``index`` lists the registered model versions; ``load`` registers a model from the model
store; ``unload`` unregisters every version of one. REST (``/v2/repository/...``) and gRPC
(``RepositoryIndex``, ``RepositoryModelLoad``, ``RepositoryModelUnload``) both call these,
so the two answer the same. Loading and unloading go through the
:class:`~trioserve.runtime.management.ManagementService` and are refused like TorchServe's
register when the model API is disabled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from trioserve.core.errors import ErrorKind, ServeError
from trioserve.runtime.dataplane import Dataplane
from trioserve.runtime.management import model_api_disabled


class ModelControl(Protocol):
    """What loading and unloading need: the control process's
    :class:`~trioserve.runtime.management.ManagementService`, or in another serving process
    its stand-in, which makes the same calls over the link."""

    @property
    def enable_model_api(self) -> bool: ...

    async def register(self, params: Mapping[str, Any]) -> object: ...

    async def unregister(self, name: str, version: str | None) -> object: ...


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One registered model version: ``READY`` when a worker is ready, else
    ``UNAVAILABLE`` with the reason."""

    name: str
    version: str
    state: str
    reason: str


def index(dataplane: Dataplane, *, only_ready: bool = False) -> list[IndexEntry]:
    """Every registered model version (``only_ready``: the ready ones)."""
    listed = []
    for name, version, model in dataplane.registered():
        ready = model.ready_workers > 0
        if ready:
            listed.append(IndexEntry(name, version, "READY", ""))
        elif not only_ready:
            listed.append(IndexEntry(name, version, "UNAVAILABLE", "no worker is ready"))
    return listed


async def load(dataplane: Dataplane, management: ModelControl, name: str) -> None:
    """Register ``name`` from the model store, ``<name>.mar`` or else the folder ``<name>``,
    with one worker unless its model-config says otherwise. A model already registered
    stays as it is."""
    if not management.enable_model_api:
        raise model_api_disabled()
    try:
        dataplane.model(name)
        return
    except ServeError as error:
        if error.kind is not ErrorKind.NOT_FOUND:
            raise
    params = {"model_name": name, "initial_workers": "1", "synchronous": "true"}
    try:
        await management.register({**params, "url": f"{name}.mar"})
    except ServeError as error:
        if error.kind is not ErrorKind.NOT_FOUND:
            raise
        await management.register({**params, "url": name})


async def unload(dataplane: Dataplane, management: ModelControl, name: str) -> None:
    """Unregister every version of ``name`` (404 when none is registered)."""
    if not management.enable_model_api:
        raise model_api_disabled()
    for version in dataplane.versions(name)[::-1]:  # NOT_FOUND: none registered
        await management.unregister(name, version)


__all__ = ["IndexEntry", "ModelControl", "index", "load", "unload"]
