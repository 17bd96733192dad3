"""Work items to MLServer ``InferenceRequest`` objects and ``InferenceResponse`` objects to
replies, for :mod:`trioserve.worker.mlserver.mlmodel`.

A request's inputs arrive as OIP tensors (:mod:`trioserve.core.oip.transport`): their data
is given flat (BYTES elements as ``str`` when UTF-8, else ``bytes``), with the request's
``id`` and ``parameters`` and each input's parameters as the client sent them. A response's
outputs go back as OIP output tensors, their parameters kept when they are plain values.
"""

from __future__ import annotations

from typing import Any

from trioserve.core import jsontext
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
    request: dict[str, Any] = jsontext.parse(described) if described else {}
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


def merged_request(types: Any, requests: list[Any]) -> tuple[Any, list[int]] | None:
    """MLServer's adaptive batching: the requests as one ``InferenceRequest`` whose inputs
    are theirs concatenated along the first dimension, and each request's share of it (its
    first input's first dimension). None when they cannot be merged (different inputs,
    datatypes or trailing dimensions, or a scalar input)."""
    first = requests[0]
    signature = [(i.name, i.datatype, list(i.shape[1:])) for i in first.inputs]
    if not signature or any(not i.shape for i in first.inputs):
        return None
    for request in requests[1:]:
        if [(i.name, i.datatype, list(i.shape[1:])) for i in request.inputs] != signature:
            return None
        if any(not i.shape for i in request.inputs):
            return None
    inputs = []
    for index, (name, datatype, rest) in enumerate(signature):
        data: list[Any] = []
        rows = 0
        for request in requests:
            tensor = request.inputs[index]
            data.extend(_flat(tensor.data))
            rows += tensor.shape[0]
        parameters = first.inputs[index].parameters
        inputs.append(
            types.RequestInput(
                name=name, shape=[rows, *rest], datatype=datatype, data=data, parameters=parameters
            )
        )
    sizes = [request.inputs[0].shape[0] for request in requests]
    return types.InferenceRequest(parameters=first.parameters, inputs=inputs), sizes


def split_replies(request_ids: list[str], response: Any, sizes: list[int]) -> list[Reply]:
    """Each request's reply from the response to a merged request: every output is cut
    along its first dimension into the requests' shares."""
    shares: list[list[Tensor]] = [[] for _ in sizes]
    for output in response.outputs:
        whole = _output_tensor(output)
        if not whole.shape or whole.shape[0] != sum(sizes):
            raise ServeError(
                ErrorKind.INTERNAL,
                f"output {whole.name!r} has shape {list(whole.shape)}: a batch of "
                f"{sum(sizes)} rows needs its first dimension to be {sum(sizes)} to be split",
                code=500,
            )
        values = whole.to_list()
        per_row = len(values) // sum(sizes) if sum(sizes) else 0
        start = 0
        for share, rows in zip(shares, sizes, strict=True):
            part = values[start : start + rows * per_row]
            start += rows * per_row
            share.append(
                Tensor.from_values(
                    whole.name, whole.datatype, [rows, *whole.shape[1:]], part,
                    whole.parameters, role="output",
                )
            )  # fmt: skip
    replies = []
    for request_id, outputs in zip(request_ids, shares, strict=True):
        described, body = outputs_reply(outputs)
        replies.append(
            Reply(
                request_id, body, 200, "", {OUTPUTS_HEADER: described}, "application/octet-stream"
            )
        )
    return replies


def _flat(data: Any) -> list[Any]:
    data = getattr(data, "root", data)
    if isinstance(data, list | tuple):
        flat: list[Any] = []
        for value in data:
            flat.extend(_flat(value) if isinstance(value, list | tuple) else [value])
        return flat
    return [data]


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


__all__ = ["answer_reply", "failed", "inference_request", "merged_request", "split_replies"]
