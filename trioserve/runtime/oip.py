"""What every Open Inference Protocol adapter (REST, gRPC) does the same way, sans protocol.

The server's and a model's metadata, the model's declared inputs as OIP tensor metadata,
submitting a request's input tensors to the :class:`~trioserve.runtime.dataplane.Dataplane`
(each tensor one handler input, the work item marked with ``OIP_HEADER``) and turning a
reply back into output tensors. The adapters only decode and encode their wire format.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import trio

from trioserve import __version__
from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.messages import Reply
from trioserve.core.oip.merging import Answer, merge_answers
from trioserve.core.oip.raw import TensorMeta
from trioserve.core.oip.tensor import Parameters, Tensor
from trioserve.core.oip.transport import (
    END_HEADER,
    OIP_HEADER,
    RESPONSE_ID_HEADER,
    STREAM_HEADER,
    reply_outputs,
    request_header,
    tensor_param,
)
from trioserve.core.request import InferenceRequest
from trioserve.runtime.dataplane import Call, Dataplane
from trioserve.runtime.model import ModelVersion

SERVER_NAME: Final = "trioserve"
SERVER_VERSION: Final = __version__
PLATFORM: Final = "pytorch_torchserve"

# torch dtype names of model-config ``tensorInputs`` -> OIP datatypes.
DATATYPES_BY_DTYPE: Final = {
    "bool": "BOOL",
    "int8": "INT8",
    "uint8": "UINT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "bfloat16": "BF16",
    "float32": "FP32",
    "float64": "FP64",
}


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    """A model's OIP metadata: name, versions, platform, declared inputs and outputs."""

    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMeta]
    outputs: list[TensorMeta]


def declared_inputs(model: ModelVersion) -> list[TensorMeta]:
    """The inputs a model declares as OIP tensor metadata (-1: a dimension that varies):
    model-config ``tensorInputs``, or an MLServer model's ``inputs`` setting."""
    if model.mlserver is not None:
        return [TensorMeta(t.name, t.datatype, t.shape) for t in model.mlserver.inputs]
    return [
        TensorMeta(
            spec.name,
            DATATYPES_BY_DTYPE[spec.dtype],
            (-1 if spec.first is None else spec.first, *spec.trailing),
        )
        for spec in model.tensor_inputs.values()
    ]


def model_metadata(dataplane: Dataplane, model: ModelVersion) -> ModelMetadata:
    """Name, versions, platform and the declared inputs (none declared: empty lists). A
    TorchServe model declares inputs in model-config ``tensorInputs`` and never outputs; an
    MLServer model declares both, and its platform, in ``model-settings.json``."""
    declared = model.mlserver
    if declared is not None:
        return ModelMetadata(
            name=model.name,
            versions=dataplane.versions(model.name),
            platform=declared.platform,
            inputs=declared_inputs(model),
            outputs=[TensorMeta(t.name, t.datatype, t.shape) for t in declared.outputs],
        )
    return ModelMetadata(
        name=model.name,
        versions=dataplane.versions(model.name),
        platform=PLATFORM,
        inputs=declared_inputs(model),
        outputs=[],
    )


def submit(
    dataplane: Dataplane,
    model: ModelVersion,
    inputs: Sequence[Tensor],
    *,
    deadline: float | None = None,
    request_id: str | None = None,
    parameters: Parameters | None = None,
    stream: str | None = None,
) -> Call:
    """Queue one OIP request: each input tensor becomes one handler input; the request's
    ``id`` and ``parameters`` travel with it (an MLServer model sees them). ``stream``
    asks for the answers as a stream: ``"out"`` for this input, ``"in"`` when more inputs
    follow (:func:`send_inputs`)."""
    headers = _oip_headers(request_id, parameters)
    if stream is not None:
        headers.append((STREAM_HEADER, stream))
    return dataplane.submit(
        InferenceRequest(
            model=model.name,
            version=model.version,
            params=[tensor_param(tensor) for tensor in inputs],
            headers=headers,
            deadline=deadline,
            streamed=stream is not None,
        )
    )


def send_inputs(
    call: Call,
    inputs: Sequence[Tensor],
    request_id: str | None = None,
    parameters: Parameters | None = None,
) -> None:
    """The next input of a call submitted with ``stream="in"``."""
    headers = _oip_headers(request_id, parameters)
    call.send_input([tensor_param(tensor) for tensor in inputs], headers=headers)


def response_id(reply: Reply, request_id: str | None) -> str | None:
    """The id to answer with: the model's own (an MLServer model's response id), else the
    request's."""
    return reply.headers.get(RESPONSE_ID_HEADER) or request_id


def is_stream_end(reply: Reply) -> bool:
    """Whether ``reply`` only marks the end of a stream (no outputs of its own)."""
    return END_HEADER in reply.headers and reply.status < 400


@dataclass(slots=True)
class Burst:
    """The answers of a stream that were there to read at once (see :func:`next_answers`)."""

    answers: list[Answer]  # (response id, outputs) of each answer, in order
    error: ServeError | None  # the failure that ends the stream after them
    ended: bool  # nothing follows: the final reply was read, or the stream failed


async def next_answers(
    call: Call, request_id: str | None, *, merge: bool = False, first: bool = False
) -> Burst:
    """The next streamed answer of ``call`` (waiting for it) and every one already delivered
    behind it, so an adapter writes them together. With ``merge``, runs of mergeable answers
    are merged (:mod:`trioserve.core.oip.merging`), but not the stream's ``first`` answer,
    which goes on its own. Raises ``trio.ClosedResourceError`` once the call was cancelled."""
    answers: list[Answer] = []
    error: ServeError | None = None
    ended = False
    try:
        item: tuple[Reply, bool] | None = await call.next_reply()
        while item is not None:
            reply, ended = item
            if not (ended and is_stream_end(reply)):
                answers.append((response_id(reply, request_id), outputs_of(reply)))
            item = None if ended else call.poll_reply()
    except ServeError as exc:
        error, ended = exc, True
    except trio.EndOfChannel:
        ended = True
    if merge and len(answers) > 1:
        head = answers[:1] if first else []
        answers = head + merge_answers(answers[len(head) :])
    return Burst(answers, error, ended)


def _oip_headers(request_id: str | None, parameters: Parameters | None) -> list[tuple[str, str]]:
    """The headers marking a work item as an OIP request, with its id and parameters."""
    headers = [(OIP_HEADER, "1")]
    described = request_header(request_id, parameters or {})
    if described is not None:
        headers.append(described)
    return headers


def outputs_of(reply: Reply) -> list[Tensor]:
    """The output tensors of a reply (a handler's error status becomes the error)."""
    if reply.status >= 400:
        text = bytes(reply.body).decode("utf-8", "replace")
        raise ServeError(ErrorKind.HANDLER_FAILED, text or reply.reason, code=reply.status)
    return reply_outputs(reply.headers, reply.body)


async def final_outputs(call: Call) -> list[Tensor]:
    """Read every reply of ``call`` and return the final reply's output tensors."""
    async with call:
        final_reply: Reply | None = None
        async for reply, final in call.replies():
            if final:
                final_reply = reply
    if final_reply is None:
        raise ServeError(ErrorKind.INTERNAL, "the model sent no final answer")
    return outputs_of(final_reply)


def is_handler_exception(error: ServeError) -> bool:
    """Whether ``error`` is TorchServe's 503 "Prediction failed" for a handler's exception,
    which an OIP client must see as an internal error (500, INTERNAL), not as a reason to
    retry."""
    return error.kind is ErrorKind.HANDLER_FAILED and (error.code, error.message) == (
        503,
        "Prediction failed",
    )


__all__ = [
    "DATATYPES_BY_DTYPE",
    "PLATFORM",
    "SERVER_NAME",
    "SERVER_VERSION",
    "Burst",
    "ModelMetadata",
    "declared_inputs",
    "final_outputs",
    "is_handler_exception",
    "is_stream_end",
    "model_metadata",
    "next_answers",
    "outputs_of",
    "response_id",
    "send_inputs",
    "submit",
]
