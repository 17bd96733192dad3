"""MLServer model folders (``model-settings.json``) in the model store, end to end: a runtime
written against MLServer's API (``tests/e2e/mlserver_models/doubler``) in a real worker, beside
a TorchServe ``.mar``, driven by httpx, tritonclient (HTTP and gRPC) and the management API."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from .server import Server, archive

pytestmark = pytest.mark.e2e

MODELS = Path(__file__).parent / "mlserver_models"


@pytest.fixture(scope="module")
def mls_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with the MLServer folder ``doubler``, a broken copy of it and ``oip.mar``."""
    store = tmp_path_factory.mktemp("mls-store")
    shutil.copytree(MODELS / "doubler", store / "doubler")
    broken = store / "badsettings"
    shutil.copytree(MODELS / "doubler", broken)
    (broken / "model-settings.json").write_text('{"name": "badsettings", "max_batch_size": -1}')
    archive(
        store,
        "oip",
        "oip_handler.py",
        "-c",
        str(Path(__file__).parent / "handlers" / "oip-config.yaml"),
    )
    return store


@pytest.fixture(scope="module")
def server(mls_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    server = Server(
        tmp_path_factory.mktemp("mls"),
        mls_store,
        "doubler=doubler,oip=oip.mar",
        properties={"enable_model_api": "true"},
    )
    server.start()
    yield server
    server.stop()
    server.kill()


def infer(server: Server, model: str, body: object) -> httpx.Response:
    return httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=30)


def seen(response: dict[str, Any]) -> Any:
    (request,) = [o for o in response["outputs"] if o["name"] == "request"]
    return json.loads(request["data"][0])


def test_metadata_comes_from_the_settings(server: Server) -> None:
    meta = httpx.get(f"{server.url}/v2/models/doubler", timeout=30).json()
    assert meta == {
        "name": "doubler",
        "versions": ["v3"],
        "platform": "numpy",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
        "outputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
    }
    assert (
        httpx.get(f"{server.url}/v2/models/doubler/versions/v3/ready", timeout=30).status_code
        == 200
    )


def test_rest_infer_runs_the_mlserver_runtime(server: Server) -> None:
    r = infer(
        server,
        "doubler",
        {
            "id": "req-7",
            "parameters": {"content_type": "np", "custom": 3},
            "inputs": [
                {"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]},
                {"name": "t", "shape": [2], "datatype": "BYTES", "data": ["ab", "cd"],
                 "parameters": {"content_type": "str"}},
            ],
        },
    )  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model_name"] == "doubler" and body["model_version"] == "v3"
    assert body["id"] == "req-7"
    x, t = body["outputs"][0], body["outputs"][1]
    assert (x["name"], x["datatype"], x["shape"], x["data"]) == (
        "x",
        "FP32",
        [1, 3],
        [2.5, 5.0, 7.5],
    )
    assert (t["name"], t["datatype"], t["data"]) == ("t", "BYTES", ["AB", "CD"])
    assert seen(body) == {
        "id": "req-7",
        "parameters": {"content_type": "np", "custom": 3},
        "content_types": {"t": "str"},
    }


def test_model_errors_keep_their_status(server: Server) -> None:
    fail = infer(
        server,
        "doubler",
        {"inputs": [{"name": "fail", "shape": [1], "datatype": "INT32", "data": [1]}]},
    )
    assert fail.status_code == 400 and "asks this model to fail" in fail.json()["error"]
    crash = infer(
        server,
        "doubler",
        {"inputs": [{"name": "crash", "shape": [1], "datatype": "INT32", "data": [1]}]},
    )
    assert crash.status_code == 500 and "crashed on purpose" in crash.json()["error"]
    # the worker survives both
    ok = infer(
        server,
        "doubler",
        {"inputs": [{"name": "x", "shape": [1], "datatype": "INT64", "data": [4]}]},
    )
    assert ok.status_code == 200 and ok.json()["outputs"][0]["data"] == [10.0]


def test_torchserve_routes_are_refused_with_directions(server: Server) -> None:
    r = httpx.post(f"{server.url}/predictions/doubler", content=b"1,2,3", timeout=30)
    assert r.status_code == 400
    assert "/v2/models/doubler/infer" in r.text


def test_tritonclient_http_and_grpc_beside_a_mar(server: Server) -> None:
    data = np.array([[1.0, -2.0, 0.5]], np.float32)
    http = triton_http.InferenceServerClient(f"127.0.0.1:{server.port}")
    try:
        for binary in (False, True):
            x = triton_http.InferInput("x", [1, 3], "FP32")
            x.set_data_from_numpy(data, binary_data=binary)
            out = triton_http.InferRequestedOutput("x", binary_data=binary)
            result = http.infer("doubler", [x], outputs=[out])
            assert result.as_numpy("x").tolist() == [[2.5, -5.0, 1.25]]
        y = triton_http.InferInput("x", [1, 3], "FP32")
        y.set_data_from_numpy(data)
        assert http.infer("oip", [y]).as_numpy("x").tolist() == [[2.0, -4.0, 1.0]]
    finally:
        http.close()
    grpc = triton_grpc.InferenceServerClient(server.grpc_target)
    try:
        x = triton_grpc.InferInput("x", [1, 3], "FP32")
        x.set_data_from_numpy(data)
        result = grpc.infer(
            "doubler", [x], request_id="g-1", outputs=[triton_grpc.InferRequestedOutput("x")]
        )
        assert result.as_numpy("x").tolist() == [[2.5, -5.0, 1.25]]
        assert result.get_response().id == "g-1"
        meta = grpc.get_model_metadata("doubler", as_json=True)
        assert meta["platform"] == "numpy" and meta["inputs"][0]["shape"] == ["-1", "3"]
        assert grpc.infer("oip", [x]).as_numpy("x").tolist() == [[2.0, -4.0, 1.0]]
    finally:
        grpc.close()


def test_management_api_registers_a_folder_and_refuses_bad_settings(server: Server) -> None:
    with httpx.Client(base_url=server.management_url, timeout=60) as mgmt:
        r = mgmt.post(
            "/models",
            params={
                "url": "doubler",
                "model_name": "twice",
                "initial_workers": "1",
                "synchronous": "true",
            },
        )
        assert r.status_code == 200, r.text
        described = mgmt.get("/models/twice").json()
        assert described[0]["modelVersion"] == "v3"
        out = infer(
            server,
            "twice",
            {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [2]}]},
        )
        assert out.status_code == 200 and out.json()["model_name"] == "twice"
        assert mgmt.delete("/models/twice").status_code == 200
        bad = mgmt.post("/models", params={"url": "badsettings", "initial_workers": "1"})
        assert bad.status_code == 400
        message = bad.json()["message"]
        assert "model-settings.json" in message and "implementation" in message
        assert "max_batch_size" in message


def test_models_all_loads_folders_and_archives(mls_store: Path, tmp_path: Path) -> None:
    good = tmp_path / "store"
    good.mkdir()
    shutil.copytree(mls_store / "doubler", good / "doubler")
    shutil.copy(mls_store / "oip.mar", good / "oip.mar")
    server = Server(tmp_path / "work", good, "all")
    (tmp_path / "work").mkdir()
    server.start()
    try:
        listed = httpx.get(f"{server.management_url}/models", timeout=30).json()["models"]
        assert sorted(m["modelName"] for m in listed) == ["doubler", "oip"]
        r = infer(
            server,
            "doubler",
            {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]},
        )
        assert r.status_code == 200
    finally:
        server.stop()
        server.kill()


# -- MLServer's own client side (its types, codecs, gRPC stubs and converters) ---------------

MLS_PYTHON = Path(__file__).resolve().parents[2] / ".venv-mlserver" / "bin" / "python"


def mlserver_client(server: Server, scenario: str) -> Any:
    """Run tests/e2e/mlserver_clients.py with the real mlserver package (``make setup``
    builds ``.venv-mlserver``)."""
    assert MLS_PYTHON.exists(), f"{MLS_PYTHON} is missing: run `make setup`"
    done = subprocess.run(
        [str(MLS_PYTHON), str(Path(__file__).parent / "mlserver_clients.py"), scenario,
         server.url, server.grpc_target],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_mlserver_rest_client(server: Server) -> None:
    got = mlserver_client(server, "rest")
    assert got["id"] == "rest-1" and got["model"] == "doubler"
    assert got["x"] == [[2.5, 5.0, 7.5]]
    assert json.loads(got["request"][0])["id"] == "rest-1"


def test_mlserver_grpc_stubs_and_converters(server: Server) -> None:
    got = mlserver_client(server, "grpc")
    assert got["id"] == "grpc-1" and got["x"] == [[5.0, 7.5, 10.0]]
    assert got["ready"] is True and got["inputs"] == [["x", "FP32", [-1, 3]]]


def test_mlserver_stream_stubs_mlserver_shape(server: Server) -> None:
    """ModelStreamInfer in MLServer's shape (the default): a stream that opens on a
    TorchServe model answers its requests one by one, so it may reach a folder too (one that
    opens on an MLServer model is that model's stream: test_mlserver_streaming.py)."""
    got = mlserver_client(server, "stream")
    assert [r["id"] for r in got] == ["s-0", "s-1", "s-2"]
    assert [r["model"] for r in got] == ["oip", "doubler", "oip"]
    assert got[0]["x"] == [[0.0, 2.0, 4.0]] and got[1]["x"] == [[2.5, 5.0, 7.5]]
