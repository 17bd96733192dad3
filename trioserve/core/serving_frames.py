"""What the control process and a serving process say to each other (sans-IO).

With ``serving_processes = N`` the server runs N serving processes on the same listening
sockets; the first also holds the control plane (management, the registry, the worker
processes). Each other serving process has one link to it (:mod:`trioserve.core.link_frames`
frames a link; :mod:`trioserve.runtime.link` runs it). The frames below are tuples whose
first item is their kind.

Control process -> serving process:

``(HELLO, setup)``  first: what the process serves and with what (a pickled
    :class:`trioserve.runtime.serving_control.Setup`)
``(STATE, n, state)``
    the registry as it now stands (a pickled :class:`trioserve.runtime.mirror.State`); the
    serving process answers ``(APPLIED, n, failure)`` once its own registry matches it
    (``failure``: None, or what it could not apply)
``(PULL_METRICS, n)``  answered ``(METRICS, n, exposition)``
``(ANSWER, n, ok, payload)``  the result of a management call ``n`` the serving process made
``(READY_WORKERS, {(name, version): count})``  how many workers each forwarded model has
``(DRAIN,)``  stop accepting, finish the requests in flight, exit
``(REPLY, f, reply, final)`` / ``(FAILED, f, kind, message, reason, code)``
    an answer (or the failure) of forwarded request ``f``

Serving process -> control process:

``(READY,)``  its listeners accept connections
``(APPLIED, n, failure)``, ``(METRICS, n, exposition)``
``(CALL, n, method, args)``  a management call made on the inference port (the Open
    Inference Protocol's repository load and unload)
``(SUBMIT, f, request)``  a request for a model the control process serves for everyone
    (stateful and continuous-batching models: see docs/design.md, "Serving processes")
``(CANCEL, f)``  its client left; ``(INPUT, f, frame)`` one more streamed input;
``(READ, f)``  the client read one more intermediate reply (the stream's window)

Both ends are the same program; a link never carries a client's bytes unparsed. The request
and reply encodings here are plain tuples that ``marshal`` carries.
"""

from __future__ import annotations

from typing import Any, Final

from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.messages import Param, Reply
from trioserve.core.request import InferenceRequest

STATE: Final = 1
APPLIED: Final = 2
PULL_METRICS: Final = 3
METRICS: Final = 4
CALL: Final = 5
ANSWER: Final = 6
READY_WORKERS: Final = 7
DRAIN: Final = 8
SUBMIT: Final = 9
CANCEL: Final = 10
INPUT: Final = 11
READ: Final = 12
REPLY: Final = 13
FAILED: Final = 14
HELLO: Final = 15
READY: Final = 16

RequestTuple = tuple[Any, ...]
ReplyTuple = tuple[Any, ...]


def request_tuple(request: InferenceRequest, remaining: float | None) -> RequestTuple:
    """``request`` as a link carries it; ``remaining``: seconds left before its deadline
    (each process's Trio clock has its own origin, so a deadline travels as a duration)."""
    return (
        request.model,
        request.version,
        [(p.name, bytes(p.value), p.content_type) for p in request.params],
        list(request.headers),
        request.request_id,
        remaining,
        request.sequence_id,
        request.ends_sequence,
        request.streamed,
    )


def request_from(fields: RequestTuple, now: float) -> InferenceRequest:
    """The request a :func:`request_tuple` describes; ``now``: this process's Trio clock."""
    model, version, params, headers, request_id, remaining, sequence_id, ends, streamed = fields
    return InferenceRequest(
        model=model,
        version=version,
        params=[Param(name, value, content_type) for name, value, content_type in params],
        headers=[(name, value) for name, value in headers],
        request_id=request_id,
        deadline=None if remaining is None else now + remaining,
        sequence_id=sequence_id,
        ends_sequence=ends,
        streamed=streamed,
    )


def reply_tuple(reply: Reply) -> ReplyTuple:
    return (
        reply.request_id,
        bytes(reply.body),
        reply.status,
        reply.reason,
        dict(reply.headers),
        reply.content_type,
    )


def reply_from(fields: ReplyTuple) -> Reply:
    request_id, body, status, reason, headers, content_type = fields
    return Reply(request_id, body, status, reason, headers, content_type)


def error_tuple(error: ServeError) -> tuple[str, str, str, int | None, int | None]:
    return (error.kind.value, error.message, error.reason, error.retry_after, error.code)


def error_from(fields: tuple[Any, ...]) -> ServeError:
    kind, message, reason, retry_after, code = fields
    return ServeError(ErrorKind(kind), message, reason=reason, retry_after=retry_after, code=code)


__all__ = [
    "ANSWER",
    "APPLIED",
    "CALL",
    "CANCEL",
    "DRAIN",
    "FAILED",
    "HELLO",
    "INPUT",
    "METRICS",
    "PULL_METRICS",
    "READ",
    "READY",
    "READY_WORKERS",
    "REPLY",
    "STATE",
    "SUBMIT",
    "error_from",
    "error_tuple",
    "reply_from",
    "reply_tuple",
    "request_from",
    "request_tuple",
]
