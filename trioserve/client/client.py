"""An async client for the gRPC APIs of trioserve (and of TorchServe: the protos are the same).

It is an asyncio client built on grpclib and the betterproto2 stubs generated from
``proto/``. Use it from asyncio code, or from Trio code inside ``trio_asyncio.open_loop()``
through ``trio_asyncio.aio_as_trio``::

    async with Client("127.0.0.1", inference_token=key) as client:
        print(await client.predictions("echo", {"data": b"hello"}))

A failed call raises :class:`grpclib.exceptions.GRPCError` (``.status``, ``.message``).
Every call takes ``timeout=`` (seconds, sent as the gRPC deadline); the client's own
``timeout`` is the default.
"""

from __future__ import annotations

from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Iterable,
    Iterator,
    Mapping,
)
from contextlib import aclosing, contextmanager
from types import TracebackType
from typing import Any, Self, cast

from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from trioserve._proto.org.pytorch.serve.grpc.inference import (
    InferenceApIsServiceStub,
    PredictionResponse,
    PredictionsRequest,
)
from trioserve._proto.org.pytorch.serve.grpc.management import (
    DescribeModelRequest,
    ListModelsRequest,
    ManagementApIsServiceStub,
    RegisterModelRequest,
    ScaleWorkerRequest,
    SetDefaultRequest,
    UnregisterModelRequest,
)
from trioserve.core import jsontext

Inputs = Mapping[str, bytes] | bytes
Requests = Iterable[PredictionsRequest] | AsyncIterable[PredictionsRequest]

DEFAULT_INFERENCE_PORT = 7070
DEFAULT_MANAGEMENT_PORT = 7071


def as_inputs(inputs: Inputs) -> dict[str, bytes]:
    """Handler inputs by name; plain bytes are the input ``data``."""
    if isinstance(inputs, bytes | bytearray | memoryview):
        return {"data": bytes(inputs)}
    return {name: bytes(value) for name, value in inputs.items()}


def prediction_request(
    model: str,
    inputs: Inputs,
    *,
    version: str | None = None,
    sequence_id: str | None = None,
) -> PredictionsRequest:
    return PredictionsRequest(
        model_name=model,
        model_version=version or "",
        input=as_inputs(inputs),
        sequence_id=sequence_id,
    )


@contextmanager
def _deadline_status() -> Iterator[None]:
    """grpclib reports a deadline that passes on the client side as TimeoutError; report it
    as the gRPC status the server would have sent."""
    try:
        yield
    except TimeoutError as exc:
        raise GRPCError(Status.DEADLINE_EXCEEDED, "Deadline exceeded") from exc


def _generator(
    stream: AsyncIterator[PredictionResponse],
) -> AsyncGenerator[PredictionResponse, None]:
    """The generated stubs' streaming methods are async generators typed as iterators."""
    return cast(AsyncGenerator[PredictionResponse, None], stream)


def _status_text(msg: str) -> str:
    """The ``status`` text of a management answer (the whole text if it has none)."""
    try:
        body = jsontext.parse(msg)
    except ValueError:
        return msg
    if isinstance(body, dict) and isinstance(body.get("status"), str):
        return str(body["status"])
    return msg


class Client:
    """Typed async access to every rpc of the inference and management services."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        *,
        inference_port: int = DEFAULT_INFERENCE_PORT,
        management_port: int = DEFAULT_MANAGEMENT_PORT,
        inference_token: str | None = None,
        management_token: str | None = None,
        timeout: float | None = None,
    ) -> None:
        self.host = host
        self.inference_port = inference_port
        self.management_port = management_port
        self.inference_token = inference_token
        self.management_token = management_token
        self.timeout = timeout
        self._channels: dict[int, Channel] = {}

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    # Channels are made on first use: grpclib binds a channel to the running loop.
    def _channel(self, port: int) -> Channel:
        channel = self._channels.get(port)
        if channel is None:
            channel = self._channels[port] = Channel(self.host, port)
        return channel

    @staticmethod
    def _metadata(token: str | None) -> list[tuple[str, str]] | None:
        return None if token is None else [("authorization", f"Bearer {token}")]

    def _inference(self) -> InferenceApIsServiceStub:
        return InferenceApIsServiceStub(
            self._channel(self.inference_port),
            timeout=self.timeout,
            metadata=self._metadata(self.inference_token),
        )

    def _management(self) -> ManagementApIsServiceStub:
        return ManagementApIsServiceStub(
            self._channel(self.management_port),
            timeout=self.timeout,
            metadata=self._metadata(self.management_token),
        )

    # -- inference ----------------------------------------------------------------------

    async def ping(self, *, timeout: float | None = None) -> str:
        """The server's health: ``"Healthy"`` or ``"Unhealthy"``."""
        with _deadline_status():
            response = await self._inference().ping(timeout=timeout)
        return str(jsontext.parse(response.health)["status"])

    async def predictions(
        self,
        model: str,
        inputs: Inputs,
        *,
        version: str | None = None,
        timeout: float | None = None,
    ) -> bytes:
        """One prediction (``Predictions``)."""
        request = prediction_request(model, inputs, version=version)
        with _deadline_status():
            response = await self._inference().predictions(request, timeout=timeout)
        return response.prediction

    async def stream_predictions(
        self,
        model: str,
        inputs: Inputs,
        *,
        version: str | None = None,
        timeout: float | None = None,
    ) -> AsyncGenerator[bytes, None]:
        """Each part of a streamed prediction as it arrives (``StreamPredictions``).

        Leaving the loop early (``break``, an exception) cancels the call on the server.
        """
        request = prediction_request(model, inputs, version=version)
        stream = _generator(self._inference().stream_predictions(request, timeout=timeout))
        async with aclosing(stream) as responses:
            with _deadline_status():
                async for response in responses:
                    yield response.prediction

    async def stream_predictions2(
        self,
        requests: Requests,
        *,
        timeout: float | None = None,
    ) -> AsyncGenerator[PredictionResponse, None]:
        """``StreamPredictions2``: responses in request order, each with its
        ``sequence_id``; a failed request has ``status`` set and the stream goes on.

        Build requests with :func:`prediction_request` (``sequence_id=`` is required).
        """
        stream = _generator(self._inference().stream_predictions_2(requests, timeout=timeout))
        async with aclosing(stream) as responses:
            with _deadline_status():
                async for response in responses:
                    yield response

    async def sequence(
        self,
        model: str,
        sequence_id: str,
        inputs: Iterable[Inputs],
        *,
        version: str | None = None,
        timeout: float | None = None,
    ) -> AsyncGenerator[PredictionResponse, None]:
        """Send several inputs as one sequence on one ``StreamPredictions2`` stream."""
        requests = [
            prediction_request(model, item, version=version, sequence_id=sequence_id)
            for item in inputs
        ]
        async with aclosing(self.stream_predictions2(requests, timeout=timeout)) as responses:
            async for response in responses:
                yield response

    # -- management ---------------------------------------------------------------------

    async def register_model(
        self,
        url: str,
        *,
        model_name: str | None = None,
        handler: str | None = None,
        runtime: str | None = None,
        batch_size: int = 0,
        max_batch_delay: int = 0,
        initial_workers: int = 0,
        response_timeout: int = 0,
        startup_timeout: int = 0,
        synchronous: bool = False,
        timeout: float | None = None,
    ) -> str:
        """Register an archive; returns the status text. 0 means "the default"."""
        request = RegisterModelRequest(
            url=url,
            model_name=model_name or "",
            handler=handler or "",
            runtime=runtime or "",
            batch_size=batch_size,
            max_batch_delay=max_batch_delay,
            initial_workers=initial_workers,
            response_timeout=response_timeout,
            startup_timeout=startup_timeout,
            synchronous=synchronous,
        )
        with _deadline_status():
            response = await self._management().register_model(request, timeout=timeout)
        return _status_text(response.msg)

    async def unregister_model(
        self, model: str, version: str | None = None, *, timeout: float | None = None
    ) -> str:
        request = UnregisterModelRequest(model_name=model, model_version=version or "")
        with _deadline_status():
            response = await self._management().unregister_model(request, timeout=timeout)
        return _status_text(response.msg)

    async def list_models(
        self, *, limit: int = 0, next_page_token: int = 0, timeout: float | None = None
    ) -> dict[str, Any]:
        """``{"nextPageToken"?: str, "models": [{"modelName", "modelUrl"}, ...]}``."""
        request = ListModelsRequest(limit=limit, next_page_token=next_page_token)
        with _deadline_status():
            response = await self._management().list_models(request, timeout=timeout)
        body: dict[str, Any] = jsontext.parse(response.msg)
        return body

    async def describe_model(
        self,
        model: str,
        version: str | None = None,
        *,
        customized: bool = False,
        timeout: float | None = None,
    ) -> list[dict[str, Any]]:
        """One description per version (``version="all"`` for every version)."""
        request = DescribeModelRequest(
            model_name=model, model_version=version or "", customized=customized
        )
        with _deadline_status():
            response = await self._management().describe_model(request, timeout=timeout)
        described: list[dict[str, Any]] = jsontext.parse(response.msg)
        return described

    async def scale_worker(
        self,
        model: str,
        version: str | None = None,
        *,
        min_worker: int = 0,
        max_worker: int = 0,
        synchronous: bool = False,
        worker_timeout: int = 0,
        timeout: float | None = None,
    ) -> str:
        """Scale workers (``min_worker`` 0 means 1, ``max_worker`` 0 means ``min_worker``)."""
        request = ScaleWorkerRequest(
            model_name=model,
            model_version=version or "",
            min_worker=min_worker,
            max_worker=max_worker,
            synchronous=synchronous,
            timeout=worker_timeout,
        )
        with _deadline_status():
            response = await self._management().scale_worker(request, timeout=timeout)
        return _status_text(response.msg)

    async def set_default(self, model: str, version: str, *, timeout: float | None = None) -> str:
        request = SetDefaultRequest(model_name=model, model_version=version)
        with _deadline_status():
            response = await self._management().set_default(request, timeout=timeout)
        return _status_text(response.msg)


__all__ = [
    "DEFAULT_INFERENCE_PORT",
    "DEFAULT_MANAGEMENT_PORT",
    "Client",
    "Inputs",
    "as_inputs",
    "prediction_request",
]
