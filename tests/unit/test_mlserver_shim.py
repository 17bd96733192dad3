"""The ``mlserver`` import hook: unmodified MLServer runtimes import ``mlserver.*`` from
trioserve.model."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

import trioserve.model
from trioserve.model import codecs, errors, model, settings, types, utils
from trioserve.worker.mlserver import mlserver_shim

# The real package lives in .venv-mlserver (the e2e tests' MLServer clients); in the test
# environment its absence is what these tests are about.
NO_REAL_MLSERVER = "the real mlserver package must not be installed in the test environment"


@pytest.fixture
def fresh_shim() -> Iterator[None]:
    """Start without the hook and leave without it (restoring a hook that was there)."""
    had = mlserver_shim.installed()
    mlserver_shim.uninstall()
    assert importlib.util.find_spec("mlserver") is None, NO_REAL_MLSERVER
    yield
    mlserver_shim.uninstall()
    if had:
        mlserver_shim.install()


@pytest.mark.usefixtures("fresh_shim")
def test_install_is_idempotent() -> None:
    assert mlserver_shim.install() is True
    assert mlserver_shim.install() is True
    assert sum(isinstance(f, mlserver_shim.MlserverFinder) for f in sys.meta_path) == 1


@pytest.mark.usefixtures("fresh_shim")
def test_names_map_to_the_trioserve_modules() -> None:
    mlserver_shim.install()
    import mlserver
    import mlserver.codecs
    import mlserver.errors
    import mlserver.model
    import mlserver.settings
    import mlserver.types
    import mlserver.utils

    assert mlserver is trioserve.model
    assert mlserver.types is types
    assert mlserver.codecs is codecs
    assert mlserver.settings is settings
    assert mlserver.errors is errors
    assert mlserver.utils is utils
    assert mlserver.model is model
    assert mlserver.MLModel is model.MLModel
    assert mlserver.types.InferenceRequest is types.InferenceRequest
    # The shared modules keep their own identity.
    assert types.__spec__ is not None
    assert types.__spec__.name == "trioserve.model.types"
    assert trioserve.model.__name__ == "trioserve.model"


@pytest.mark.usefixtures("fresh_shim")
def test_every_alias_imports() -> None:
    mlserver_shim.install()
    for name, target in mlserver_shim.ALIASES.items():
        assert importlib.import_module(name) is importlib.import_module(target)


@pytest.mark.usefixtures("fresh_shim")
def test_unknown_names_say_what_is_provided() -> None:
    mlserver_shim.install()
    with pytest.raises(ModuleNotFoundError, match="trioserve provides only mlserver, ") as info:
        importlib.import_module("mlserver.batching.hooks")
    assert info.value.name == "mlserver.batching"
    with pytest.raises(ModuleNotFoundError, match="PandasCodec needs pandas"):
        importlib.import_module("mlserver.codecs.pandas")
    with pytest.raises(ImportError, match="PandasCodec is not provided"):
        from mlserver.codecs import PandasCodec  # noqa: F401
    with pytest.raises(ImportError, match="not its server"):
        from mlserver import MLServer  # noqa: F401


@pytest.mark.usefixtures("fresh_shim")
def test_uninstall_forgets_the_modules() -> None:
    mlserver_shim.install()
    importlib.import_module("mlserver.types")
    mlserver_shim.uninstall()
    assert not mlserver_shim.installed()
    assert "mlserver" not in sys.modules and "mlserver.types" not in sys.modules
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("mlserver")
    # The trioserve modules themselves stay.
    assert sys.modules["trioserve.model.types"] is types


def test_other_names_are_left_alone() -> None:
    finder = mlserver_shim.MlserverFinder()
    assert finder.find_spec("mlserver_sklearn", None) is None
    assert finder.find_spec("json", None) is None


RUNTIME = """
import asyncio
import sys

from trioserve.worker.mlserver import mlserver_shim

assert mlserver_shim.install()

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.settings import ModelSettings
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput

import trioserve.model.types


class EchoModel(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        return InferenceResponse(model_name=self.name, id=payload.id,
            outputs=[ResponseOutput(name=i.name, shape=i.shape, datatype=i.datatype, data=i.data)
                     for i in payload.inputs])


assert InferenceRequest is trioserve.model.types.InferenceRequest
model = EchoModel(ModelSettings(name="echo", implementation=EchoModel))
assert asyncio.run(model.load())
request = InferenceRequest.model_validate(
    {"id": "7", "inputs": [{"name": "x", "shape": [1, 2], "datatype": "INT32", "data": [1, 2]}]}
)
response = asyncio.run(model.predict(request))
print(response.model_dump_json())
print(NumpyCodec.decode_output(response.outputs[0]).tolist())
print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "trio")))
"""


def test_an_unmodified_runtime_runs_in_a_fresh_interpreter() -> None:
    assert mlserver_shim.installed() or importlib.util.find_spec("mlserver") is None, (
        NO_REAL_MLSERVER
    )
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", textwrap.dedent(RUNTIME)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        '{"model_name":"echo","id":"7","outputs":[{"name":"x","shape":[1,2],'
        '"datatype":"INT32","data":[1,2]}]}',
        "[[1, 2]]",
        "[]",  # neither torch nor trio was imported
    ]
