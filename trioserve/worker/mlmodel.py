"""An MLServer-style model in the worker: ``model-settings.json`` + an ``MLModel`` class.

:func:`load_mlmodel` imports the ``implementation`` (``module.Class``, the model folder on
``sys.path``), with ``mlserver`` resolving to the real package when it is installed and to
trioserve's :mod:`trioserve.model` otherwise (:mod:`trioserve.worker.mlserver_shim`), builds
its ``ModelSettings`` from the document the server sends, and awaits its ``load()``.

The model's coroutines run on an asyncio event loop the runner owns, in the handler thread.
Each OIP request of a batch becomes an ``InferenceRequest`` (its inputs' data flat, BYTES
elements as ``str`` when UTF-8, else ``bytes``; the request's ``id`` and ``parameters``
and each input's parameters as sent) and the batch's requests are predicted concurrently
(``asyncio.gather``); each ``InferenceResponse``'s outputs go back as OIP output tensors. A
request whose ``predict`` raises fails alone: an ``MLServerError`` with its status code,
anything else with 500 and the exception's text. A request that is not OIP is refused with
400 saying which routes reach the model.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.messages import BatchReply, LoadSpec, Reply, WorkItem
from trioserve.core.oip.tensor import Parameters, Tensor
from trioserve.core.oip.transport import (
    OIP_HEADER,
    OUTPUTS_HEADER,
    REQUEST_HEADER,
    is_tensor_param,
    outputs_reply,
    param_tensor,
)
from trioserve.worker.errors import LoadError

log = logging.getLogger("trioserve.worker")

SETTINGS_FILE = "model-settings.json"


class MLModelRunner:
    """A loaded MLServer-style model and the event loop its coroutines run on."""

    def __init__(self, model: Any, loop: asyncio.AbstractEventLoop, types: Any) -> None:
        self.model = model
        self._loop = loop
        self._types = types

    # -- a batch ------------------------------------------------------------------------

    def reply(self, batch_id: int, items: Sequence[WorkItem]) -> BatchReply:
        """Predict every request of the batch; one reply each, in order."""
        requests: list[Any] = []
        replies: list[Reply | None] = []
        for item in items:
            try:
                requests.append(self._request(item))
                replies.append(None)
            except ServeError as error:
                replies.append(_failed(item.request_id, error.code or 400, error.message))
        results = self._loop.run_until_complete(self._predict_all(requests))
        answers = iter(results)
        merged: list[Reply] = []
        for item, reply in zip(items, replies, strict=True):
            merged.append(reply if reply is not None else self._answer(item, next(answers)))
        return BatchReply(batch_id, 200, "Prediction success", merged, final=True)

    async def _predict_all(self, requests: list[Any]) -> list[Any]:
        return list(
            await asyncio.gather(*(self.model.predict(r) for r in requests), return_exceptions=True)
        )

    def _request(self, item: WorkItem) -> Any:
        """The ``InferenceRequest`` of an OIP work item."""
        if not any(name == OIP_HEADER for name, _value in item.headers):
            raise ServeError(
                ErrorKind.BAD_INPUT,
                f"{self.model.name} is an MLServer model: send Open Inference Protocol "
                f"requests (POST /v2/models/{self.model.name}/infer, or gRPC ModelInfer)",
                code=400,
            )
        described = next((v for k, v in item.headers if k == REQUEST_HEADER), None)
        request: dict[str, Any] = json.loads(described) if described else {}
        types = self._types
        inputs = []
        for param in item.params:
            if not is_tensor_param(param):
                continue
            tensor = param_tensor(param)
            inputs.append(
                types.RequestInput(
                    name=tensor.name,
                    shape=list(tensor.shape),
                    datatype=tensor.datatype,
                    data=_data(tensor),
                    parameters=types.Parameters(**tensor.parameters) if tensor.parameters else None,
                )
            )
        parameters = request.get("parameters")
        return types.InferenceRequest(
            id=request.get("id"),
            parameters=types.Parameters(**parameters) if parameters else None,
            inputs=inputs,
        )

    def _answer(self, item: WorkItem, result: Any) -> Reply:
        if isinstance(result, BaseException):
            status = getattr(result, "status_code", None)
            code = status if isinstance(status, int) and 400 <= status < 600 else 500
            log.error(
                "request %s: %s.predict raised", item.request_id, type(self.model).__name__,
                exc_info=result,
            )  # fmt: skip
            return _failed(item.request_id, code, str(result) or type(result).__name__)
        try:
            outputs = [_output_tensor(output) for output in result.outputs]
        except ServeError as error:
            return _failed(item.request_id, 500, f"the model's response: {error.message}")
        except Exception as exc:
            return _failed(item.request_id, 500, f"the model's response is not usable: {exc}")
        described, body = outputs_reply(outputs)
        headers = {OUTPUTS_HEADER: described}
        return Reply(item.request_id, body, 200, "", headers, "application/octet-stream")

    def close(self) -> None:
        """Await the model's ``unload()`` (when it has one) and close the loop."""
        unload = getattr(self.model, "unload", None)
        try:
            if callable(unload):
                self._loop.run_until_complete(unload())
        except Exception:
            log.exception("unload() of %s raised", type(self.model).__name__)
        finally:
            self._loop.close()


def load_mlmodel(spec: LoadSpec) -> MLModelRunner:
    """Import, build and load the MLServer-style model of ``spec`` (in the handler thread)."""
    from trioserve.worker import mlserver_shim

    assert spec.model_settings is not None
    mlserver_shim.install()
    model_dir = os.path.abspath(spec.model_dir)
    if model_dir in sys.path:
        sys.path.remove(model_dir)
    sys.path.insert(0, model_dir)
    settings_module = importlib.import_module("mlserver.settings")
    types = importlib.import_module("mlserver.types")
    implementation = _import_class(spec.handler)
    document = {**spec.model_settings, "implementation": implementation}
    try:
        settings = settings_module.ModelSettings.model_validate(document)
    except Exception as exc:
        raise LoadError(f"{SETTINGS_FILE} of {spec.model_name}: {exc}") from exc
    _remember_source(settings, os.path.join(model_dir, SETTINGS_FILE))
    model = implementation(settings)
    loop = asyncio.new_event_loop()
    try:
        ready = loop.run_until_complete(model.load())
    except BaseException:
        loop.close()
        raise
    if ready is False:
        loop.close()
        raise LoadError(f"{spec.handler}.load() returned False: the model is not ready")
    model.ready = True
    return MLModelRunner(model, loop, types)


def _import_class(path: str) -> type[Any]:
    module_name, _, class_name = path.rpartition(".")
    if not module_name:
        raise LoadError(f"implementation {path!r} must be 'module.Class'")
    module = importlib.import_module(module_name)
    found = getattr(module, class_name, None)
    if not isinstance(found, type):
        raise LoadError(f"implementation {path!r}: {module_name} has no class {class_name}")
    return found


def _remember_source(settings: Any, path: str) -> None:
    """Where the settings came from, which ``get_model_uri`` resolves relative URIs against
    (MLServer keeps it in the private attribute ``_source``)."""
    try:
        settings._source = path
    except (AttributeError, ValueError, TypeError):
        log.debug("the model settings do not keep their source path")


def _data(tensor: Tensor) -> list[Any]:
    if tensor.datatype != "BYTES":
        return tensor.to_list()
    elements: list[Any] = []
    for value in tensor.to_list():
        try:
            elements.append(value.decode())
        except UnicodeDecodeError:
            elements.append(value)
    return elements


def _output_tensor(output: Any) -> Tensor:
    data = output.data
    data = getattr(data, "root", data)  # MLServer's TensorData is a pydantic RootModel
    return Tensor.from_values(
        output.name,
        output.datatype,
        list(output.shape),
        data,
        _parameters(output.parameters),
        role="output",
    )


def _parameters(parameters: Any) -> Parameters | None:
    """A response output's parameters as plain values (None and nested values dropped)."""
    if parameters is None:
        return None
    found = parameters.model_dump() if hasattr(parameters, "model_dump") else dict(parameters)
    return {
        key: value for key, value in found.items() if isinstance(value, bool | int | float | str)
    }


def _failed(request_id: str, code: int, message: str) -> Reply:
    return Reply(request_id, message.encode(), code, message, {}, "text/plain")


__all__ = ["MLModelRunner", "load_mlmodel"]
