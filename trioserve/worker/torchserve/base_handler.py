"""``BaseHandler``: the default handler for a PyTorch model (``ts.torch_handler.base_handler``).

``initialize`` picks the device, loads the model named by the manifest (TorchScript from
``serializedFile`` when there is no ``modelFile``; otherwise the one ``nn.Module`` class of
``modelFile`` with the ``serializedFile`` state dict, loaded with ``weights_only=True``) and
the optional ``index_to_name.json`` label map. ``handle`` runs describe, or
preprocess -> inference -> postprocess, and records ``HandlerTime``.

torch is imported inside the methods, so importing this module does not need torch. This
module defines exactly one class: it doubles as the handler module ``base_handler``.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import time
import warnings
from typing import Any

from trioserve.core import jsontext
from trioserve.worker.errors import LoadError
from trioserve.worker.torchserve.errors import PredictionException
from trioserve.worker.torchserve.util import list_classes_from_module, load_label_mapping

log = logging.getLogger("trioserve.worker")

MAPPING_FILE = "index_to_name.json"


def compile_as_configured(model: Any, pt2: Any) -> Any:
    """``model`` through ``torch.compile`` as model-config.yaml's ``pt2`` asks, TorchServe's
    forms: ``pt2: {compile: {enable: true, backend: ..., mode: ...}}``, the older ``pt2:
    {backend: ..., mode: ...}`` and ``pt2: BACKEND``. ``pt2.export`` (AOTInductor) and options
    ``torch.compile`` does not take are refused with a :class:`LoadError`."""
    import torch

    if pt2 is None:
        return model
    if isinstance(pt2, str):
        options: dict[str, Any] = {"backend": pt2}
    elif isinstance(pt2, dict) and "export" in pt2:
        raise LoadError("model-config pt2.export (AOTInductor) is not supported by trioserve")
    elif isinstance(pt2, dict) and "compile" in pt2:
        compile_settings = pt2["compile"]
        if not isinstance(compile_settings, dict):
            raise LoadError("model-config pt2.compile must be a mapping")
        if compile_settings.get("enable") is not True:
            return model
        options = {k: v for k, v in compile_settings.items() if k != "enable"}
    elif isinstance(pt2, dict):
        options = dict(pt2)
    else:
        raise LoadError(f"model-config pt2 must be a mapping or a backend name, not {pt2!r}")
    try:
        compiled = torch.compile(model, **options)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise LoadError(f"model-config pt2: torch.compile refused {options}: {exc}") from exc
    log.info("compiled the model with torch.compile(%s)", options)
    return compiled


class BaseHandler:
    """Loads a PyTorch model and answers with ``postprocess(inference(preprocess(data)))``."""

    def __init__(self) -> None:
        self.model: Any = None
        self.mapping: dict[str, str] | None = None
        self.device: Any = None
        self.initialized = False
        self.context: Any = None
        self.model_pt_path: str | None = None
        self.manifest: dict[str, Any] | None = None
        self.map_location: str | None = None
        self.explain = False
        self.target = 0
        self.model_yaml_config: dict[str, Any] = {}

    # -- loading ------------------------------------------------------------------------------

    def initialize(self, context: Any) -> None:
        import torch

        self.context = context
        properties = context.system_properties
        gpu_id = properties.get("gpu_id")
        if gpu_id is not None and torch.cuda.is_available():
            self.map_location = "cuda"
            self.device = torch.device(f"cuda:{gpu_id}")
        else:
            self.map_location = "cpu"
            self.device = torch.device("cpu")
        self.manifest = context.manifest
        self.model_yaml_config = getattr(context, "model_yaml_config", None) or {}

        model_dir = properties.get("model_dir") or "."
        model_info = (self.manifest or {}).get("model") or {}
        serialized_file = model_info.get("serializedFile")
        model_file = model_info.get("modelFile")
        self.model_pt_path = os.path.join(model_dir, serialized_file) if serialized_file else None

        if model_file:
            self.model = self._load_pickled_model(model_dir, model_file, self.model_pt_path)
        elif self.model_pt_path is None:
            raise LoadError(
                "BaseHandler needs a model: the manifest names no serializedFile "
                "(TorchScript) and no modelFile (eager model)"
            )
        elif self.model_pt_path.endswith((".onnx", ".so")):
            raise LoadError(
                f"{serialized_file}: ONNX and AOTInductor models are not supported by "
                "trioserve's BaseHandler; use TorchScript or an eager modelFile"
            )
        else:
            self.model = self._load_torchscript_model(self.model_pt_path)
        self.model.eval()
        self.model = compile_as_configured(self.model, self.model_yaml_config.get("pt2"))
        self.mapping = load_label_mapping(os.path.join(model_dir, MAPPING_FILE))
        self.initialized = True

    def _load_torchscript_model(self, model_pt_path: str) -> Any:
        import torch

        if not os.path.isfile(model_pt_path):
            raise LoadError(f"model file {model_pt_path} does not exist")
        with warnings.catch_warnings():
            # torch.jit is deprecated; serving an existing TorchScript archive is still fine.
            warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*torch.jit")
            jit_load: Any = torch.jit.load
            return jit_load(model_pt_path, map_location=self.device)

    def _load_pickled_model(
        self, model_dir: str, model_file: str, model_pt_path: str | None
    ) -> Any:
        import torch

        path = os.path.join(model_dir, model_file)
        if not path.endswith(".py"):
            path += ".py"
        if not os.path.isfile(path):
            raise LoadError(f"model definition file {path} does not exist")
        name = os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise LoadError(f"cannot import model definition file {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        classes = list_classes_from_module(module, torch.nn.Module)
        if len(classes) != 1:
            names = [c.__name__ for c in classes] or "none"
            raise LoadError(
                f"{model_file} must define exactly one torch.nn.Module class, found {names}"
            )
        model = classes[0]()
        if model_pt_path is not None:
            if not os.path.isfile(model_pt_path):
                raise LoadError(f"model weights file {model_pt_path} does not exist")
            state_dict = torch.load(model_pt_path, map_location=self.device, weights_only=True)
            model.load_state_dict(state_dict)
        return model.to(self.device)

    # -- the pipeline -------------------------------------------------------------------------

    def preprocess(self, data: list[Any]) -> Any:
        """A tensor stacking each request's ``data`` (or ``body``) value."""
        import torch

        rows = []
        for index, row in enumerate(data):
            value = row
            if isinstance(row, dict):
                value = row["data"] if "data" in row else row.get("body")
            if isinstance(value, bytes | bytearray):
                try:
                    value = jsontext.parse(bytes(value))
                except jsontext.JSONError as exc:
                    raise PredictionException(
                        f"request {index}: body is not JSON: {exc}", 400
                    ) from None
            rows.append(value)
        return torch.as_tensor(rows, device=self.device)

    def inference(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        import torch

        with torch.inference_mode():
            return self.model(data.to(self.device), *args, **kwargs)

    def postprocess(self, data: Any) -> Any:
        return data.tolist()

    def handle(self, data: list[Any], context: Any) -> Any:
        start = time.time()
        self.context = context
        if self._is_describe():
            output = [self.describe_handle()]
        else:
            preprocessed = self.preprocess(data)
            if self._is_explain():
                output = self.explain_handle(preprocessed, data)
            else:
                output = self.postprocess(self.inference(preprocessed))
        metrics = getattr(context, "metrics", None)
        if metrics is not None:
            metrics.add_time("HandlerTime", round((time.time() - start) * 1000, 2), None, "ms")
        return output

    def _header(self, key: str) -> Any:
        try:
            return self.context.get_request_header(0, key)
        except (AttributeError, IndexError, KeyError, RuntimeError, TypeError):
            return None

    def _is_describe(self) -> bool:
        return bool(self._header("describe") == "True")

    def _is_explain(self) -> bool:
        if self._header("explain") == "True":
            self.explain = True
            return True
        return False

    def explain_handle(self, data_preprocess: Any, raw_data: Any) -> Any:
        """TorchServe's: the first request's ``data`` (or ``body``) and ``target`` (default
        0) go to :meth:`get_insights` with the preprocessed batch."""
        row = raw_data[0] if raw_data else None
        inputs, target = None, 0
        if isinstance(row, dict):
            inputs = row.get("data") or row.get("body")
            target = row.get("target") or 0
        return self.get_insights(data_preprocess, inputs, target)

    def get_insights(self, tensor_data: Any, raw_input: Any, target: Any = 0) -> Any:
        raise PredictionException(
            f"{type(self).__name__} does not explain its answers: override get_insights (or "
            "explain_handle) in the handler; TorchServe's image handlers do it with captum",
            501,
        )

    def describe_handle(self) -> Any:
        """Custom metadata for the describe API; None by default."""
        return None

    def get_device(self) -> Any:
        return self.device
