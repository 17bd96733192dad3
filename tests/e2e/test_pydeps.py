"""install_py_dep_per_model end to end: a real server pip-installs an archive's requirements
file (offline: a wheel shipped in the archive) and its workers import from it; an archive
whose requirements cannot be installed is refused and leaves no model behind."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from ..wheels import write_wheel
from .server import Server, archive

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Overrides the shared store: two archives with requirements files."""
    path = tmp_path_factory.mktemp("pydeps-store")
    source = tmp_path_factory.mktemp("pydeps-source")
    wheel = write_wheel(source, "tinydep", "1.0", {"tinydep": "ANSWER = 42\n"})
    good = source / "good-requirements.txt"
    good.write_text(f"--no-index\n./{wheel.name}\n")
    bad = source / "bad-requirements.txt"
    bad.write_text("--no-index\ntrioserve-no-such-package==9.9\n")
    archive(path, "deps", "pydep_handler.py", "-r", str(good), "--extra-files", str(wheel))
    archive(path, "baddeps", "pydep_handler.py", "-r", str(bad))
    return path


def test_workers_import_the_installed_requirements_and_a_failed_install_registers_nothing(
    make_server,  # type: ignore[no-untyped-def]
) -> None:
    server: Server = make_server(
        "deps=deps.mar",
        properties={"install_py_dep_per_model": "true", "enable_model_api": "true"},
    )
    server.start()
    r = httpx.post(f"{server.url}/predictions/deps", content=b"x", timeout=30)
    assert r.status_code == 200, r.text
    answer, module_file = r.text.split(" ", 1)
    assert answer == "42"
    # imported from the per-hash install directory, not from the model's own directory
    assert Path(module_file).parent.parent.name == "pydeps"

    with httpx.Client(base_url=server.management_url, timeout=60) as c:
        r = c.post("/models", params={"url": "baddeps.mar", "initial_workers": 1})
        assert r.status_code == 400, r.text
        body = r.json()
        assert body["type"] == "ModelException"
        assert body["message"].startswith(
            "Custom pip package installation failed for model baddeps: "
        )
        assert "trioserve-no-such-package" in body["message"]
        assert c.get("/models/baddeps").status_code == 404
        assert [m["modelName"] for m in c.get("/models").json()["models"]] == ["deps"]


def test_off_by_default_the_handler_cannot_import_its_requirements(
    make_server,  # type: ignore[no-untyped-def]
) -> None:
    server: Server = make_server("", properties={"enable_model_api": "true"})
    server.start()
    with httpx.Client(base_url=server.management_url, timeout=60) as c:
        r = c.post("/models", params={"url": "deps.mar", "initial_workers": 1})
        assert r.status_code == 500
        assert "tinydep" in r.json()["message"]
        assert c.get("/models/deps").status_code == 404
