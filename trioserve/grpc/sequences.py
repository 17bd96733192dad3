"""How requests arriving on a ``StreamPredictions2`` stream reach the models.

The stream plumbing in :mod:`trioserve.grpc.inference` reads requests, hands each to a
:class:`SequenceRouter`, and answers the jobs strictly in request order, in-band errors
included. The router is the model-side policy: which requests are accepted, which headers
the handler sees, and which queue a request waits in.

:class:`StatelessSequences` is the policy until stateful models exist: every request must
carry a ``sequence_id``, the handler sees it in the sequence id header, and the request is
queued like any other. Sequence batching replaces it with a router that keeps per-sequence
state (start and end headers, one ordered queue per sequence, closed or expired ids
rejected) without touching the stream plumbing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from trioserve.core import errors
from trioserve.core.messages import Param
from trioserve.core.request import InferenceRequest
from trioserve.runtime.jobs import Job

DEFAULT_SEQUENCE_ID_HEADER = "ts_request_sequence_id"


@dataclass(frozen=True, slots=True)
class SequenceRequest:
    """One request read from the stream, already decoded."""

    model: str
    version: str | None
    params: list[Param]
    sequence_id: str | None  # None: the message did not set the field


@dataclass(frozen=True, slots=True)
class Accepted:
    """A queued request and the sequence id its responses carry."""

    sequence_id: str
    job: Job


class SequenceRouter(Protocol):
    def submit(self, request: SequenceRequest) -> Accepted:
        """Queue one request of a sequence.

        Raises :class:`~trioserve.core.errors.ServeError` for a request that cannot be
        accepted; the stream answers it in-band and stays open.
        """
        ...


class StatelessSequences:
    """Every request names its sequence; the handler sees the id as a request header."""

    def __init__(
        self,
        submit: Callable[[InferenceRequest], Job],
        *,
        sequence_id_header: str = DEFAULT_SEQUENCE_ID_HEADER,
    ) -> None:
        self._submit = submit
        self._header = sequence_id_header

    def submit(self, request: SequenceRequest) -> Accepted:
        if not request.sequence_id:
            raise errors.bad_request("Parameter sequenceId is required.")
        infer = InferenceRequest(
            model=request.model,
            version=request.version,
            params=request.params,
            headers=[(self._header, request.sequence_id)],
        )
        return Accepted(request.sequence_id, self._submit(infer))
