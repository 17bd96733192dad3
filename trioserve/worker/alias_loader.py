"""The loader behind the worker's import hooks (:mod:`trioserve.worker.torchserve.ts_shim`,
:mod:`trioserve.worker.mlserver.mlserver_shim`): an alias is loaded as its target module itself (the
same object, so classes are shared), a package without a target as an empty stand-in."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import types


class AliasLoader(importlib.abc.Loader):
    """Loads an alias as the target module itself, or a package as an empty stand-in."""

    def __init__(self, target: str | None) -> None:
        self._target = target
        self._target_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        if self._target is not None:
            module = importlib.import_module(self._target)
            self._target_spec = module.__spec__
            return module
        package = types.ModuleType(spec.name, "trioserve stand-in for a TorchServe package")
        package.__path__ = []
        return package

    def exec_module(self, module: types.ModuleType) -> None:
        # The import system stamped the alias's spec on the shared module; give the module
        # its own spec back so it stays a normal trioserve module.
        if self._target_spec is not None:
            module.__spec__ = self._target_spec


__all__ = ["AliasLoader"]
