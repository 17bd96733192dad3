"""Hostile JSON end to end: bodies nested 100,000 deep on every route that parses JSON, and
names a mebibyte long that an error message would quote. Each ends in a clear answer (a 400
naming the problem; on ``/predictions`` the raw body reaching the handler, as TorchServe's
worker passes it), with the server's and the worker's memory unharmed, the worker not
restarted, and a normal request answered right after."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import numpy as np
import psutil
import pytest
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

from .server import HANDLERS, Server, archive, running

pytestmark = pytest.mark.e2e

DEEP_ARRAY = b"[" * 100_000 + b"]" * 100_000
DEEP_OBJECT = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
BIG = "n" * (1 << 20)
GROWTH_LIMIT = 64 << 20  # what the server or its worker may grow by over a whole test
SMALL_BODY = 1024  # an error body quoting a mebibyte value stays under this


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    store = tmp_path_factory.mktemp("hostile-json-store")
    archive(store, "oip", "oip_handler.py", "-c", str(HANDLERS / "oip-config.yaml"))
    work = tmp_path_factory.mktemp("hostile-json")
    with running(Server(work, store, "oip=oip.mar", {"enable_model_api": "true"})) as server:
        yield server


def memory(server: Server) -> dict[int, int]:
    """RSS of the server and each process it started, by pid."""
    assert server.process is not None
    processes = [psutil.Process(server.process.pid), *server.descendants()]
    return {p.pid: p.memory_info().rss for p in processes}


def assert_unharmed(server: Server, before: dict[int, int]) -> None:
    """Same processes (no worker restarted), none grown by more than GROWTH_LIMIT, and a
    normal request answered correctly."""
    after = memory(server)
    assert set(after) == set(before), "a process died or was restarted"
    grown = {pid: after[pid] - before[pid] for pid in before}
    assert max(grown.values()) < GROWTH_LIMIT, grown
    body = {"inputs": [{"name": "x", "shape": [2], "datatype": "INT32", "data": [1, 2]}]}
    answer = httpx.post(f"{server.url}/v2/models/oip/infer", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == [2, 4]
    plain = httpx.post(f"{server.url}/predictions/oip", json={"a": [1]}, timeout=30)
    assert plain.status_code == 200 and plain.json() == {"a": [1]}


def post(url: str, body: bytes) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    return httpx.post(url, content=body, headers=headers, timeout=60)


def test_deep_json_is_refused_or_passed_raw_on_every_route(server: Server) -> None:
    before = memory(server)
    oip_body = b'{"inputs": [{"name": "a", "shape": [1], "datatype": "BYTES", "data": '
    oip_body += DEEP_ARRAY + b"}]}"
    for deep in (DEEP_ARRAY, DEEP_OBJECT):
        for _ in range(3):
            index = post(f"{server.url}/v2/repository/index", deep)
            assert index.status_code == 400, index.text[:300]
            assert "nested deeper than 200 levels" in index.json()["error"]

            v1 = post(f"{server.url}/v1/models/oip:predict", deep)
            assert v1.status_code == 400, v1.text[:300]
            assert "nested deeper than 200 levels" in v1.json()["error"]

            register = post(f"{server.management_url}/models", deep)
            assert register.status_code == 400, register.text[:300]
            assert register.json()["type"] == "BadRequestException"
            assert "nested deeper than 200 levels" in register.json()["message"]

            # TorchServe's worker hands a body it cannot decode to the handler raw.
            raw = post(f"{server.url}/predictions/oip", deep)
            assert raw.status_code == 200, raw.text[:300]
            assert raw.content == deep

            infer = post(f"{server.url}/v2/models/oip/infer", oip_body)
            assert infer.status_code == 400, infer.text[:300]
            assert "malformed JSON: nested deeper than 200 levels" in infer.json()["error"]
    assert_unharmed(server, before)


def test_a_mebibyte_name_gets_a_small_error_body(server: Server) -> None:
    before = memory(server)
    cases = [
        {"inputs": [{"name": BIG, "shape": [2], "datatype": "INT32", "data": [1]}]},
        {"inputs": [{"name": "x", "shape": [1], "datatype": BIG, "data": [1]}]},
        {"inputs": [{"name": BIG, "shape": [1], "datatype": BIG, "data": [1]}]},
        {"inputs": [{"name": "x", "shape": [1], "datatype": "INT32", "data": [1],
                     "parameters": {BIG: {}}}]},
        {"inputs": [{"name": "x", "shape": [1], "datatype": "INT32", "data": [1]}],
         "outputs": [{"name": BIG}]},
    ]  # fmt: skip
    for body in cases:
        answer = httpx.post(f"{server.url}/v2/models/oip/infer", json=body, timeout=60)
        assert answer.status_code == 400, answer.text[:300]
        assert len(answer.content) < SMALL_BODY, answer.content[:300]
        assert "(1048576 characters)" in answer.json()["error"]
    # the same in TorchServe's error body: a version as long as a URL may be
    torchserve = httpx.put(
        f"{server.management_url}/models/oip/{'9' * 8000}/set-default", timeout=60
    )
    assert torchserve.status_code == 404 and len(torchserve.content) < SMALL_BODY
    assert "(8000 characters)" in torchserve.json()["message"]
    # and over gRPC: the status message
    client = triton.InferenceServerClient(server.grpc_target)
    try:
        x = triton.InferInput(BIG, [1], "INT32")
        x.set_data_from_numpy(np.array([1], np.int32))
        x.set_shape([2])  # 4 bytes for a shape that needs 8
        with pytest.raises(InferenceServerException) as caught:
            client.infer("oip", [x])
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert len(caught.value.message()) < SMALL_BODY, caught.value.message()[:300]
        assert "(1048576 characters)" in caught.value.message()
        x = triton.InferInput("x", [1], "INT32")
        x.set_data_from_numpy(np.array([1], np.int32))
        with pytest.raises(InferenceServerException) as caught:
            client.infer(BIG, [x])
        assert caught.value.status() == "StatusCode.NOT_FOUND"
        assert len(caught.value.message()) < SMALL_BODY, caught.value.message()[:300]
    finally:
        client.close()
    assert_unharmed(server, before)


def test_the_handler_sees_the_raw_body_of_deep_json(server: Server) -> None:
    """The body that reached the handler is exactly the bytes sent (no partial decode)."""
    deep = b'{"x": ' + DEEP_ARRAY + b"}"
    answer = post(f"{server.url}/predictions/oip", deep)
    assert answer.status_code == 200 and answer.content == deep
    assert json.loads(post(f"{server.url}/predictions/oip", b'{"x": [[1]]}').content) == {
        "x": [[1]]
    }
