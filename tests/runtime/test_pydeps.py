"""install_py_dep_per_model: the installer runs the real pip (offline, from a wheel written
into the model directory), and the model manager hands the installed directory to the
launcher of that model's workers."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from trioserve import archive
from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.model_settings import RegisterOptions, ServerDefaults
from trioserve.runtime.manager import ManagerSettings, ModelManager
from trioserve.runtime.pydeps import COMPLETE_MARKER, DependencyInstaller

from ..wheels import write_wheel
from .fakes import FakeLauncher

GOOD = "--no-index\n./tinydep-1.0-py3-none-any.whl\n"
BAD = "--no-index\ntrioserve-no-such-package==9.9\n"


def model_dir(tmp_path: Path, name: str, requirements: str) -> Path:
    path = tmp_path / name
    path.mkdir()
    write_wheel(path, "tinydep", "1.0", {"tinydep": "ANSWER = 42\n"})
    (path / "requirements.txt").write_text(requirements)
    return path


async def test_installs_once_per_requirements_hash(tmp_path: Path) -> None:
    installer = DependencyInstaller(tmp_path / "pydeps")
    first = model_dir(tmp_path, "a", GOOD)
    deps = await installer.install(first / "requirements.txt", cwd=first, model="a")
    assert deps.parent == tmp_path / "pydeps"
    assert (deps / "tinydep.py").read_text() == "ANSWER = 42\n"
    assert (deps / COMPLETE_MARKER).is_file()
    assert installer.pip_runs == 1
    # another model with the same file: the same directory, pip not run again
    second = model_dir(tmp_path, "b", GOOD)
    assert await installer.install(second / "requirements.txt", cwd=second, model="b") == deps
    assert installer.pip_runs == 1
    assert sorted(p.name for p in (tmp_path / "pydeps").iterdir()) == [deps.name]


async def test_concurrent_installs_of_one_hash_run_pip_once(tmp_path: Path) -> None:
    installer = DependencyInstaller(tmp_path / "pydeps")
    dirs = [model_dir(tmp_path, name, GOOD) for name in ("a", "b", "c")]
    results: list[Path] = []

    async def install(path: Path) -> None:
        results.append(await installer.install(path / "requirements.txt", cwd=path, model="m"))

    async with trio.open_nursery() as nursery:
        for path in dirs:
            nursery.start_soon(install, path)
    assert installer.pip_runs == 1
    assert len(set(results)) == 1 and len(results) == 3


async def test_a_pip_failure_says_what_pip_said_and_leaves_nothing(tmp_path: Path) -> None:
    installer = DependencyInstaller(tmp_path / "pydeps")
    path = model_dir(tmp_path, "bad", BAD)
    for attempt in (1, 2):  # a failure is not cached
        with pytest.raises(ServeError) as caught:
            await installer.install(path / "requirements.txt", cwd=path, model="bad")
        assert installer.pip_runs == attempt
    error = caught.value
    assert (error.kind, error.reason) == (ErrorKind.BAD_INPUT, "ModelException")
    assert error.message.startswith("Custom pip package installation failed for model bad: ")
    assert "trioserve-no-such-package" in error.message
    assert "No matching distribution" in error.message
    assert list((tmp_path / "pydeps").iterdir()) == []


# -- the model manager ----------------------------------------------------------------------


def write_model(store: Path, name: str, requirements: str | None) -> None:
    source = store / f".src-{name}"
    source.mkdir()
    handler = source / "handler.py"
    handler.write_text("def handle(data, context):\n    return data\n")
    extra: list[Path] = []
    req: Path | None = None
    if requirements is not None:
        extra.append(write_wheel(source, "tinydep", "1.0", {"tinydep": "ANSWER = 42\n"}))
        req = source / "requirements.txt"
        req.write_text(requirements)
    archive.write_archive(
        model_name=name,
        version="1.0",
        handler=str(handler),
        export_path=store,
        requirements_file=req,
        extra_files=extra,
    )


def manager(tmp_path: Path, launcher: FakeLauncher, *, install: bool) -> ModelManager:
    settings = ManagerSettings(
        model_store=tmp_path / "store",
        work_root=tmp_path / "work",
        defaults=ServerDefaults(
            default_workers=1, job_queue_size=10, response_timeout=30, startup_timeout=5
        ),
        stop_grace=0.5,
        max_response_size=1 << 20,
        max_unpacked_bytes=1 << 30,
        unregister_timeout=5,
        install_py_deps=install,
    )
    return ModelManager(settings, launcher)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    path = tmp_path / "store"
    path.mkdir()
    write_model(path, "good", GOOD)
    write_model(path, "bad", BAD)
    write_model(path, "plain", None)
    return path


async def register(models: ModelManager, url: str) -> None:
    await models.register(RegisterOptions(url=url, initial_workers=1))


async def test_the_manager_puts_installed_requirements_on_the_workers_path(
    tmp_path: Path, store: Path
) -> None:
    launcher = FakeLauncher()
    async with trio.open_nursery() as nursery:
        models: ModelManager = await nursery.start(manager(tmp_path, launcher, install=True).run)
        await register(models, "good.mar")
        await register(models, "plain.mar")  # no requirements file: nothing to install
        assert models.pydeps.pip_runs == 1
        (deps,) = launcher.python_paths[0]
        assert deps.parent == tmp_path / "work" / "pydeps"
        assert (deps / "tinydep.py").is_file()
        assert launcher.python_paths[1] == ()
        nursery.cancel_scope.cancel()


async def test_a_failed_install_registers_nothing(tmp_path: Path, store: Path) -> None:
    launcher = FakeLauncher()
    async with trio.open_nursery() as nursery:
        models: ModelManager = await nursery.start(manager(tmp_path, launcher, install=True).run)
        with pytest.raises(ServeError) as caught:
            await register(models, "bad.mar")
        assert caught.value.kind is ErrorKind.BAD_INPUT
        assert "trioserve-no-such-package" in caught.value.message
        assert list(models.registry) == [] and launcher.processes == []
        # the extracted archive is gone too
        assert [p.name for p in (tmp_path / "work").iterdir()] == ["pydeps"]
        nursery.cancel_scope.cancel()


async def test_off_by_default_nothing_is_installed(tmp_path: Path, store: Path) -> None:
    launcher = FakeLauncher()
    async with trio.open_nursery() as nursery:
        models: ModelManager = await nursery.start(manager(tmp_path, launcher, install=False).run)
        await register(models, "bad.mar")  # its requirements are never looked at
        assert models.pydeps.pip_runs == 0 and launcher.python_paths == [()]
        assert not (tmp_path / "work" / "pydeps").exists()
        nursery.cancel_scope.cancel()
