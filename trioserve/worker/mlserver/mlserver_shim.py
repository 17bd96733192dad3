"""Lets unmodified MLServer runtimes ``import mlserver.*`` without the ``mlserver`` package.

:func:`install` puts a finder on ``sys.meta_path`` that answers for ``mlserver`` and the
``mlserver.*`` modules runtimes use, mapping each to a :mod:`trioserve.model` module (the
same module object, so classes are shared: ``mlserver.types.InferenceRequest is
trioserve.model.types.InferenceRequest``). Nothing named ``mlserver`` is written anywhere;
when the real ``mlserver`` package is importable the finder is not installed and the real
package is used.

Unlike the ``ts`` hook, every name here (``mlserver`` itself included) is a real trioserve
module, so there are no synthetic packages. ``mlserver.types`` is one module here (a package
with ``dataplane`` / ``model_repository`` in MLServer): import its names from
``mlserver.types``. Any ``mlserver.*`` name not in :data:`ALIASES`
fails with a ModuleNotFoundError that says what trioserve provides.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import types
from collections.abc import Sequence
from typing import Final

from trioserve.worker.alias_loader import AliasHook, AliasLoader

ALIASES: Final[dict[str, str]] = {
    "mlserver": "trioserve.model",
    "mlserver.model": "trioserve.model.model",
    "mlserver.types": "trioserve.model.types",
    "mlserver.settings": "trioserve.model.settings",
    "mlserver.errors": "trioserve.model.errors",
    "mlserver.utils": "trioserve.model.utils",
    "mlserver.metrics": "trioserve.model.metrics",
    "mlserver.codecs": "trioserve.model.codecs",
    "mlserver.codecs.base": "trioserve.model.codecs.base",
    "mlserver.codecs.errors": "trioserve.model.codecs.errors",
    "mlserver.codecs.utils": "trioserve.model.codecs.utils",
    "mlserver.codecs.lists": "trioserve.model.codecs.lists",
    "mlserver.codecs.numpy": "trioserve.model.codecs.numpy",
    "mlserver.codecs.string": "trioserve.model.codecs.string",
    "mlserver.codecs.base64": "trioserve.model.codecs.base64",
    "mlserver.codecs.datetime": "trioserve.model.codecs.datetime",
    "mlserver.codecs.decorator": "trioserve.model.codecs.decorator",
}

# Why some MLServer modules are missing, for the error message.
_NOT_PROVIDED_HINTS: Final[dict[str, str]] = {
    "mlserver.codecs.pandas": "PandasCodec needs pandas and is not provided",
    "mlserver.server": "trioserve is the server; MLServer's own is not provided",
}


class MlserverFinder(importlib.abc.MetaPathFinder):
    """Resolves ``mlserver`` and the ``mlserver.*`` names of :data:`ALIASES`."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "mlserver" and not fullname.startswith("mlserver."):
            return None
        if fullname in ALIASES:
            target_name = ALIASES[fullname]
            is_package = hasattr(importlib.import_module(target_name), "__path__")
            return importlib.machinery.ModuleSpec(
                fullname, AliasLoader(target_name), is_package=is_package
            )
        hint = _NOT_PROVIDED_HINTS.get(fullname)
        reason = f" ({hint})" if hint else ""
        raise ModuleNotFoundError(
            f"No module named {fullname!r}{reason}: the MLServer package is not installed and "
            f"trioserve provides only {', '.join(sorted(ALIASES))}",
            name=fullname,
        )


_hook = AliasHook("mlserver", MlserverFinder, lambda name: name in ALIASES)
installed = _hook.installed
install = _hook.install
uninstall = _hook.uninstall
