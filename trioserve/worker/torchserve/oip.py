"""OIP requests in the worker: TorchServe's KServe v2 envelope, batched.

A work item marked with :data:`~trioserve.core.oip.transport.OIP_HEADER` carries one
parameter per input tensor. The handler sees it the way TorchServe's ``kservev2`` envelope
shows it: one row per input, ``{"name", "shape", "datatype", "data"}`` with ``data`` nested
in the tensor's shape (BYTES elements as ``str`` when UTF-8, else ``bytes``), and answers
one element per row, which becomes the output named after that row's input. Unlike
TorchServe's envelope (which reads only the first request of a batch), every OIP request
of a batch is expanded, so OIP requests batch like any other; plain requests in the same
batch keep their usual rows.

:func:`expand` turns a batch into the rows the handler gets (each row keeps its request's
id and headers, so ``context.get_request_header(idx, ...)`` answers for the row's request);
:func:`wrap_entry` turns each OIP row's answer into a tensor (body: its binary form, a
header describing it); :func:`merge` joins a request's rows back into one reply whose body is
its outputs (see :func:`~trioserve.core.oip.transport.outputs_reply`).

An answer becomes a tensor by its Python type: a torch tensor or numpy array keeps its
dtype and shape; a nested list of numbers or strings its natural shape (bools -> BOOL, ints
-> INT64, floats -> FP64, strings -> BYTES); a scalar shape ``[1]``; ``bytes``/``str`` one
BYTES element; anything else (a dict...) one BYTES element holding its JSON; an empty list
the input's datatype. An answer that does not fit its datatype (an int past INT64) fails
its own request with 500 and a message saying why, not the batch.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trioserve.core import jsontext
from trioserve.core.errors import ServeError
from trioserve.core.messages import BatchReply, Reply, WorkItem
from trioserve.core.oip.tensor import Tensor
from trioserve.core.oip.transport import (
    OIP_HEADER,
    OUTPUTS_HEADER,
    is_tensor_param,
    param_tensor,
)
from trioserve.worker.responses import error_reply
from trioserve.worker.torchserve import batch
from trioserve.worker.torchserve.batch import Entry
from trioserve.worker.torchserve.codec import decode_request, request_headers

ROW_OUTPUT_HEADER = "x-trioserve-oip-row"  # on a row's reply: [name, datatype, shape]

# torch / numpy dtype names -> OIP datatypes.
_DTYPES = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
    "bfloat16": "BF16",
}


def is_oip(item: WorkItem) -> bool:
    return any(name == OIP_HEADER for name, _value in item.headers)


@dataclass(slots=True)
class Expanded:
    """A batch as the handler sees it: ``items[i]`` / ``data[i]`` is row ``i``;
    ``owners[i]`` the index of its request in the original batch; ``inputs[i]`` the input
    name of an OIP row (None for a plain request's row)."""

    items: list[WorkItem] = field(default_factory=list)
    data: list[Any] = field(default_factory=list)
    owners: list[int] = field(default_factory=list)
    inputs: list[str | None] = field(default_factory=list)


def expand(items: Sequence[WorkItem], decode: bool = True) -> Expanded:
    """The rows of a batch that holds OIP requests (raises the input's ``ServeError`` when a
    tensor does not decode)."""
    out = Expanded()
    for owner, item in enumerate(items):
        if not is_oip(item):
            out.items.append(item)
            out.data.append(decode_request(item, decode))
            out.owners.append(owner)
            out.inputs.append(None)
            continue
        headers = [(k, v) for k, v in item.headers if k != OIP_HEADER]
        for param in item.params:
            if not is_tensor_param(param):
                continue
            tensor = param_tensor(param)
            out.items.append(WorkItem(item.request_id, headers, []))
            out.data.append(input_row(tensor))
            out.owners.append(owner)
            out.inputs.append(tensor.name)
    return out


def wrap_entry(entry: Entry, expanded: Expanded) -> Entry:
    """``entry`` whose answers to OIP rows become tensors (a list of the right length is
    left for the usual checks otherwise)."""

    def call(data: Any, context: Any) -> Any:
        answers = entry(data, context)
        if not isinstance(answers, list) or len(answers) != len(expanded.items):
            return answers
        for idx, name in enumerate(expanded.inputs):
            if name is None:
                continue
            try:
                tensor = answer_tensor(name, answers[idx], expanded.data[idx]["datatype"])
            except ServeError as error:
                # This request's answer does not make a tensor: its request fails saying why
                # (the other requests of the batch are answered).
                context.set_response_status(500, "Invalid model output", idx)
                answers[idx] = f"the handler's answer is not a valid output: {error.message}"
                continue
            described = json.dumps([tensor.name, tensor.datatype, list(tensor.shape)])
            context.set_response_header(idx, ROW_OUTPUT_HEADER, described)
            answers[idx] = bytes(tensor.raw)
        return answers

    return call


def run_batch(
    entry: Entry,
    context: Any,
    batch_id: int,
    items: Sequence[WorkItem],
    *,
    decode: bool,
    cancel_check: Callable[[str], bool],
    channel: Any,
    tensors: Mapping[str, Any],
) -> BatchReply:
    """Run a batch holding OIP requests through a TorchServe handler: their inputs become
    rows, and each request's rows join into its reply again."""
    try:
        expanded = expand(items, decode)
    except ServeError as error:
        return error_reply(batch_id, 400, error.message)
    reply = run_rows(
        wrap_entry(entry, expanded),
        context,
        batch_id,
        expanded,
        cancel_check=cancel_check,
        channel=channel,
        tensors=tensors,
    )
    return merge(reply, items, expanded)


def run_rows(
    entry: Entry,
    context: Any,
    batch_id: int,
    rows: Expanded,
    *,
    cancel_check: Callable[[str], bool],
    channel: Any,
    tensors: Mapping[str, Any],
) -> BatchReply:
    """Run the rows of an expanded batch through ``entry``, with the context set up for the
    rows (each row's request id and headers), one answer per row."""
    context.begin_batch(
        [item.request_id for item in rows.items],
        [request_headers(item) for item in rows.items],
        cancel_check=cancel_check,
        channel=channel,
        tensors=tensors,
    )
    return batch.run_batch(entry, context, batch_id, rows.items, rows.data)


def merge(reply: BatchReply, items: Sequence[WorkItem], expanded: Expanded) -> BatchReply:
    """One reply per request again: an OIP request's rows join into its outputs."""
    if reply.code != 200 or len(reply.replies) != len(expanded.items):
        return reply
    rows: dict[int, list[Reply]] = {}
    for owner, row in zip(expanded.owners, reply.replies, strict=True):
        rows.setdefault(owner, []).append(row)
    merged: list[Reply] = []
    for owner, item in enumerate(items):
        parts = rows.get(owner, [])
        if not is_oip(item):
            merged.extend(parts)
            continue
        merged.append(_join(item.request_id, parts))
    return BatchReply(reply.batch_id, reply.code, reply.message, merged, reply.final)


def _join(request_id: str, parts: list[Reply]) -> Reply:
    failed = next((part for part in parts if part.status >= 400), None)
    if failed is not None:
        return failed
    headers: dict[str, str] = {}
    described: list[Any] = []
    for part in parts:
        for key, value in part.headers.items():
            if key == ROW_OUTPUT_HEADER:
                described.append(jsontext.parse(value))
            else:
                headers[key] = value
    headers[OUTPUTS_HEADER] = json.dumps(described, separators=(",", ":"))
    body = b"".join(bytes(part.body) for part in parts)
    return Reply(request_id, body, 200, "", headers, "application/octet-stream")


def answer_tensor(name: str, answer: Any, empty_datatype: str = "FP32") -> Tensor:
    """The output tensor ``name`` for one row's answer (see the module docstring); an empty
    list takes ``empty_datatype`` (the input's)."""
    array = _array_tensor(name, answer)
    if array is not None:
        return array
    if isinstance(answer, bytes | bytearray | memoryview):
        return Tensor.from_values(name, "BYTES", [1], [bytes(answer)], role="output")
    if isinstance(answer, str):
        return Tensor.from_values(name, "BYTES", [1], [answer], role="output")
    if isinstance(answer, bool | int | float):
        answer = [answer]
    if isinstance(answer, list | tuple):
        shaped = _shape_of(answer)
        if shaped is not None:
            shape, flat = shaped
            datatype = _datatype_of(flat) if flat else empty_datatype
            if datatype is not None:
                return Tensor.from_values(name, datatype, shape, flat, role="output")
    text = json.dumps(answer, default=str)
    return Tensor.from_values(name, "BYTES", [1], [text], role="output")


def _array_tensor(name: str, answer: Any) -> Tensor | None:
    """A torch tensor or numpy array as a tensor of its dtype and shape (None otherwise)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(answer, torch.Tensor):
        value = answer.detach().cpu().contiguous()
        dtype = str(value.dtype).removeprefix("torch.")
        datatype = _DTYPES.get(dtype)
        if datatype is None:
            return None
        if dtype == "bfloat16":
            raw = value.view(torch.int16).numpy().astype("<i2").tobytes()
        else:
            raw = value.numpy().astype(value.numpy().dtype.newbyteorder("<")).tobytes()
        return Tensor.from_raw(name, datatype, list(value.shape), raw, role="output")
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(answer, numpy.ndarray):
        datatype = _DTYPES.get(str(answer.dtype))
        if datatype is None:
            return None
        raw = numpy.ascontiguousarray(answer).astype(answer.dtype.newbyteorder("<")).tobytes()
        return Tensor.from_raw(name, datatype, list(answer.shape), raw, role="output")
    return None


def _shape_of(value: list[Any] | tuple[Any, ...]) -> tuple[list[int], list[Any]] | None:
    """The shape and flat elements of a rectangular nested list (None if ragged or empty
    inside)."""
    shape = [len(value)]
    level: list[Any] = list(value)
    while level and isinstance(level[0], list | tuple):
        width = len(level[0])
        if any(not isinstance(v, list | tuple) or len(v) != width for v in level):
            return None
        shape.append(width)
        level = [element for v in level for element in v]
    if any(isinstance(v, list | tuple) for v in level):
        return None
    return shape, level


def _datatype_of(flat: list[Any]) -> str | None:
    if all(isinstance(v, bool) for v in flat):
        return "BOOL"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in flat):
        return "INT64"
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in flat):
        return "FP64"
    if all(isinstance(v, str | bytes) for v in flat):
        return "BYTES"
    return None


def input_row(tensor: Tensor) -> dict[str, Any]:
    """An input tensor as the handler sees it (TorchServe's ``kservev2`` envelope's row)."""
    return {
        "name": tensor.name,
        "shape": list(tensor.shape),
        "datatype": tensor.datatype,
        "data": nest(handler_elements(tensor), tensor.shape),
    }


def handler_elements(tensor: Tensor) -> list[Any]:
    """The tensor's elements as a handler gets them: BYTES elements as ``str`` when they are
    UTF-8 (as TorchServe's envelope gives JSON strings), else ``bytes``."""
    values = tensor.to_list()
    if tensor.datatype != "BYTES":
        return values
    decoded: list[Any] = []
    for value in values:
        try:
            decoded.append(value.decode("utf-8"))
        except UnicodeDecodeError:
            decoded.append(value)
    return decoded


def nest(flat: list[Any], shape: tuple[int, ...]) -> Any:
    """``flat`` nested in ``shape`` (row-major); a scalar shape ``()`` gives the element."""
    if not shape:
        return flat[0] if flat else None
    if len(shape) == 1:
        return flat
    step = len(flat) // shape[0] if shape[0] else 0
    return [nest(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]
