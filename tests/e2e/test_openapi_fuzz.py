"""Schemathesis against the OpenAPI documents the server serves: no 5xx, no response
that breaks its documented schema. Bounded: a fixed seed and a few examples per route."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from .server import Server

pytestmark = pytest.mark.e2e
SCHEMATHESIS = Path(os.environ.get("VIRTUAL_ENV", Path(__file__).parents[2] / ".venv"))


def run_schemathesis(
    schema_url: str, base_url: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    exe = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "schemathesis"
    cmd = [
        str(exe if exe.exists() else "schemathesis"),
        "run",
        schema_url,
        "--url",
        base_url,
        "--checks",
        "not_a_server_error,response_schema_conformance,status_code_conformance",
        "--max-examples",
        "8",
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


@pytest.mark.parametrize("api", ["inference", "management"])
def test_served_document_holds_under_fuzzing(fuzz_server: Server, api: str) -> None:
    base = fuzz_server.url if api == "inference" else fuzz_server.management_url
    out = run_schemathesis(f"{base}/api-description", base)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert "passed" in out.stdout.lower()
