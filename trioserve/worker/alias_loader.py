"""What the worker's import hooks share (:mod:`trioserve.worker.torchserve.ts_shim`,
:mod:`trioserve.worker.mlserver.mlserver_shim`): the loader, which loads an alias as its
target module itself (the same object, so classes are shared) and a package without a target
as an empty stand-in, and :class:`AliasHook`, which puts a hook's finder on ``sys.meta_path``
unless the real package is installed."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
import types
from collections.abc import Callable


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


class AliasHook:
    """One import hook: ``make_finder()`` resolves the names of the top-level package
    ``package``; ``provided(name)`` says which loaded modules are the hook's own."""

    def __init__(
        self,
        package: str,
        make_finder: Callable[[], importlib.abc.MetaPathFinder],
        provided: Callable[[str], bool],
    ) -> None:
        self._package = package
        self._make_finder = make_finder
        self._provided = provided
        self._finder: importlib.abc.MetaPathFinder | None = None
        self._lock = threading.Lock()

    def installed(self) -> bool:
        return self._finder is not None and self._finder in sys.meta_path

    def install(self) -> bool:
        """Install the hook unless the real package exists. Idempotent.

        Returns True when the hook is (now or already) installed, False when the real
        package is importable and is left to serve the imports.
        """
        with self._lock:
            if self.installed():
                return True
            name = self._package
            if name in sys.modules or importlib.util.find_spec(name) is not None:
                return False
            self._finder = self._make_finder()
            sys.meta_path.insert(0, self._finder)
            return True

    def uninstall(self) -> None:
        """Remove the hook and forget the modules it provided (for tests)."""
        with self._lock:
            if self._finder is None:
                return
            if self._finder in sys.meta_path:
                sys.meta_path.remove(self._finder)
            self._finder = None
            for name in list(sys.modules):
                if self._provided(name):
                    del sys.modules[name]


__all__ = ["AliasHook", "AliasLoader"]
