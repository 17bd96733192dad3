"""The Trio side of the gRPC transport: admission, aborts, error shaping; the sequence router."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.messages import Param
from trioserve.core.request import InferenceRequest
from trioserve.grpc.calls import Dispatcher, Gate, RpcContext, Unary, single_error
from trioserve.http.errors import http_status
from trioserve.runtime.sequences import SequenceHeaders

CONTEXT = RpcContext(method="Predictions", metadata=(("authorization", "Bearer k"),))


async def test_unexpected_exceptions_become_internal_errors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken(_request: object, _context: RpcContext) -> object:
        raise ValueError("boom")

    with caplog.at_level(logging.ERROR), pytest.raises(ServeError) as info:
        await Dispatcher(Gate(), None).unary(Unary(broken), object(), CONTEXT)
    assert (http_status(info.value), info.value.message) == (500, "ValueError: boom")
    assert "unexpected error in a gRPC method" in caplog.text


async def test_a_closed_gate_refuses_and_abort_ends_running_calls() -> None:
    gate = Gate()
    dispatcher = Dispatcher(gate, None)
    outcome: list[BaseException] = []

    async def forever(_request: object, _context: RpcContext) -> object:
        await trio.sleep_forever()

    async def call() -> None:
        try:
            await dispatcher.unary(Unary(forever), object(), CONTEXT)
        except ServeError as error:
            outcome.append(error)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call)
        await trio.testing.wait_all_tasks_blocked()
        gate.close()
        with pytest.raises(ServeError) as refused:
            await dispatcher.unary(Unary(forever), object(), CONTEXT)
        assert http_status(refused.value) == 503 and "shutting down" in refused.value.message
        gate.abort_all()
    (aborted,) = outcome
    assert isinstance(aborted, ServeError) and http_status(aborted) == 503
    assert "shut down before this call finished" in aborted.message


def test_authorization_metadata_ambiguity_is_missing() -> None:
    assert CONTEXT.authorization() == "Bearer k"
    twice = RpcContext("Ping", (("authorization", "Bearer a"), ("authorization", "Bearer b")))
    assert twice.authorization() is None


def test_single_error_prefers_the_serve_error() -> None:
    error = ServeError(ErrorKind.NOT_FOUND, "gone")
    group = BaseExceptionGroup("g", [RuntimeError("x"), BaseExceptionGroup("h", [error])])
    assert single_error(group) is error
    plain = RuntimeError("x")
    assert single_error(BaseExceptionGroup("g", [plain])) is plain


def test_sequence_headers_show_the_id_once_and_the_start_of_a_new_sequence() -> None:
    headers = SequenceHeaders(id_header="x-seq", start_header="x-start")
    params = [Param("data", b"1")]
    request = InferenceRequest("m", "2.0", params, sequence_id="s1")
    headers.mark(request, started=True)
    assert request.headers == [("x-seq", "s1"), ("x-start", "true")]
    sent = InferenceRequest(
        "m", None, params, headers=[("X-Seq", "s2"), ("X-Start", "x")], sequence_id="s2"
    )
    headers.mark(sent, started=False)
    assert sent.headers == [("x-seq", "s2")]  # the client's own are replaced, not doubled
