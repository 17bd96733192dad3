"""Work items to MLServer ``InferenceRequest`` objects and ``InferenceResponse`` objects to
replies, for :mod:`trioserve.worker.mlmodel`.

A request's inputs arrive as OIP tensors (:mod:`trioserve.core.oip.transport`): their data
is given flat (BYTES elements as ``str`` when UTF-8, else ``bytes``), with the request's
``id`` and ``parameters`` and each input's parameters as the client sent them. A response's
outputs go back as OIP output tensors, their parameters kept when they are plain values.
"""

from __future__ import annotations

import json
from typing import Any

from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.messages import Reply, WorkItem
from trioserve.core.oip.tensor import Parameters, Tensor
from trioserve.core.oip.transport import (
    OIP_HEADER,
    OUTPUTS_HEADER,
    REQUEST_HEADER,
    RESPONSE_ID_HEADER,
    is_tensor_param,
    outputs_reply,
    param_tensor,
)


def inference_request(types: Any, model_name: str, item: WorkItem) -> Any:
    """The ``InferenceRequest`` (of the ``types`` module in use) of an OIP work item; a
    request that is not OIP is refused with directions."""
    if not any(name == OIP_HEADER for name, _value in item.headers):
        raise ServeError(
            ErrorKind.BAD_INPUT,
            f"{model_name} is an MLServer model: send Open Inference Protocol requests "
            f"(POST /v2/models/{model_name}/infer, or gRPC ModelInfer)",
            code=400,
        )
    described = next((v for k, v in item.headers if k == REQUEST_HEADER), None)
    request: dict[str, Any] = json.loads(described) if described else {}
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


def answer_reply(request_id: str, response: Any) -> Reply:
    """The reply carrying an ``InferenceResponse``'s outputs (500 saying why when an output
    does not hold together)."""
    try:
        outputs = [_output_tensor(output) for output in response.outputs]
    except ServeError as error:
        return failed(request_id, 500, f"the model's response: {error.message}")
    except Exception as exc:
        return failed(request_id, 500, f"the model's response is not usable: {exc}")
    described, body = outputs_reply(outputs)
    headers = {OUTPUTS_HEADER: described}
    if isinstance(response.id, str) and response.id:
        headers[RESPONSE_ID_HEADER] = response.id
    return Reply(request_id, body, 200, "", headers, "application/octet-stream")


def failed(request_id: str, code: int, message: str) -> Reply:
    return Reply(request_id, message.encode(), code, message, {}, "text/plain")


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


__all__ = ["answer_reply", "failed", "inference_request"]
