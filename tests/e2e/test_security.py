"""Attacks on the server: each is refused with a clear error and leaves nothing on disk."""

from __future__ import annotations

import json
import stat
import zipfile
from pathlib import Path

import httpx
import pytest

from .server import Server

pytestmark = pytest.mark.e2e

MANIFEST = json.dumps(
    {
        "runtime": "python",
        "model": {"modelName": "evil", "modelVersion": "1.0", "handler": "h.py"},
        "archiverVersion": "0.12.0",
    }
)


def write_zip(path: Path, entries: list[tuple[zipfile.ZipInfo | str, bytes]]) -> None:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("MAR-INF/MANIFEST.json", MANIFEST)
        z.writestr("h.py", "def handle(data, context):\n    return data\n")
        for name, data in entries:
            z.writestr(name, data)


@pytest.fixture
def attack_store(tmp_path: Path) -> Path:
    store = tmp_path / "attack-store"
    store.mkdir()
    write_zip(store / "slip.mar", [("../../escaped.txt", b"owned")])
    write_zip(store / "absolute.mar", [("/tmp/trioserve-absolute-escape.txt", b"owned")])
    link = zipfile.ZipInfo("link")
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    write_zip(store / "symlink.mar", [(link, b"/etc/passwd")])
    # 64 MiB of zeros compresses to ~64 KiB: a bomb for a 4 MiB unpack limit
    write_zip(store / "bomb.mar", [("zeros.bin", bytes(64 << 20))])
    return store


def leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_hostile_archives_are_refused_and_leave_nothing(
    make_server,
    attack_store: Path,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    tmp = tmp_path / "server-tmp"
    tmp.mkdir()
    server: Server = make_server(
        "",
        properties={"enable_model_api": "true", "max_unpacked_archive_bytes": str(4 << 20)},
        env={"TMPDIR": str(tmp)},
    )
    server.store = attack_store
    server.start()
    store_before = leftovers(attack_store)
    work_before = leftovers(tmp)
    expected = {
        "slip.mar": "..",
        "absolute.mar": "absolute",
        "symlink.mar": "link",
        "bomb.mar": "limit",
    }
    with httpx.Client(base_url=server.management_url, timeout=60) as c:
        for name, word in expected.items():
            r = c.post("/models", params={"url": name, "initial_workers": 1})
            assert r.status_code in (400, 413), (name, r.text)
            body = r.json()
            assert list(body) == ["code", "type", "message"]
            assert word in body["message"].lower(), (name, body["message"])
        assert c.get("/models").json()["models"] == []
    assert leftovers(attack_store) == store_before
    assert leftovers(tmp) == work_before  # no partial extraction anywhere
    assert not (tmp_path / "escaped.txt").exists()
    assert not Path("/tmp/trioserve-absolute-escape.txt").exists()


def test_urls_outside_the_store_are_refused_without_network(mgmt_default: Server) -> None:
    with httpx.Client(base_url=mgmt_default.management_url, timeout=60) as c:
        for url in (
            "http://127.0.0.1:1/m.mar",
            "https://example.invalid/m.mar",
            "file:///etc/passwd",
            "../control.mar",
            "/etc/passwd",
        ):
            r = c.post("/models", params={"url": url})
            assert r.status_code in (400, 404), (url, r.text)
            assert r.json()["type"] in ("ModelNotFoundException", "BadRequestException")


def test_oversized_bodies_are_413_on_both_ports(make_server) -> None:  # type: ignore[no-untyped-def]
    server: Server = make_server(
        properties={"enable_model_api": "true", "max_request_size": "2048"}
    )
    server.start()
    big = b"{" + b" " * 10_000 + b"}"
    r = httpx.post(
        f"{server.management_url}/models",
        content=big,
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert r.status_code == 413
    r = httpx.post(f"{server.url}/predictions/control", content=bytes(10_000), timeout=30)
    assert r.status_code == 413 and "2048" in r.json()["message"]


def test_wrong_tokens_are_refused_on_every_protected_port(make_server) -> None:  # type: ignore[no-untyped-def]
    server: Server = make_server(tokens=True, properties={"enable_model_api": "true"})
    server.start()
    for headers in (
        {},
        {"Authorization": "Bearer wrongkey"},
        {"Authorization": "Basic abc"},
        {"Authorization": f"Bearer {server.key('API')}"},
    ):
        for method, url in (
            ("POST", f"{server.url}/predictions/control"),
            ("GET", f"{server.url}/ping"),
            ("GET", f"{server.management_url}/models"),
            ("POST", f"{server.management_url}/models?url=control2.mar"),
            ("DELETE", f"{server.management_url}/models/control"),
        ):
            r = httpx.request(method, url, headers=headers, timeout=30)
            assert r.status_code == 401, (method, url, headers)
            assert r.json()["type"] == "InvalidKeyException"
    # nothing was registered or removed by any of those
    r = httpx.get(f"{server.management_url}/models", headers=server.auth("management"), timeout=30)
    assert [m["modelName"] for m in r.json()["models"]] == ["control"]


def test_a_server_that_fails_to_start_leaves_the_running_ones_key_file(make_server) -> None:  # type: ignore[no-untyped-def]
    first: Server = make_server(tokens=True)
    first.start()
    key_file = first.workdir / "key_file.json"
    published = key_file.read_bytes()
    # A second server in the same folder whose inference port is the first one's: it fails
    # to bind, and must neither replace nor delete the running server's keys.
    second: Server = make_server(
        tokens=True, properties={"inference_address": f"http://127.0.0.1:{first.port}"}
    )
    second.workdir = first.workdir
    with pytest.raises(RuntimeError, match="did not start"):
        second.start()
    assert key_file.read_bytes() == published
    r = httpx.get(f"{first.url}/ping", headers=first.auth("inference"), timeout=30)
    assert r.status_code == 200
    first.stop()
    assert not key_file.exists()  # its own file goes with it


def test_listeners_bind_loopback_by_default(tmp_path: Path) -> None:
    from trioserve.config import CliOptions, load_config

    config = load_config(CliOptions(), {}, tmp_path)
    for address in (config.inference_address, config.management_address, config.metrics_address):
        assert address.host == "127.0.0.1"
    assert config.grpc_inference_address == config.grpc_management_address == "127.0.0.1"
    assert config.allowed_urls == ()
    assert config.enable_model_api is False
    assert config.disable_token_authorization is False


@pytest.fixture
def mgmt_default(make_server) -> Server:  # type: ignore[no-untyped-def]
    server: Server = make_server(properties={"enable_model_api": "true"})
    server.start()
    return server
