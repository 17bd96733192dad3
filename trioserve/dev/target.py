"""What ``trioserve dev PATH`` serves, and which file changes reload it (sans-IO).

The caller looks at the file system (is PATH a folder, what does the folder hold) and hands
the answers here; nothing in this module reads a file.

PATH is one of:

- a handler file (``handler.py``): a TorchServe handler, served from its folder. Files
  beside it take the parts ``torch-model-archiver`` flags would give them: one weights file
  (``*.pt``, ``*.pth``, ...; ``model.*`` first when there are several) is the serialized
  file, ``model.py`` the model file, ``model-config.yaml`` the config file and
  ``requirements.txt`` the requirements file;
- a folder with ``MAR-INF/MANIFEST.json`` (an unpacked archive) or ``model-settings.json``
  (an MLServer model): served as ``trioserve start`` serves such a folder in a model store;
- any other folder: a handler folder, whose handler is ``handler.py``, else its one
  ``*_handler.py``, else its one Python file other than ``model.py``.
"""

from __future__ import annotations

import enum
import fnmatch
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath, PurePosixPath
from typing import Any, Final

MANIFEST_FOLDER: Final = "MAR-INF"
MODEL_SETTINGS: Final = "model-settings.json"
MODEL_CONFIG: Final = "model-config.yaml"
MODEL_FILE: Final = "model.py"
REQUIREMENTS: Final = "requirements.txt"
HANDLER_FILE: Final = "handler.py"
DEV_VERSION: Final = "1.0"
WEIGHT_SUFFIXES: Final = (".pt", ".pth", ".bin", ".safetensors", ".ckpt", ".onnx")
# Sample request bodies, best first: the first of these names beside the model is used.
SAMPLE_STEMS: Final = ("sample", "sample_input", "sample_text", "example")
SAMPLE_SUFFIXES: Final = (".json", ".txt", ".jpg", ".jpeg", ".png", ".bin")


class DevError(Exception):
    """PATH cannot be served by ``trioserve dev``; the message says why and what to do."""


class TargetKind(enum.Enum):
    HANDLER = "TorchServe handler"
    MLSERVER = "MLServer model"
    ARCHIVE = "unpacked model archive"


@dataclass(frozen=True)
class DevTarget:
    """A model to serve in place.

    ``folder`` is the model directory, which is also the folder watched. ``name`` is None
    when the folder's own metadata names the model (``model-settings.json``'s ``name``, the
    manifest's ``modelName``), with the folder's name as the fallback. For a handler,
    ``handler`` is the handler file in ``folder`` and ``parts`` the manifest's ``model``
    keys the files beside it give (``serializedFile``, ``modelFile``, ...).
    """

    kind: TargetKind
    folder: PurePath
    name: str | None
    handler: str | None = None
    parts: dict[str, str] = field(default_factory=dict)
    sample: str | None = None

    @property
    def config_file(self) -> str | None:
        """The handler's ``model-config.yaml``, when one sits beside it."""
        return self.parts.get("configFile")

    def manifest(self) -> dict[str, Any]:
        """A handler's ``MANIFEST.json``, as ``torch-model-archiver`` would write it."""
        if self.kind is not TargetKind.HANDLER or self.handler is None or self.name is None:
            raise ValueError("only a handler target has a derived manifest")
        model = {"modelName": self.name, "handler": self.handler, "modelVersion": DEV_VERSION}
        model.update(self.parts)
        return {"runtime": "python", "model": model}


def resolve_target(
    path: PurePath,
    *,
    is_dir: bool,
    names: Collection[str],
    model_name: str | None = None,
) -> DevTarget:
    """The model ``path`` names. ``names`` are the entries of the folder served: ``path``
    itself for a folder, the handler's folder for a file. ``model_name`` is
    ``--model-name``."""
    if model_name is not None and not model_name.strip():
        raise DevError("--model-name must not be empty")
    sample = find_sample(names)
    if not is_dir:
        if path.suffix != ".py":
            raise DevError(
                f"{path.name} is not a handler file (*.py) or a model folder; dev serves "
                "files in place, so unpack an archive first (or serve it with trioserve start)"
            )
        return _handler_target(path.parent, path.name, names, model_name or path.stem, sample)
    if MANIFEST_FOLDER in names:
        return DevTarget(TargetKind.ARCHIVE, path, model_name, sample=sample)
    if MODEL_SETTINGS in names:
        return DevTarget(TargetKind.MLSERVER, path, model_name, sample=sample)
    handler = _folder_handler(path, names)
    return _handler_target(path, handler, names, model_name or path.name, sample)


def _handler_target(
    folder: PurePath, handler: str, names: Collection[str], name: str, sample: str | None
) -> DevTarget:
    parts: dict[str, str] = {}
    weights = find_weights(names)
    if weights is not None:
        parts["serializedFile"] = weights
    if MODEL_FILE in names and handler != MODEL_FILE:
        parts["modelFile"] = MODEL_FILE
    if REQUIREMENTS in names:
        parts["requirementsFile"] = REQUIREMENTS
    if MODEL_CONFIG in names:
        parts["configFile"] = MODEL_CONFIG
    return DevTarget(TargetKind.HANDLER, folder, name, handler, parts, sample)


def _folder_handler(folder: PurePath, names: Collection[str]) -> str:
    """The handler file of a handler folder (see the module's docstring)."""
    sources = sorted(n for n in names if n.endswith(".py") and not n.startswith("."))
    if HANDLER_FILE in sources:
        return HANDLER_FILE
    for candidates in (
        [n for n in sources if n.endswith("_handler.py")],
        [n for n in sources if n != MODEL_FILE],
    ):
        if len(candidates) == 1:
            return candidates[0]
    if not sources:
        raise DevError(
            f"{folder} holds no handler (*.py), no {MODEL_SETTINGS} and no "
            f"{MANIFEST_FOLDER}/MANIFEST.json: nothing to serve"
        )
    raise DevError(
        f"cannot tell which file of {folder} is the handler ({', '.join(sources)}): name "
        f"it, as in trioserve dev {folder / sources[0]}"
    )


def find_weights(names: Collection[str]) -> str | None:
    """The serialized file beside a handler: the one weights file, or ``model.*`` of
    several; None when there is none or the choice is not clear."""
    weights = sorted(n for n in names if n.endswith(WEIGHT_SUFFIXES))
    if len(weights) == 1:
        return weights[0]
    named = [n for n in weights if n.startswith("model.")]
    return named[0] if len(named) == 1 else None


def find_sample(names: Collection[str]) -> str | None:
    """The sample request body beside the model (``sample.json``, ``sample.txt``, ...)."""
    for stem in SAMPLE_STEMS:
        for suffix in SAMPLE_SUFFIXES:
            if stem + suffix in names:
                return stem + suffix
    return None


# -- what reloads -----------------------------------------------------------------------

# Folders whose changes never reload: caches, tools' state, logs. Hidden folders neither.
IGNORED_DIRS: Final = frozenset(
    {"__pycache__", "node_modules", "logs", "venv", "site-packages", "wandb", "mlruns"}
)
# Files that never reload: compiled Python, editors' swap, backup and lock files, logs,
# the server's own key file.
IGNORED_SUFFIXES: Final = (".pyc", ".pyo", ".swp", ".swo", ".swx", ".swn", ".tmp", ".log",
                           ".bak", "~", "___jb_tmp___", "___jb_old___")  # fmt: skip
IGNORED_NAMES: Final = frozenset({"key_file.json", "4913"})  # 4913: vim's probe file


def triggers_reload(relative: str | PurePath, ignore: Sequence[str] = ()) -> bool:
    """Whether a change of the file at ``relative`` (to the watched folder) reloads the
    model. ``ignore`` holds ``--ignore`` glob patterns, matched against the relative path
    and against the file's name."""
    path = PurePosixPath(PurePath(relative).as_posix())
    if not path.parts or path.is_absolute() or ".." in path.parts:
        return False
    *folders, name = path.parts
    if any(part.startswith(".") or part in IGNORED_DIRS for part in folders):
        return False
    if name.startswith((".", "#")) or name in IGNORED_NAMES or name.endswith(IGNORED_SUFFIXES):
        return False
    text = path.as_posix()
    return not any(fnmatch.fnmatchcase(text, p) or fnmatch.fnmatchcase(name, p) for p in ignore)


def lasting_changes(changes: Iterable[tuple[str, str]]) -> set[str]:
    """The paths of a batch of ``(change, path)`` pairs (change: ``added``, ``modified``,
    ``deleted``) less those both added and deleted in it: a temporary file an editor or
    ``sed -i`` wrote and renamed (or removed) changes nothing by itself."""
    seen: dict[str, set[str]] = {}
    for change, path in changes:
        seen.setdefault(path, set()).add(change)
    return {path for path, kinds in seen.items() if not {"added", "deleted"} <= kinds}


__all__ = [
    "DevError",
    "DevTarget",
    "TargetKind",
    "find_sample",
    "find_weights",
    "lasting_changes",
    "resolve_target",
    "triggers_reload",
]
