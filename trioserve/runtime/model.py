"""One registered model version at run time: its batcher (the job queue) and its workers."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import trio

from trioserve.archive import MlserverSettings
from trioserve.core import errors
from trioserve.core.model_settings import ModelSettings
from trioserve.core.model_stats import ModelStats
from trioserve.core.openai.mapping import OpenAIMapping
from trioserve.core.request import InferenceRequest
from trioserve.core.tensor_inputs import TensorInput
from trioserve.runtime.batcher import Batcher
from trioserve.runtime.jobs import Job
from trioserve.runtime.launcher import Launcher
from trioserve.runtime.sequence_batcher import SequenceBatcher
from trioserve.runtime.supervisor import WorkerSettings, WorkerState, WorkerSupervisor

log = logging.getLogger("trioserve.runtime.model")


@dataclass(frozen=True, slots=True)
class PoolSettings:
    """Per-worker settings shared by every worker of this model version."""

    worker: WorkerSettings
    next_worker_id: Callable[[], int]
    tensor_inputs: Mapping[str, TensorInput] = field(default_factory=dict)
    mlserver: MlserverSettings | None = None  # an MLServer model's settings
    sequence_id_header: str = "ts_request_sequence_id"
    sequence_end_header: str = "ts_request_sequence_end"
    # The gpu_id of each new worker (None: CPU), and the model's device type for describe.
    next_gpu: Callable[[], int | None] = lambda: None
    device_type: str = "cpu"
    # clientTimeoutInMills, in seconds: the longest a request may wait in the queue.
    queue_timeout: float | None = None
    # How the model answers the OpenAI API (None: it does not; core/openai/mapping.py).
    openai: OpenAIMapping | None = None


class ModelVersion:
    def __init__(self, settings: ModelSettings, pool: PoolSettings, launcher: Launcher) -> None:
        self.settings = settings
        self.min_workers = settings.min_workers
        self.max_workers = settings.max_workers
        self.queue: Batcher | SequenceBatcher
        # The queue's batches (each step of a running batch) hold up to batch_capacity.
        if settings.sequence is None:
            self.queue = Batcher(
                batch_size=settings.batch_capacity,
                max_delay=settings.max_batch_delay / 1000.0,
                capacity=settings.job_queue_size,
                queue_timeout=pool.queue_timeout,
            )
        else:
            self.queue = SequenceBatcher(
                settings.sequence,
                batch_size=settings.batch_capacity,
                id_header=pool.sequence_id_header,
                end_header=pool.sequence_end_header,
            )
        self.workers: list[WorkerSupervisor] = []
        # Triton's statistics extension: counted by this process's dataplane and workers.
        self.stats = ModelStats()
        self._pool = pool
        self.device_type = pool.device_type  # "gpu" or "cpu", as describe shows it
        self.queue_timeout = pool.queue_timeout
        self.openai = pool.openai
        self._launcher = launcher
        self._nursery: trio.Nursery | None = None
        self._closed = False
        # With several serving processes (runtime/mirror.py). In the control process:
        # awaited after workers are added and before chosen ones stop, so that the other
        # serving processes attach to new workers and detach from leaving ones first.
        self.workers_changed: Callable[[], Awaitable[None]] | None = None
        self.leaving: set[int] = set()  # ids of workers chosen to stop, not yet told
        # In another serving process: the control process serves this model for everyone
        # (runtime/forward.py); ``remote_ready`` is how many workers it has ready.
        self.forwarded = False
        self.remote_ready = 0

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def version(self) -> str:
        return self.settings.version

    # -- lifetime --------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(self.queue.run)
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._closed = True
            self.queue.close(errors.shutting_down())

    async def stop(self, timeout: float) -> None:
        """Stop taking jobs, let running batches finish (up to ``timeout``), stop workers."""
        self._closed = True
        self.queue.close(
            errors.ServeError(
                errors.ErrorKind.UNAVAILABLE,
                f'Model "{self.name}" version {self.version} was unregistered.',
            )
        )
        await self._remove_workers(list(self.workers), timeout)

    # -- workers ---------------------------------------------------------------------

    @property
    def live_workers(self) -> list[WorkerSupervisor]:
        """Workers not asked to stop."""
        return [w for w in self.workers if not w.stop_requested]

    async def scale(
        self, min_workers: int, max_workers: int, *, drain_timeout: float | None = None
    ) -> None:
        """Start or drain workers so that ``min_workers`` run.

        Returns once new workers are started (not yet loaded) or removed ones have stopped;
        a removed worker finishes the batch in hand first, for up to ``drain_timeout``.
        """
        self.min_workers, self.max_workers = min_workers, max_workers
        live = self.live_workers
        if len(live) < min_workers:
            for _ in range(min_workers - len(live)):
                await self._add_worker()
            await self._workers_changed()
        elif len(live) > min_workers:
            # Idle workers go first, so busy ones finish their batch undisturbed.
            live.sort(key=lambda w: w.state is WorkerState.BUSY)
            leaving = live[: len(live) - min_workers]
            self.leaving.update(w.id for w in leaving)
            try:
                await self._workers_changed()
                await self._remove_workers(leaving, timeout=drain_timeout)
            finally:
                self.leaving.difference_update(w.id for w in leaving)

    async def _workers_changed(self) -> None:
        if self.workers_changed is not None:
            await self.workers_changed()

    @property
    def shared_workers(self) -> list[WorkerSupervisor]:
        """The workers other serving processes attach to: live ones not chosen to stop."""
        return [w for w in self.live_workers if w.id not in self.leaving]

    async def sync_workers(
        self, workers: Sequence[tuple[int, str, int | None]], drain_timeout: float | None
    ) -> None:
        """In a serving process other than the control process: supervise exactly
        ``workers`` (``(id, name, gpu_id)`` of the control process's workers): attach to new
        ones, detach from the others (each finishes its batch in hand first)."""
        wanted = {worker_id: (name, gpu) for worker_id, name, gpu in workers}
        have = {w.id for w in self.live_workers}
        for worker_id, (name, gpu) in wanted.items():
            if worker_id not in have:
                await self._add_worker(worker_id, name, gpu)
        gone = [w for w in self.live_workers if w.id not in wanted]
        if gone:
            await self._remove_workers(gone, timeout=drain_timeout)

    async def _add_worker(
        self, worker_id: int | None = None, name: str | None = None, gpu: int | None = None
    ) -> None:
        assert self._nursery is not None, "ModelVersion.run() is not running"
        if worker_id is None:
            worker_id = self._pool.next_worker_id()
            gpu = self._pool.next_gpu()
        if name is None:
            name = f"W-{worker_id}-{self.name}_{self.version}"
        settings = self._pool.worker
        if gpu is not None:
            settings = replace(settings, load=replace(settings.load, gpu_id=gpu))
        worker = WorkerSupervisor(
            worker_id, name, settings, self.queue, self._launcher, stats=self.stats
        )
        self.workers.append(worker)
        await self._nursery.start(self._run_worker, worker)

    async def _run_worker(
        self,
        worker: WorkerSupervisor,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        try:
            await worker.run(task_status=task_status)
        finally:
            if worker in self.workers:
                self.workers.remove(worker)

    async def _remove_workers(self, workers: list[WorkerSupervisor], timeout: float | None) -> None:
        for worker in workers:
            worker.request_stop()
        with trio.move_on_after(timeout if timeout is not None else float("inf")):
            await self._wait_stopped(workers)
        for worker in workers:
            if worker.state is not WorkerState.STOPPED:
                log.warning("worker %s did not drain in time: stopping it", worker.name)
                worker.force_stop()
        await self._wait_stopped(workers)

    @staticmethod
    async def _wait_stopped(workers: list[WorkerSupervisor]) -> None:
        for worker in workers:
            while worker.state is not WorkerState.STOPPED:
                await worker.wait_state_change()

    async def wait_settled(self) -> None:
        """Wait until each live worker is serving or has failed once."""
        for worker in self.live_workers:
            await worker.wait_settled()

    # -- requests --------------------------------------------------------------------

    @property
    def mlserver(self) -> MlserverSettings | None:
        """The settings of an MLServer model (``model-settings.json``), else None."""
        return self._pool.mlserver

    @property
    def merge_stream_replies(self) -> bool:
        """Whether streamed answers waiting for a slow client go out merged as one
        (``parameters.merge_stream_replies`` of an MLServer model; off by default)."""
        mlserver = self._pool.mlserver
        return mlserver is not None and mlserver.merge_stream_replies

    @property
    def streams(self) -> bool | None:
        """Whether the model answers a stream with its own code (an MLServer runtime that
        overrides ``predict_stream``), as its workers' loads said; None: no worker has
        loaded it yet, or its kind of model does not say (a TorchServe handler)."""
        for worker in self.workers:
            if worker.streams is not None:
                return worker.streams
        return None

    @property
    def tensor_inputs(self) -> Mapping[str, TensorInput]:
        """The inputs the model declares (model-config ``tensorInputs``)."""
        return self._pool.tensor_inputs

    @property
    def ready_workers(self) -> int:
        if self.forwarded:
            return self.remote_ready
        return sum(1 for w in self.workers if w.serving)

    @property
    def healthy(self) -> bool:
        return self.min_workers == 0 or self.ready_workers > 0

    def _check_tensor_inputs(self, request: InferenceRequest) -> None:
        """A request must carry every declared tensor input, of a size that fits it."""
        for name, spec in self._pool.tensor_inputs.items():
            param = next((p for p in request.params if p.name == name), None)
            if param is None:
                raise errors.bad_request(
                    f'Model "{self.name}" needs input {name!r} ({spec.dtype} '
                    f"{[spec.first, *spec.trailing]}) as raw bytes; the request has "
                    f"{[p.name for p in request.params]}."
                )
            try:
                spec.rows(memoryview(param.value).nbytes)
            except ValueError as exc:
                raise errors.bad_request(str(exc)) from None

    def submit(self, request: InferenceRequest) -> Job:
        if self._closed:
            raise errors.shutting_down()
        if not self.workers:
            raise errors.no_worker(
                self.name,
                self.version,
                "it has no workers. Use the scale workers API to add workers "
                f"(PUT /models/{self.name}?min_worker=1).",
            )
        if self.ready_workers == 0 and all(w.failures > 0 for w in self.workers):
            last = next((w.last_error for w in self.workers if w.last_error), "unknown error")
            raise errors.no_worker(
                self.name,
                self.version,
                f"no worker is ready; the last worker failure was: {last}",
            )
        self._check_tensor_inputs(request)
        job = Job(request)
        self.queue.put(
            job,
            lambda: errors.queue_full(self.name, self.version, self.queue.capacity),
        )
        return job
