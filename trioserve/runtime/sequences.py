"""What a handler sees of the sequence a request belongs to: TorchServe's sequence headers.

A request that names a sequence (``InferenceRequest.sequence_id``: TorchServe's
``StreamPredictions2`` field or its HTTP sequence header) carries the id to the handler in
the sequence id header (``ts_request_sequence_id``, ``ts_header_key_sequence_id``); the first
request of a sequence the server opened also carries the start header
(``ts_request_sequence_start: true``). Which sequences are open, and in what order and on
which worker their requests run, is the stateful model's queue's business
(:mod:`trioserve.runtime.sequence_batcher`).
"""

from __future__ import annotations

from trioserve.core.request import InferenceRequest

DEFAULT_SEQUENCE_ID_HEADER = "ts_request_sequence_id"
DEFAULT_SEQUENCE_START_HEADER = "ts_request_sequence_start"
DEFAULT_SEQUENCE_END_HEADER = "ts_request_sequence_end"


class SequenceHeaders:
    """Shows a request's sequence id (and a sequence's start) to the handler."""

    def __init__(
        self,
        *,
        id_header: str = DEFAULT_SEQUENCE_ID_HEADER,
        start_header: str = DEFAULT_SEQUENCE_START_HEADER,
        end_header: str = DEFAULT_SEQUENCE_END_HEADER,
    ) -> None:
        self.id_header = id_header
        self.start_header = start_header
        self.end_header = end_header  # also the gRPC input key a client ends a sequence with
        self._folded = {id_header.lower(), start_header.lower()}

    def mark(self, request: InferenceRequest, *, started: bool) -> None:
        """Set the id header (and, for a sequence opened now, the start header), replacing
        any the client sent under those names."""
        sequence_id = request.sequence_id
        assert sequence_id is not None
        request.headers[:] = [
            (name, value) for name, value in request.headers if name.lower() not in self._folded
        ]
        request.headers.append((self.id_header, sequence_id))
        if started:
            request.headers.append((self.start_header, "true"))
