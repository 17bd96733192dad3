"""Lets unmodified TorchServe handlers ``import ts.*`` without the ``ts`` package.

:func:`install` puts a finder on ``sys.meta_path`` that answers for ``ts`` and the ``ts.*``
modules handlers use, mapping each to a module of :mod:`trioserve.worker.torchserve` (the same
module object, so classes are shared: ``ts.context.Context is
trioserve.worker.torchserve.context.Context``). Nothing named ``ts`` is written anywhere;
when the real ``ts`` package is importable the finder is not installed and the real package
is used.

The intermediate packages (``ts``, ``ts.torch_handler``, ...) are empty synthetic modules with
an empty ``__path__``, so only the names listed in :data:`ALIASES` resolve; any other
``ts.*`` name fails with a ModuleNotFoundError that says what trioserve provides.
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
    "ts.context": "trioserve.worker.torchserve.context",
    "ts.torch_handler.base_handler": "trioserve.worker.torchserve.base_handler",
    "ts.torch_handler.vision_handler": "trioserve.worker.torchserve.builtin.vision_handler",
    "ts.torch_handler.image_classifier": "trioserve.worker.torchserve.builtin.image_classifier",
    "ts.torch_handler.image_segmenter": "trioserve.worker.torchserve.builtin.image_segmenter",
    "ts.torch_handler.object_detector": "trioserve.worker.torchserve.builtin.object_detector",
    "ts.torch_handler.text_handler": "trioserve.worker.torchserve.builtin.text_handler",
    "ts.torch_handler.text_classifier": "trioserve.worker.torchserve.builtin.text_classifier",
    "ts.handler_utils.timer": "trioserve.worker.torchserve.timer",
    **{
        f"ts.torch_handler.request_envelope.{name}": "trioserve.worker.torchserve.envelopes"
        for name in ("base", "body", "json", "kserve", "kservev2")
    },
    "ts.handler_utils.utils": "trioserve.worker.torchserve.streaming",
    "ts.protocol.otf_message_handler": "trioserve.worker.torchserve.streaming",
    "ts.utils.util": "trioserve.worker.torchserve.util",
    "ts.metrics.dimension": "trioserve.worker.torchserve.metrics",
    "ts.metrics.metric_type_enum": "trioserve.worker.torchserve.metrics",
    "ts.metrics.metric_cache_errors": "trioserve.worker.torchserve.metrics",
    "ts.metrics.metric_cache_abstract": "trioserve.worker.torchserve.metrics",
    "ts.metrics.caching_metric": "trioserve.worker.torchserve.metrics",
}


def _packages() -> frozenset[str]:
    names = {"ts"}
    for alias in ALIASES:
        parts = alias.split(".")
        names.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return frozenset(names)


PACKAGES: Final = _packages()


class TsFinder(importlib.abc.MetaPathFinder):
    """Resolves ``ts`` and the ``ts.*`` names of :data:`ALIASES`."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "ts" and not fullname.startswith("ts."):
            return None
        if fullname in PACKAGES:
            return importlib.machinery.ModuleSpec(fullname, AliasLoader(None), is_package=True)
        if fullname in ALIASES:
            return importlib.machinery.ModuleSpec(fullname, AliasLoader(ALIASES[fullname]))
        raise ModuleNotFoundError(
            f"No module named {fullname!r}: the TorchServe package is not installed and "
            f"trioserve provides only {', '.join(sorted(ALIASES))}",
            name=fullname,
        )


_hook = AliasHook("ts", TsFinder, lambda name: name in PACKAGES or name in ALIASES)
installed = _hook.installed
install = _hook.install
uninstall = _hook.uninstall
