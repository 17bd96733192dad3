"""GPU placement end to end on a CPU machine: ``CUDA_VISIBLE_DEVICES`` names devices that are
not there (as a container's would), workers get ``gpu_id`` round-robin and describe shows it;
torch in the workers still runs on the CPU."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from .server import HANDLERS, Server, archive, running

pytestmark = pytest.mark.e2e


@pytest.fixture
def gpu_store(tmp_path: Path, store: Path) -> Path:
    own = tmp_path / "store"
    own.mkdir()
    shutil.copy(store / "control2.mar", own / "control2.mar")
    archive(own, "cpuonly", "control_handler.py", "-c", str(HANDLERS / "cpu-config.yaml"))
    archive(own, "second", "control_handler.py", "-c", str(HANDLERS / "gpu1-config.yaml"))
    return own


def _server(tmp_path: Path, store: Path, visible: str, models: str, **props: str) -> Server:
    workdir = tmp_path / f"work-{len(list(tmp_path.iterdir()))}"
    workdir.mkdir()
    properties = {"default_workers_per_model": "3", "enable_model_api": "true", **props}
    return Server(
        workdir, store, models, properties=properties, env={"CUDA_VISIBLE_DEVICES": visible}
    )


def _workers(server: Server, model: str) -> tuple[str, list[tuple[bool, str]]]:
    described = httpx.get(f"{server.management_url}/models/{model}", timeout=30).json()[0]
    return described["deviceType"], [(w["gpu"], w["gpuUsage"]) for w in described["workers"]]


def test_workers_are_spread_over_the_visible_gpus(tmp_path: Path, gpu_store: Path) -> None:
    server = _server(tmp_path, gpu_store, "0,1", "control2.mar,cpuonly.mar,second.mar")
    with running(server):
        device, workers = _workers(server, "control2")
        assert device == "gpu"
        assert sorted(workers) == [(True, "gpuId::0"), (True, "gpuId::0"), (True, "gpuId::1")]
        assert _workers(server, "cpuonly") == ("cpu", [(False, "N/A")] * 3)
        assert _workers(server, "second") == ("gpu", [(True, "gpuId::1")] * 3)  # deviceIds
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert client.post("/predictions/control2", content=b"gpu").text in ("0", "1")
            assert client.post("/predictions/second", content=b"gpu").text == "1"
            assert client.post("/predictions/cpuonly", content=b"gpu").text == "None"


def test_number_of_gpu_limits_the_gpus_used(tmp_path: Path, gpu_store: Path) -> None:
    server = _server(tmp_path, gpu_store, "0,1", "control2.mar", number_of_gpu="1")
    with running(server):
        assert _workers(server, "control2") == ("gpu", [(True, "gpuId::0")] * 3)
        r = httpx.post(
            f"{server.management_url}/models",
            params={"url": "second.mar", "initial_workers": 1, "synchronous": True},
            timeout=60,
        )
        assert r.status_code == 400
        assert "deviceIds [1] name GPUs this server does not have" in r.json()["message"]


def test_without_gpus_everything_runs_on_the_cpu(tmp_path: Path, gpu_store: Path) -> None:
    server = _server(tmp_path, gpu_store, "", "control2.mar")
    with running(server):
        assert _workers(server, "control2") == ("cpu", [(False, "N/A")] * 3)
