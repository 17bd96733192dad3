"""write_archive -> unpack_archive for every format, archiver-made layouts, and the CLI."""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
import zipfile
from pathlib import Path

import pytest

from trioserve.archive import (
    ArchiveError,
    Manifest,
    ModelConfig,
    unpack_archive,
    write_archive,
)
from trioserve.archive.cli import main

CONFIG_YAML = "minWorkers: 1\nmaxWorkers: 2\nbatchSize: 4\nhandler:\n  topk: 3\n"


@pytest.fixture
def src(tmp_path: Path) -> Path:
    """A model's source files, as a user would have them before archiving."""
    src = tmp_path / "src"
    (src / "assets" / "labels").mkdir(parents=True)
    (src / "assets" / "__pycache__").mkdir()
    (src / "assets" / ".git").mkdir()
    (src / "handler.py").write_text("def handle(data, context):\n    return data\n")
    (src / "model.py").write_text("class Net: pass\n")
    (src / "model.pt").write_bytes(bytes(range(256)) * 64)
    (src / "requirements.txt").write_text("numpy\n")
    (src / "model-config.yaml").write_text(CONFIG_YAML)
    (src / "vocab.txt").write_text("a\nb\n")
    (src / "index_to_name.json").write_text('{"0": "cat"}')
    (src / "extra.json").write_text("{}")
    (src / "assets" / "top.txt").write_text("top")
    (src / "assets" / "labels" / "l.txt").write_text("label")
    (src / "assets" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    (src / "assets" / ".git" / "HEAD").write_text("ref")
    return src


EXPECTED_FILES = {
    "handler.py",
    "model.py",
    "model.pt",
    "requirements.txt",
    "model-config.yaml",
    "vocab.txt",
    "index_to_name.json",
    "extra.json",
    "top.txt",
    "labels/l.txt",
    "MAR-INF/MANIFEST.json",
}


def _write(src: Path, export: Path, archive_format: str, **kw: object) -> Path:
    args: dict[str, object] = {
        "model_name": "echo",
        "version": "1.0",
        "handler": str(src / "handler.py"),
        "export_path": export,
        "serialized_file": src / "model.pt",
        "model_file": src / "model.py",
        "extra_files": [src / "vocab.txt", src / "assets", src / "*.json"],
        "requirements_file": src / "requirements.txt",
        "config_file": src / "model-config.yaml",
        "archive_format": archive_format,
    }
    args.update(kw)
    return write_archive(**args)  # type: ignore[arg-type]


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("archive_format", "file_name"),
    [
        ("default", "echo.mar"),
        ("zip-store", "echo.mar"),
        ("tgz", "echo.tar.gz"),
        ("no-archive", "echo"),
    ],
)
def test_round_trip(src: Path, tmp_path: Path, archive_format: str, file_name: str) -> None:
    export = tmp_path / "store" / "new"  # created on demand
    out = _write(src, export, archive_format)
    assert out == export / file_name
    assert os.listdir(export) == [file_name]  # no temporary left behind

    work = tmp_path / "work"
    loaded = unpack_archive(out, work)
    assert loaded.source == out
    assert loaded.extracted is (archive_format != "no-archive")
    if loaded.extracted:
        assert loaded.model_dir.parent == work.resolve()
        assert re.fullmatch(r"[0-9a-f]{32}", loaded.model_dir.name)
    else:
        assert loaded.model_dir == out.resolve()
        assert not work.exists()
    assert _files(loaded.model_dir) == EXPECTED_FILES
    assert (loaded.model_dir / "model.pt").read_bytes() == (src / "model.pt").read_bytes()
    assert (loaded.model_dir / "labels" / "l.txt").read_text() == "label"

    m = loaded.manifest
    assert m == Manifest(
        model_name="echo",
        model_version="1.0",
        handler="handler.py",
        runtime="python",
        serialized_file="model.pt",
        model_file="model.py",
        requirements_file="requirements.txt",
        config_file="model-config.yaml",
        raw=m.raw,
    )
    assert list(m.raw) == ["createdOn", "runtime", "model", "archiverVersion"]
    assert list(m.raw["model"]) == [
        "modelName",
        "serializedFile",
        "handler",
        "modelFile",
        "modelVersion",
        "requirementsFile",
        "configFile",
    ]
    assert re.fullmatch(r"\d\d/\d\d/\d{4} \d\d:\d\d:\d\d", m.raw["createdOn"])
    assert m.raw["archiverVersion"] == "0.12.0"
    assert loaded.config.min_workers == 1
    assert loaded.config.batch_size == 4
    assert loaded.config.raw["handler"] == {"topk": 3}


def test_zip_compression_and_tar_layout(src: Path, tmp_path: Path) -> None:
    deflated = _write(src, tmp_path / "d", "default")
    stored = _write(src, tmp_path / "s", "zip-store")
    with zipfile.ZipFile(deflated) as z:
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_DEFLATED}
        assert "MAR-INF/MANIFEST.json" in z.namelist()
        assert "model.pt" in z.namelist()  # artifacts at the root
    with zipfile.ZipFile(stored) as z:
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_STORED}
    tgz = _write(src, tmp_path / "t", "tgz")
    with tarfile.open(tgz, "r:gz") as t:
        names = t.getnames()
    assert all(n.startswith("echo/") for n in names)
    assert "echo/MAR-INF/MANIFEST.json" in names


def test_minimal_archive(tmp_path: Path) -> None:
    (tmp_path / "h.py").write_text("")
    out = write_archive(
        model_name="m-1.a_b",
        version="2",
        handler=str(tmp_path / "h.py"),
        export_path=tmp_path / "out",
        runtime="python3",
    )
    with zipfile.ZipFile(out) as z:
        assert sorted(z.namelist()) == ["MAR-INF/MANIFEST.json", "h.py"]
        doc = json.loads(z.read("MAR-INF/MANIFEST.json"))
    assert doc["runtime"] == "python3"
    assert doc["model"] == {"modelName": "m-1.a_b", "handler": "h.py", "modelVersion": "2"}
    loaded = unpack_archive(out, tmp_path / "w")
    assert loaded.config == ModelConfig()


def test_handler_forms(tmp_path: Path) -> None:
    (tmp_path / "svc.py").write_text("def run(d, c): return d\n")

    def manifest_handler(handler: str, name: str) -> tuple[str, list[str]]:
        out = write_archive(model_name=name, version="1", handler=handler, export_path=tmp_path)
        with zipfile.ZipFile(out) as z:
            doc = json.loads(z.read("MAR-INF/MANIFEST.json"))
            return doc["model"]["handler"], sorted(z.namelist())

    # module:function: the module's file is packaged, the manifest keeps module:function
    assert manifest_handler(f"{tmp_path}/svc:run", "a") == (
        "svc:run",
        ["MAR-INF/MANIFEST.json", "svc.py"],
    )
    # a path without .py names the .py file
    assert manifest_handler(f"{tmp_path}/svc", "b") == ("svc", ["MAR-INF/MANIFEST.json", "svc.py"])
    # a default handler needs no file
    assert manifest_handler("image_classifier", "c") == (
        "image_classifier",
        ["MAR-INF/MANIFEST.json"],
    )


@pytest.mark.parametrize(
    ("handler", "status", "message"),
    [
        ("{d}/svc.py:run", 400, "without '.py'"),
        ("{d}/svc:1run", 400, "is not a function name"),
        ("{d}/missing.py", 404, "handler file not found"),
        ("not_a_default_handler", 404, "or use a default handler"),
        ("", 400, "handler must not be empty"),
    ],
)
def test_bad_handler(tmp_path: Path, handler: str, status: int, message: str) -> None:
    (tmp_path / "svc.py").write_text("")
    with pytest.raises(ArchiveError, match=re.escape(message)) as info:
        write_archive(
            model_name="m",
            version="1",
            handler=handler.format(d=tmp_path),
            export_path=tmp_path / "out",
        )
    assert info.value.status == status
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["-lead", ".dot", "a b", "a/b", "abc\n", ""])
def test_bad_model_name(tmp_path: Path, name: str) -> None:
    (tmp_path / "h.py").write_text("")
    with pytest.raises(ArchiveError, match="is not allowed") as info:
        write_archive(
            model_name=name, version="1", handler=str(tmp_path / "h.py"), export_path=tmp_path
        )
    assert info.value.status == 400


def test_bad_format_runtime_version(tmp_path: Path) -> None:
    (tmp_path / "h.py").write_text("")
    common: dict[str, object] = {
        "model_name": "m",
        "handler": str(tmp_path / "h.py"),
        "export_path": tmp_path,
    }
    with pytest.raises(ArchiveError, match="archive format 'zip'"):
        write_archive(version="1", archive_format="zip", **common)  # type: ignore[arg-type]
    with pytest.raises(ArchiveError, match="runtime 'java'"):
        write_archive(version="1", runtime="java", **common)  # type: ignore[arg-type]
    with pytest.raises(ArchiveError, match="version must not be empty"):
        write_archive(version="", **common)  # type: ignore[arg-type]


def test_missing_inputs(src: Path, tmp_path: Path) -> None:
    with pytest.raises(ArchiveError, match="serialized file not found") as info:
        _write(src, tmp_path / "o", "default", serialized_file=src / "nope.pt")
    assert info.value.status == 404
    with pytest.raises(ArchiveError, match="extra file not found"):
        _write(src, tmp_path / "o", "default", extra_files=[src / "nope.txt"])
    with pytest.raises(ArchiveError, match="matches nothing"):
        _write(src, tmp_path / "o", "default", extra_files=[src / "*.nothing"])
    assert list((tmp_path / "o").glob("*")) == []


def test_two_inputs_with_one_name(src: Path, tmp_path: Path) -> None:
    (src / "assets" / "model.py").write_text("other")
    with pytest.raises(ArchiveError, match=re.escape("two files would be stored as 'model.py'")):
        _write(src, tmp_path / "o", "default", extra_files=[src / "assets"])
    # the same file named twice is fine
    out = _write(src, tmp_path / "o", "default", extra_files=[src / "model.py"])
    assert out.exists()


@pytest.mark.parametrize("archive_format", ["default", "tgz", "no-archive"])
def test_existing_output_needs_force(src: Path, tmp_path: Path, archive_format: str) -> None:
    export = tmp_path / "store"
    out = _write(src, export, archive_format)
    with pytest.raises(ArchiveError, match="already exists; use --force") as info:
        _write(src, export, archive_format, version="2.0")
    assert info.value.status == 409
    assert unpack_archive(out, tmp_path / "w").manifest.model_version == "1.0"
    assert _write(src, export, archive_format, version="2.0", force=True) == out
    assert unpack_archive(out, tmp_path / "w").manifest.model_version == "2.0"
    assert len(os.listdir(export)) == 1


def test_force_rearchives_a_folder_in_place(src: Path, tmp_path: Path) -> None:
    """no-archive with force, taking the files from the output folder itself."""
    out = _write(src, tmp_path, "no-archive")
    again = write_archive(
        model_name="echo",
        version="3",
        handler=str(out / "handler.py"),
        export_path=tmp_path,
        extra_files=[out],
        archive_format="no-archive",
        force=True,
    )
    assert again == out
    loaded = unpack_archive(out, tmp_path / "w")
    assert loaded.manifest.model_version == "3"
    assert (out / "model.pt").read_bytes() == (src / "model.pt").read_bytes()


def test_mar_written_by_python_zipfile(tmp_path: Path) -> None:
    """The layout torch-model-archiver writes: artifacts at the root, then the manifest."""
    mar = tmp_path / "noop.mar"
    manifest = {
        "createdOn": "01/02/2025 10:11:12",
        "runtime": "python",
        "model": {
            "modelName": "noop",
            "handler": "service:handle",
            "modelVersion": "1.11",
            "configFile": "cfg.yaml",
        },
        "modelServerVersion": "1.0",
        "archiverVersion": "0.12.0",
    }
    with zipfile.ZipFile(mar, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("service.py", "def handle(d, c): return d\n")
        z.writestr("cfg.yaml", "batchSize: 3\nuseJobTicket: true\n")
        z.writestr("sub/", b"")  # a directory entry
        z.writestr("sub/data.bin", b"\x01" * 1000)
        z.writestr(os.path.join("MAR-INF", "MANIFEST.json"), json.dumps(manifest, indent=2))
    loaded = unpack_archive(mar, tmp_path / "w")
    assert _files(loaded.model_dir) == {
        "service.py",
        "cfg.yaml",
        "sub/data.bin",
        "MAR-INF/MANIFEST.json",
    }
    assert loaded.manifest.model_name == "noop"
    assert loaded.manifest.model_version == "1.11"
    assert loaded.manifest.handler == "service:handle"
    assert loaded.config.batch_size == 3
    assert loaded.config.use_job_ticket is True


def _tgz(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


def test_tgz_top_folder_is_stripped_only_when_it_is_the_only_one(tmp_path: Path) -> None:
    one = _tgz(tmp_path / "one.tgz", {"./m/a.py": b"a", "./m/d/b.txt": b"b"})
    assert _files(unpack_archive(one, tmp_path / "w").model_dir) == {"a.py", "d/b.txt"}
    two = _tgz(tmp_path / "two.tar.gz", {"m/a.py": b"a", "n/b.txt": b"b"})
    assert _files(unpack_archive(two, tmp_path / "w").model_dir) == {"m/a.py", "n/b.txt"}
    flat = _tgz(tmp_path / "flat.tgz", {"a.py": b"a"})
    assert _files(unpack_archive(flat, tmp_path / "w").model_dir) == {"a.py"}
    mar_inf = _tgz(tmp_path / "mi.tgz", {"MAR-INF/MANIFEST.json": b'{"model": {}}'})
    assert _files(unpack_archive(mar_inf, tmp_path / "w").model_dir) == {"MAR-INF/MANIFEST.json"}


def test_missing_manifest_is_tolerated(tmp_path: Path) -> None:
    mar = tmp_path / "bare.mar"
    with zipfile.ZipFile(mar, "w") as z:
        z.writestr("handler.py", "")
    loaded = unpack_archive(mar, tmp_path / "w")
    assert loaded.manifest == Manifest()
    assert loaded.manifest.model_name is None
    assert loaded.config == ModelConfig()
    folder = tmp_path / "folder_model"
    folder.mkdir()
    in_place = unpack_archive(folder, tmp_path / "w2")
    assert in_place.manifest == Manifest()
    assert in_place.extracted is False
    assert not (tmp_path / "w2").exists()


def _mar_with_manifest(path: Path, model: dict[str, str], extra: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": model}))
        for name, text in extra.items():
            z.writestr(name, text)
    return path


@pytest.mark.parametrize(
    ("config_file", "files", "status", "message"),
    [
        ("cfg.yaml", {}, 400, "configFile 'cfg.yaml' named in MAR-INF/MANIFEST.json is not in"),
        ("../cfg.yaml", {}, 400, "points outside the model directory"),
        ("/etc/hostname", {}, 400, "points outside the model directory"),
        ("cfg.yaml", {"cfg.yaml": "- not a mapping"}, 400, "must be a mapping"),
        ("sub", {"sub/x": ""}, 400, "is not a regular file"),
    ],
)
def test_bad_config_file_leaves_nothing(
    tmp_path: Path, config_file: str, files: dict[str, str], status: int, message: str
) -> None:
    mar = _mar_with_manifest(
        tmp_path / "m.mar", {"modelName": "m", "configFile": config_file}, files
    )
    work = tmp_path / "w"
    with pytest.raises(ArchiveError, match=re.escape(message)) as info:
        unpack_archive(mar, work)
    assert info.value.status == status
    assert list(work.iterdir()) == []


def test_bad_manifest_leaves_nothing(tmp_path: Path) -> None:
    mar = tmp_path / "m.mar"
    with zipfile.ZipFile(mar, "w") as z:
        z.writestr("MAR-INF/MANIFEST.json", "{broken")
    with pytest.raises(ArchiveError, match="not valid JSON"):
        unpack_archive(mar, tmp_path / "w")
    assert list((tmp_path / "w").iterdir()) == []


def test_directory_manifest_symlink_out_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    (folder / "MAR-INF").mkdir(parents=True)
    (tmp_path / "secret.json").write_text('{"model": {"modelName": "x"}}')
    (folder / "MAR-INF" / "MANIFEST.json").symlink_to(tmp_path / "secret.json")
    with pytest.raises(ArchiveError, match="points outside the model directory"):
        unpack_archive(folder, tmp_path / "w")


def test_unknown_type_and_missing_source(tmp_path: Path) -> None:
    (tmp_path / "model.zip").write_bytes(b"PK")
    with pytest.raises(ArchiveError, match="not a model archive") as info:
        unpack_archive(tmp_path / "model.zip", tmp_path / "w")
    assert info.value.status == 400
    with pytest.raises(ArchiveError, match="Model not found at") as info:
        unpack_archive(tmp_path / "gone.mar", tmp_path / "w")
    assert info.value.status == 404
    assert not (tmp_path / "w").exists()


# -- the command line ------------------------------------------------------------------


def test_cli_end_to_end(src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    export = tmp_path / "cli" / "store"
    rc = main(
        [
            "--model-name",
            "echo",
            "-v",
            "1.0",
            "--handler",
            str(src / "handler.py"),
            "--serialized-file",
            str(src / "model.pt"),
            "--model-file",
            str(src / "model.py"),
            "--extra-files",
            f"{src / 'vocab.txt'}, {src / 'assets'},{src / '*.json'}",
            "--export-path",
            str(export),
            "-r",
            str(src / "requirements.txt"),
            "-c",
            str(src / "model-config.yaml"),
            "--archive-format",
            "tgz",
        ]
    )
    assert rc == 0
    assert capsys.readouterr().err == ""
    loaded = unpack_archive(export / "echo.tar.gz", tmp_path / "w")
    assert _files(loaded.model_dir) == EXPECTED_FILES
    assert loaded.manifest.config_file == "model-config.yaml"
    assert loaded.config.max_workers == 2

    # again without -f: refused; with --force: replaced
    args = [
        "--model-name",
        "echo",
        "--version",
        "2",
        "--handler",
        "base_handler",
        "--export-path",
        str(export),
        "--archive-format",
        "tgz",
    ]
    assert main(args) == 2
    assert "already exists; use --force" in capsys.readouterr().err
    assert main([*args, "-f"]) == 0
    assert unpack_archive(export / "echo.tar.gz", tmp_path / "w").manifest.handler == (
        "base_handler"
    )


def test_cli_defaults_to_cwd(src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(src)
    assert (
        main(
            [
                "--model-name",
                "m",
                "--version",
                "1",
                "--handler",
                "handler:handle",
                "--runtime",
                "python3",
            ]
        )
        == 0
    )
    with zipfile.ZipFile(src / "m.mar") as z:
        doc = json.loads(z.read("MAR-INF/MANIFEST.json"))
        assert sorted(z.namelist()) == ["MAR-INF/MANIFEST.json", "handler.py"]
    assert doc["runtime"] == "python3"
    assert doc["model"]["handler"] == "handler:handle"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--version", "1", "--handler", "h"],
            "the following arguments are required: --model-name",
        ),
        (["--model-name", "m", "--handler", "h"], "required: -v/--version"),
        (["--model-name", "m", "-v", "1"], "required: --handler"),
        (
            ["--model-name", "m", "-v", "1", "--handler", "base_handler", "--runtime", "java"],
            "invalid choice: 'java'",
        ),
        (
            [
                "--model-name",
                "m",
                "-v",
                "1",
                "--handler",
                "base_handler",
                "--archive-format",
                "zip",
            ],
            "invalid choice: 'zip'",
        ),
        (
            ["--model-name", "bad name", "-v", "1", "--handler", "base_handler"],
            "model name 'bad name' is not allowed",
        ),
        (["--model-name", "m", "-v", "1", "--handler", "h.py:fn"], "without '.py'"),
        (
            [
                "--model-name",
                "m",
                "-v",
                "1",
                "--handler",
                "base_handler",
                "--serialized-file",
                "nope.pt",
            ],
            "serialized file not found: nope.pt",
        ),
    ],
)
def test_cli_bad_input(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error:" in err
    assert message in err
    assert list(tmp_path.iterdir()) == []


def test_cli_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for flag in (
        "--model-name",
        "--serialized-file",
        "--extra-files",
        "--export-path",
        "--archive-format",
        "--requirements-file",
        "--config-file",
        "--force",
    ):
        assert flag in out
