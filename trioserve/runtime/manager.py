"""The model manager: the registry of running model versions and their lifetimes."""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from trioserve import archive
from trioserve.core import errors
from trioserve.core.gpus import GpuError, GpuPlan
from trioserve.core.limits import DEFAULT_LIMITS, RequestLimits, response_frame_limit
from trioserve.core.messages import LoadSpec
from trioserve.core.model_settings import (
    ModelSettings,
    RegisterOptions,
    ServerDefaults,
    YamlSettings,
    decide,
    is_default_version,
)
from trioserve.core.openai.mapping import MappingError, mapping_of
from trioserve.core.registry import Registry
from trioserve.core.request import InferenceRequest
from trioserve.core.tensor_inputs import TensorSpecError, parse_tensor_inputs
from trioserve.runtime.jobs import Job
from trioserve.runtime.launcher import Launcher, WithPythonPath
from trioserve.runtime.model import ModelVersion, PoolSettings
from trioserve.runtime.model_sources import (
    archive_error,
    mlserver_settings,
    model_stem,
    remove_extracted,
)
from trioserve.runtime.pydeps import DependencyInstaller
from trioserve.runtime.sequence_batcher import SequenceBatcher
from trioserve.runtime.supervisor import WorkerSettings, default_batch_frame
from trioserve.runtime.tensor_frames import tensor_frame_builder

log = logging.getLogger("trioserve.runtime.manager")

RUNTIMES = ("python", "python3")


@dataclass(frozen=True, slots=True)
class ManagerSettings:
    model_store: Path | None
    work_root: Path
    defaults: ServerDefaults
    stop_grace: float
    max_response_size: int
    max_unpacked_bytes: int
    unregister_timeout: float
    # Receives each worker's handler metrics: (model, version, records).
    metrics_sink: Callable[[str, str, list[Any]], None] | None = None
    # Told each worker's load time: (worker name, milliseconds).
    load_time_sink: Callable[[str, float], None] | None = None
    # The sequence id and end header names (ts_header_key_sequence_id / _end).
    sequence_id_header: str = "ts_request_sequence_id"
    sequence_end_header: str = "ts_request_sequence_end"
    # install_py_dep_per_model: pip-install each archive's requirements file for its workers.
    install_py_deps: bool = False
    # default_service_handler: the handler of an archive whose manifest names none.
    default_handler: str | None = None
    # service_envelope: the request envelope of a model whose manifest names none.
    default_envelope: str | None = None
    # Which GPU each new worker gets (number_of_gpu, deviceType, deviceIds).
    gpu_plan: GpuPlan = field(default_factory=lambda: GpuPlan(0))
    # What one request may expand to (max_request_inputs, ...); the workers check it too.
    request_limits: RequestLimits = DEFAULT_LIMITS


@dataclass(slots=True)
class Entry:
    model: ModelVersion
    loaded: archive.LoadedArchive
    scope: trio.CancelScope


class ModelManager:
    def __init__(self, settings: ManagerSettings, launcher: Launcher) -> None:
        self.settings = settings
        self._launcher = launcher
        self.registry: Registry[Entry] = Registry()
        self._nursery: trio.Nursery | None = None
        self._worker_ids = itertools.count(9000)
        self._lock = trio.Lock()
        self.pydeps = DependencyInstaller(settings.work_root / "pydeps")
        # With several serving processes, in the control process: tells the other serving
        # processes the registry's new state and returns once each has applied it
        # (runtime/mirror.py). Called after every change to the registry or to the workers.
        self.publish: Callable[[], Awaitable[None]] | None = None

    async def run(
        self, *, task_status: trio.TaskStatus[ModelManager] = trio.TASK_STATUS_IGNORED
    ) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started(self)
                await trio.sleep_forever()
        finally:
            self._nursery = None
            for _name, _version, entry in list(self.registry):
                remove_extracted(entry.loaded)

    def start_soon(self, operation: Callable[[], Awaitable[object]]) -> None:
        """Run a background operation (an asynchronous scale) inside the manager's nursery.

        Its failure is logged; it never takes the manager down."""
        assert self._nursery is not None, "ModelManager.run() is not running"

        async def guarded() -> None:
            try:
                await operation()
            except Exception:
                log.exception("background model operation failed")

        self._nursery.start_soon(guarded)

    # -- lookups ---------------------------------------------------------------------

    def get(self, name: str, version: str | None = None) -> ModelVersion:
        return self.registry.get(name, version).model

    def submit(self, request: InferenceRequest) -> Job:
        return self.get(request.model, request.version).submit(request)

    def healthy(self) -> bool:
        return all(entry.model.healthy for _n, _v, entry in self.registry)

    # -- registration ----------------------------------------------------------------

    async def register(self, options: RegisterOptions) -> ModelVersion:
        """Load an archive and start its workers.

        With ``options.synchronous`` this returns once every worker is serving or has
        failed once; a model whose workers all fail to load is rolled back (unregistered)
        and the error says why.
        """
        if self.settings.model_store is None:
            raise errors.bad_request("No model store is configured (use --model-store).")
        try:
            source = archive.resolve_url(self.settings.model_store, options.url)
            loaded = await trio.to_thread.run_sync(self._unpack, source)
        except archive.ArchiveError as exc:
            raise archive_error(exc) from None
        return await self.register_loaded(options, loaded)

    async def register_loaded(
        self, options: RegisterOptions, loaded: archive.LoadedArchive
    ) -> ModelVersion:
        """:meth:`register` for a model already read (``trioserve dev`` reads its files in
        place); from here ``loaded`` is the manager's, removed with the model if extracted."""
        try:
            model = await self._start(options, loaded)
        except BaseException:
            remove_extracted(loaded)
            raise
        if options.synchronous:
            await model.wait_settled()
            if model.min_workers > 0 and model.ready_workers == 0:
                reason = next(
                    (w.last_error for w in model.workers if w.last_error), "unknown error"
                )
                await self.unregister(model.name, model.version)
                raise errors.ServeError(
                    errors.ErrorKind.WORKER_FAILED,
                    f"Failed to start workers for model {model.name} version: "
                    f"{model.version}: {reason}",
                )
        return model

    def _unpack(self, source: Path) -> archive.LoadedArchive:
        return archive.unpack_archive(
            source,
            self.settings.work_root,
            max_unpacked_bytes=self.settings.max_unpacked_bytes,
        )

    async def _start(self, options: RegisterOptions, loaded: archive.LoadedArchive) -> ModelVersion:
        manifest = loaded.manifest
        name = options.model_name or manifest.model_name or model_stem(loaded.source)
        version = manifest.model_version or "1.0"
        handler = options.handler or manifest.handler or self.settings.default_handler
        if not handler:
            raise errors.bad_request(
                f"Model {name} has no handler: give one in the manifest or the register call "
                "(or set default_service_handler)."
            )
        runtime = options.runtime or manifest.runtime or "python"
        if runtime not in RUNTIMES:
            raise errors.bad_request(
                f"Invalid runtime: {runtime}. trioserve runs Python handlers "
                f"({', '.join(RUNTIMES)})."
            )
        cfg = loaded.config
        settings = decide(
            name=name,
            version=version,
            handler=handler,
            runtime=runtime,
            options=options,
            yaml=YamlSettings(
                min_workers=cfg.min_workers,
                max_workers=cfg.max_workers,
                batch_size=cfg.batch_size,
                max_batch_delay=cfg.max_batch_delay,
                response_timeout=cfg.response_timeout,
                startup_timeout=cfg.startup_timeout,
                job_queue_size=cfg.job_queue_size,
                sequence_batching=cfg.sequence_batching,
                sequence_max_idle_msec=cfg.sequence_max_idle_msec,
                sequence_timeout_msec=cfg.sequence_timeout_msec,
                max_sequence_job_queue_size=cfg.max_sequence_job_queue_size,
                max_num_sequence=cfg.max_num_sequence,
                continuous_batching=cfg.continuous_batching,
            ),
            defaults=self.settings.defaults,
        )
        pool = self._pool(settings, loaded)
        model = ModelVersion(settings, pool, await self._model_launcher(name, loaded))
        async with self._lock:
            scope = trio.CancelScope()
            self.registry.add(name, version, Entry(model, loaded, scope))
            if is_default_version(self.settings.defaults, name, version):
                self.registry.set_default(name, version)  # models={...: {"defaultVersion": true}}
        assert self._nursery is not None, "ModelManager.run() is not running"
        await self._nursery.start(_run_in_scope, model, scope)
        await model.scale(settings.min_workers, settings.max_workers)
        model.workers_changed = self._publish
        await self._publish()
        log.info(
            "registered model %s version %s with %d workers", name, version, settings.min_workers
        )
        return model

    async def _model_launcher(self, name: str, loaded: archive.LoadedArchive) -> Launcher:
        """The launcher for the model's workers: with ``install_py_dep_per_model`` and a
        requirements file in the archive, one that puts the installed requirements on the
        workers' import path (pip runs here; its failure fails the registration)."""
        requirements = loaded.manifest.requirements_file
        if not self.settings.install_py_deps or not requirements:
            return self._launcher
        model_dir = loaded.model_dir.resolve()
        path = (model_dir / requirements).resolve()
        if not path.is_relative_to(model_dir) or not path.is_file():
            raise errors.bad_request(
                f"Model {name}: the requirements file {requirements!r} named in "
                "MAR-INF/MANIFEST.json is not a file in the archive."
            )
        deps = await self.pydeps.install(path, cwd=model_dir, model=name)
        return WithPythonPath(self._launcher, (deps,))

    def _pool(self, settings: ModelSettings, loaded: archive.LoadedArchive) -> PoolSettings:
        # What the server reads from a worker, which the worker keeps its frames within.
        max_frame = response_frame_limit(self.settings.max_response_size, settings.batch_capacity)
        load = LoadSpec(
            model_name=settings.name,
            model_version=settings.version,
            model_dir=str(loaded.model_dir),
            handler=settings.handler,
            batch_size=settings.batch_size,
            envelope=loaded.manifest.envelope or self.settings.default_envelope,
            manifest=loaded.manifest.raw or None,
            model_yaml_config=dict(loaded.config.raw),
            model_settings=mlserver_settings(settings, loaded),
            max_response_size=self.settings.max_response_size,
            request_limits=self.settings.request_limits,
            max_response_frame=max_frame,
        )
        plan = self.settings.gpu_plan
        config = loaded.config
        try:
            next_gpu = plan.chooser(settings.name, config.device_type, config.device_ids)
        except GpuError as exc:
            raise errors.bad_request(str(exc)) from None
        device_type = config.device_type or ("gpu" if plan.gpus else "cpu")
        try:
            tensors = parse_tensor_inputs(loaded.config.raw.get("tensorInputs"))
        except TensorSpecError as exc:
            raise errors.bad_request(f"model-config.yaml of {settings.name}: {exc}") from None
        try:
            openai = mapping_of(loaded.mlserver.raw if loaded.mlserver else None, loaded.config.raw)
        except MappingError as exc:
            where = "model-settings.json" if loaded.mlserver else "model-config.yaml"
            raise errors.bad_request(f"{where} of {settings.name}: {exc}") from None
        if tensors and settings.continuous_batching:
            raise errors.bad_request(
                f"model-config.yaml of {settings.name}: continuousBatching cannot be combined "
                "with tensorInputs (a running batch's requests are not collated again)."
            )
        sink = self.settings.metrics_sink
        on_metrics = (
            None if sink is None else functools.partial(sink, settings.name, settings.version)
        )
        worker = WorkerSettings(
            load=load,
            cwd=loaded.model_dir,
            response_timeout=settings.response_timeout,
            startup_timeout=settings.startup_timeout,
            stop_grace=self.settings.stop_grace,
            max_frame=max_frame,
            batch_capacity=settings.batch_capacity,
            on_metrics=on_metrics,
            on_loaded=self.settings.load_time_sink,
            frame_builder=tensor_frame_builder(tensors) if tensors else default_batch_frame,
            # Keep the worker fed: a full batch (for one-request models, one request) goes
            # behind the running one once no worker is idle.
            prefetch=not settings.continuous_batching,
            continuous=settings.continuous_batching,
        )
        return PoolSettings(
            worker=worker,
            next_worker_id=lambda: next(self._worker_ids),
            tensor_inputs=tensors,
            sequence_id_header=self.settings.sequence_id_header,
            sequence_end_header=self.settings.sequence_end_header,
            mlserver=loaded.mlserver,
            next_gpu=next_gpu,
            device_type=device_type,
            queue_timeout=(config.client_timeout_in_mills or 0) / 1000 or None,
            openai=openai,
        )

    def open_sequences(self) -> list[tuple[tuple[str, str], float]]:
        """``((model name, version), open sequences)`` of every stateful model version."""
        return [
            ((name, version), float(entry.model.queue.open_sequences))
            for name, version, entry in self.registry
            if isinstance(entry.model.queue, SequenceBatcher)
        ]

    async def unregister(self, name: str, version: str | None = None) -> None:
        async with self._lock:
            target = self.registry.check_removable(name, version)
            entry = self.registry.remove(name, target)
        try:
            await self._publish()  # the other serving processes let go of it first
            await entry.model.stop(self.settings.unregister_timeout)
        finally:
            entry.scope.cancel()
            await trio.to_thread.run_sync(remove_extracted, entry.loaded)

    async def set_default(self, name: str, version: str) -> None:
        self.registry.set_default(name, version)
        await self._publish()

    async def _publish(self) -> None:
        if self.publish is not None:
            await self.publish()

    # -- another serving process's copy (runtime/mirror.py) ----------------------------

    async def adopt(
        self,
        settings: ModelSettings,
        loaded: archive.LoadedArchive,
        launcher: Launcher,
        prepare: Callable[[ModelVersion], Awaitable[None]],
    ) -> ModelVersion:
        """Add a model version the control process registered (its files are the control
        process's: never removed here); ``prepare`` (attaching its workers) runs before the
        version can take requests."""
        model = ModelVersion(settings, self._pool(settings, loaded), launcher)
        scope = trio.CancelScope()
        assert self._nursery is not None, "ModelManager.run() is not running"
        await self._nursery.start(_run_in_scope, model, scope)
        await prepare(model)
        self.registry.add(settings.name, settings.version, Entry(model, loaded, scope))
        return model

    async def release(self, name: str, version: str) -> None:
        """Drop an adopted model version (the control process unregistered it)."""
        entry = self.registry.remove(name, version)
        try:
            await entry.model.stop(self.settings.unregister_timeout)
        finally:
            entry.scope.cancel()


async def _run_in_scope(
    model: ModelVersion,
    scope: trio.CancelScope,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    with scope:
        await model.run(task_status=task_status)


__all__ = ["ManagerSettings", "ModelManager"]
