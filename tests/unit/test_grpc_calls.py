"""The Trio side of the gRPC transport: admission, aborts, error shaping, the sequence router."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

from trioserve.core.errors import ServeError
from trioserve.core.messages import Param
from trioserve.core.request import InferenceRequest
from trioserve.grpc.calls import Dispatcher, Gate, RpcContext, Unary, single_error
from trioserve.grpc.sequences import SequenceRequest, StatelessSequences

CONTEXT = RpcContext(method="Predictions", metadata=(("authorization", "Bearer k"),))


async def test_unexpected_exceptions_become_internal_errors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken(_request: object, _context: RpcContext) -> object:
        raise ValueError("boom")

    with caplog.at_level(logging.ERROR), pytest.raises(ServeError) as info:
        await Dispatcher(Gate(), None).unary(Unary(broken), object(), CONTEXT)
    assert (info.value.status, info.value.message) == (500, "ValueError: boom")
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
        assert refused.value.status == 503 and "shutting down" in refused.value.message
        gate.abort_all()
    (aborted,) = outcome
    assert isinstance(aborted, ServeError) and aborted.status == 503
    assert "shut down before this call finished" in aborted.message


def test_authorization_metadata_ambiguity_is_missing() -> None:
    assert CONTEXT.authorization() == "Bearer k"
    twice = RpcContext("Ping", (("authorization", "Bearer a"), ("authorization", "Bearer b")))
    assert twice.authorization() is None


def test_single_error_prefers_the_serve_error() -> None:
    error = ServeError(404, "X", "gone")
    group = BaseExceptionGroup("g", [RuntimeError("x"), BaseExceptionGroup("h", [error])])
    assert single_error(group) is error
    plain = RuntimeError("x")
    assert single_error(BaseExceptionGroup("g", [plain])) is plain


def test_stateless_sequences_need_an_id_and_pass_it_as_a_header() -> None:
    submitted: list[InferenceRequest] = []

    def submit(request: InferenceRequest) -> object:
        submitted.append(request)
        return "job"

    router = StatelessSequences(submit, sequence_id_header="x-seq")  # type: ignore[arg-type]
    params = [Param("data", b"1")]
    with pytest.raises(ServeError) as info:
        router.submit(SequenceRequest("m", None, params, None))
    assert (info.value.status, info.value.message) == (400, "Parameter sequenceId is required.")
    accepted = router.submit(SequenceRequest("m", "2.0", params, "s1"))
    assert (accepted.sequence_id, accepted.job) == ("s1", "job")
    assert submitted[0].headers == [("x-seq", "s1")] and submitted[0].version == "2.0"
