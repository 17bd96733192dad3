"""Answering an OIP ``infer`` call over REST: one JSON (or binary extension) answer, or a
Server-Sent Events stream of them (``infer_stream`` / ``generate_stream``).

:mod:`trioserve.http.oip` routes and parses the request; this module submits it to the
dataplane and encodes what the model answers (:mod:`trioserve.core.oip`).
"""

from __future__ import annotations

from typing import Final

import trio

from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.oip import (
    HEADER_LENGTH_HEADER,
    InferRequest,
    Tensor,
    encode_infer_response,
    error_body,
)
from trioserve.http.bodies import NO_CACHE_HEADERS, Answer
from trioserve.runtime.dataplane import Call, Dataplane
from trioserve.runtime.model import ModelVersion
from trioserve.runtime.oip import final_outputs, next_answers, submit

JSON_TYPE: Final = "application/json"
SSE_TYPE: Final = "text/event-stream; charset=utf-8"


def _encoded(
    model: ModelVersion,
    request: InferRequest,
    outputs: list[Tensor],
    *,
    binary: bool = True,
    answer_id: str | None = None,
) -> tuple[bytes, int | None]:
    """The response body, and the JSON header's length when outputs are binary (``binary``
    false: JSON only, whatever the request's default); its id is ``answer_id`` when given,
    else the request's."""
    return encode_infer_response(
        model_name=model.name,
        model_version=model.version,
        id=answer_id or request.id,
        parameters=None,
        outputs=outputs,
        requested=request.outputs,
        binary_default=request.binary_default and binary,
    )


async def infer(dataplane: Dataplane, model: ModelVersion, request: InferRequest) -> Answer:
    outputs = await final_outputs(
        submit(
            dataplane, model, request.inputs, request_id=request.id, parameters=request.parameters
        )
    )
    body, length = _encoded(model, request, outputs)
    extra: list[tuple[str, str]] = []
    content_type = JSON_TYPE
    if length is not None:
        extra.append((HEADER_LENGTH_HEADER, str(length)))
        content_type = "application/octet-stream"
    headers = [*NO_CACHE_HEADERS.items(), ("Content-Type", content_type), *extra]
    return Answer(200, headers, body)


class EventStream:
    """The SSE body of an ``infer_stream`` call: one ``data:`` event per answer (the answers
    waiting for a slow client merged into one event when the model's
    ``merge_stream_replies`` is on, the first answer always on its own); a failure after the
    first event is an ``event: error`` with ``{"error": ...}``, then the stream ends. The
    events already there go out as one piece of the body (one write). Closing it cancels
    the call (the client went away)."""

    def __init__(self, call: Call, model: ModelVersion, request: InferRequest) -> None:
        self._call = call
        self._model = model
        self._request = request
        self._merge = model.merge_stream_replies
        self._started = False
        self._done = False

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> bytes:
        if self._done:
            raise StopAsyncIteration
        try:
            burst = await next_answers(
                self._call, self._request.id, merge=self._merge, first=not self._started
            )
        except trio.ClosedResourceError:
            self._finish()
            raise StopAsyncIteration from None
        self._started = True
        events: list[bytes] = []
        error = burst.error
        try:
            for answer_id, outputs in burst.answers:
                # JSON only: infer_stream refused binary outputs before submitting.
                body, _length = _encoded(
                    self._model, self._request, outputs, binary=False, answer_id=answer_id
                )
                events.append(b"data: " + body + b"\n\n")
        except ServeError as exc:
            error = exc
        if error is not None:
            events.append(_error_event(error))
        if burst.ended or error is not None:
            self._finish()
        if not events:
            raise StopAsyncIteration
        return b"".join(events)

    def _finish(self) -> None:
        self._done = True
        self._call.cancel()

    async def aclose(self) -> None:
        self._finish()


def _error_event(error: ServeError) -> bytes:
    return b"event: error\ndata: " + error_body(error.message) + b"\n\n"


def refuse_binary_stream_outputs(request: InferRequest) -> None:
    """Events are JSON: an output asked for as binary could only fail after the 200, as an
    error event, once the model has run. Refuse it before the request is queued."""
    binary = [output.name for output in request.outputs if output.binary_data]
    if binary:
        raise ServeError(
            ErrorKind.BAD_INPUT,
            "outputs cannot be binary in a stream (its events are JSON); "
            f"parameters.binary_data is true for {', '.join(repr(name) for name in binary)}",
        )


async def infer_stream(dataplane: Dataplane, model: ModelVersion, request: InferRequest) -> Answer:
    refuse_binary_stream_outputs(request)
    call = submit(
        dataplane,
        model,
        request.inputs,
        request_id=request.id,
        parameters=request.parameters,
        stream="out",
    )
    headers = [*NO_CACHE_HEADERS.items(), ("Content-Type", SSE_TYPE)]
    return Answer(200, headers, EventStream(call, model, request))
