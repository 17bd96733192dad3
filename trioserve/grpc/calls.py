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
from functools import partial
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import outcome
import trio

from trioserve.auth import KeyKind, TokenStore, bearer
from trioserve.core import errors
from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.messages import Reply
from trioserve.runtime.dataplane import Call

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


# An outcome (a unary rpc's, or started work's), told once, in Trio.
Settle = Callable[[outcome.Outcome[Any]], None]


@dataclass(frozen=True, slots=True)
class Unary(Generic[Req, Resp]):
    """A unary rpc: ``func`` answers it in a Trio task of its own. ``start``, when given,
    answers the same call without one: called synchronously in Trio with the request, the
    context and a ``settle`` callable, it begins the work and returns a function that
    cancels it; the reply (or the ServeError) goes to ``settle``, once. The bridge uses it
    for calls without a deadline (deadlines need a task's cancel scope), saving the task."""

    func: Callable[[Req, RpcContext], Awaitable[Resp]]
    start: Callable[[Req, RpcContext, Settle], Callable[[], None]] | None = None


def collect_replies(
    call: Call, finish: Callable[[list[Reply]], Any], settle: Settle
) -> Callable[[], None]:
    """A :attr:`Unary.start`'s body: keep the call's replies as its job delivers them and,
    at the final one, settle with ``finish(replies)`` (or what it raises); a failed job
    settles with its error. Returns the call's cancel.

    The collecting runs inside the job's delivery (a worker task's), so it must not act on
    the job: a final reply or an error ends the job anyway."""
    replies: list[Reply] = []

    def collect() -> None:
        try:
            while (item := call.poll_reply()) is not None:
                reply, final = item
                replies.append(reply)
                if final:
                    settle(outcome.Value(finish(replies)))
                    return
        except Exception as exc:
            settle(outcome.Error(exc))
            return
        call.when_ready(collect)

    collect()
    return call.cancel


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
        self._aborts: set[Callable[[], None]] = set()

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

    def admit(self, abort: Callable[[], None]) -> Callable[[], None]:
        """Admit a call that runs without a task (refused once draining); :meth:`abort_all`
        calls ``abort``. Returns what the call calls when it ends."""
        if self.closed:
            raise errors.shutting_down()
        self._aborts.add(abort)
        return partial(self._aborts.discard, abort)

    def close(self) -> None:
        """Refuse new calls from now on."""
        self.closed = True

    def abort_all(self) -> None:
        for scope in self._scopes:
            scope.cancel()
        for abort in list(self._aborts):
            abort()


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

    def start_unary(
        self, method: Unary[Any, Any], request: Any, context: RpcContext, settle: Settle
    ) -> Callable[[], None]:
        """:meth:`unary` without a task, for ``method.start`` (a :data:`~portal.Start`):
        admitted by the gate, errors shaped the same way. Returns the call's cancel."""
        assert method.start is not None
        ended = False

        def end(result: outcome.Outcome[Any]) -> None:
            nonlocal ended
            if ended:
                return
            ended = True
            leave()
            if isinstance(result, outcome.Error):
                error = result.error
                if isinstance(error, Exception) and not isinstance(error, ServeError):
                    result = outcome.Error(unexpected(error))
            settle(result)

        def stop(reason: BaseException) -> None:
            end(outcome.Error(reason))  # first, so that the cancel's wake-up finds it ended
            cancel()

        leave = self.gate.admit(lambda: stop(aborted_by_shutdown()))
        try:
            cancel = method.start(request, context, end)
        except ServeError:
            leave()
            raise
        except Exception as exc:
            leave()
            raise unexpected(exc) from exc
        return lambda: stop(client_went_away())

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
