"""The management API end to end: real server, real workers, httpx."""

from __future__ import annotations

import os
import stat
import threading
import time

import httpx
import pytest

from .server import Server

pytestmark = pytest.mark.e2e


def body_of(r: httpx.Response) -> object:
    return r.json()


@pytest.fixture
def mgmt(make_server) -> Server:  # type: ignore[no-untyped-def]
    server = make_server("control=control.mar", properties={"enable_model_api": "true"})
    server.start()
    return server


def wait_for(predicate, timeout: float = 30) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)


def test_model_api_is_off_by_default(make_server) -> None:  # type: ignore[no-untyped-def]
    server = make_server()
    server.start()
    with httpx.Client(base_url=server.management_url, timeout=30) as c:
        r = c.post("/models", params={"url": "control2.mar"})
        assert r.status_code == 405
        assert r.json()["type"] == "MethodNotAllowedException"
        assert "enable-model-api" in r.json()["message"]
        assert c.delete("/models/control").status_code == 405
        # list, describe and scale keep working
        assert c.get("/models").json()["models"] == [
            {"modelName": "control", "modelUrl": "control.mar"}
        ]
        assert c.get("/models/control").status_code == 200
        assert c.put("/models/control", params={"min_worker": 1}).status_code == 202


def test_register_describe_list_and_unregister(mgmt: Server) -> None:
    with httpx.Client(base_url=mgmt.management_url, timeout=60) as c:
        r = c.post("/models", params={"url": "control2.mar", "initial_workers": 1})
        assert r.status_code == 200
        assert r.json() == {
            "status": 'Model "control2" Version: 1.0 registered with 1 initial workers'
        }
        r = c.post("/models", params={"url": "control2.mar"})
        assert r.status_code == 409
        assert r.json()["message"] == "Model version 1.0 is already registered for model control2"
        described = c.get("/models/control2").json()
        assert isinstance(described, list) and len(described) == 1
        d = described[0]
        assert d["modelName"] == "control2" and d["modelVersion"] == "1.0"
        assert d["modelUrl"] == "control2.mar"
        assert (d["minWorkers"], d["maxWorkers"], d["batchSize"]) == (1, 1, 1)
        assert d["loadedAtStartup"] is False
        worker = d["workers"][0]
        assert worker["status"] == "READY" and worker["pid"] > 0
        assert worker["memoryUsage"] > 0 and worker["id"].isdigit()
        assert d["jobQueueStatus"] == {"remainingCapacity": 100, "pendingRequests": 0}
        # the registered model serves
        r = httpx.post(f"{mgmt.url}/predictions/control2", content=b"hi", timeout=30)
        assert r.text == "hi"
        r = c.delete("/models/control2")
        assert r.json() == {"status": 'Model "control2" unregistered'}
        assert c.get("/models/control2").status_code == 404
        assert worker["pid"] not in mgmt.worker_pids()


def test_register_with_json_body_and_no_workers(mgmt: Server) -> None:
    with httpx.Client(base_url=mgmt.management_url, timeout=60) as c:
        r = c.post("/models", json={"url": "control2.mar", "model_name": "viajson"})
        assert r.status_code == 200
        assert "registered with 0 initial workers" in r.json()["status"]
        r = httpx.post(f"{mgmt.url}/predictions/viajson", content=b"x", timeout=30)
        assert r.status_code == 503
        assert "scale workers API" in r.json()["message"]


def test_register_errors(mgmt: Server) -> None:
    with httpx.Client(base_url=mgmt.management_url, timeout=60) as c:
        r = c.post("/models")
        assert (r.status_code, r.json()["message"]) == (400, "Parameter url is required.")
        r = c.post("/models", params={"url": "nope.mar"})
        assert (r.status_code, r.json()["message"]) == (404, "Model not found at: nope.mar")
        r = c.post("/models", params={"url": "control2.mar", "runtime": "LSP"})
        assert r.status_code == 400 and "runtime" in r.json()["message"]
        r = c.post("/models", params={"url": "control2.mar", "batch_size": "many"})
        assert r.status_code == 400 and "batch_size" in r.json()["message"]
        r = c.post("/models", params={"url": "../control2.mar"})
        assert r.status_code == 404
        r = c.put("/models/control", params={"min_worker": 100000})
        assert r.status_code == 400 and "max_workers_per_model" in r.json()["message"]
        r = c.post("/models", params={"url": "control2.mar", "initial_workers": -1})
        assert r.status_code == 400 and "initial_workers" in r.json()["message"]
        r = c.post(
            "/models", content=b'{"url": "\xff', headers={"Content-Type": "application/json"}
        )
        assert r.status_code == 400 and "not valid JSON" in r.json()["message"]
        r = c.post("/models", params={"url": "http://127.0.0.1:1/x.mar"})
        assert r.status_code == 404 and "allowed" in r.json()["message"]


def test_failed_registration_is_rolled_back(mgmt: Server) -> None:
    with httpx.Client(base_url=mgmt.management_url, timeout=90) as c:
        r = c.post("/models", params={"url": "broken.mar", "initial_workers": 1})
        assert r.status_code == 500
        assert r.json()["message"].startswith("Failed to start workers for model broken")
        assert "weights are missing" in r.json()["message"]
        assert c.get("/models/broken").status_code == 404
        assert [m["modelName"] for m in c.get("/models").json()["models"]] == ["control"]


def test_async_scale_reaches_the_requested_count_and_sync_scale_down(mgmt: Server) -> None:
    with httpx.Client(base_url=mgmt.management_url, timeout=60) as c:
        r = c.put("/models/control", params={"min_worker": 3})
        assert (r.status_code, r.json()) == (202, {"status": "Processing worker updates..."})

        def ready() -> int:
            workers = c.get("/models/control").json()[0]["workers"]
            return sum(1 for w in workers if w["status"] == "READY")

        wait_for(lambda: ready() == 3)
        assert len(mgmt.worker_pids()) >= 3
        r = c.put("/models/control", params={"min_worker": 1, "synchronous": "true"})
        assert r.status_code == 200
        assert r.json() == {"status": "Workers scaled to 1 for model: control"}
        assert len(c.get("/models/control").json()[0]["workers"]) == 1
        r = c.put("/models/control/1.0", params={"min_worker": 2, "max_worker": 1})
        assert (r.status_code, r.json()["message"]) == (
            400,
            "max_worker cannot be less than min_worker.",
        )
        r = c.put("/models/control/1.0", params={"min_worker": 1, "synchronous": "true"})
        assert r.json() == {"status": "Workers scaled to 1 for model: control, version: 1.0"}
        assert c.put("/models/nope", params={"min_worker": 1}).status_code == 404


def test_scale_down_drains_a_busy_worker_without_failing_its_request(mgmt: Server) -> None:
    with httpx.Client(base_url=mgmt.management_url, timeout=60) as c:
        c.put("/models/control", params={"min_worker": 2, "synchronous": "true"})
        results: list[httpx.Response] = []
        threads = [
            threading.Thread(
                target=lambda: results.append(
                    httpx.post(f"{mgmt.url}/predictions/control", content=b"sleep:1.2", timeout=30)
                )
            )
            for _ in range(2)
        ]
        for t in threads:
            t.start()
        markers = mgmt.workdir / "markers"
        wait_for(lambda: len(list(markers.glob("started-*"))) == 2)  # both workers are busy
        r = c.put("/models/control", params={"min_worker": 0, "synchronous": "true"})
        assert r.status_code == 200
        for t in threads:
            t.join()
        assert [x.status_code for x in results] == [200, 200]
        assert [x.text for x in results] == ["slept", "slept"]
        assert c.get("/models/control").json()[0]["workers"] == []


def test_versions_default_rules_and_describe_all(mgmt: Server) -> None:
    with httpx.Client(base_url=mgmt.management_url, timeout=60) as c:
        assert c.post("/models", params={"url": "multi-1.mar"}).status_code == 200
        assert c.post("/models", params={"url": "multi-2.mar"}).status_code == 200
        versions = [d["modelVersion"] for d in c.get("/models/multi/all").json()]
        assert versions == ["1.0", "2.0"]
        assert c.get("/models/multi").json()[0]["modelVersion"] == "1.0"
        r = c.delete("/models/multi")
        assert (r.status_code, r.json()["message"]) == (
            403,
            "Cannot remove default version for model multi",
        )
        r = c.put("/models/multi/3.0/set-default")
        assert (r.status_code, r.json()["message"]) == (
            404,
            "Model version 3.0 does not exist for model multi",
        )
        r = c.put("/models/multi/2.0/set-default")
        assert r.json() == {
            "status": 'Default version successfully updated for model "multi" to "2.0"'
        }
        assert c.get("/models/multi").json()[0]["modelVersion"] == "2.0"
        r = c.delete("/models/multi/7.0")
        assert (r.status_code, r.json()["message"]) == (
            404,
            "Model version: 7.0 does not exist for model: multi",
        )
        assert c.delete("/models/multi/1.0").status_code == 200
        assert c.delete("/models/multi").status_code == 200
        assert c.get("/models/multi").status_code == 404


def test_list_pagination_edges(mgmt: Server) -> None:
    with httpx.Client(base_url=mgmt.management_url, timeout=60) as c:
        for name in ("b", "a"):
            c.post("/models", params={"url": "control2.mar", "model_name": name})
        names = lambda body: [m["modelName"] for m in body["models"]]  # noqa: E731
        full = c.get("/models").json()
        assert names(full) == ["a", "b", "control"] and "nextPageToken" not in full
        page = c.get("/models", params={"limit": 2}).json()
        assert (names(page), page["nextPageToken"]) == (["a", "b"], "2")
        page = c.get("/models", params={"limit": 2, "next_page_token": 2}).json()
        assert names(page) == ["control"] and "nextPageToken" not in page
        page = c.get("/models", params={"limit": 3}).json()
        assert page["nextPageToken"] == "3"  # TorchServe points past the end
        page = c.get("/models", params={"limit": -5}).json()
        assert names(page) == ["a", "b", "control"]
        assert c.get("/models", params={"limit": "x"}).status_code == 400
        page = c.get("/models", params={"next_page_token": 10}).json()
        assert page["models"] == []


def test_customized_describe_calls_the_handler(make_server) -> None:  # type: ignore[no-untyped-def]
    server = make_server("tsstyle.mar")
    server.start()
    r = httpx.get(
        f"{server.management_url}/models/tsstyle", params={"customized": "true"}, timeout=30
    )
    assert r.status_code == 200
    assert r.json()[0]["customizedMetadata"] == {"purpose": "upper-cases text", "prefix": "ts:"}


def test_tokens_guard_each_port(make_server) -> None:  # type: ignore[no-untyped-def]
    server = make_server(tokens=True)
    server.start()
    key_file = server.workdir / "key_file.json"
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    infer, manage = server.auth("inference"), server.auth("management")
    api = server.auth("API")
    r = httpx.post(f"{server.url}/predictions/control", content=b"x", timeout=30)
    assert r.status_code == 401 and r.json()["type"] == "InvalidKeyException"
    assert httpx.get(f"{server.url}/ping", timeout=30).status_code == 401
    r = httpx.post(f"{server.url}/predictions/control", content=b"x", headers=manage, timeout=30)
    assert r.status_code == 401
    r = httpx.post(f"{server.url}/predictions/control", content=b"x", headers=infer, timeout=30)
    assert r.status_code == 200 and r.text == "x"
    assert (
        httpx.get(f"{server.management_url}/models", headers=infer, timeout=30).status_code == 401
    )
    assert (
        httpx.get(f"{server.management_url}/models", headers=manage, timeout=30).status_code == 200
    )
    # rotating the inference key needs the API key, and the old key stops working
    assert (
        httpx.get(
            f"{server.management_url}/token",
            params={"type": "inference"},
            headers=manage,
            timeout=30,
        ).status_code
        == 401
    )
    r = httpx.get(
        f"{server.management_url}/token", params={"type": "inference"}, headers=api, timeout=30
    )
    assert r.status_code == 200
    assert (
        httpx.post(
            f"{server.url}/predictions/control", content=b"x", headers=infer, timeout=30
        ).status_code
        == 401
    )
    fresh = server.auth("inference")
    assert fresh != infer
    assert (
        httpx.post(
            f"{server.url}/predictions/control", content=b"x", headers=fresh, timeout=30
        ).status_code
        == 200
    )
    r = httpx.get(
        f"{server.management_url}/token", params={"type": "bogus"}, headers=api, timeout=30
    )
    assert r.status_code == 400
    server.stop()
    assert not key_file.exists()


def test_token_endpoint_is_404_when_auth_is_disabled(mgmt: Server) -> None:
    r = httpx.get(f"{mgmt.management_url}/token", params={"type": "inference"}, timeout=30)
    assert r.status_code == 404


def test_models_setting_picks_the_default_version(make_server) -> None:  # type: ignore[no-untyped-def]
    import json

    models = {"multi": {"2.0": {"defaultVersion": True}}}
    server = make_server("multi-1.mar,multi-2.mar", properties={"models": json.dumps(models)})
    server.start()
    with httpx.Client(base_url=server.management_url, timeout=30) as c:
        assert c.get("/models/multi").json()[0]["modelVersion"] == "2.0"
