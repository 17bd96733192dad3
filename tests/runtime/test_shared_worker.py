"""One real worker process shared by two serving processes' supervisors: the primary one
starts it (``SubprocessLauncher(listen_dir=...)``), the other attaches to it
(``AttachLauncher``); both are unchanged WorkerSupervisors inside ModelVersions."""

from __future__ import annotations

import itertools
import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.messages import LoadSpec, Param
from trioserve.core.model_settings import ModelSettings
from trioserve.core.request import InferenceRequest
from trioserve.runtime.attach import AttachLauncher, attach_path
from trioserve.runtime.jobs import Job, JobState
from trioserve.runtime.launcher import Launcher, SubprocessLauncher
from trioserve.runtime.model import ModelVersion, PoolSettings
from trioserve.runtime.supervisor import WorkerSettings, WorkerState

from .fakes import wait_for

REPO = Path(__file__).resolve().parents[2]
HANDLER = REPO / "tests" / "fixtures" / "worker" / "fx_stream.py"
STOP_GRACE = 20.0


@pytest.fixture
def listen_dir() -> Iterator[Path]:
    # Short: a Unix socket path holds at most 107 bytes.
    with tempfile.TemporaryDirectory(prefix="ts-attach-") as directory:
        os.chmod(directory, 0o700)
        yield Path(directory)


def model(launcher: Launcher, model_dir: Path) -> ModelVersion:
    settings = ModelSettings(
        name="m",
        version="1.0",
        url="m.mar",
        handler=str(HANDLER),
        runtime="python",
        batch_size=1,
        max_batch_delay=100,
        min_workers=1,
        max_workers=1,
        response_timeout=60,
        startup_timeout=60,
        job_queue_size=10,
        loaded_at_startup=False,
    )
    # Each serving process numbers its workers alike, so both name theirs W-9000-m_1.0.
    ids = itertools.count(9000)
    pool = PoolSettings(
        worker=WorkerSettings(
            load=LoadSpec("m", "1.0", str(model_dir), str(HANDLER)),
            cwd=model_dir,
            response_timeout=60,
            startup_timeout=60,
            stop_grace=STOP_GRACE,
            max_frame=1 << 20,
        ),
        next_worker_id=lambda: next(ids),
    )
    return ModelVersion(settings, pool, launcher)


def request(mode: str | None = None) -> InferenceRequest:
    headers = [("mode", mode)] if mode else []
    return InferenceRequest("m", None, [Param("body", b"1")], headers)


async def answer(version: ModelVersion) -> list[bytes]:
    with trio.fail_after(30):
        return [bytes(reply.body) async for reply, _final in version.submit(request()).replies()]


async def failure(job: Job) -> ServeError:
    """The error the job ends with."""
    with trio.fail_after(30):
        while True:
            try:
                await job.next_reply()
            except ServeError as error:
                return error


async def test_two_serving_processes_share_a_worker(tmp_path: Path, listen_dir: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    primary = model(SubprocessLauncher(env, listen_dir=listen_dir), tmp_path)
    shared = model(AttachLauncher(listen_dir, connect_timeout=30), tmp_path)
    async with trio.open_nursery() as nursery:
        for version in (primary, shared):
            await nursery.start(version.run)
            await version.scale(1, 1)
        with trio.fail_after(60):
            await primary.wait_settled()
            await shared.wait_settled()
        first, other = primary.workers[0], shared.workers[0]
        assert first.serving and other.serving, (first.last_error, other.last_error)
        assert attach_path(listen_dir, first.name).is_socket()
        assert other.pid == first.pid is not None  # the same process (SO_PEERCRED)
        want = [b"chunk0-0", b"chunk1-0", b"chunk2-0", b"last-0"]
        assert await answer(primary) == want
        assert await answer(shared) == want

        # The worker dies with a job of each in flight (the second queued behind the first
        # in the worker's one handler thread): both fail, the primary restarts the worker
        # and the other supervisor attaches again.
        running = primary.submit(request("cancel"))
        with trio.fail_after(30):
            started, _final = await running.next_reply()
        assert bytes(started.body) == b"started"  # it runs in the worker
        behind = shared.submit(request("cancel"))
        await wait_for(lambda: behind.state is JobState.RUNNING and other.state is WorkerState.BUSY)
        old_pid = first.pid
        assert old_pid is not None
        os.kill(old_pid, signal.SIGKILL)
        primary_error, shared_error = await failure(running), await failure(behind)
        assert "SIGKILL" in primary_error.message
        assert shared_error.kind is ErrorKind.WORKER_FAILED
        assert "shared worker process" in shared_error.message
        assert f"pid {old_pid}" in shared_error.message
        assert "exited with status" not in shared_error.message
        await wait_for(lambda: first.serving and other.serving and first.pid != old_pid, 60)
        # (It may have reached the dying worker first: connection reset, one more restart.)
        assert other.pid == first.pid and other.restarts >= 1
        assert await answer(shared) == want
        assert await answer(primary) == want

        # The attached supervisor stops: it detaches at once (not after stop_grace), and the
        # worker goes on serving the primary.
        began = trio.current_time()
        other.request_stop()
        with trio.fail_after(STOP_GRACE / 4):
            await wait_for(lambda: other.state is WorkerState.STOPPED)
        assert trio.current_time() - began < STOP_GRACE / 4
        assert await answer(primary) == want
        assert first.restarts == 1

        with trio.fail_after(STOP_GRACE):
            await primary.stop(timeout=STOP_GRACE)
            await shared.stop(timeout=STOP_GRACE)
        nursery.cancel_scope.cancel()


async def test_attaching_to_no_worker_fails_naming_the_path(listen_dir: Path) -> None:
    launcher = AttachLauncher(listen_dir, connect_timeout=0.2)
    async with trio.open_nursery() as nursery:
        with pytest.raises(OSError, match=str(attach_path(listen_dir, "W-1-m_1.0"))):
            await launcher.launch("W-1-m_1.0", listen_dir, nursery)


def test_attach_paths_are_short_and_distinct(listen_dir: Path) -> None:
    long = "W-123456-" + "x" * 300 + "_1.0"
    path = attach_path(listen_dir, long)
    assert len(os.fsencode(path)) < 108
    assert path != attach_path(listen_dir, long + "1")
    assert path == attach_path(listen_dir, long)
