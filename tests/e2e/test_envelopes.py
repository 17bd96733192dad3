"""Server-wide request envelopes (``service_envelope``) and ``default_service_handler`` end to
end, with httpx."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from .server import HANDLERS, Server, archive, running

pytestmark = pytest.mark.e2e


@pytest.fixture
def envelope_store(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    store.mkdir()
    archive(store, "env", "envelope_handler.py")
    # A model folder whose manifest names no handler: default_service_handler picks it.
    folder = store / "plain"
    (folder / "MAR-INF").mkdir(parents=True)
    shutil.copy(HANDLERS / "envelope_handler.py", folder / "envelope_handler.py")
    manifest = {"runtime": "python", "model": {"modelName": "plain", "modelVersion": "1.0"}}
    (folder / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(manifest))
    return store


def _server(tmp_path: Path, store: Path, properties: dict[str, str]) -> Server:
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    return Server(workdir, store, "env.mar,plain", properties=properties)


def test_kserve_envelope_answers_predictions(tmp_path: Path, envelope_store: Path) -> None:
    server = _server(
        tmp_path,
        envelope_store,
        {"service_envelope": "kserve", "default_service_handler": "envelope_handler"},
    )
    with running(server):
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for model in ("env", "plain"):
                r = client.post(f"/predictions/{model}", json={"instances": [1, 2.5]})
                assert r.status_code == 200, r.text
                assert r.json() == {"predictions": [2, 5.0]}
                r = client.post(f"/explanations/{model}", json={"instances": [3]})
                assert r.json() == {"explanations": [6]}
            r = client.post("/predictions/env", json={"rows": [1]})
            assert r.status_code == 400 and "instances" in r.json()["message"]


def test_kservev2_envelope_answers_outputs(tmp_path: Path, envelope_store: Path) -> None:
    server = _server(
        tmp_path,
        envelope_store,
        {"service_envelope": "kservev2", "default_service_handler": "envelope_handler"},
    )
    with running(server):
        body = {
            "id": "q1",
            "inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1, 2, 3, 4]}],
        }
        with httpx.Client(base_url=server.url, timeout=60) as client:
            r = client.post("/predictions/env", json=body)
            assert r.status_code == 200, r.text
            assert r.json() == {
                "id": "q1",
                "model_name": "env",
                "outputs": [{"name": "x", "shape": [1], "datatype": "FP64", "data": [10.0]}],
            }
            r = client.post("/predictions/env", json={"inputs": [{"name": "x"}]})
            assert r.status_code == 400
