"""Error messages quote a client's values as a bounded prefix and never carry more than
MAX_MESSAGE characters, whatever a call site does, on HTTP and gRPC alike."""

from __future__ import annotations

import json

import pytest

from trioserve.core import errors
from trioserve.core.errors import MAX_MESSAGE, ErrorKind, ServeError, bounded, excerpt, quote
from trioserve.core.registry import Registry
from trioserve.grpc.errors import grpc_code
from trioserve.grpc.inference import in_band_status
from trioserve.http.errors import error_answer, error_body, protocol_error_answer

BIG = "n" * (1 << 20)


def test_quote_shows_short_values_whole_and_long_ones_as_a_prefix_and_length() -> None:
    assert quote("a") == "'a'"
    assert quote("x" * 64) == repr("x" * 64)
    assert quote(BIG) == f"{'n' * 64!r}... (1048576 characters)"
    assert quote(BIG, 5) == "'nnnnn'... (1048576 characters)"
    assert quote(7) == "7" and quote([1, 2]) == "[1, 2]"
    assert quote(list(range(100_000))).endswith(
        f"... ({len(repr(list(range(100_000))))} characters)"
    )
    assert excerpt("v1") == "v1"
    assert excerpt(BIG) == f"{'n' * 64}... (1048576 characters)"


def test_bounded_cuts_a_message_saying_how_long_it_was() -> None:
    assert bounded("short") == "short"
    cut = bounded(BIG)
    assert len(cut) == MAX_MESSAGE
    assert cut.startswith("nnnn") and cut.endswith("... (message cut: 1048576 characters)")
    exact = "m" * MAX_MESSAGE
    assert bounded(exact) == exact


def test_a_serve_error_cuts_its_message_on_construction_and_on_assignment() -> None:
    error = ServeError(ErrorKind.BAD_INPUT, f"input {BIG}: bad")
    assert len(error.message) == MAX_MESSAGE and str(error) == error.message
    assert error.args == (error.message,)
    error.message += BIG  # what a call site adding context does
    assert len(error.message) == MAX_MESSAGE and error.args == (error.message,)
    small = ServeError(ErrorKind.BAD_INPUT, "fine")
    assert small.message == str(small) == "fine"
    handler = errors.prediction_failed(400, BIG)
    assert len(handler.message) == MAX_MESSAGE and handler.code == 400


def test_not_found_errors_quote_long_names() -> None:
    assert errors.model_not_found("m").message == "Model not found: m"
    assert len(errors.model_not_found(BIG).message) < 200
    assert len(errors.version_not_found(BIG, BIG).message) < 300
    registry: Registry[object] = Registry()
    registry.add("m", "1.0", object())
    with pytest.raises(ServeError) as caught:
        registry.set_default("m", BIG)
    assert len(caught.value.message) < 200


@pytest.mark.parametrize("kind", [ErrorKind.BAD_INPUT, ErrorKind.INTERNAL, ErrorKind.NOT_FOUND])
def test_every_adapter_answers_a_bounded_message(kind: ErrorKind) -> None:
    error = ServeError(kind, BIG)
    body = error_answer(error).body
    assert len(body) < MAX_MESSAGE + 200
    assert json.loads(body)["message"] == error_body(error)["message"] == error.message
    status = in_band_status(error)
    assert len(status.message) == MAX_MESSAGE and status.code == grpc_code(error)


def test_a_protocol_error_answer_is_bounded_too() -> None:
    answer = protocol_error_answer(400, f"malformed header line {BIG}")
    assert len(answer.body) < MAX_MESSAGE + 200
    assert json.loads(answer.body)["message"].endswith("(message cut: 1048598 characters)")
