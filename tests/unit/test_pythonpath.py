"""``trioserve.pythonpath``: what a Python child needs on PYTHONPATH to import trioserve.

The zipapp case (trioserve in shiv's extracted site-packages) is run for real in
tests/e2e/test_binary.py; here, the installs a checkout has."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trioserve import pythonpath

REPO = Path(__file__).resolve().parents[2]
CODE = "from trioserve.pythonpath import child_python_path; print(list(child_python_path()))"


def _child_python_path(cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, cwd=cwd, env=env, check=True
    )
    return done.stdout.strip()


def test_nothing_when_the_interpreter_finds_trioserve_itself(tmp_path: Path) -> None:
    # This venv's install (editable: an import hook, set up again in every child).
    assert _child_python_path(tmp_path) == "[]"


def test_the_folder_trioserve_came_from_when_only_this_process_has_it() -> None:
    # ``python -c`` in the checkout imports trioserve from the working directory, which a
    # child started in a model's folder would not have on its path.
    assert _child_python_path(REPO) == repr([str(REPO)])


def test_child_environment_puts_it_first(monkeypatch: pytest.MonkeyPatch) -> None:
    base = {"PYTHONPATH": "/mine", "OTHER": "1"}
    monkeypatch.setattr(pythonpath, "child_python_path", lambda: ("/from/zipapp",))
    env = pythonpath.child_environment(base)
    assert env == {"PYTHONPATH": f"/from/zipapp{os.pathsep}/mine", "OTHER": "1"}
    assert pythonpath.child_environment({}) == {"PYTHONPATH": "/from/zipapp"}
    monkeypatch.setattr(pythonpath, "child_python_path", lambda: ())
    assert pythonpath.child_environment(base) == base
    assert base == {"PYTHONPATH": "/mine", "OTHER": "1"}  # a copy, not the caller's dict
