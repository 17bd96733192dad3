"""KServe's v1 protocol end to end, with httpx: the demo echo model, a TorchServe handler that
batches (each instance one row), a model whose own ``kserve`` envelope answers, and an
MLServer model (v2 only), in one real server."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from .server import HANDLERS, Server, archive, running

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    store = tmp_path_factory.mktemp("kserve-store")
    archive(store, "echo", str(REPO / "handlers" / "echo" / "echo_handler.py"))
    config = store.parent / "doubler-config.yaml"
    config.write_text("minWorkers: 1\nmaxWorkers: 1\nbatchSize: 4\nmaxBatchDelay: 50\n")
    archive(store, "doubler", "envelope_handler.py", "-c", str(config))
    # A model folder whose manifest names the kserve envelope: v1 bodies go to it as they are.
    folder = store / "enveloped"
    (folder / "MAR-INF").mkdir(parents=True)
    shutil.copy(HANDLERS / "envelope_handler.py", folder / "envelope_handler.py")
    manifest = {
        "runtime": "python",
        "model": {
            "modelName": "enveloped",
            "modelVersion": "1.0",
            "handler": "envelope_handler.py",
            "envelope": "kserve",
        },
    }
    (folder / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(manifest))
    shutil.copytree(Path(__file__).parent / "mlserver_models" / "doubler", store / "mls")
    settings = json.loads((store / "mls" / "model-settings.json").read_text())
    (store / "mls" / "model-settings.json").write_text(json.dumps({**settings, "name": "mls"}))
    workdir = tmp_path_factory.mktemp("kserve")
    with running(Server(workdir, store, "echo.mar,doubler.mar,enveloped,mls=mls")) as server:
        yield server


def predict(server: Server, model: str, body: object, verb: str = "predict") -> httpx.Response:
    return httpx.post(f"{server.url}/v1/models/{model}:{verb}", json=body, timeout=30)


def test_models_and_readiness(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert sorted(http.get("/v1/models").json()["models"]) == [
            "doubler",
            "echo",
            "enveloped",
            "mls",
        ]
        r = http.get("/v1/models/echo")
        assert (r.status_code, r.json()) == (200, {"name": "echo", "ready": True})
        r = http.get("/v1/models/nope")
        assert r.status_code == 404
        assert set(r.json()) == {"error"} and "nope" in r.json()["error"]


def test_the_demo_echo_model_answers_each_instance(server: Server) -> None:
    instances = [1, [1, 2], [3.5, None], True, {"body": [5]}]
    r = predict(server, "echo", {"instances": instances})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    # A dict instance is a row of named values to the echo handler: it answers "body"'s.
    assert r.json() == {"predictions": [*instances[:-1], [5]]}


def test_a_batching_handler_gets_instances_as_rows_in_order(server: Server) -> None:
    r = predict(server, "doubler", {"instances": [1, 2.5, [7]]})
    assert r.json() == {"predictions": [2, 5.0, [7]]}
    r = predict(server, "doubler", {"instances": [3]}, verb="explain")
    assert r.json() == {"explanations": [6]}

    def one(n: int) -> object:
        return predict(server, "doubler", {"instances": list(range(n))}).json()

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, range(8)))
    assert answers == [{"predictions": [2 * i for i in range(n)]} for n in range(8)]


def test_a_model_with_the_kserve_envelope_answers_itself(server: Server) -> None:
    assert predict(server, "enveloped", {"instances": [1, 2]}).json() == {"predictions": [2, 4]}
    r = predict(server, "enveloped", {"instances": [5]}, verb="explain")
    assert r.json() == {"explanations": [10]}


@pytest.mark.parametrize(
    ("model", "body", "status", "says"),
    [
        ("echo", b"{not json", 400, "not JSON"),
        ("echo", b'{"inputs": [1]}', 400, '"instances"'),
        ("echo", b'{"instances": 3}', 400, "must be an array"),
        ("nope", b'{"instances": [1]}', 404, "nope"),
        ("mls", b'{"instances": [1]}', 400, "/v2/models/mls/infer"),
    ],
)
def test_failures_answer_kserves_error_body(
    server: Server, model: str, body: bytes, status: int, says: str
) -> None:
    r = httpx.post(f"{server.url}/v1/models/{model}:predict", content=body, timeout=30)
    assert r.status_code == status
    assert set(r.json()) == {"error"} and says in r.json()["error"]


def test_the_app_answers_what_the_fast_path_hands_on(server: Server) -> None:
    # A percent-escaped path goes to the Quart app, which answers the same way.
    r = httpx.post(f"{server.url}/v1/models/ech%6F:predict", json={"instances": [4]}, timeout=30)
    assert (r.status_code, r.json()) == (200, {"predictions": [4]})
    r = httpx.get(f"{server.url}/v1/models/ech%6F", timeout=30)
    assert r.json() == {"name": "echo", "ready": True}
    r = httpx.get(f"{server.url}/v1/models/echo:predict", timeout=30)  # a model of that name
    assert r.status_code == 404 and "echo:predict" in r.json()["error"]
    r = httpx.get(f"{server.url}/v1/other", timeout=30)
    assert r.status_code == 404 and set(r.json()) == {"error"}
