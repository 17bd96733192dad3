"""A JSON body nested 100,000 deep at each place that parses one: a clear 400 where the
server reads it, the raw bytes where a worker decodes it for a handler (as TorchServe's
worker does), never a ``RecursionError``."""

from __future__ import annotations

import pytest

from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.kserve import instances_of
from trioserve.core.limits import DEFAULT_LIMITS
from trioserve.core.messages import Param
from trioserve.http.oip import _json_object
from trioserve.runtime.management import _parse_metadata
from trioserve.worker.torchserve.base_handler import BaseHandler
from trioserve.worker.torchserve.codec import decode_value
from trioserve.worker.torchserve.envelopes import _instances
from trioserve.worker.torchserve.errors import PredictionException

DEEP = b"[" * 100_000 + b"]" * 100_000
DEEP_OBJECT = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
DEEP_INSTANCES = b'{"instances": ' + DEEP + b"}"


@pytest.mark.parametrize("body", [DEEP, DEEP_OBJECT, DEEP_INSTANCES])
def test_kserve_v1_bodies(body: bytes) -> None:
    with pytest.raises(ServeError, match="not JSON: nested deeper than 200 levels") as caught:
        instances_of(body)
    assert caught.value.kind is ErrorKind.BAD_INPUT


@pytest.mark.parametrize("body", [DEEP, DEEP_OBJECT])
def test_oip_repository_bodies(body: bytes) -> None:
    with pytest.raises(ServeError, match="malformed JSON: nested deeper than 200") as caught:
        _json_object(body)
    assert caught.value.kind is ErrorKind.BAD_INPUT


def test_a_handlers_customized_metadata_nested_too_deep_reads_as_empty() -> None:
    assert _parse_metadata(DEEP_OBJECT) == {}
    assert _parse_metadata(b'"' + b"[" * 1000 + b'"') == {}  # a JSON string holding JSON
    assert _parse_metadata(b'{"a": 1}') == {"a": 1}


@pytest.mark.parametrize("body", [DEEP, DEEP_OBJECT])
def test_the_worker_gives_the_handler_the_raw_body(body: bytes) -> None:
    value = decode_value(Param("body", memoryview(body), "application/json"))
    assert isinstance(value, bytearray) and value == body
    assert decode_value(Param("body", b'{"a": [1]}', "application/json")) == {"a": [1]}


def test_the_json_envelope_refuses_it_as_a_bad_request() -> None:
    with pytest.raises(PredictionException, match="request 0: body is not JSON") as caught:
        _instances({"body": bytearray(DEEP_INSTANCES)}, 0, DEFAULT_LIMITS)
    assert caught.value.error_code == 400


def test_the_base_handler_refuses_it_as_a_bad_request() -> None:
    handler = BaseHandler()
    handler.device = "cpu"  # what initialize sets
    with pytest.raises(PredictionException, match="request 1: body is not JSON: nested") as caught:
        handler.preprocess([{"body": bytearray(b"[1]")}, {"body": bytearray(DEEP)}])
    assert caught.value.error_code == 400
    assert handler.preprocess([{"body": bytearray(b"[1, 2]")}]).tolist() == [[1, 2]]
