"""Two serving processes' registries in one Trio run, on fake workers: the control process's
:class:`ModelManager` publishes its state after every change (``runtime/mirror.py``) and the
other process's manager applies it before the change's call returns. The state crosses as
pickled bytes, as it does over the link."""

from __future__ import annotations

import pickle
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

from trioserve import archive
from trioserve.core.messages import Param
from trioserve.core.model_settings import RegisterOptions, ServerDefaults
from trioserve.core.request import InferenceRequest
from trioserve.runtime.dataplane import Dataplane
from trioserve.runtime.manager import ManagerSettings, ModelManager
from trioserve.runtime.mirror import apply_state, state_of

from .fakes import FakeLauncher


def _settings(tmp_path: Path, role: str) -> ManagerSettings:
    return ManagerSettings(
        model_store=tmp_path / "store",
        work_root=tmp_path / f"work-{role}",
        defaults=ServerDefaults(
            default_workers=1, job_queue_size=10, response_timeout=30, startup_timeout=5
        ),
        stop_grace=0.5,
        max_response_size=1 << 20,
        max_unpacked_bytes=1 << 30,
        unregister_timeout=5,
    )


def _archive(store: Path, name: str, version: str) -> None:
    store.mkdir(exist_ok=True)
    source = store.parent / f"src-{name}-{version}"
    source.mkdir()
    handler = source / "handler.py"
    handler.write_text("def handle(data, context):\n    return data\n")
    archive.write_archive(model_name=name, version=version, handler=str(handler), export_path=store)
    (store / f"{name}.mar").rename(store / f"{name}-{version}.mar")


@dataclass
class Pair:
    control: ModelManager
    member: ModelManager
    member_launcher: FakeLauncher
    published: list[int]

    def member_models(self) -> dict[tuple[str, str], list[int]]:
        return {
            (name, version): sorted(w.id for w in entry.model.live_workers)
            for name, version, entry in self.member.registry
        }

    def control_models(self) -> dict[tuple[str, str], list[int]]:
        return {
            (name, version): sorted(w.id for w in entry.model.live_workers)
            for name, version, entry in self.control.registry
        }


@asynccontextmanager
async def pair(tmp_path: Path) -> AsyncIterator[Pair]:
    async with trio.open_nursery() as nursery:
        control: ModelManager = await nursery.start(
            ModelManager(_settings(tmp_path, "control"), FakeLauncher()).run
        )
        member_launcher = FakeLauncher()
        member: ModelManager = await nursery.start(
            ModelManager(_settings(tmp_path, "member"), member_launcher).run
        )
        published: list[int] = []

        async def publish() -> None:
            state = pickle.loads(pickle.dumps(state_of(control)))
            await apply_state(member, state, member_launcher, drain_timeout=1)
            published.append(len(state.versions))

        control.publish = publish
        yield Pair(control, member, member_launcher, published)
        nursery.cancel_scope.cancel()


async def test_register_scale_default_and_unregister_are_applied_before_the_call_returns(
    tmp_path: Path,
) -> None:
    for version in ("1.0", "2.0"):
        _archive(tmp_path / "store", "m", version)
    async with pair(tmp_path) as p:
        await p.control.register(RegisterOptions(url="m-1.0.mar", initial_workers=2))
        assert p.member_models() == p.control_models()
        assert len(p.member_models()[("m", "1.0")]) == 2

        # Scaling down: the member detaches from the leaving worker; up: attaches to the new.
        model = p.control.get("m", "1.0")
        await model.scale(1, 1)
        assert p.member_models() == p.control_models()
        assert len(p.member_models()[("m", "1.0")]) == 1
        await model.scale(3, 3)
        await model.wait_settled()
        assert p.member_models() == p.control_models()
        assert len(p.member_models()[("m", "1.0")]) == 3

        await p.control.register(RegisterOptions(url="m-2.0.mar", initial_workers=1))
        await p.control.set_default("m", "2.0")
        assert p.member.registry.default_version("m") == "2.0"
        assert p.member_models() == p.control_models()

        await p.control.unregister("m", "1.0")
        assert list(p.member_models()) == [("m", "2.0")]
        await p.control.unregister("m", "2.0")
        assert p.member_models() == {}
        assert p.published  # every change above went through publish


async def test_the_member_answers_on_its_own_supervisors_of_the_listed_workers(
    tmp_path: Path,
) -> None:
    _archive(tmp_path / "store", "m", "1.0")
    async with pair(tmp_path) as p:
        await p.control.register(RegisterOptions(url="m-1.0.mar", initial_workers=2))
        dataplane = Dataplane(p.member)
        for text in (b"a", b"b", b"c"):
            call = dataplane.submit(InferenceRequest("m", None, [Param("body", text)], []))
            async with call:
                replies = [reply async for reply, _final in call.replies()]
            assert bytes(replies[-1].body) == text
        assert sum(len(batch) for batch in p.member_launcher.batches) == 3
