"""What every gRPC method implementation shares, on the Trio side of the bridge.

A gRPC service is a plain Trio object whose :meth:`Service.methods` maps each rpc name of the
proto (``"Predictions"``) to its implementation, wrapped in :class:`Unary`,
:class:`ServerStreaming` or :class:`BidiStreaming`. Implementations are Trio-flavoured
functions that take decoded messages, a :class:`RpcContext` and, for streams, Trio-flavoured
``send``/``receive`` callables, and raise :class:`ServeError` for anything a client should
see. They know nothing about grpclib or asyncio: ``trioserve.grpc.bridge`` owns that.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import trio

from trioserve.auth import KeyKind, TokenStore, bearer
from trioserve.core import errors
from trioserve.core.errors import ErrorKind, ServeError

log = logging.getLogger("trioserve.grpc")

Req = TypeVar("Req")
Resp = TypeVar("Resp")
T = TypeVar("T")

# Trio-flavoured stream operations handed to streaming implementations.
Send = Callable[[Resp], Awaitable[None]]
Receive = Callable[[], Awaitable[Req | None]]  # None: the client half-closed its side


@dataclass(frozen=True, slots=True)
class RpcContext:
    """What an implementation may know about the call besides its messages."""

    method: str  # the rpc name, e.g. "Predictions"
    metadata: tuple[tuple[str, str], ...]  # invocation metadata as received (text values)
    peer: str | None = None
    timeout: float | None = None  # seconds the client's deadline left when the call came
    deadline: float | None = None  # that deadline on the trio clock (set on the trio side)

    def on_trio_clock(self) -> RpcContext:
        """This context with ``deadline`` set from ``timeout`` (call it on the trio side)."""
        if self.timeout is None or self.deadline is not None:
            return self
        return replace(self, deadline=trio.current_time() + self.timeout)

    def authorization(self) -> str | None:
        """The ``authorization`` metadata value (None if absent or given twice)."""
        return bearer(self.metadata)


@dataclass(frozen=True, slots=True)
class Unary(Generic[Req, Resp]):
    func: Callable[[Req, RpcContext], Awaitable[Resp]]


@dataclass(frozen=True, slots=True)
class ServerStreaming(Generic[Req, Resp]):
    func: Callable[[Req, RpcContext, Send[Resp]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class BidiStreaming(Generic[Req, Resp]):
    func: Callable[[Receive[Req], RpcContext, Send[Resp]], Awaitable[None]]


Method = Unary[Any, Any] | ServerStreaming[Any, Any] | BidiStreaming[Any, Any]


class Service(Protocol):
    """One gRPC service: which key guards each rpc (None: none), which generated service
    base declares its rpcs (paths, cardinalities, message types) and how each rpc is
    implemented."""

    base: ClassVar[type[Any]]  # the generated grpclib base class (its __mapping__ is used)

    def key_kind_of(self, method: str) -> KeyKind | None: ...

    def methods(self) -> Mapping[str, Method]: ...


def unexpected(exc: Exception) -> ServeError:
    """An exception no implementation meant to raise: logged, reported as INTERNAL."""
    log.error("unexpected error in a gRPC method", exc_info=exc)
    return errors.internal_error(exc)


def message_too_large(size: int, limit: int) -> ServeError:
    return ServeError(
        ErrorKind.TOO_LARGE,
        f"Received message larger than max_request_size ({size} vs. {limit} bytes).",
    )


class ClientGone(ServeError):
    """The call's stream ended under it (client reset, connection lost)."""


def client_went_away() -> ClientGone:
    return ClientGone(ErrorKind.CANCELLED, "The client closed the stream.")


def missing_message() -> ServeError:
    return errors.bad_request("The call carried no request message.")


def aborted_by_shutdown() -> ServeError:
    return ServeError(
        ErrorKind.UNAVAILABLE,
        "The server shut down before this call finished (shutdown_grace_seconds).",
        retry_after=5,
    )


class Gate:
    """Admission of calls on the Trio side, and a way to abort the ones still running."""

    def __init__(self) -> None:
        self.closed = False
        self._scopes: set[trio.CancelScope] = set()

    async def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await fn(*args)`` as one call; refused (UNAVAILABLE) once draining. A call
        aborted by :meth:`abort_all` ends with UNAVAILABLE too (its jobs are cancelled on the
        way). A plain coroutine, not a generator-based context manager: those showed in
        profiles on the call path."""
        if self.closed:
            raise errors.shutting_down()
        scope = trio.CancelScope()
        self._scopes.add(scope)
        try:
            with scope:
                return await fn(*args)
        finally:
            self._scopes.discard(scope)
        raise aborted_by_shutdown()  # only reached when the scope caught abort_all's cancel

    def close(self) -> None:
        """Refuse new calls from now on."""
        self.closed = True

    def abort_all(self) -> None:
        for scope in self._scopes:
            scope.cancel()


class Dispatcher:
    """The Trio entry points the bridge calls: admission, auth and error shaping."""

    def __init__(self, gate: Gate, tokens: TokenStore | None) -> None:
        self.gate = gate
        self.tokens = tokens

    def authorize(self, kind: KeyKind | None, context: RpcContext) -> None:
        """Synchronous and flavour-neutral, so the bridge can check before reading
        (``kind`` None: an rpc no key guards, like health checks)."""
        if self.tokens is not None and kind is not None:
            self.tokens.check(kind, context.authorization())

    async def _run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Admit the call; anything but a ServeError (or a cancellation) is a bug: INTERNAL."""
        try:
            return await self.gate.run(fn, *args)
        except ServeError:
            raise
        except Exception as exc:
            raise unexpected(exc) from exc

    async def unary(self, method: Unary[Any, Any], request: Any, context: RpcContext) -> Any:
        return await self._run(method.func, request, context.on_trio_clock())

    async def server_streaming(
        self,
        method: ServerStreaming[Any, Any],
        request: Any,
        context: RpcContext,
        send: Send[Any],
    ) -> None:
        await self._run(method.func, request, context.on_trio_clock(), send)

    async def bidi_streaming(
        self,
        method: BidiStreaming[Any, Any],
        receive: Receive[Any],
        context: RpcContext,
        send: Send[Any],
    ) -> None:
        await self._run(method.func, receive, context.on_trio_clock(), send)


def single_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one interesting exception of a nursery's group (ServeError first).

    A stream's helper tasks fail together: when one raises, the others are cancelled,
    so the group is that one error plus Cancelled noise.
    """
    serve_errors, rest = group.split(ServeError)
    if serve_errors is not None:
        return _first_leaf(serve_errors)
    if rest is not None:
        _cancelled, others = rest.split(trio.Cancelled)
        if others is not None:
            return _first_leaf(others)
    return group


def _first_leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc
