"""MLServer model folders: ``model-settings.json`` read by the archive package (sans-IO parse
plus the folder/archive detection in ``unpack_archive``)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from trioserve.archive import ArchiveError, parse_model_settings, unpack_archive

SETTINGS = {
    "name": "m",
    "implementation": "runtime.Model",
    "parameters": {"version": "v2", "uri": "./w.bin", "extra": {"k": 1}},
    "max_batch_size": 4,
    "max_batch_time": 0.02,
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2], "parameters": {"a": 1}}],
    "outputs": [{"name": "y", "datatype": "INT64", "shape": [-1]}],
    "platform": "sklearn",
    "warm_workers": True,
}


def test_settings_become_manifest_config_and_declarations() -> None:
    settings = parse_model_settings(json.dumps(SETTINGS).encode())
    manifest = settings.manifest()
    assert (manifest.model_name, manifest.model_version, manifest.handler) == (
        "m", "v2", "runtime.Model",
    )  # fmt: skip
    config = settings.model_config()
    assert (config.batch_size, config.max_batch_delay) == (4, 20)
    assert [(t.name, t.datatype, t.shape) for t in settings.inputs] == [("x", "FP32", (-1, 2))]
    assert [(t.name, t.datatype, t.shape) for t in settings.outputs] == [("y", "INT64", (-1,))]
    assert settings.platform == "sklearn"
    assert settings.raw == SETTINGS  # unknown keys kept for the worker


@pytest.mark.parametrize(("size", "time"), [(0, 0.0), (1, 0.5), (8, 0.0)])
def test_adaptive_batching_needs_size_over_one_and_a_time(size: int, time: float) -> None:
    """Without it, a worker takes up to 16 requests at once, to run them concurrently."""
    document = {"implementation": "r.M", "max_batch_size": size, "max_batch_time": time}
    settings = parse_model_settings(json.dumps(document).encode())
    config = settings.model_config()
    assert not settings.adaptive_batching
    assert (config.batch_size, config.max_batch_delay) == (16, 0)


def test_minimal_settings() -> None:
    settings = parse_model_settings(b'{"implementation": "r.M"}')
    assert (settings.name, settings.version, settings.inputs, settings.platform) == (
        None, None, (), "",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"{nope", "not valid JSON"),
        (b"[1]", "must hold a JSON object"),
        (b"{}", "implementation: Field required"),
        (b'{"implementation": "r.M", "max_batch_size": -1}', "max_batch_size"),
        (b'{"implementation": "r.M", "inputs": [{"name": "x"}]}', "inputs.0.datatype"),
        (b'{"implementation": "r.M", "max_batch_time": "soon"}', "max_batch_time"),
    ],
)
def test_bad_settings_say_what_is_wrong(data: bytes, expected: str) -> None:
    with pytest.raises(ArchiveError) as caught:
        parse_model_settings(data)
    assert caught.value.status == 400
    assert "model-settings.json" in str(caught.value) and expected in str(caught.value)


def test_a_folder_with_settings_is_an_mlserver_model(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model-settings.json").write_text(json.dumps(SETTINGS))
    loaded = unpack_archive(folder, tmp_path / "work")
    assert loaded.mlserver is not None and loaded.mlserver.implementation == "runtime.Model"
    assert loaded.manifest.handler == "runtime.Model" and loaded.config.batch_size == 4
    assert not loaded.extracted


def test_a_manifest_wins_over_settings(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    (folder / "MAR-INF").mkdir(parents=True)
    (folder / "MAR-INF" / "MANIFEST.json").write_text(
        json.dumps({"model": {"modelName": "ts", "handler": "h.py", "modelVersion": "1.0"}})
    )
    (folder / "model-settings.json").write_text(json.dumps(SETTINGS))
    loaded = unpack_archive(folder, tmp_path / "work")
    assert loaded.mlserver is None and loaded.manifest.handler == "h.py"


def test_an_archive_may_hold_an_mlserver_model(tmp_path: Path) -> None:
    source = tmp_path / "m.mar"
    with zipfile.ZipFile(source, "w") as zf:
        zf.writestr("model-settings.json", json.dumps(SETTINGS))
        zf.writestr("runtime.py", "")
    loaded = unpack_archive(source, tmp_path / "work")
    assert loaded.mlserver is not None and loaded.extracted
    assert (loaded.model_dir / "runtime.py").is_file()
