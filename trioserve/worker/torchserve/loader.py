"""Finding, importing and initialising a handler (TorchServe's loading rules).

A handler string is ``[dir/]module[.py][:function]``, split on the first ``:``. The module
part loses its ``.py`` and its directory (which goes on ``sys.path`` with the model dir);
the function defaults to ``handle``. The module is imported by name; if that raises
ImportError, ``ts.torch_handler.<module>`` is tried (the built-in handlers, e.g.
``base_handler``).

* The module has the function: it is the entry point, initialised with ``fn(None, context)``.
* Otherwise the module must define exactly one class: it is instantiated, initialised with
  ``obj.initialize(context)``, and ``obj.handle`` is the entry point.

An envelope (``json``/``body``) wraps the entry point.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType
from typing import Any

from trioserve.core.limits import DEFAULT_LIMITS, RequestLimits
from trioserve.core.messages import LoadSpec
from trioserve.worker.errors import LoadError
from trioserve.worker.torchserve import envelopes, ts_shim
from trioserve.worker.torchserve.batch import Entry
from trioserve.worker.torchserve.util import list_classes_from_module

DEFAULT_FUNCTION = "handle"
BUILTIN_PACKAGE = "ts.torch_handler"


def split_handler(handler: str) -> tuple[str, str, str | None]:
    """``(directory, module name, function or None)`` of a handler string."""
    module_part, _, function = handler.partition(":")
    directory, base = os.path.split(module_part.strip())
    if base.endswith(".py"):
        base = base[: -len(".py")]
    if not base:
        raise LoadError(f"handler {handler!r} names no module")
    return directory, base, function.strip() or None


def add_search_paths(model_dir: str, handler_dir: str) -> list[str]:
    """Put the handler's directory, then the model dir, at the front of ``sys.path``."""
    wanted = []
    if handler_dir:
        path = handler_dir if os.path.isabs(handler_dir) else os.path.join(model_dir, handler_dir)
        wanted.append(os.path.abspath(path))
    wanted.append(os.path.abspath(model_dir))
    for path in reversed(wanted):
        if path in sys.path:
            sys.path.remove(path)
        sys.path.insert(0, path)
    return wanted


def import_handler_module(name: str, searched: list[str] | None = None) -> ModuleType:
    """Import the handler module, falling back to the built-in handler of that name.

    The built-in handlers are found through the ``ts`` import hook (see :mod:`ts_shim`).
    """
    try:
        return importlib.import_module(name)
    except ImportError as own_error:
        builtin = f"{BUILTIN_PACKAGE}.{name}"
        try:
            return importlib.import_module(builtin)
        except ImportError:
            pass
        if isinstance(own_error, ModuleNotFoundError) and own_error.name == name:
            where = f" in {', '.join(searched)}" if searched else ""
            raise LoadError(
                f"handler module {name!r} was not found{where} and is not a built-in "
                f"handler ({builtin})"
            ) from own_error
        raise


def resolve_entry(module: ModuleType, function: str | None, context: Any) -> Entry:
    """Initialise the handler of ``module`` and return its entry point."""
    function_name = function or DEFAULT_FUNCTION
    if hasattr(module, function_name):
        entry = getattr(module, function_name)
        if not callable(entry):
            raise LoadError(f"{module.__name__}.{function_name} is not callable")
        entry(None, context)
        return entry  # type: ignore[no-any-return]
    classes = list_classes_from_module(module)
    if len(classes) != 1:
        names = ", ".join(c.__name__ for c in classes) or "none"
        raise LoadError(
            f"handler module {module.__name__!r} has no function {function_name!r}, so it "
            f"must define exactly one class; it defines {len(classes)} ({names})"
        )
    service = classes[0]()
    handle = getattr(service, "handle", None)
    if not callable(handle):
        raise LoadError(f"handler class {classes[0].__name__} has no handle method")
    initialize = getattr(service, "initialize", None)
    if callable(initialize):
        initialize(context)
    return handle  # type: ignore[no-any-return]


def load_handler(
    handler: str,
    model_dir: str,
    context: Any,
    envelope: str | None = None,
    limits: RequestLimits = DEFAULT_LIMITS,
) -> Entry:
    """Find, import and initialise ``handler``; return the (enveloped) entry point (an
    envelope that parses bodies holds them to ``limits``)."""
    envelopes.validate(envelope)
    directory, module_name, function = split_handler(handler)
    ts_shim.install()
    searched = add_search_paths(model_dir, directory)
    module = import_handler_module(module_name, searched)
    entry = resolve_entry(module, function, context)
    return envelopes.wrap(envelope, entry, limits)


def load_spec_handler(spec: LoadSpec, context: Any) -> Entry:
    """:func:`load_handler` for the model a LOAD frame names."""
    return load_handler(spec.handler, spec.model_dir, context, spec.envelope, spec.request_limits)
