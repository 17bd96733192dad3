"""The ``ts`` import hook: unmodified TorchServe handlers import ``ts.*`` from trioserve."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from trioserve.core.frames import decode
from trioserve.core.messages import decode_reply
from trioserve.worker.torchserve import base_handler, context, metrics, streaming, ts_shim, util
from trioserve.worker.torchserve.context import Context
from trioserve.worker.torchserve.errors import PredictionException, batch_error
from trioserve.worker.torchserve.loader import load_handler
from trioserve.worker.torchserve.metrics import MetricsCache

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "worker"


@pytest.fixture
def fresh_shim(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Start without the hook and leave without it (restoring a hook that was there)."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    had = ts_shim.installed()
    ts_shim.uninstall()
    yield
    ts_shim.uninstall()
    sys.modules.pop("fx_shim_handler", None)
    if had:
        ts_shim.install()


@pytest.mark.usefixtures("fresh_shim")
def test_install_is_idempotent() -> None:
    assert importlib.util.find_spec("ts") is None  # the real package is not installed here
    assert ts_shim.install() is True
    assert ts_shim.install() is True
    assert sum(isinstance(f, ts_shim.TsFinder) for f in sys.meta_path) == 1


@pytest.mark.usefixtures("fresh_shim")
def test_names_map_to_the_trioserve_modules() -> None:
    ts_shim.install()
    import ts.context
    import ts.handler_utils.utils
    import ts.metrics.dimension
    import ts.protocol.otf_message_handler
    import ts.torch_handler.base_handler
    import ts.utils.util

    assert ts.context is context
    assert ts.torch_handler.base_handler is base_handler
    assert ts.handler_utils.utils is streaming
    assert ts.protocol.otf_message_handler is streaming
    assert ts.utils.util is util
    assert ts.metrics.dimension is metrics
    assert ts.context.Context is Context
    assert ts.utils.util.PredictionException is PredictionException
    # The shared modules keep their own identity.
    assert context.__spec__ is not None
    assert context.__spec__.name == "trioserve.worker.torchserve.context"
    assert base_handler.__name__ == "trioserve.worker.torchserve.base_handler"


@pytest.mark.usefixtures("fresh_shim")
def test_every_alias_imports() -> None:
    ts_shim.install()
    for name, target in ts_shim.ALIASES.items():
        if target.startswith("trioserve.worker.torchserve.builtin."):
            continue  # these need torchvision: test_worker_builtin_vision.py imports them
        assert importlib.import_module(name) is importlib.import_module(target)


@pytest.mark.usefixtures("fresh_shim")
def test_ts_is_synthetic_not_a_package_on_disk() -> None:
    ts_shim.install()
    import ts

    assert ts.__path__ == []
    assert getattr(ts, "__file__", None) is None


@pytest.mark.usefixtures("fresh_shim")
def test_unknown_ts_module_says_what_is_provided() -> None:
    ts_shim.install()
    with pytest.raises(ModuleNotFoundError, match="provides only") as info:
        importlib.import_module("ts.torch_handler.dali_image_classifier")
    assert info.value.name == "ts.torch_handler.dali_image_classifier"


@pytest.mark.usefixtures("fresh_shim")
def test_not_installed_when_the_real_package_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.machinery.ModuleSpec("ts", None)
    original = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, package=None: real if name == "ts" else original(name, package),
    )
    assert ts_shim.install() is False
    assert not ts_shim.installed()


@pytest.mark.usefixtures("fresh_shim")
def test_uninstall_forgets_the_modules() -> None:
    ts_shim.install()
    import ts.context  # noqa: F401

    ts_shim.uninstall()
    assert "ts" not in sys.modules
    assert "ts.context" not in sys.modules
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("ts.context")


@pytest.mark.usefixtures("fresh_shim")
def test_unmodified_torchserve_handler_runs(tmp_path: Path) -> None:
    ctx = Context("m", str(tmp_path), None, 2, None, "0.12.0", metrics=MetricsCache("m"))
    entry = load_handler(str(FIXTURES / "fx_shim_handler.py"), str(tmp_path), ctx)
    sent: list[bytes] = []
    ctx.begin_batch(
        ["r1", "r2"],
        [{}, {}],
        channel=streaming.IntermediateChannel(7, sent.append),
    )
    assert entry([{"body": "a"}, {"body": "b"}], ctx) == ["final:a", "final:b"]

    (frame,) = sent
    reply = decode_reply(decode(frame))
    assert not reply.final
    assert reply.batch_id == 7
    assert [(r.request_id, bytes(r.body)) for r in reply.replies] == [
        ("r1", b"partial:a"),
        ("r2", b"partial:b"),
    ]
    # BaseHandler.handle recorded HandlerTime.
    assert [m["name"] for m in ctx.metrics.drain()] == ["HandlerTime"]

    with pytest.raises(PredictionException) as info:
        entry([{"body": "refuse"}, {"body": "b"}], ctx)
    assert batch_error(info.value) == (422, "refused")


@pytest.mark.usefixtures("fresh_shim")
def test_torchserve_metric_class_names() -> None:
    ts_shim.install()
    from ts.metrics.caching_metric import CachingMetric
    from ts.metrics.dimension import Dimension
    from ts.metrics.metric_cache_abstract import MetricCacheAbstract
    from ts.metrics.metric_type_enum import MetricTypes

    cache = MetricCacheAbstract("m")
    metric = cache.add_metric_to_cache("Tokens", "count", ["Shard"], MetricTypes.COUNTER)
    assert isinstance(metric, CachingMetric)
    metric.update(2, "r", [Dimension("Shard", 1)])
    assert cache.drain()[0]["dimensions"] == {"Shard": "1"}
