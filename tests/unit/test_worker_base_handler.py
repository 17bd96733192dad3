"""``BaseHandler`` with real (tiny) TorchScript and eager models."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from trioserve.worker.errors import LoadError
from trioserve.worker.torchserve.base_handler import BaseHandler
from trioserve.worker.torchserve.context import Context
from trioserve.worker.torchserve.errors import PredictionException
from trioserve.worker.torchserve.metrics import MetricsCache

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "worker"


def linear() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2).eval()


def save_torchscript(module: torch.nn.Module, path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit is deprecated
        torch.jit.save(torch.jit.trace(module, torch.zeros(1, 3)), str(path))


def make_context(model_dir: Path, model: dict[str, Any]) -> Context:
    return Context(
        "tiny", str(model_dir), {"model": model}, 2, None, "0.12.0", metrics=MetricsCache("tiny")
    )


def start_batch(ctx: Context, headers: dict[str, str] | None = None, n: int = 2) -> None:
    ctx.begin_batch([f"r{i}" for i in range(n)], [dict(headers or {}) for _ in range(n)])


def expected(module: torch.nn.Module, rows: list[list[float]]) -> list[list[float]]:
    with torch.no_grad():
        return module(torch.tensor(rows)).tolist()  # type: ignore[no-any-return]


def assert_close(actual: Any, wanted: list[list[float]]) -> None:
    assert isinstance(actual, list)
    assert len(actual) == len(wanted)
    for got_row, want_row in zip(actual, wanted, strict=True):
        assert got_row == pytest.approx(want_row)


def test_torchscript_model(tmp_path: Path) -> None:
    module = linear()
    save_torchscript(module, tmp_path / "model.pt")
    (tmp_path / "index_to_name.json").write_text(json.dumps({"0": "cat", "1": ["n01", "dog"]}))
    ctx = make_context(tmp_path, {"modelName": "tiny", "serializedFile": "model.pt"})

    handler = BaseHandler()
    handler.initialize(ctx)
    assert handler.initialized
    assert handler.get_device() == torch.device("cpu")
    assert handler.mapping == {"0": "cat", "1": "dog"}

    start_batch(ctx)
    rows = [[1.0, 2.0, 3.0], [0.0, -1.0, 0.5]]
    out = handler.handle(
        [{"body": rows[0]}, {"data": bytearray(json.dumps(rows[1]).encode())}], ctx
    )
    assert_close(out, expected(module, rows))
    (metric,) = ctx.metrics.drain()
    assert (metric["name"], metric["unit"]) == ("HandlerTime", "Milliseconds")


def test_eager_model_with_state_dict(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "fx_linear_model.py", tmp_path / "tiny_model_def.py")
    source = linear()
    torch.save({"fc." + k: v for k, v in source.state_dict().items()}, tmp_path / "weights.pt")
    ctx = make_context(tmp_path, {"serializedFile": "weights.pt", "modelFile": "tiny_model_def.py"})
    handler = BaseHandler()
    handler.initialize(ctx)
    assert type(handler.model).__name__ == "TinyLinear"
    assert handler.mapping is None
    start_batch(ctx, n=1)
    assert_close(handler.handle([{"body": [1.0, 1.0, 1.0]}], ctx), expected(source, [[1.0] * 3]))


def test_describe_and_explain(tmp_path: Path) -> None:
    save_torchscript(linear(), tmp_path / "model.pt")
    ctx = make_context(tmp_path, {"serializedFile": "model.pt"})
    handler = BaseHandler()
    handler.initialize(ctx)

    start_batch(ctx, {"describe": "True"}, n=1)
    assert handler.handle([{"body": [1, 2, 3]}], ctx) == [None]

    start_batch(ctx, {"explain": "True"}, n=1)
    with pytest.raises(PredictionException) as info:
        handler.handle([{"body": [1, 2, 3]}], ctx)
    assert info.value.error_code == 501
    assert "BaseHandler does not explain its answers: override get_insights" in info.value.message

    class Explaining(BaseHandler):
        def get_insights(self, tensor_data: Any, raw_input: Any, target: Any = 0) -> Any:
            return [raw_input, target, tensor_data.tolist()]

    explaining = Explaining()
    explaining.initialize(ctx)
    answer = explaining.handle([{"body": [1, 2, 3], "target": 1}], ctx)
    assert answer == [[1, 2, 3], 1, [[1.0, 2.0, 3.0]]]


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({}, "names no serializedFile"),
        ({"serializedFile": "missing.pt"}, "does not exist"),
        ({"serializedFile": "model.onnx"}, "ONNX"),
        ({"serializedFile": "w.pt", "modelFile": "nope.py"}, "does not exist"),
    ],
)
def test_load_errors(tmp_path: Path, model: dict[str, Any], message: str) -> None:
    with pytest.raises(LoadError, match=message):
        BaseHandler().initialize(make_context(tmp_path, model))


def test_eager_model_file_needs_exactly_one_module_class(tmp_path: Path) -> None:
    (tmp_path / "two_modules_def.py").write_text(
        "import torch\nclass A(torch.nn.Module):\n    pass\nclass B(torch.nn.Module):\n    pass\n"
    )
    ctx = make_context(tmp_path, {"modelFile": "two_modules_def.py"})
    with pytest.raises(LoadError, match=r"exactly one torch\.nn\.Module class"):
        BaseHandler().initialize(ctx)


@pytest.mark.parametrize(
    "pt2",
    [
        {"compile": {"enable": True, "backend": "eager"}},
        {"backend": "eager"},  # TorchServe's older form
        "eager",  # and its oldest
    ],
)
def test_pt2_compile_is_honoured(tmp_path: Path, pt2: Any) -> None:
    shutil.copy(FIXTURES / "fx_linear_model.py", tmp_path / "tiny_model_def.py")
    module = linear()
    torch.save({"fc." + k: v for k, v in module.state_dict().items()}, tmp_path / "weights.pt")
    ctx = make_context(tmp_path, {"serializedFile": "weights.pt", "modelFile": "tiny_model_def.py"})
    ctx.model_yaml_config = {"pt2": pt2}
    handler = BaseHandler()
    handler.initialize(ctx)
    assert type(handler.model).__name__ == "OptimizedModule"  # what torch.compile returns
    start_batch(ctx, n=1)
    assert_close(
        handler.handle([{"body": [1.0, 2.0, 3.0]}], ctx), expected(module, [[1.0, 2.0, 3.0]])
    )


@pytest.mark.parametrize(
    ("pt2", "message"),
    [
        ({"export": {"aot_compile": True}}, "AOTInductor"),
        ({"compile": {"enable": True, "backend": "no-such-backend"}}, "torch.compile refused"),
        ({"compile": {"enable": True, "colour": "blue"}}, "torch.compile refused"),
        ({"compile": "yes"}, "must be a mapping"),
        ({"backend": "eager"}, "does not support compiling torch.jit"),  # a TorchScript model
        (3, "must be a mapping or a backend name"),
    ],
)
def test_pt2_settings_torch_cannot_honour_are_refused(
    tmp_path: Path, pt2: Any, message: str
) -> None:
    save_torchscript(linear(), tmp_path / "model.pt")
    ctx = make_context(tmp_path, {"serializedFile": "model.pt"})
    ctx.model_yaml_config = {"pt2": pt2}
    with pytest.raises(LoadError, match=message):
        BaseHandler().initialize(ctx)


def test_pt2_compile_disabled_leaves_the_model_alone(tmp_path: Path) -> None:
    save_torchscript(linear(), tmp_path / "model.pt")
    ctx = make_context(tmp_path, {"serializedFile": "model.pt"})
    ctx.model_yaml_config = {"pt2": {"compile": {"enable": False, "backend": "eager"}}}
    handler = BaseHandler()
    handler.initialize(ctx)
    assert type(handler.model).__name__ == "RecursiveScriptModule"
