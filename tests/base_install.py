"""What ``pip install trioserve`` (no extras) installs, read from pyproject.toml and this
environment's metadata: for the tests that check that the base install is enough."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, distribution, packages_distributions
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def base_distributions() -> set[str]:
    """The distributions trioserve's base requirements (``[project] dependencies``) need,
    followed through their own requirements without extras (normalised names)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    seen: set[str] = set()
    todo = [Requirement(line) for line in project["dependencies"]]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        key = normalise(req.name)
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = distribution(key).requires or []
        except PackageNotFoundError:
            continue  # another platform's dependency, not installed here
        todo += [Requirement(line) for line in requires]
    return seen


def allowed_modules() -> list[str]:
    """The top-level module names the base distributions provide."""
    base = base_distributions()
    return sorted(
        top
        for top, dists in packages_distributions().items()
        if any(normalise(dist) in base for dist in dists)
    )


def link_base_distributions(folder: Path) -> Path:
    """``folder`` with links to the files of the base distributions as installed in this
    environment (their dist-info folders included), and nothing else: a ``.pth`` file that
    names it gives another Python those packages without pip or an index."""
    return link_distributions(folder, base_distributions())


def link_distributions(folder: Path, keys: Iterable[str]) -> Path:
    """``folder`` with links to the files of the distributions ``keys`` as installed in
    this environment (their dist-info folders included), and nothing else."""
    folder.mkdir()
    for key in keys:
        dist = distribution(key)
        for top in {f.parts[0] for f in dist.files or ()}:
            if top in ("..", "__pycache__", "bin") or top.endswith(".pth"):
                continue
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (folder / top).exists():
                (folder / top).symlink_to(source)
    return folder
