"""The Open Inference Protocol over REST, end to end: a TorchServe-style handler in a real
worker, driven by httpx and by tritonclient's HTTP client (JSON and binary tensors)."""

from __future__ import annotations

import json
import struct
from concurrent.futures import ThreadPoolExecutor

import httpx
import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from .server import Server

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(store, tmp_path_factory) -> Server:  # type: ignore[no-untyped-def]
    workdir = tmp_path_factory.mktemp("oip")
    server = Server(workdir, store, "oip=oip.mar")
    server.start()
    yield server
    server.stop()
    server.kill()


def infer(server: Server, body: object, path: str = "/v2/models/oip/infer") -> httpx.Response:
    return httpx.post(f"{server.url}{path}", content=json.dumps(body), timeout=30)


def test_server_and_model_metadata_health_and_readiness(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        meta = http.get("/v2").json()
        assert meta["name"] == "trioserve" and "binary_tensor_data" in meta["extensions"]
        assert http.get("/v2/health/live").status_code == 200
        assert http.get("/v2/health/ready").status_code == 200
        model = http.get("/v2/models/oip").json()
        assert model["name"] == "oip" and model["versions"] == ["1.0"]
        assert model["inputs"] == [] and model["outputs"] == []  # none declared: none invented
        assert http.get("/v2/models/oip/versions/1.0").json()["name"] == "oip"
        assert http.get("/v2/models/oip/ready").status_code == 200
        assert http.get("/v2/models/oip/versions/1.0/ready").status_code == 200


def test_json_inference_each_input_becomes_an_output(server: Server) -> None:
    r = infer(
        server,
        {
            "id": "r-1",
            "inputs": [
                {"name": "x", "shape": [2, 2], "datatype": "INT32", "data": [[1, 2], [3, 4]]},
                {"name": "flag", "shape": [3], "datatype": "BOOL", "data": [True, False, True]},
                {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["héllo"]},
            ],
        },
    )
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["model_name"] == "oip" and answer["model_version"] == "1.0"
    assert answer["id"] == "r-1"
    outputs = {o["name"]: o for o in answer["outputs"]}
    assert outputs["x"] == {"name": "x", "datatype": "INT64", "shape": [2, 2], "data": [2, 4, 6, 8]}
    assert outputs["flag"]["data"] == [False, True, False]
    assert outputs["text"]["data"] == ["olléh"]


def test_outputs_can_be_selected_and_asked_for_as_binary(server: Server) -> None:
    body = {
        "inputs": [
            {"name": "a", "shape": [2], "datatype": "FP32", "data": [1.5, 2.5]},
            {"name": "b", "shape": [1], "datatype": "INT64", "data": [7]},
        ],
        "outputs": [{"name": "a", "parameters": {"binary_data": True}}],
    }
    r = infer(server, body)
    assert r.status_code == 200, r.text
    length = int(r.headers["Inference-Header-Content-Length"])
    head = json.loads(r.content[:length])
    (output,) = head["outputs"]
    assert output["name"] == "a" and output["parameters"]["binary_data_size"] == 16
    assert struct.unpack("<2d", r.content[length:]) == (3.0, 5.0)


def test_binary_inputs_every_numeric_datatype(server: Server) -> None:
    cases = {
        "UINT8": np.array([1, 255], np.uint8),
        "INT16": np.array([-3, 300], np.int16),
        "UINT64": np.array([2**40], np.uint64),
        "FP16": np.array([0.5, -2.0], np.float16),
        "FP64": np.array([1e-3], np.float64),
    }
    for datatype, array in cases.items():
        raw = array.astype(array.dtype.newbyteorder("<")).tobytes()
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": "v",
                        "shape": list(array.shape),
                        "datatype": datatype,
                        "parameters": {"binary_data_size": len(raw)},
                    }
                ]
            }
        ).encode()
        r = httpx.post(
            f"{server.url}/v2/models/oip/infer",
            content=header + raw,
            headers={"Inference-Header-Content-Length": str(len(header))},
            timeout=30,
        )
        assert r.status_code == 200, (datatype, r.text)
        (output,) = r.json()["outputs"]
        assert output["data"] == pytest.approx([float(v) * 2 for v in array]), datatype


def test_bad_requests_get_oip_errors(server: Server) -> None:
    cases = [
        ("/v2/models/nope/infer", {"inputs": []}, 404, "nope"),
        ("/v2/models/oip/versions/9/infer", {"inputs": []}, 404, "9"),
        ("/v2/models/oip/infer", {"inputs": [{"name": "a", "shape": [2], "datatype": "FP32",
                                              "data": [1]}]}, 400, "needs 2 elements"),
        ("/v2/models/oip/infer", {"inputs": [{"name": "a", "shape": [1], "datatype": "FP99",
                                              "data": [1]}]}, 400, "FP99"),
        ("/v2/models/oip/infer", {"nothing": 1}, 400, "inputs"),
    ]  # fmt: skip
    for path, body, status, words in cases:
        r = infer(server, body, path)
        assert r.status_code == status, (path, body, r.text)
        assert set(r.json()) == {"error"} and words in r.json()["error"], r.text
    malformed = httpx.post(f"{server.url}/v2/models/oip/infer", content=b"{nope", timeout=30)
    assert malformed.status_code == 400 and "error" in malformed.json()
    sizes = httpx.post(
        f"{server.url}/v2/models/oip/infer",
        content=b'{"inputs":[{"name":"a","shape":[2],"datatype":"FP32",'
        b'"parameters":{"binary_data_size":8}}]}' + b"\0" * 4,
        headers={"Inference-Header-Content-Length": "76"},
        timeout=30,
    )
    assert sizes.status_code == 400 and "error" in sizes.json()
    assert httpx.get(f"{server.url}/v2/models/nope", timeout=30).status_code == 404


def test_a_handler_failure_is_an_oip_error(server: Server) -> None:
    r = infer(server, {"inputs": [{"name": "fail", "shape": [1], "datatype": "INT8", "data": [1]}]})
    assert r.status_code == 500 and r.json() == {"error": "Prediction failed"}


def test_an_answer_that_fits_no_datatype_is_a_clear_error(server: Server) -> None:
    big = {"name": "n", "shape": [1], "datatype": "UINT64", "data": [2**64 - 1]}
    r = infer(server, {"inputs": [big]})  # the handler doubles it: past every integer type
    assert r.status_code == 500
    assert "not a valid output" in r.json()["error"] and "'n'" in r.json()["error"]


def test_concurrent_oip_requests_are_batched(server: Server) -> None:
    body = {"inputs": [{"name": "batch", "shape": [1], "datatype": "INT8", "data": [0]}]}
    with ThreadPoolExecutor(8) as pool:
        sizes = list(pool.map(lambda _i: infer(server, body).json()["outputs"][0]["data"][0],
                              range(32)))  # fmt: skip
    assert max(sizes) > 1  # some requests shared a batch (batchSize 4)
    assert max(sizes) <= 4


def test_infer_stream_answers_server_sent_events(server: Server) -> None:
    body = {"inputs": [{"name": "a", "shape": [2], "datatype": "INT32", "data": [1, 5]}]}
    with httpx.stream(
        "POST", f"{server.url}/v2/models/oip/infer_stream", content=json.dumps(body), timeout=30
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        text = r.read().decode()
    events = [line for line in text.split("\n\n") if line]
    assert len(events) == 1 and events[0].startswith("data: ")
    assert json.loads(events[0][6:])["outputs"][0]["data"] == [2, 10]


def test_tritonclient_http_json_and_binary(server: Server) -> None:
    client = triton.InferenceServerClient(f"127.0.0.1:{server.port}")
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("oip")
        assert client.get_model_metadata("oip")["name"] == "oip"
        for binary in (False, True):
            values = np.array([[1.0, 2.0, 3.0]], np.float32)
            tensor = triton.InferInput("input0", [1, 3], "FP32")
            tensor.set_data_from_numpy(values, binary_data=binary)
            words = triton.InferInput("words", [2], "BYTES")
            words.set_data_from_numpy(np.array([b"ab", b"xyz"], dtype=object), binary_data=binary)
            outputs = [
                triton.InferRequestedOutput("input0", binary_data=binary),
                triton.InferRequestedOutput("words", binary_data=binary),
            ]
            result = client.infer("oip", [tensor, words], outputs=outputs, request_id="t-1")
            assert result.get_response()["id"] == "t-1"
            np.testing.assert_allclose(result.as_numpy("input0"), values * 2)
            words = [w if isinstance(w, bytes) else w.encode() for w in result.as_numpy("words")]
            assert words == [b"ba", b"zyx"]  # JSON gives str, binary bytes
        with pytest.raises(InferenceServerException, match="nope"):
            client.get_model_metadata("nope")
    finally:
        client.close()


def test_tritonclient_bf16_binary(server: Server) -> None:
    client = triton.InferenceServerClient(f"127.0.0.1:{server.port}")
    try:
        tensor = triton.InferInput("h", [3], "BF16")
        values = np.array([1.0, -2.5, 0.15625], dtype=ml_dtypes.bfloat16)
        tensor.set_data_from_numpy(values, binary_data=True)
        result = client.infer("oip", [tensor])
        # The handler got the values as floats and answered floats (FP64 out).
        np.testing.assert_allclose(result.as_numpy("h"), [2.0, -5.0, 0.3125])
    finally:
        client.close()


def test_repository_index_and_a_disabled_model_api(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        listed = http.post("/v2/repository/index").json()
        assert {"name": "oip", "version": "1.0", "state": "READY", "reason": ""} in listed
        assert http.post("/v2/repository/index", json={"ready": True}).json() == listed
        refused = http.post("/v2/repository/models/echo/load")
        assert refused.status_code == 405 and "model API" in refused.json()["error"]
        assert http.post("/v2/repository/index", content=b"[1]").status_code == 400


def test_repository_load_and_unload_with_the_model_api(store, tmp_path) -> None:  # type: ignore[no-untyped-def]
    server = Server(tmp_path, store, "oip=oip.mar", properties={"enable_model_api": "true"})
    server.start()
    try:
        client = triton.InferenceServerClient(f"127.0.0.1:{server.port}")
        try:
            client.load_model("echo")  # echo.mar from the store, one worker
            assert client.is_model_ready("echo")
            names = {m["name"] for m in client.get_model_repository_index()}
            assert names == {"oip", "echo"}
            client.load_model("echo")  # already loaded: left as it is
            client.unload_model("echo")
            assert not _exists(client, "echo")
            with pytest.raises(InferenceServerException, match="nope"):
                client.load_model("nope")
        finally:
            client.close()
        with httpx.Client(base_url=server.url, timeout=30) as http:
            assert http.get("/v2/models/echo").status_code == 404
            assert http.post("/v2/repository/models/echo/unload").status_code == 404
    finally:
        server.stop()
        server.kill()


def _exists(client: triton.InferenceServerClient, name: str) -> bool:
    try:
        client.get_model_metadata(name)
    except InferenceServerException:
        return False
    return True


def test_a_body_over_the_limit_gets_the_oip_error_body(server: Server) -> None:
    """The front refuses an oversized body before routing; on an OIP path it still answers
    ``{"error"}`` (Content-Length known up front, and a chunked body that grows too big)."""
    import socket

    def send(head: bytes, body: bytes = b"") -> tuple[int, bytes]:
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(head + body)
            data = b""
            while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) == 0:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        status = int(data.split(b" ", 2)[1])
        return status, data.split(b"\r\n\r\n", 1)[1]

    big = 1 << 40
    for path, expected in (("/v2/models/oip/infer", "error"), ("/predictions/oip", "code")):
        status, body = send(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {big}\r\n\r\n".encode()
        )
        assert status == 413
        assert expected in json.loads(body) and "max_request_size" in body.decode()
    chunk = b"x" * (1 << 20)
    status, body = send(
        b"POST /v2/models/oip/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(8)),
    )
    assert status == 413 and "error" in json.loads(body)
