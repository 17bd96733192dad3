"""What a child Python process needs on ``PYTHONPATH`` to import this trioserve.

The server starts Python children with ``sys.executable``: workers (``-m trioserve.worker``),
serving processes (``-m trioserve.serving_process``) and, for ``trioserve start``
without ``--foreground``, the server itself (``-m trioserve``). When trioserve is installed
in that interpreter (a venv, ``pip install``, an editable checkout) the child finds it by
itself. When it runs from the one-file zipapp (``make binary``, docs/binary.md) it does not:
``sys.executable`` is then a bare ``python3``, and trioserve and every package it depends on
live in the folder that shiv extracted the zipapp to (``~/.shiv/trioserve.pyz_<id>/
site-packages``), which only the zipapp's own start-up puts on ``sys.path``.

Every place that starts a Python child that imports trioserve builds its environment with
:func:`child_environment`, so such a child imports the same trioserve, and the same
dependencies, as the process that started it.
"""

from __future__ import annotations

import os
import site
import sys
from collections.abc import Mapping
from functools import cache
from pathlib import Path

__all__ = ["child_environment", "child_python_path"]

# The folder that holds the ``trioserve`` package (and, in the zipapp, its dependencies).
_ROOT = str(Path(__file__).resolve().parent.parent)


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _site_dirs() -> list[str]:
    """The site-packages folders the interpreter puts on ``sys.path`` by itself."""
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return dirs


@cache
def child_python_path() -> tuple[str, ...]:
    """The folders a child ``sys.executable`` must import from, besides its own path, to
    import this trioserve and its dependencies.

    Empty when the child finds trioserve by itself: trioserve sits in one of the
    interpreter's site-packages folders, or was found by an import hook rather than through
    a ``sys.path`` folder (an editable install's finder, set up again in every interpreter
    by its ``.pth`` file). Otherwise (the zipapp's extracted site-packages, a checkout run
    with ``python -m trioserve`` from its root) the folder trioserve was imported from.
    """
    on_path = any(_same(entry or ".", _ROOT) for entry in sys.path)
    if not on_path or any(_same(folder, _ROOT) for folder in _site_dirs()):
        return ()
    return (_ROOT,)


def child_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with :func:`child_python_path` in
    front of its ``PYTHONPATH``, for a Python child that imports trioserve."""
    env = dict(os.environ if base is None else base)
    extra = child_python_path()
    if extra:
        env["PYTHONPATH"] = os.pathsep.join(
            entry for entry in (*extra, env.get("PYTHONPATH", "")) if entry
        )
    return env
