"""The bundled demo models: build ``echo.mar``, ``classifier.mar``, ``streaming.mar``,
``stateful.mar`` and ``stateful_stream.mar``, and copy the MLServer model folder ``textgen``.

The handlers live in the repository's ``handlers/`` folder (one folder per model, each with a
README). :func:`build_demo_store` packs them into a model store with
:func:`trioserve.archive.write_archive`, the same code path as ``trioserve-archiver``, so the
archives are ordinary TorchServe ``.mar`` files.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Final

from trioserve.archive import write_archive

__all__ = [
    "DEMO_MODELS",
    "DEMO_VERSION",
    "FOLDER_MODELS",
    "TORCH_MODELS",
    "build_demo_store",
    "handlers_dir",
    "torch_available",
]

DEMO_VERSION: Final = "1.0"
DEMO_MODELS: Final = ("echo", "classifier", "streaming", "stateful", "stateful_stream", "textgen")
# Models that are folders in the store (MLServer's model-settings.json), not archives.
FOLDER_MODELS: Final = frozenset({"textgen"})
# Models whose build needs PyTorch: left out where it is not installed (the one-file binary
# without torch in the environment, docs/binary.md).
TORCH_MODELS: Final = frozenset({"classifier"})


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def handlers_dir() -> Path:
    """The repository's ``handlers/`` folder; a clear error if this install has none."""
    path = Path(__file__).resolve().parents[1] / "handlers"
    if not path.is_dir():
        raise FileNotFoundError(
            f"demo handlers folder not found at {path}: the demo models ship with the trioserve "
            "source tree (handlers/), which this installation does not include; run from a "
            "checkout of the repository"
        )
    return path


def _require(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"demo model file missing: {path}")
    return path


def _load_model_builder(make_model: Path) -> Callable[[Path], Path]:
    """``build`` from ``handlers/classifier/make_model.py`` (not an importable package)."""
    spec = importlib.util.spec_from_file_location("_trioserve_demo_make_model", make_model)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {make_model}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ModuleNotFoundError as exc:
        if exc.name == "torch":
            raise RuntimeError(
                "building the classifier demo model needs PyTorch; install it with "
                "pip install 'trioserve[torch]'"
            ) from exc
        raise
    build: Callable[[Path], Path] = module.build
    return build


def _build_echo(handlers: Path, store: Path, *, force: bool) -> None:
    write_archive(
        model_name="echo",
        version=DEMO_VERSION,
        handler=str(_require(handlers / "echo" / "echo_handler.py")),
        export_path=store,
        force=force,
    )


def _build_classifier(handlers: Path, store: Path, *, force: bool) -> None:
    folder = handlers / "classifier"
    build = _load_model_builder(_require(folder / "make_model.py"))
    with tempfile.TemporaryDirectory(prefix="trioserve-demo-") as tmp:
        weights = build(Path(tmp))
        write_archive(
            model_name="classifier",
            version=DEMO_VERSION,
            handler=str(_require(folder / "classifier_handler.py")),
            export_path=store,
            serialized_file=weights,
            extra_files=[_require(folder / "index_to_name.json")],
            config_file=_require(folder / "model-config.yaml"),
            force=force,
        )


def _build_streaming(handlers: Path, store: Path, *, force: bool) -> None:
    write_archive(
        model_name="streaming",
        version=DEMO_VERSION,
        handler=str(_require(handlers / "streaming" / "stream_handler.py")),
        export_path=store,
        force=force,
    )


def _build_stateful(handlers: Path, store: Path, *, force: bool) -> None:
    folder = handlers / "stateful"
    write_archive(
        model_name="stateful",
        version=DEMO_VERSION,
        handler=str(_require(folder / "stateful_handler.py")),
        export_path=store,
        config_file=_require(folder / "model-config.yaml"),
        force=force,
    )


def _build_stateful_stream(handlers: Path, store: Path, *, force: bool) -> None:
    folder = handlers / "stateful_stream"
    write_archive(
        model_name="stateful_stream",
        version=DEMO_VERSION,
        handler=str(_require(folder / "stream_sum_handler.py")),
        export_path=store,
        config_file=_require(folder / "model-config.yaml"),
        force=force,
    )


def _copy_textgen(handlers: Path, store: Path, *, force: bool) -> None:
    folder = handlers / "textgen"
    target = store / "textgen"
    if force and target.exists():
        shutil.rmtree(target)
    target.mkdir()
    for name in ("model-settings.json", "textgen.py"):
        shutil.copyfile(_require(folder / name), target / name)


def build_demo_store(store: Path, *, force: bool = False) -> list[str]:
    """Create the demo archives in ``store`` (created if missing); return the model names.

    An archive already in the store (``<name>.mar``, or the folder ``textgen``) is kept as it
    is unless ``force`` is true, in which case it is rebuilt. The names come back in a fixed
    order: ``["echo", "classifier", "streaming", "stateful", "stateful_stream", "textgen"]``,
    less ``TORCH_MODELS`` when PyTorch is not installed (those are not built then).
    """
    handlers = handlers_dir()
    store = Path(store)
    store.mkdir(parents=True, exist_ok=True)
    builders: dict[str, Callable[..., None]] = {
        "echo": _build_echo,
        "classifier": _build_classifier,
        "streaming": _build_streaming,
        "stateful": _build_stateful,
        "stateful_stream": _build_stateful_stream,
        "textgen": _copy_textgen,
    }
    names = [n for n in DEMO_MODELS if n not in TORCH_MODELS or torch_available()]
    for name in names:
        built = store / (name if name in FOLDER_MODELS else f"{name}.mar")
        if not force and built.exists():
            continue
        builders[name](handlers, store, force=force)
    return names
