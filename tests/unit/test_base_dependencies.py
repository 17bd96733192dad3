"""trioserve's base install (``pip install trioserve``, no extras) is enough for every module.

Each check runs in a fresh interpreter whose imports of anything that is neither the standard
library, trioserve, nor a distribution that trioserve's base dependencies (pyproject.toml's
``[project] dependencies``, followed through their own requirements) install fail as if it
were not installed: numpy, torch, Pillow, mlserver, httpx, ... It is what a worker sees after
``pip install trioserve``. An optional import (inside a function, or guarded by ``except
ImportError``) is left to do what it does when the package is missing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ..base_install import allowed_modules, base_distributions

REPO = Path(__file__).resolve().parents[2]

# Runs first in the child: ``sys.argv[1]`` (JSON) names the top-level modules that may be
# imported besides the standard library and trioserve, and the distributions whose metadata
# may be read. The others are not found, exactly as if they were not installed
# (``importlib.util.find_spec`` gives None, ``importlib.metadata`` PackageNotFoundError).
BLOCKER = """
import importlib.abc
import json
import os
import sys
import sysconfig

GIVEN = json.loads(sys.argv[1])
ALLOWED = frozenset(GIVEN["modules"]) | {"trioserve"}
DISTRIBUTIONS = frozenset(GIVEN["distributions"]) | {"trioserve"}
STDLIB = tuple(
    os.path.join(os.path.realpath(sysconfig.get_paths()[key]), "")
    for key in ("stdlib", "platstdlib")
)


def in_the_stdlib(spec):
    places = [spec.origin] if spec.has_location else list(spec.submodule_search_locations or [])
    if spec.origin in ("built-in", "frozen"):
        return True
    return places != [] and all(
        os.path.realpath(place).startswith(STDLIB)
        and "site-packages" not in place
        and "dist-packages" not in place
        for place in places
    )


class BaseInstallOnly(importlib.abc.MetaPathFinder):
    \"\"\"The interpreter's finders, which find nothing but the standard library and ALLOWED.\"\"\"

    def __init__(self, finders):
        self.finders = finders

    def find_spec(self, name, path=None, target=None):
        for finder in self.finders:
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if name.partition(".")[0] in ALLOWED or in_the_stdlib(spec):
                    return spec
                return None
        return None

    def find_distributions(self, context=None):
        # importlib.metadata asks the finders too: the others' metadata is not there either.
        for finder in self.finders:
            for dist in getattr(finder, "find_distributions", lambda context: ())(context):
                name = dist.metadata["Name"] or ""
                if name.lower().replace("_", "-").replace(".", "-") in DISTRIBUTIONS:
                    yield dist

    def invalidate_caches(self):
        for finder in self.finders:
            finder.invalidate_caches()


sys.meta_path[:] = [BaseInstallOnly(list(sys.meta_path))]
"""

IMPORT_EVERYTHING = """
import pkgutil
import trioserve

failed = {}
names = [
    module.name
    for module in pkgutil.walk_packages(trioserve.__path__, "trioserve.", onerror=print)
    if module.name != "trioserve.__main__"  # runs the command line
]
for name in names:
    try:
        __import__(name)
    except Exception as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps({"imported": len(names), "failed": failed}))
"""


def run_blocked(code: str) -> dict[str, object]:
    """Run ``code`` (after the blocker) in a fresh interpreter; what it prints last, as JSON."""
    given = {"modules": allowed_modules(), "distributions": sorted(base_distributions())}
    done = subprocess.run(
        [sys.executable, "-c", BLOCKER + code, json.dumps(given)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_the_base_dependencies_leave_out_the_extras() -> None:
    """The check below means something: numpy, torch and Pillow are not base dependencies."""
    base = base_distributions()
    assert {"trio", "pydantic", "quart", "werkzeug"} <= base
    assert {"numpy", "torch", "pillow", "torchvision", "mlserver", "httpx"}.isdisjoint(base)
    allowed = allowed_modules()
    assert "trio" in allowed and "yaml" in allowed
    assert {"numpy", "torch", "PIL"}.isdisjoint(allowed)


# The modules that need an extra to import, and the extra: each fails with a message that
# says how to install it (they are handlers, loaded only by a model that names them).
NEED_AN_EXTRA = {
    "trioserve.worker.torchserve.builtin.vision_handler": "vision",
    "trioserve.worker.torchserve.builtin.image_classifier": "vision",
    "trioserve.worker.torchserve.builtin.image_segmenter": "vision",
    "trioserve.worker.torchserve.builtin.object_detector": "vision",
}


def test_every_module_imports_with_only_the_base_dependencies() -> None:
    found = run_blocked(IMPORT_EVERYTHING)
    failed = found["failed"]
    assert isinstance(failed, dict)
    assert {
        name: f"pip install 'trioserve[{extra}]'" in message
        for name, message in failed.items()
        for extra in [NEED_AN_EXTRA.get(name)]
    } == dict.fromkeys(NEED_AN_EXTRA, True), failed
    assert isinstance(found["imported"], int) and found["imported"] > 150


def test_the_blocker_blocks() -> None:
    """The child cannot import numpy, though this environment has it."""
    code = """
try:
    import numpy
except ModuleNotFoundError as exc:
    print(json.dumps({"error": str(exc), "loaded": "numpy" in sys.modules}))
"""
    assert run_blocked(code) == {
        "error": "No module named 'numpy'",
        "loaded": False,
    }


def test_an_mlserver_model_without_numpy() -> None:
    """A model written against MLServer's API that never touches numpy loads, decodes and
    encodes strings through the codecs (``decode_args`` included); only NumpyCodec says that
    it needs numpy."""
    code = """
from trioserve.worker.mlserver import mlserver_shim

mlserver_shim.install()
from mlserver.codecs import (
    NumpyCodec,
    StringCodec,
    find_input_codec,
    find_request_codec,
)
from mlserver.codecs.decorator import SignatureCodec
from mlserver.codecs.numpy import NUMPY_MISSING
from mlserver.types import InferenceRequest


async def predict(self, text: list[str]) -> list[str]:
    return text


signature = SignatureCodec(predict)
request = InferenceRequest(inputs=[StringCodec.encode_input("text", ["ab", "c"])])
decoded = signature.decode_request(request)
response = signature.encode_response("m", ["x", "yz"], "1")
try:
    NumpyCodec.decode_input(request.inputs[0])
except ModuleNotFoundError as exc:
    missing = str(exc) == NUMPY_MISSING and exc.name == "numpy"
print(json.dumps({
    "decoded": decoded,
    "encoded": [bytes(x).decode() for x in response.outputs[0].data.root],
    "np": find_input_codec("np") is NumpyCodec and find_request_codec("np") is not None,
    "can_encode": NumpyCodec.can_encode([1, 2]),
    "type_hint": NumpyCodec.TypeHint.__name__,
    "missing": missing,
    "loaded": "numpy" in sys.modules,
}))
"""
    assert run_blocked(code) == {
        "decoded": {"text": ["ab", "c"]},
        "encoded": ["x", "yz"],
        "np": True,
        "can_encode": False,
        "type_hint": "_NoNumpy",
        "missing": True,
        "loaded": False,
    }


def test_numpy_is_imported_only_when_an_array_is_coded() -> None:
    """With numpy installed: importing the model API does not import it; the first array
    does, and NumpyCodec then works as before (its behaviour is tested in
    test_model_codecs.py)."""
    code = """
import json
import sys

import trioserve.model
from trioserve.model.codecs import NumpyCodec, find_input_codec

before = "numpy" in sys.modules
hint = NumpyCodec.TypeHint
import numpy

print(json.dumps({
    "before": before,
    "hint": hint is numpy.ndarray,
    "by_hint": find_input_codec(type_hint=numpy.ndarray) is NumpyCodec,
    "can_encode": NumpyCodec.can_encode(numpy.zeros(2)),
    "encoded": NumpyCodec.encode_output("x", numpy.arange(3)).data.root,
}))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "before": False,
        "hint": True,
        "by_hint": True,
        "can_encode": True,
        "encoded": [0, 1, 2],
    }
