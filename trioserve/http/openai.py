"""The OpenAI-compatible API on the inference port: ``POST /v1/completions`` and ``POST
/v1/chat/completions`` (``GET /v1/models`` is KServe v1's list, which also answers OpenAI's
shape: :mod:`trioserve.http.kserve`).

A thin adapter: the request is read by :mod:`trioserve.core.openai`, the model is one that
opted in (its :class:`~trioserve.core.openai.mapping.OpenAIMapping`), and the call goes
through the dataplane like any other:

- an MLServer-style model gets an OIP request (:func:`trioserve.runtime.oip.submit`, always
  as a stream, so that ``predict_stream`` runs when the model has one and ``predict``
  otherwise): the prompt in one BYTES input, OpenAI's settings as request parameters; each
  answer's BYTES output is one piece of text;
- a TorchServe handler gets a JSON body; each of its intermediate responses and its final
  response is one piece.

Pieces go through a :class:`~trioserve.core.openai.stops.PieceCounter` (separator, stop
strings, ``max_tokens``); once it is done the call is cancelled, which stops the generation
in the worker. A streamed answer is an SSE body whose ``aclose`` (the client went away)
cancels the call too, as the OIP streams do.
"""

from __future__ import annotations

import json
import time
from typing import Final

import trio

from trioserve.auth import KeyKind
from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.messages import Param, Reply
from trioserve.core.oip import Tensor
from trioserve.core.openai import answers
from trioserve.core.openai.errors import OpenAIError, from_serve_error, model_not_found
from trioserve.core.openai.requests import Generation, parse_chat, parse_completion
from trioserve.core.openai.stops import PieceCounter
from trioserve.core.request import InferenceRequest
from trioserve.http.bodies import NO_CACHE_HEADERS, Answer
from trioserve.http.oip import oip_status
from trioserve.http.routes import Route
from trioserve.runtime.dataplane import Call, Dataplane
from trioserve.runtime.model import ModelVersion
from trioserve.runtime.oip import next_answers, submit

JSON_TYPE: Final = "application/json"
SSE_TYPE: Final = "text/event-stream; charset=utf-8"
POST = frozenset({"POST"})

OPENAI_ROUTES: Final = [
    Route("openai_completions", "/v1/completions", POST, KeyKind.INFERENCE, True),
    Route("openai_chat", "/v1/chat/completions", POST, KeyKind.INFERENCE, True),
]
OPENAI_ENDPOINTS: Final = frozenset(route.endpoint for route in OPENAI_ROUTES)
OPENAI_PATHS: Final = frozenset(route.rule for route in OPENAI_ROUTES)


def is_openai_path(path: str) -> bool:
    """Whether every failure on ``path`` answers OpenAI's error object."""
    return path.rstrip("/") in OPENAI_PATHS


def error_answer(error: OpenAIError) -> Answer:
    headers = [*NO_CACHE_HEADERS.items(), ("Content-Type", JSON_TYPE)]
    if error.retry_after is not None:
        headers.append(("Retry-After", str(error.retry_after)))
    return Answer(error.status, headers, error.body())


def serve_error_answer(error: ServeError) -> Answer:
    """A failure the rest of the server reports (a token, a full queue...) in OpenAI's shape."""
    return error_answer(from_serve_error(error, oip_status(error)))


class Pieces:
    """The pieces of text of one call, as they come (see the module)."""

    def __init__(self, call: Call, model: ModelVersion, output: str) -> None:
        self._call = call
        self._oip = model.mlserver is not None
        self._output = output
        self._error: ServeError | None = None

    async def next(self) -> tuple[list[str], bool]:
        """The pieces there are now (waiting for one) and whether the model has ended.
        Raises the call's ``ServeError``; ``trio.ClosedResourceError`` once cancelled."""
        if self._error is not None:
            raise self._error
        if self._oip:
            burst = await next_answers(self._call, None)
            pieces = [self._text(outputs) for _id, outputs in burst.answers]
            if burst.error is not None:
                if not pieces:
                    raise burst.error
                self._error = burst.error
            return pieces, burst.ended and burst.error is None
        pieces, ended = [], False
        item: tuple[Reply, bool] | None = await self._call.next_reply()
        while item is not None:
            reply, ended = item
            body = bytes(reply.body)
            if reply.status >= 400:
                text = body.decode("utf-8", "replace") or reply.reason
                raise ServeError(ErrorKind.HANDLER_FAILED, text, code=reply.status)
            if body or not ended:
                pieces.append(body.decode("utf-8", "replace"))
            item = None if ended else self._call.poll_reply()
        return pieces, ended

    def _text(self, outputs: list[Tensor]) -> str:
        for tensor in outputs:
            if tensor.name == self._output and tensor.datatype == "BYTES":
                return "".join(bytes(v).decode("utf-8", "replace") for v in tensor.to_list())
        names = ", ".join(repr(t.name) for t in outputs) or "none"
        raise ServeError(
            ErrorKind.INTERNAL,
            f"the model answered without the BYTES output {self._output!r} its openai "
            f"settings name (outputs: {names})",
        )

    def close(self) -> None:
        self._call.cancel()


def _model(dataplane: Dataplane, name: str) -> ModelVersion:
    try:
        model = dataplane.model(name)
    except ServeError as error:
        if error.kind is ErrorKind.NOT_FOUND:
            raise model_not_found(name) from None
        raise
    if model.openai is None:
        raise model_not_found(
            name, "does not answer the OpenAI API (its settings have no 'openai' section)"
        )
    return model


def _submit(
    dataplane: Dataplane, model: ModelVersion, generation: Generation, prompt: str, answer_id: str
) -> Call:
    assert model.openai is not None
    sampling: dict[str, str | int | float] = dict(generation.sampling)
    if generation.max_tokens is not None:
        sampling["max_tokens"] = generation.max_tokens
    if model.mlserver is not None:
        # OIP parameters are scalars: lists travel as JSON text.
        parameters = dict(sampling)
        if generation.stop:
            parameters["stop"] = json.dumps(list(generation.stop))
        if generation.kind == "chat":
            parameters["messages"] = json.dumps(list(generation.messages), ensure_ascii=False)
        tensor = Tensor.from_values(model.openai.input, "BYTES", [1], [prompt.encode()])
        return submit(
            dataplane,
            model,
            [tensor],
            request_id=answer_id,
            parameters=parameters,
            stream="out",
        )
    # A TorchServe handler reads one JSON body: lists stay lists.
    body: dict[str, object] = {"model": generation.model, "prompt": prompt, **sampling}
    if generation.stop:
        body["stop"] = list(generation.stop)
    if generation.kind == "chat":
        body["messages"] = list(generation.messages)
    body["stream"] = generation.stream
    param = Param("body", json.dumps(body, ensure_ascii=False).encode(), JSON_TYPE)
    return dataplane.submit(InferenceRequest(model.name, model.version, [param], []))


async def answer(dataplane: Dataplane, endpoint: str, body: bytes) -> Answer:
    """The answer to one request on :data:`OPENAI_ROUTES`."""
    try:
        generation = parse_chat(body) if endpoint == "openai_chat" else parse_completion(body)
        model = _model(dataplane, generation.model)
        assert model.openai is not None
        prompt = (
            model.openai.render_chat(generation.messages)
            if generation.kind == "chat"
            else generation.prompt
        )
    except OpenAIError as error:
        return error_answer(error)
    except ServeError as error:
        return serve_error_answer(error)
    answer_id = answers.new_id(generation)
    created = int(time.time())
    counter = PieceCounter(generation.stop, generation.max_tokens, model.openai.separator)
    try:
        call = _submit(dataplane, model, generation, prompt, answer_id)
    except ServeError as error:
        return _counted(serve_error_answer(error))
    pieces = Pieces(call, model, model.openai.output)
    prompt_tokens = answers.prompt_tokens(prompt)
    headers = [*NO_CACHE_HEADERS.items(), ("x-request-id", answer_id)]
    if generation.stream:
        # The status waits for the model's first pieces, so that a model that fails at once
        # answers with its error's status, not a 200 and an error event.
        try:
            first = await pieces.next()
        except ServeError as error:
            pieces.close()
            return _counted(serve_error_answer(error))
        except BaseException:
            pieces.close()
            raise
        writer = answers.ChunkWriter(generation, answer_id, created)
        events = EventStream(pieces, counter, writer, prompt_tokens, first)
        return Answer(200, [*headers, ("Content-Type", SSE_TYPE)], events, counted=True)
    try:
        text = await _collect(pieces, counter)
    except ServeError as error:
        return _counted(serve_error_answer(error))
    used = answers.usage(prompt_tokens, counter.tokens)
    out = answers.response(generation, answer_id, created, text, counter.finish_reason, used)
    return Answer(200, [*headers, ("Content-Type", JSON_TYPE)], out, counted=True)


def _counted(answer: Answer) -> Answer:
    answer.counted = True
    return answer


async def _collect(pieces: Pieces, counter: PieceCounter) -> str:
    parts: list[str] = []
    try:
        ended = False
        while not (ended or counter.done):
            got, ended = await pieces.next()
            for piece in got:
                parts.append(counter.feed(piece))
                if counter.done:
                    break
        parts.append(counter.flush())
    finally:
        pieces.close()
    return "".join(parts)


class EventStream:
    """The SSE body of a streamed answer: the chunks of the pieces as they come, then the
    finishing chunk, the usage chunk (``include_usage``) and ``data: [DONE]``. A failure
    after the 200 is one event with OpenAI's error object, then ``[DONE]``. Closing it
    (the client went away) cancels the call."""

    def __init__(
        self,
        pieces: Pieces,
        counter: PieceCounter,
        writer: answers.ChunkWriter,
        prompt_tokens: int,
        first: tuple[list[str], bool] | None = None,
    ) -> None:
        self._pieces = pieces
        self._waiting = first  # pieces read before the stream began
        self._counter = counter
        self._writer = writer
        self._prompt_tokens = prompt_tokens
        self._started = False
        self._done = False

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> bytes:
        if not self._started:
            self._started = True
            first = self._writer.first()
            if first:
                return first
        events: list[bytes] = []
        while not events:
            if self._done:
                raise StopAsyncIteration
            try:
                if self._waiting is not None:
                    (got, ended), self._waiting = self._waiting, None
                else:
                    got, ended = await self._pieces.next()
            except trio.ClosedResourceError:
                self._finish()
                raise StopAsyncIteration from None
            except ServeError as error:
                body = from_serve_error(error, oip_status(error)).body()
                events += [answers.error_event(body), answers.DONE]
                self._finish()
                break
            for piece in got:
                text = self._counter.feed(piece)
                if text:
                    events.append(self._writer.text(text))
                if self._counter.done:
                    break
            if ended or self._counter.done:
                events += self._closing()
                self._finish()
        return b"".join(events)

    def _closing(self) -> list[bytes]:
        counter, writer = self._counter, self._writer
        tail = counter.flush()
        used = answers.usage(self._prompt_tokens, counter.tokens)
        return [
            *([writer.text(tail)] if tail else []),
            writer.finish(counter.finish_reason),
            writer.usage(used),
            answers.DONE,
        ]

    def _finish(self) -> None:
        self._done = True
        self._pieces.close()

    async def aclose(self) -> None:
        self._finish()


__all__ = ["OPENAI_ENDPOINTS", "OPENAI_ROUTES", "answer", "error_answer", "is_openai_path"]
