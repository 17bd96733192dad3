"""``ModelStreamInfer`` into one model stream: the whole gRPC stream is one request of an
MLServer model, whose ``predict_stream`` gets every message of the stream as its next input
and whose every yielded response is one message back, as MLServer does.

The first message names the model (later ones may leave ``model_name`` empty or repeat it)
and opens the call; each further message is sent to the running call as it arrives
(:func:`trioserve.runtime.oip.send_inputs`); the client's half-close ends the input. The
answers are read concurrently, so a model may answer before the input ends.

A later message that is refused (malformed, over the size limit, an invalid input, another
model) ends the model's input there, as a half-close would; the model's answers to what it
got are all sent, then the stream ends with the refusal. However the RPC ends (answered,
failed, the client gone, the deadline), the call is cancelled, which cancels the model's task
in the worker.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from trioserve._proto.inference import ModelInferRequest, ModelInferResponse
from trioserve.core.errors import ErrorKind, ServeError, quote
from trioserve.grpc.calls import ClientGone, Receive, RpcContext, single_error
from trioserve.grpc.oip_messages import (
    infer_response,
    parameters_of,
    request_inputs,
    requested_outputs,
)
from trioserve.runtime import oip
from trioserve.runtime.dataplane import Dataplane
from trioserve.runtime.model import ModelVersion


async def stream_into_model(
    dataplane: Dataplane,
    model: ModelVersion,
    first: ModelInferRequest,
    receive: Receive[ModelInferRequest],
    context: RpcContext,
    send: Callable[[ModelInferResponse], Awaitable[None]],
) -> None:
    """Answer a ModelStreamInfer stream whose first message is ``first``, for ``model``."""
    requested = requested_outputs(first, dataplane.limits)
    call = oip.submit(
        dataplane,
        model,
        request_inputs(first, dataplane.limits),
        deadline=context.deadline,
        request_id=first.id or None,
        parameters=parameters_of(first.parameters),
        stream="in",
    )

    refused: list[ServeError] = []  # the message that ended the input early

    async def feed() -> None:
        try:
            while (message := await receive()) is not None:
                if message.model_name not in ("", model.name):
                    raise ServeError(
                        ErrorKind.BAD_INPUT,
                        f"this stream goes to model {model.name!r} (its first request's); a "
                        f"later request names {quote(message.model_name)}",
                    )
                oip.send_inputs(
                    call,
                    request_inputs(message, dataplane.limits),
                    request_id=message.id or None,
                    parameters=parameters_of(message.parameters),
                )
        except ClientGone:
            raise
        except ServeError as error:
            refused.append(error)
        call.send_input([], end=True)

    try:
        async with call, trio.open_nursery() as nursery:
            nursery.start_soon(feed)
            started = False
            while True:
                # The answers already there go out together: merged into fewer messages
                # when the model's merge_stream_replies is on (the first on its own).
                burst = await oip.next_answers(
                    call, first.id, merge=model.merge_stream_replies, first=not started
                )
                started = True
                for answer_id, outputs in burst.answers:
                    await send(infer_response(model, first, outputs, requested, answer_id))
                if burst.error is not None:
                    raise burst.error
                if burst.ended:
                    break
            nursery.cancel_scope.cancel()  # the model is done: further input is not read
    except BaseExceptionGroup as group:
        raise single_error(group) from None
    if refused:
        raise refused[0]


def streams_into_model(model: ModelVersion) -> bool:
    """Whether a ModelStreamInfer stream to ``model`` is one model stream (an MLServer
    model) rather than requests answered one by one."""
    return model.mlserver is not None


__all__ = ["stream_into_model", "streams_into_model"]
