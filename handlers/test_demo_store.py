"""``trioserve.demo.build_demo_store`` packs the four demo handlers into ``.mar`` files."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest

from trioserve import demo
from trioserve.archive import unpack_archive

ALL = ("echo", "classifier", "streaming", "stateful", "stateful_stream", "textgen")
EXPECTED = {
    "echo": {"handler": "echo_handler.py"},
    "classifier": {
        "handler": "classifier_handler.py",
        "serializedFile": "model.pt",
        "configFile": "model-config.yaml",
    },
    "streaming": {"handler": "stream_handler.py"},
    "stateful": {"handler": "stateful_handler.py", "configFile": "model-config.yaml"},
    "stateful_stream": {"handler": "stream_sum_handler.py", "configFile": "model-config.yaml"},
}


def _manifest(archive: Path) -> dict[str, object]:
    with zipfile.ZipFile(archive) as zf:
        manifest = json.loads(zf.read("MAR-INF/MANIFEST.json"))
    assert isinstance(manifest, dict)
    return manifest


def test_builds_the_five_archives(tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert demo.build_demo_store(store) == list(ALL)
    assert sorted(p.name for p in store.iterdir()) == [
        "classifier.mar",
        "echo.mar",
        "stateful.mar",
        "stateful_stream.mar",
        "streaming.mar",
        "textgen",
    ]
    assert sorted(p.name for p in (store / "textgen").iterdir()) == [
        "model-settings.json",
        "textgen.py",
    ]
    for name, fields in EXPECTED.items():
        manifest = _manifest(store / f"{name}.mar")
        assert manifest["runtime"] == "python"
        model = manifest["model"]
        assert isinstance(model, dict)
        assert model["modelName"] == name
        assert model["modelVersion"] == "1.0"
        for key, value in fields.items():
            assert model[key] == value


def test_archive_contents(tmp_path: Path) -> None:
    demo.build_demo_store(tmp_path)
    with zipfile.ZipFile(tmp_path / "classifier.mar") as zf:
        names = set(zf.namelist())
        assert {
            "MAR-INF/MANIFEST.json",
            "model.pt",
            "classifier_handler.py",
            "index_to_name.json",
            "model-config.yaml",
        } <= names
        handlers = demo.handlers_dir()
        assert json.loads(zf.read("index_to_name.json")) == json.loads(
            (handlers / "classifier" / "index_to_name.json").read_text(encoding="utf-8")
        )
    for name, handler in [("echo", "echo_handler.py"), ("streaming", "stream_handler.py")]:
        with zipfile.ZipFile(tmp_path / f"{name}.mar") as zf:
            assert {"MAR-INF/MANIFEST.json", handler} <= set(zf.namelist())


def test_server_side_reader_accepts_the_archives(tmp_path: Path) -> None:
    store = tmp_path / "store"
    demo.build_demo_store(store)
    for name in demo.DEMO_MODELS:
        source = store / (name if name in demo.FOLDER_MODELS else f"{name}.mar")
        loaded = unpack_archive(source, tmp_path / "unpacked" / name)
        assert loaded.manifest.model_name == name
        assert (loaded.mlserver is not None) == (name in demo.FOLDER_MODELS)
        assert loaded.manifest.model_version == "1.0"
        if name == "classifier":
            config = loaded.config
            assert (config.min_workers, config.max_workers) == (1, 1)
            assert (config.batch_size, config.response_timeout) == (1, 30)


def test_unpacked_classifier_archive_serves_the_sample(tmp_path: Path, load_model: Any) -> None:
    demo.build_demo_store(tmp_path / "store")
    loaded = unpack_archive(tmp_path / "store" / "classifier.mar", tmp_path / "unpacked")
    manifest = loaded.manifest.raw
    model = load_model(
        loaded.model_dir / manifest["model"]["handler"], loaded.model_dir, manifest=manifest
    )
    sample = (demo.handlers_dir() / "classifier" / "sample.json").read_bytes()
    (reply,) = model.infer([(sample, "application/json")]).final.replies
    answer = json.loads(bytes(reply.body))
    assert list(answer) == ["fish", "dog", "bird", "cat"]


def test_existing_archives_are_kept_unless_forced(tmp_path: Path) -> None:
    demo.build_demo_store(tmp_path)
    echo = tmp_path / "echo.mar"
    echo.write_bytes(b"placeholder")
    assert demo.build_demo_store(tmp_path) == list(ALL)
    assert echo.read_bytes() == b"placeholder"
    demo.build_demo_store(tmp_path, force=True)
    assert _manifest(echo)["model"] == {
        "modelName": "echo",
        "handler": "echo_handler.py",
        "modelVersion": "1.0",
    }


def test_missing_handlers_folder_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_module = tmp_path / "site-packages" / "trioserve" / "demo.py"
    monkeypatch.setattr(demo, "__file__", str(fake_module))
    with pytest.raises(FileNotFoundError, match="demo handlers folder not found"):
        demo.build_demo_store(tmp_path / "store")
    assert not (tmp_path / "store").exists()


def test_without_torch_the_torch_models_are_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-file binary runs where PyTorch may be missing: the classifier (whose weights
    torch writes) is left out then, and the other demo models are built."""
    monkeypatch.setattr(demo, "torch_available", lambda: False)
    names = demo.build_demo_store(tmp_path)
    assert names == [name for name in ALL if name != "classifier"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "echo.mar",
        "stateful.mar",
        "stateful_stream.mar",
        "streaming.mar",
        "textgen",
    ]
