"""TorchServe's gRPC management service (port 7071), on the Trio side of the bridge.

Every rpc is a translation of its request message into the arguments of the HTTP API's
:class:`ManagementService` call, whose outcome body becomes ``ManagementResponse.msg``
(pretty-printed JSON, as TorchServe sends it). proto3 cannot tell an unset number from 0 or
an unset string from "", so 0 and "" mean "not given" (TorchServe's reading too).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from trioserve._proto.org.pytorch.serve.grpc.management import (
    DescribeModelRequest,
    ListModelsRequest,
    ManagementApIsServiceBase,
    ManagementResponse,
    RegisterModelRequest,
    ScaleWorkerRequest,
    SetDefaultRequest,
    UnregisterModelRequest,
)
from trioserve.auth import KeyKind
from trioserve.core.errors import ErrorKind, ServeError
from trioserve.grpc.calls import Method, RpcContext, Unary
from trioserve.runtime.management import ManagementService, Outcome


def response_text(body: Any) -> str:
    """The HTTP API's JSON body as TorchServe's gRPC sends it: 2-space indent, no newline."""
    return json.dumps(body, indent=2, ensure_ascii=False)


def _respond(outcome: Outcome) -> ManagementResponse:
    return ManagementResponse(msg=response_text(outcome.body))


def _given(value: Any) -> Any:
    """proto3's zero value (0, "") as "not given"."""
    return None if value in (0, "") else value


def model_api_disabled() -> ServeError:
    """TorchServe's gRPC answer when register/unregister are switched off."""
    return ServeError(ErrorKind.FORBIDDEN, "Model API disabled", reason="ModelException")


class ManagementRpcs:
    """``org.pytorch.serve.grpc.management.ManagementAPIsService``."""

    base: ClassVar[type[Any]] = ManagementApIsServiceBase

    def __init__(self, service: ManagementService) -> None:
        self._service = service

    def key_kind_of(self, method: str) -> KeyKind:
        return KeyKind.MANAGEMENT

    def methods(self) -> dict[str, Method]:
        return {
            "DescribeModel": Unary(self.describe_model),
            "ListModels": Unary(self.list_models),
            "RegisterModel": Unary(self.register_model),
            "ScaleWorker": Unary(self.scale_worker),
            "SetDefault": Unary(self.set_default),
            "UnregisterModel": Unary(self.unregister_model),
        }

    def _check_model_api(self) -> None:
        if not self._service.enable_model_api:
            raise model_api_disabled()

    async def describe_model(
        self, request: DescribeModelRequest, _context: RpcContext
    ) -> ManagementResponse:
        return _respond(
            await self._service.describe(
                request.model_name, _given(request.model_version), request.customized
            )
        )

    async def list_models(
        self, request: ListModelsRequest, _context: RpcContext
    ) -> ManagementResponse:
        # An unset limit (0) means 100, as on HTTP (TorchServe's gRPC lists nothing).
        return _respond(
            self._service.list_models(_given(request.limit), _given(request.next_page_token))
        )

    async def register_model(
        self, request: RegisterModelRequest, _context: RpcContext
    ) -> ManagementResponse:
        self._check_model_api()
        params = {
            "url": _given(request.url),
            "model_name": _given(request.model_name),
            "handler": _given(request.handler),
            "runtime": _given(request.runtime),
            "batch_size": _given(request.batch_size),
            "max_batch_delay": _given(request.max_batch_delay),
            "initial_workers": _given(request.initial_workers),
            "response_timeout": _given(request.response_timeout),
            "startup_timeout": _given(request.startup_timeout),
            # The proto's default (false) is the call's default, unlike HTTP's true.
            "synchronous": request.synchronous,
        }
        return _respond(await self._service.register(params))

    async def scale_worker(
        self, request: ScaleWorkerRequest, _context: RpcContext
    ) -> ManagementResponse:
        # number_gpu is accepted and ignored (CPU workers only), as TorchServe ignores it.
        params = {
            "min_worker": _given(request.min_worker),
            "max_worker": _given(request.max_worker),
            "synchronous": request.synchronous,
            "timeout": _given(request.timeout),
        }
        return _respond(
            await self._service.scale(request.model_name, _given(request.model_version), params)
        )

    async def set_default(
        self, request: SetDefaultRequest, _context: RpcContext
    ) -> ManagementResponse:
        return _respond(await self._service.set_default(request.model_name, request.model_version))

    async def unregister_model(
        self, request: UnregisterModelRequest, _context: RpcContext
    ) -> ManagementResponse:
        self._check_model_api()
        return _respond(
            await self._service.unregister(request.model_name, _given(request.model_version))
        )


__all__ = ["ManagementRpcs", "model_api_disabled", "response_text"]
