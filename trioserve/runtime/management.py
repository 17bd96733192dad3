"""Management operations, transport-neutral: the HTTP API on 8081 and gRPC both call these.

Each operation takes already-parsed arguments and returns a :class:`Outcome` (status code
plus a JSON-able body) or raises :class:`ServeError`. Response texts are TorchServe's.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import psutil

from trioserve.core import errors, jsontext
from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.messages import Param
from trioserve.core.model_settings import RegisterOptions
from trioserve.core.request import InferenceRequest
from trioserve.runtime.manager import ModelManager
from trioserve.runtime.model import ModelVersion
from trioserve.runtime.supervisor import WorkerState, WorkerSupervisor

log = logging.getLogger("trioserve.management")

PROCESSING = "Processing worker updates..."


@dataclass(frozen=True, slots=True)
class Outcome:
    status: int
    body: Any


def model_api_disabled() -> ServeError:
    return ServeError(
        ErrorKind.NOT_ALLOWED,
        "Requested method is not allowed: the model API (register/unregister) is disabled. "
        "Start trioserve with --enable-model-api or enable_model_api=true.",
    )


# -- parameter parsing ------------------------------------------------------------------


def int_param(params: Mapping[str, Any], name: str) -> int | None:
    value = params.get(name)
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise errors.bad_request(f"Parameter {name} must be an integer, got {errors.quote(value)}.")
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        raise errors.bad_request(
            f"Parameter {name} must be an integer, got {errors.quote(value)}."
        ) from None


def bool_param(params: Mapping[str, Any], name: str, default: bool) -> bool:
    value = params.get(name)
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise errors.bad_request(f"Parameter {name} must be true or false, got {errors.quote(value)}.")


def str_param(params: Mapping[str, Any], name: str) -> str | None:
    value = params.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise errors.bad_request(f"Parameter {name} must be a string, got {errors.quote(value)}.")
    return value


# -- describe ---------------------------------------------------------------------------


def _start_time(when: dt.datetime | None) -> str | None:
    if when is None:
        return None
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def _memory(pid: int | None) -> int:
    if pid is None:
        return 0
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ValueError):
        return 0


WORKER_STATUS = {
    WorkerState.READY: "READY",
    WorkerState.BUSY: "READY",
    WorkerState.STARTING: "STARTING",
    WorkerState.BACKOFF: "RESTARTING",
    WorkerState.STOPPING: "UNLOADING",
    WorkerState.STOPPED: "STOPPED",
}


def describe_worker(worker: WorkerSupervisor) -> dict[str, Any]:
    status = "UNLOADING" if worker.stop_requested else WORKER_STATUS[worker.state]
    entry: dict[str, Any] = {
        "id": str(worker.id),
        "startTime": _start_time(worker.start_time),
        "status": status,
        "memoryUsage": _memory(worker.pid if worker.serving else None),
        "pid": worker.pid if worker.pid is not None else -1,
        "gpu": worker.gpu_id is not None,
        "gpuUsage": "N/A" if worker.gpu_id is None else f"gpuId::{worker.gpu_id}",
    }
    if worker.last_error is not None and not worker.serving:
        entry["lastError"] = worker.last_error
    return {k: v for k, v in entry.items() if v is not None}


def describe_model(model: ModelVersion) -> dict[str, Any]:
    s = model.settings
    return {
        "modelName": s.name,
        "modelVersion": s.version,
        "modelUrl": s.url,
        "runtime": s.runtime,
        "minWorkers": model.min_workers,
        "maxWorkers": model.max_workers,
        "batchSize": s.batch_size,
        "maxBatchDelay": s.max_batch_delay,
        "responseTimeout": s.response_timeout,
        "startupTimeout": s.startup_timeout,
        "maxRetryTimeoutInSec": 300,
        "clientTimeoutInMills": round((model.queue_timeout or 0) * 1000),
        "parallelType": "",
        "parallelLevel": 0,
        "deviceType": model.device_type,
        "continuousBatching": s.continuous_batching,
        "useJobTicket": False,
        "useVenv": False,
        "stateful": s.sequence is not None,
        "sequenceMaxIdleMSec": s.sequence.max_idle_msec if s.sequence else 0,
        "sequenceTimeoutMSec": s.sequence.timeout_msec if s.sequence else 0,
        "maxNumSequence": s.sequence.max_sequences if s.sequence else 0,
        "maxSequenceJobQueueSize": s.sequence.max_queue if s.sequence else 0,
        "loadedAtStartup": s.loaded_at_startup,
        "workers": [describe_worker(w) for w in model.workers],
        "jobQueueStatus": {
            "remainingCapacity": model.queue.remaining_capacity,
            "pendingRequests": len(model.queue),
        },
    }


def _parse_metadata(body: bytes) -> Any:
    try:
        parsed = jsontext.parse(body)
    except jsontext.JSONError:
        return {}
    # A handler returning a JSON string holding JSON (TorchServe's examples do) is unwrapped.
    if isinstance(parsed, str):
        try:
            return jsontext.parse(parsed)
        except jsontext.JSONError:
            return {}
    return parsed


# -- the service ------------------------------------------------------------------------


class ManagementService:
    def __init__(
        self,
        manager: ModelManager,
        *,
        enable_model_api: bool,
        download: Callable[[str], Awaitable[Path]] | None = None,
        max_workers: int = 64,
    ) -> None:
        self.manager = manager
        self.enable_model_api = enable_model_api
        self.max_workers = max_workers
        self._download = download

    # register ---------------------------------------------------------------------------

    async def register(self, params: Mapping[str, Any]) -> Outcome:
        if not self.enable_model_api:
            raise model_api_disabled()
        url = params.get("url")
        if url is None:
            raise errors.bad_request("Parameter url is required.")
        if not isinstance(url, str):
            raise errors.bad_request(f"Parameter url must be a string, got {errors.quote(url)}.")
        if url == "":
            raise errors.ServeError(
                errors.ErrorKind.NOT_FOUND, "empty url", reason="ModelNotFoundException"
            )
        if url.startswith(("http://", "https://")):
            if self._download is None:
                raise errors.bad_request(
                    "Registering from http(s) URLs needs a model store (--model-store)."
                )
            path = await self._download(url)
            url = path.name
        synchronous = bool_param(params, "synchronous", True)
        initial = int_param(params, "initial_workers")
        if initial is not None:
            self._check_workers("initial_workers", initial)
        options = RegisterOptions(
            url=url,
            model_name=str_param(params, "model_name"),
            handler=str_param(params, "handler"),
            runtime=str_param(params, "runtime"),
            batch_size=int_param(params, "batch_size"),
            max_batch_delay=int_param(params, "max_batch_delay"),
            initial_workers=initial if initial is not None else 0,
            response_timeout=int_param(params, "response_timeout"),
            startup_timeout=int_param(params, "startup_timeout"),
            synchronous=synchronous,
        )
        model = await self.manager.register(options)
        name, version = model.name, model.version
        if model.min_workers == 0:
            return Outcome(
                200,
                {
                    "status": f'Model "{name}" Version: {version} registered with '
                    "0 initial workers. Use scale workers API to add workers for "
                    "the model."
                },
            )
        if not synchronous:
            return Outcome(202, {"status": PROCESSING})
        return Outcome(
            200,
            {
                "status": f'Model "{name}" Version: {version} registered with '
                f"{model.min_workers} initial workers"
            },
        )

    # scale ------------------------------------------------------------------------------

    async def scale(self, name: str, version: str | None, params: Mapping[str, Any]) -> Outcome:
        version = version or str_param(params, "model_version")
        model = self.manager.get(name, version)
        min_workers = int_param(params, "min_worker")
        min_workers = 1 if min_workers is None else min_workers
        max_workers = int_param(params, "max_worker")
        max_workers = min_workers if max_workers is None else max_workers
        self._check_workers("min_worker", min_workers)
        self._check_workers("max_worker", max_workers)
        if max_workers < min_workers:
            raise errors.bad_request("max_worker cannot be less than min_worker.")
        synchronous = bool_param(params, "synchronous", False)
        timeout = int_param(params, "timeout")
        drain = float(timeout) if timeout is not None and timeout >= 0 else None
        if not synchronous:
            self.manager.start_soon(
                partial(model.scale, min_workers, max_workers, drain_timeout=drain)
            )
            return Outcome(202, {"status": PROCESSING})
        await model.scale(min_workers, max_workers, drain_timeout=drain)
        await model.wait_settled()
        if sum(1 for w in model.live_workers if w.serving) < min_workers:
            return Outcome(206, {"status": "Workers scaling in progress..."})
        text = f"Workers scaled to {min_workers} for model: {name}"
        if version:
            text += f", version: {version}"
        return Outcome(200, {"status": text})

    def _check_workers(self, name: str, count: int) -> None:
        if count < 0:
            raise errors.bad_request(f"{name} cannot be negative.")
        if count > self.max_workers:
            raise errors.bad_request(
                f"{name} {count} is more than the {self.max_workers} workers a model may have "
                "(max_workers_per_model)."
            )

    # describe ---------------------------------------------------------------------------

    async def describe(self, name: str, version: str | None, customized: bool) -> Outcome:
        if version == "all":
            models = [entry.model for _v, entry in self.manager.registry.versions(name)]
        else:
            models = [self.manager.get(name, version)]
        described = []
        for model in models:
            entry = describe_model(model)
            if customized:
                entry["customizedMetadata"] = await self._custom_metadata(model)
            described.append(entry)
        return Outcome(200, described)

    async def _custom_metadata(self, model: ModelVersion) -> Any:
        request = InferenceRequest(
            model=model.name,
            version=model.version,
            params=[Param("body", b"")],
            headers=[("describe", "True")],
        )
        job = model.submit(request)
        try:
            body = b""
            async for reply, final in job.replies():
                if final:
                    body = bytes(reply.body)
        finally:
            job.cancel()
        return _parse_metadata(body)

    # list, set-default, unregister ------------------------------------------------------

    def list_models(self, limit: int | None, next_page_token: int | None) -> Outcome:
        if limit is None or limit > 100 or limit < 0:
            limit = 100
        start = max(0, next_page_token or 0)
        names = self.manager.registry.names()
        page = names[start : start + limit]
        models = []
        for name in page:
            model = self.manager.get(name)
            models.append({"modelName": name, "modelUrl": model.settings.url})
        body: dict[str, Any] = {}
        if start + limit <= len(names):
            body["nextPageToken"] = str(start + limit)
        body["models"] = models
        return Outcome(200, body)

    async def set_default(self, name: str, version: str) -> Outcome:
        await self.manager.set_default(name, version)
        return Outcome(
            200,
            {"status": f'Default version successfully updated for model "{name}" to "{version}"'},
        )

    async def unregister(self, name: str, version: str | None) -> Outcome:
        if not self.enable_model_api:
            raise model_api_disabled()
        await self.manager.unregister(name, version)
        return Outcome(200, {"status": f'Model "{name}" unregistered'})
