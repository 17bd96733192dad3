"""Error-code mapping (spec §7.6) and ``run_batch``, which applies it."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from trioserve.core.messages import Param, WorkItem
from trioserve.worker.errors import LoadError, load_error
from trioserve.worker.torchserve.batch import prepare, run_batch
from trioserve.worker.torchserve.context import Context
from trioserve.worker.torchserve.errors import PredictionException, batch_error
from trioserve.worker.torchserve.metrics import MetricsCache


class PredictionExceptionFromRealTs(Exception):
    """Stands for ``ts.utils.util.PredictionException`` of an installed TorchServe."""

    def __init__(self, message: str, error_code: int = 500) -> None:
        super().__init__(message)
        self.message = message
        self.error_code = error_code


PredictionExceptionFromRealTs.__name__ = "PredictionException"


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (MemoryError(), (507, "Out of resources")),
        (RuntimeError("CUDA out of memory. Tried to allocate"), (507, "Out of resources")),
        (PredictionException("bad input", 400), (400, "bad input")),
        (PredictionException("default code"), (500, "default code")),
        (PredictionException("CUDA is mentioned", 422), (422, "CUDA is mentioned")),
        (PredictionExceptionFromRealTs("theirs", 409), (409, "theirs")),
        (ValueError("anything else"), (503, "Prediction failed")),
        (SystemExit(3), (503, "Prediction failed")),
    ],
)
def test_batch_error(exc: BaseException, expected: tuple[int, str]) -> None:
    assert batch_error(exc) == expected


def test_prediction_exception_shape() -> None:
    exc = PredictionException("msg", 418)
    assert (exc.message, exc.error_code) == ("msg", 418)
    assert str(exc) == "msg : 418"


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (MemoryError("x"), (507, "System out of memory")),
        (RuntimeError("CUDA error: no kernel image"), (507, "System out of memory")),
        (RuntimeError("boom"), (500, "RuntimeError: boom")),
        (LoadError("no model"), (500, "LoadError: no model")),
        (KeyError("k"), (500, "KeyError: 'k'")),
        (ValueError(), (500, "ValueError")),
    ],
)
def test_load_error(exc: BaseException, expected: tuple[int, str]) -> None:
    assert load_error(exc) == expected


def _batch(n: int = 2) -> tuple[Context, list[WorkItem], list[dict[str, Any]]]:
    ctx = Context("m", "/d", None, n, None, "0.12.0", metrics=MetricsCache("m"))
    items = [
        WorkItem(f"r{i}", [], [Param("body", b"%d" % i, "application/json")]) for i in range(n)
    ]
    data = prepare(ctx, items)
    return ctx, items, data


def test_run_batch_success_records_prediction_time() -> None:
    ctx, items, data = _batch()
    assert data == [{"body": 0}, {"body": 1}]
    reply = run_batch(lambda d, c: [row["body"] * 10 for row in d], ctx, 5, items, data)
    assert (reply.batch_id, reply.code, reply.message, reply.final) == (
        5,
        200,
        "Prediction success",
        True,
    )
    assert [bytes(r.body) for r in reply.replies] == [b"0", b"10"]
    (metric,) = ctx.metrics.drain()
    assert metric["name"] == "PredictionTime"
    assert metric["unit"] == "Milliseconds"
    assert metric["request_id"] == "r0,r1"


def _raise(exc: BaseException) -> Any:
    def entry(data: Any, context: Any) -> Any:
        raise exc

    return entry


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (_raise(RuntimeError("boom")), (503, "Prediction failed")),
        (_raise(PredictionException("nope", 418)), (418, "nope")),
        (_raise(MemoryError()), (507, "Out of resources")),
        (_raise(RuntimeError("CUDA error")), (507, "Out of resources")),
        (lambda d, c: {"not": "a list"}, (503, "Invalid model predict output")),
        (lambda d, c: None, (503, "Invalid model predict output")),
        (lambda d, c: ["one"], (503, "number of batch response mismatched")),
        (lambda d, c: [1, {1, 2}], (503, "Unsupported model output data type.")),
    ],
)
def test_run_batch_failures(entry: Any, expected: tuple[int, str]) -> None:
    ctx, items, data = _batch()
    reply = run_batch(entry, ctx, 3, items, data)
    assert (reply.code, reply.message) == expected
    assert reply.replies == []
    assert reply.final
    assert ctx.metrics.drain() == []  # no PredictionTime for a failed batch


def test_run_batch_logs_the_traceback(caplog: pytest.LogCaptureFixture) -> None:
    ctx, items, data = _batch()
    with caplog.at_level(logging.ERROR, logger="trioserve.worker"):
        run_batch(_raise(RuntimeError("kaboom")), ctx, 1, items, data)
    (record,) = caplog.records
    assert record.exc_info is not None
    assert "kaboom" in caplog.text
