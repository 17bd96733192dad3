"""How an OIP request travels to a worker and its outputs come back (trioserve-internal).

An OIP inference request becomes an ordinary work item (``core/messages.WorkItem``): the
header :data:`OIP_HEADER` marks it, and each input tensor is one parameter whose value is
the tensor's binary form (little-endian, row-major: the frame carries it as a blob, never
re-encoded) and whose content type carries the datatype and shape
(:func:`tensor_param` / :func:`param_tensor`), the tensor's parameters too (as
percent-encoded JSON). The request's own ``id`` and ``parameters``, when it has them, ride in
the header :data:`REQUEST_HEADER` (JSON). The worker answers such a request with the
outputs' binary forms concatenated as the reply body, described by the reply header
:data:`OUTPUTS_HEADER` (``[[name, datatype, [dims...], {parameters}?], ...]`` as JSON;
:func:`outputs_reply` / :func:`reply_outputs`). The adapters then encode the outputs in
their own wire format (REST JSON or binary extension, gRPC typed or raw contents).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, unquote

from trioserve.core import jsontext
from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.messages import Param
from trioserve.core.oip.datatypes import lookup_datatype
from trioserve.core.oip.tensor import Parameters, Tensor

__all__ = [
    "END_HEADER",
    "OIP_HEADER",
    "OUTPUTS_HEADER",
    "REQUEST_HEADER",
    "RESPONSE_ID_HEADER",
    "STREAM_HEADER",
    "TENSOR_CONTENT_TYPE",
    "is_tensor_param",
    "outputs_reply",
    "param_tensor",
    "reply_outputs",
    "request_header",
    "tensor_param",
]

OIP_HEADER = "x-trioserve-oip"  # on a work item: its parameters are OIP input tensors
OUTPUTS_HEADER = "x-trioserve-oip-outputs"  # on a reply: its body is these output tensors
REQUEST_HEADER = "x-trioserve-oip-request"  # on a work item: {"id", "parameters"} as JSON
# On a work item: answer as a stream ("out": this one input; "in": more inputs follow in
# STREAM_INPUT frames until one marked end). The stream's final reply carries END_HEADER and
# no outputs: every answer went before it as an intermediate reply.
STREAM_HEADER = "x-trioserve-oip-stream"
END_HEADER = "x-trioserve-oip-end"
# On a reply: the response id the model chose (an MLServer model's InferenceResponse.id),
# answered instead of the request's.
RESPONSE_ID_HEADER = "x-trioserve-oip-id"
TENSOR_CONTENT_TYPE = "application/x-trioserve-tensor"


def request_header(request_id: str | None, parameters: Parameters) -> tuple[str, str] | None:
    """The :data:`REQUEST_HEADER` of a request with this ``id`` and ``parameters`` (None
    when it has neither)."""
    found: dict[str, Any] = {}
    if request_id:
        found["id"] = request_id
    if parameters:
        found["parameters"] = parameters
    if not found:
        return None
    return REQUEST_HEADER, json.dumps(found, separators=(",", ":"))


def tensor_param(tensor: Tensor) -> Param:
    """The work-item parameter carrying ``tensor``."""
    shape = ",".join(str(dim) for dim in tensor.shape)
    content_type = f"{TENSOR_CONTENT_TYPE}; datatype={tensor.datatype}; shape={shape}"
    if tensor.parameters:
        encoded = quote(json.dumps(tensor.parameters, separators=(",", ":")), safe="")
        content_type = f"{content_type}; parameters={encoded}"
    return Param(tensor.name, tensor.raw, content_type)


def is_tensor_param(param: Param) -> bool:
    return param.content_type is not None and param.content_type.startswith(TENSOR_CONTENT_TYPE)


def param_tensor(param: Param) -> Tensor:
    """The tensor a :func:`tensor_param` parameter carries."""
    fields: dict[str, str] = {}
    for part in (param.content_type or "").split(";")[1:]:
        key, _, value = part.strip().partition("=")
        fields[key] = value
    shape = [int(dim) for dim in fields.get("shape", "").split(",") if dim]
    encoded = fields.get("parameters")
    parameters = jsontext.parse(unquote(encoded)) if encoded else None
    return Tensor.from_raw(
        param.name, fields.get("datatype", ""), shape, param.value, parameters, role="input"
    )


def outputs_reply(outputs: Sequence[Tensor]) -> tuple[str, bytes]:
    """The :data:`OUTPUTS_HEADER` value and the body of a reply carrying ``outputs``."""
    described = [
        [t.name, t.datatype, list(t.shape), t.parameters]
        if t.parameters
        else [t.name, t.datatype, list(t.shape)]
        for t in outputs
    ]
    return json.dumps(described, separators=(",", ":")), b"".join(bytes(t.raw) for t in outputs)


def reply_outputs(headers: Mapping[str, str], body: bytes | bytearray | memoryview) -> list[Tensor]:
    """The output tensors of a worker's reply (a reply without :data:`OUTPUTS_HEADER` is not
    an OIP answer: INTERNAL)."""
    described = headers.get(OUTPUTS_HEADER)
    if described is None:
        raise ServeError(ErrorKind.INTERNAL, "the worker's answer carries no OIP outputs")
    view = memoryview(body).cast("B")
    outputs: list[Tensor] = []
    offset = 0
    for name, datatype, shape, *rest in jsontext.parse(described):
        parameters = rest[0] if rest else None
        info = lookup_datatype(datatype)
        if info.itemsize is not None:
            count = 1
            for dim in shape:
                count *= dim
            size = count * info.itemsize
        else:  # BYTES: walk the length prefixes
            size = _bytes_size(view[offset:], shape)
        outputs.append(
            Tensor.from_raw(name, datatype, shape, view[offset : offset + size], parameters)
        )
        offset += size
    if offset != len(view):
        raise ServeError(ErrorKind.INTERNAL, "the worker's OIP outputs do not add up to its body")
    return outputs


def _bytes_size(view: memoryview, shape: Sequence[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    offset = 0
    for _ in range(count):
        length = int.from_bytes(view[offset : offset + 4], "little")
        offset += 4 + length
    return offset
