"""Which worker state a request of a sequence reaches: the dataplane's sequence router.

A request that names a sequence (``InferenceRequest.sequence_id``: TorchServe's
``StreamPredictions2`` field, its HTTP sequence header) is given to the
:class:`SequenceRouter` before it is queued. The router may refuse it (a
:class:`~trioserve.core.errors.ServeError`), decides which sequence id its replies carry,
and prepares what the handler sees.

:class:`StatelessSequences` is the router while models keep no sequence state: the handler
sees the id in the sequence id header and the request is queued like any other. Sequence
batching replaces it with a router that keeps per-sequence state (start and end, one ordered
queue per sequence, closed or expired ids refused) without touching the adapters.
"""

from __future__ import annotations

from typing import Protocol

from trioserve.core.request import InferenceRequest

DEFAULT_SEQUENCE_ID_HEADER = "ts_request_sequence_id"


class SequenceRouter(Protocol):
    def route(self, request: InferenceRequest) -> str:
        """Prepare ``request`` (its ``sequence_id`` is set) for queueing; return the
        sequence id its replies carry. Raises ``ServeError`` to refuse it."""
        ...


class StatelessSequences:
    """The handler sees the request's sequence id as a request header."""

    def __init__(self, *, sequence_id_header: str = DEFAULT_SEQUENCE_ID_HEADER) -> None:
        self.header = sequence_id_header
        self._folded = sequence_id_header.lower()

    def route(self, request: InferenceRequest) -> str:
        sequence_id = request.sequence_id
        assert sequence_id is not None
        if not any(name.lower() == self._folded for name, _value in request.headers):
            request.headers.append((self.header, sequence_id))
        return sequence_id
