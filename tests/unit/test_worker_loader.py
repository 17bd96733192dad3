"""Handler loading rules (TorchServe's model_loader behaviour)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trioserve.worker.errors import LoadError
from trioserve.worker.torchserve import ts_shim
from trioserve.worker.torchserve.base_handler import BaseHandler
from trioserve.worker.torchserve.context import Context
from trioserve.worker.torchserve.loader import import_handler_module, load_handler, split_handler
from trioserve.worker.torchserve.metrics import MetricsCache

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "worker"


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Restore sys.path, forget imported fixture modules and the ts hook afterwards."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    had_shim = ts_shim.installed()
    before = set(sys.modules)
    yield
    roots = (str(FIXTURES), str(tmp_path))
    for name in set(sys.modules) - before:
        origin = getattr(sys.modules[name], "__file__", None) or ""
        if origin.startswith(roots):
            del sys.modules[name]
    if not had_shim:
        ts_shim.uninstall()


def make_context(model_dir: Path, manifest: dict[str, Any] | None = None) -> Context:
    return Context("m", str(model_dir), manifest, 1, None, "0.12.0", metrics=MetricsCache("m"))


def fixture(name: str) -> str:
    return str(FIXTURES / name)


@pytest.mark.parametrize(
    ("handler", "expected"),
    [
        ("handler.py", ("", "handler", None)),
        ("handler", ("", "handler", None)),
        ("a/b/handler.py:predict", ("a/b", "handler", "predict")),
        ("/abs/dir/h.py:fn", ("/abs/dir", "h", "fn")),
        ("h:fn:extra", ("", "h", "fn:extra")),
        ("h.py:", ("", "h", None)),
    ],
)
def test_split_handler(handler: str, expected: tuple[str, str, str | None]) -> None:
    assert split_handler(handler) == expected


@pytest.mark.parametrize("handler", ["", ":handle", "dir/", ".py"])
def test_split_handler_without_module(handler: str) -> None:
    with pytest.raises(LoadError, match="names no module"):
        split_handler(handler)


@pytest.mark.usefixtures("isolated")
def test_module_function_default_handle(tmp_path: Path) -> None:
    context = make_context(tmp_path)
    entry = load_handler(fixture("fx_echo.py"), str(tmp_path), context)
    module = sys.modules["fx_echo"]
    assert entry is module.handle
    loads = module.LOADS
    assert loads == [context]  # initialised with handle(None, context)


@pytest.mark.usefixtures("isolated")
def test_module_colon_function(tmp_path: Path) -> None:
    context = make_context(tmp_path)
    entry = load_handler(fixture("fx_custom_fn.py") + ":predict", str(tmp_path), context)
    module = sys.modules["fx_custom_fn"]
    assert module.CALLS == [None]
    assert entry([{"body": 1}, {"body": 2}], context) == ["custom", "custom"]


@pytest.mark.usefixtures("isolated")
def test_single_class_is_instantiated_and_initialised(tmp_path: Path) -> None:
    context = make_context(tmp_path)
    entry = load_handler(fixture("fx_single_class.py"), str(tmp_path), context)
    service = entry.__self__  # type: ignore[attr-defined]
    assert type(service).__name__ == "OnlyHandler"
    assert service.context is context
    assert entry([{}], context) == ["only"]


@pytest.mark.usefixtures("isolated")
def test_two_classes_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LoadError, match=r"exactly one class; it defines 2 \(First, Second\)"):
        load_handler(fixture("fx_two_classes.py"), str(tmp_path), make_context(tmp_path))


@pytest.mark.usefixtures("isolated")
def test_no_class_no_function_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LoadError, match=r"no function 'handle'.*it defines 0 \(none\)"):
        load_handler(fixture("fx_no_class.py"), str(tmp_path), make_context(tmp_path))


@pytest.mark.usefixtures("isolated")
def test_missing_function_falls_back_to_the_class_rule(tmp_path: Path) -> None:
    with pytest.raises(LoadError, match="no function 'nope'"):
        load_handler(fixture("fx_two_classes.py") + ":nope", str(tmp_path), make_context(tmp_path))


@pytest.mark.usefixtures("isolated")
def test_handler_found_in_model_dir(tmp_path: Path) -> None:
    (tmp_path / "model_dir_handler.py").write_text(
        "def handle(data, context):\n    return None if data is None else ['md'] * len(data)\n"
    )
    entry = load_handler("model_dir_handler.py", str(tmp_path), make_context(tmp_path))
    assert entry([{}], None) == ["md"]
    assert sys.path[0] == str(tmp_path)


@pytest.mark.usefixtures("isolated")
def test_relative_handler_dir_is_resolved_against_model_dir(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "nested_dir_handler.py").write_text(
        "def handle(data, context):\n    return None if data is None else ['nested']\n"
    )
    entry = load_handler("code/nested_dir_handler.py", str(tmp_path), make_context(tmp_path))
    assert entry([{}], None) == ["nested"]
    assert sys.path[:2] == [str(tmp_path / "code"), str(tmp_path)]


@pytest.mark.usefixtures("isolated")
def test_fallback_to_builtin_base_handler() -> None:
    assert ts_shim.install()
    module = import_handler_module("base_handler")
    assert module.BaseHandler is BaseHandler


@pytest.mark.usefixtures("isolated")
def test_builtin_base_handler_is_loaded_and_initialised(tmp_path: Path) -> None:
    # No model in the manifest: BaseHandler.initialize runs and says so.
    with pytest.raises(LoadError, match="needs a model"):
        load_handler("base_handler", str(tmp_path), make_context(tmp_path, {"model": {}}))


@pytest.mark.usefixtures("isolated")
def test_unknown_module_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LoadError, match=r"'no_such_handler_xyz' was not found.*ts\.torch_handler"):
        load_handler("no_such_handler_xyz.py", str(tmp_path), make_context(tmp_path))


@pytest.mark.usefixtures("isolated")
def test_missing_dependency_of_handler_is_reported_as_such(tmp_path: Path) -> None:
    with pytest.raises(ModuleNotFoundError, match="trioserve_missing_dependency_for_tests"):
        load_handler(fixture("fx_broken_import.py"), str(tmp_path), make_context(tmp_path))


@pytest.mark.usefixtures("isolated")
def test_unsupported_envelope_fails_before_import(tmp_path: Path) -> None:
    with pytest.raises(LoadError, match="envelope 'kserve3' is not supported"):
        load_handler(fixture("fx_custom_fn.py"), str(tmp_path), make_context(tmp_path), "kserve3")
    assert "fx_custom_fn" not in sys.modules


@pytest.mark.usefixtures("isolated")
def test_json_envelope_wraps_the_entry(tmp_path: Path) -> None:
    context = make_context(tmp_path)
    entry = load_handler(fixture("fx_custom_fn.py") + ":predict", str(tmp_path), context, "json")
    data = [{"body": {"instances": [1, 2]}}, {"data": bytearray(b'{"instances": [3]}')}]
    assert entry(data, context) == [
        {"predictions": ["custom", "custom"]},
        {"predictions": ["custom"]},
    ]
    assert sys.modules["fx_custom_fn"].CALLS[-1] == [1, 2, 3]


@pytest.mark.usefixtures("isolated")
def test_body_envelope_is_a_no_op(tmp_path: Path) -> None:
    context = make_context(tmp_path)
    entry = load_handler(fixture("fx_custom_fn.py") + ":predict", str(tmp_path), context, "body")
    assert entry is sys.modules["fx_custom_fn"].predict
