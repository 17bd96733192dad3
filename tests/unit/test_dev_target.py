"""trioserve dev: what PATH is, which changes reload, and the model read from a folder."""

from __future__ import annotations

from pathlib import Path, PurePath

import pytest

from trioserve.cli import build_parser
from trioserve.dev import command
from trioserve.dev.loop import DevOptions, inspect, read_model
from trioserve.dev.target import (
    DevError,
    TargetKind,
    find_sample,
    find_weights,
    lasting_changes,
    resolve_target,
    triggers_reload,
)

HOME = PurePath("/work/model")


def test_a_handler_file_is_served_from_its_folder_under_its_stem() -> None:
    names = {"my_handler.py", "model.py", "weights.pt", "model-config.yaml", "sample.txt"}
    target = resolve_target(HOME / "my_handler.py", is_dir=False, names=names)
    assert target.kind is TargetKind.HANDLER
    assert (target.folder, target.name, target.handler) == (HOME, "my_handler", "my_handler.py")
    assert target.sample == "sample.txt"
    assert target.config_file == "model-config.yaml"
    assert target.manifest() == {
        "runtime": "python",
        "model": {
            "modelName": "my_handler",
            "handler": "my_handler.py",
            "modelVersion": "1.0",
            "serializedFile": "weights.pt",
            "modelFile": "model.py",
            "configFile": "model-config.yaml",
        },
    }


def test_model_name_wins_and_a_handler_named_model_py_is_not_its_own_model_file() -> None:
    target = resolve_target(
        HOME / "model.py", is_dir=False, names={"model.py"}, model_name="resnet"
    )
    assert target.name == "resnet"
    assert target.manifest()["model"] == {
        "modelName": "resnet",
        "handler": "model.py",
        "modelVersion": "1.0",
    }


@pytest.mark.parametrize(
    ("names", "handler"),
    [
        ({"handler.py", "utils.py", "model.py"}, "handler.py"),
        ({"text_handler.py", "utils.py"}, "text_handler.py"),
        ({"serve.py", "model.py"}, "serve.py"),
    ],
)
def test_a_folder_without_metadata_is_a_handler_folder(names: set[str], handler: str) -> None:
    target = resolve_target(HOME, is_dir=True, names=names | {"requirements.txt"})
    assert (target.kind, target.handler, target.name) == (TargetKind.HANDLER, handler, "model")
    assert target.parts.get("requirementsFile") == "requirements.txt"


def test_folders_with_metadata_name_their_own_model() -> None:
    mlserver = resolve_target(HOME, is_dir=True, names={"model-settings.json", "runtime.py"})
    assert (mlserver.kind, mlserver.name, mlserver.handler) == (TargetKind.MLSERVER, None, None)
    unpacked = resolve_target(HOME, is_dir=True, names={"MAR-INF", "handler.py"}, model_name="x")
    assert (unpacked.kind, unpacked.name) == (TargetKind.ARCHIVE, "x")
    with pytest.raises(ValueError, match="only a handler"):
        mlserver.manifest()


@pytest.mark.parametrize(
    ("path", "is_dir", "names", "message"),
    [
        (HOME / "model.mar", False, {"model.mar"}, "unpack an archive first"),
        (HOME, True, {"a.py", "b.py"}, "cannot tell which file .* is the handler"),
        (HOME, True, {"notes.md"}, "nothing to serve"),
    ],
)
def test_what_cannot_be_served_says_why(
    path: PurePath, is_dir: bool, names: set[str], message: str
) -> None:
    with pytest.raises(DevError, match=message):
        resolve_target(path, is_dir=is_dir, names=names)


def test_an_empty_model_name_is_refused() -> None:
    with pytest.raises(DevError, match="must not be empty"):
        resolve_target(HOME / "h.py", is_dir=False, names={"h.py"}, model_name=" ")


def test_weights_and_samples() -> None:
    assert find_weights({"a.pt", "b.txt"}) == "a.pt"
    assert find_weights({"a.pt", "model.safetensors", "c.bin"}) == "model.safetensors"
    assert find_weights({"a.pt", "b.pt"}) is None
    assert find_sample({"example.txt", "sample.png", "sample.json"}) == "sample.json"
    assert find_sample({"sample.png"}) == "sample.png"
    assert find_sample({"notes.txt"}) is None


@pytest.mark.parametrize(
    "path",
    [
        "handler.py",
        "model-config.yaml",
        "lib/utils.py",
        "weights/model.pt",
        "MAR-INF/MANIFEST.json",
    ],
)
def test_edits_to_sources_data_and_settings_reload(path: str) -> None:
    assert triggers_reload(path)


@pytest.mark.parametrize(
    "path",
    [
        "__pycache__/handler.cpython-311.pyc",
        "handler.pyc",
        ".handler.py.swp",
        "handler.py~",
        "4913",
        ".#handler.py",
        "#handler.py#",
        "handler.py___jb_tmp___",
        ".git/index",
        ".ipynb_checkpoints/handler-checkpoint.py",
        "logs/model_log.log",
        "server.log",
        "key_file.json",
        "sub/.cache/x.py",
        "../elsewhere.py",
    ],
)
def test_caches_editor_files_logs_and_keys_do_not_reload(path: str) -> None:
    assert not triggers_reload(path)


def test_ignore_patterns_match_the_path_or_the_name() -> None:
    assert not triggers_reload("outputs/run1/result.json", ["outputs/*"])
    assert not triggers_reload("deep/down/result.csv", ["*.csv"])
    assert triggers_reload("handler.py", ["outputs/*", "*.csv"])


def test_a_file_added_and_deleted_in_one_batch_changes_nothing() -> None:
    batch = [
        ("added", "sedX1"),
        ("modified", "sedX1"),
        ("deleted", "sedX1"),
        ("modified", "handler.py"),
        ("deleted", "old.py"),
        ("added", "new.py"),
    ]
    assert lasting_changes(batch) == {"handler.py", "old.py", "new.py"}
    assert lasting_changes([("added", "tmp"), ("deleted", "tmp")]) == set()


def test_a_handler_folder_is_read_in_place_with_its_config_and_one_worker(tmp_path: Path) -> None:
    (tmp_path / "handler.py").write_text("def handle(data, context):\n    return data\n")
    (tmp_path / "model-config.yaml").write_text("minWorkers: 4\nmaxWorkers: 8\nbatchSize: 2\n")
    target = inspect(DevOptions(tmp_path / "handler.py"))
    loaded = read_model(target)
    assert loaded.model_dir == tmp_path.resolve() and not loaded.extracted
    assert (loaded.manifest.model_name, loaded.manifest.handler) == ("handler", "handler.py")
    assert (loaded.config.min_workers, loaded.config.max_workers) == (1, 1)
    assert loaded.config.batch_size == 2
    assert loaded.config.raw["minWorkers"] == 4  # the handler still sees its file as written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["handler.py", "model-config.yaml"]


def test_an_mlserver_folder_is_read_with_its_settings(tmp_path: Path) -> None:
    (tmp_path / "model-settings.json").write_text(
        '{"name": "doubler", "implementation": "runtime.Doubler",'
        ' "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}]}'
    )
    loaded = read_model(inspect(DevOptions(tmp_path)))
    assert loaded.mlserver is not None and loaded.mlserver.name == "doubler"
    assert (loaded.config.min_workers, loaded.config.max_workers) == (1, 1)


def test_a_missing_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DevError, match="does not exist"):
        inspect(DevOptions(tmp_path / "nope.py"))


def test_the_command_refuses_a_path_that_is_no_model_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes.md").write_text("no handler here")
    args = build_parser().parse_args(["dev", str(tmp_path), "--ignore", "out/*"])
    reports: list[str] = []
    assert command.main(args, reports.append) == 2
    assert len(reports) == 1 and reports[0].startswith("FAILED ")
    assert "nothing to serve" in reports[0]
    assert "nothing to serve" in capsys.readouterr().err
