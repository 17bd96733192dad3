"""Schemathesis against the OpenAPI documents the server serves: no 5xx, no response
that breaks its documented schema. Bounded: a fixed seed and a few examples per route.

The Open Inference Protocol's document (``GET /v2/docs/dataplane.json``) is fuzzed against
a server with token authorization on and a model loaded (the ``oip`` archive), so that most
generated requests reach the model and its handler, not only the 404 of an unknown model."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import pytest
from openapi_schema_validator import OAS30Validator

from .server import Server

pytestmark = pytest.mark.e2e
SCHEMATHESIS = Path(os.environ.get("VIRTUAL_ENV", Path(__file__).parents[2] / ".venv"))
CHECKS = "not_a_server_error,response_schema_conformance,status_code_conformance"
OIP_CHECKS = f"{CHECKS},content_type_conformance,response_headers_conformance"

# Path parameters mostly name the loaded model and its version (a quarter of them stay
# random: unknown models and versions, odd characters).
OIP_CONFIG = """\
[dictionaries.models]
values = ["oip"]

[dictionaries.versions]
values = ["1.0"]

[parameters]
"path.model_name" = { dictionary = "models", probability = 0.75 }
"path.model_version" = { dictionary = "versions", probability = 0.75 }
"""


def run_schemathesis(
    schema_url: str,
    base_url: str,
    *extra: str,
    checks: str = CHECKS,
    max_examples: int = 8,
    config: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    exe = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "schemathesis"
    cmd = [
        str(exe if exe.exists() else "schemathesis"),
        *(["--config-file", str(config)] if config is not None else []),
        "run",
        schema_url,
        "--url",
        base_url,
        "--checks",
        checks,
        "--max-examples",
        str(max_examples),
        "--seed",
        "1",
        "--request-timeout",
        "60",
        "--phases",
        "examples,coverage,fuzzing",
        "--no-color",
        *extra,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory, store: Path):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("fuzz")
    # A low worker cap keeps fuzzed scale calls from starting many processes on a small box.
    server = Server(
        root,
        store,
        "echo=echo.mar",
        properties={"enable_model_api": "true", "max_workers_per_model": "2"},
    )
    server.start()
    yield server
    server.stop()
    server.kill()


@pytest.fixture(scope="module")
def oip_server(tmp_path_factory: pytest.TempPathFactory, store: Path):  # type: ignore[no-untyped-def]
    server = Server(tmp_path_factory.mktemp("fuzz-oip"), store, "oip=oip.mar", tokens=True)
    server.start()
    yield server
    server.stop()
    server.kill()


@pytest.mark.parametrize("api", ["inference", "management"])
def test_served_document_holds_under_fuzzing(fuzz_server: Server, api: str) -> None:
    base = fuzz_server.url if api == "inference" else fuzz_server.management_url
    out = run_schemathesis(f"{base}/api-description", base)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert "passed" in out.stdout.lower()


def test_oip_document_holds_under_fuzzing(oip_server: Server, tmp_path: Path) -> None:
    """Some 300 requests over the OIP routes (about 25 s): every answer is documented, of
    the documented content type and schema (event streams: event by event), and none is
    a 5xx."""
    config = tmp_path / "schemathesis.toml"
    config.write_text(OIP_CONFIG)
    base = oip_server.url
    out = run_schemathesis(
        f"{base}/v2/docs/dataplane.json",
        base,
        "--header",
        f"Authorization: Bearer {oip_server.key('inference')}",
        # Loading and unloading need the management key (and the model API): tested in
        # tests/e2e/test_oip_rest.py, not fuzzed with the inference key.
        "--exclude-path-regex",
        "^/v2/repository/models/",
        checks=OIP_CHECKS,
        max_examples=20,
        config=config,
    )
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert "no issues found" in out.stdout.lower(), out.stdout[-3000:]


def test_oip_failures_answer_the_documented_error_object(oip_server: Server) -> None:
    """Failures the fuzzer cannot reach: a missing token, a path or method no route has,
    an escaped path the fast path leaves to the Quart app. Each answers the OIP error
    object, never TorchServe's body."""
    auth = oip_server.auth("inference")
    with httpx.Client(base_url=oip_server.url, timeout=30) as http:
        doc = http.get("/v2/docs/dataplane.json").json()  # no token needed
        error = OAS30Validator(doc["components"]["schemas"]["Error"])
        cases = [
            (http.get("/v2"), 401),  # no token: the fast path
            (http.get("/v2/models/o%69p"), 401),  # no token: the Quart app
            (http.get("/v2/models/a%2Fb", headers=auth), 404),  # no such route
            (http.get("/v2/repository/index", headers=auth), 405),
            (http.delete("/v2/models/oip", headers=auth), 405),
            (http.get("/v2/models/oip/infer", headers=auth), 405),
            (http.post("/v2/models/nope/infer", headers=auth, content=b"{}"), 404),
            (http.post("/v2/models/o%69p/infer", headers=auth, content=b"{"), 400),
            (
                http.post(
                    "/v2/models/oip/infer_stream",
                    headers=auth,
                    json={
                        "inputs": [{"name": "a", "shape": [1], "datatype": "INT8", "data": [1]}],
                        "outputs": [{"name": "a", "parameters": {"binary_data": True}}],
                    },
                ),
                400,
            ),
        ]
        for response, status in cases:
            assert response.status_code == status, (response.request.url, response.text)
            assert response.headers["content-type"] == "application/json"
            error.validate(response.json())
        escaped = http.get("/v2/models/o%69p", headers=auth)  # the Quart app answers it too
        assert escaped.status_code == 200 and escaped.json()["name"] == "oip"
