"""The transport-neutral request that every adapter (HTTP, gRPC) builds."""

from __future__ import annotations

import enum
import itertools
import os
from dataclasses import dataclass, field

from trioserve.core.messages import Param, WorkItem

# Request ids look like version-4 UUIDs (TorchServe's do, and handlers see them): 64 random
# bits chosen once per process, then a counter, so each id costs a format instead of a
# system call and a UUID object (uuid4 showed as 2% of the server's CPU per request). Ids
# are unique within the process, and across processes as their random parts differ; they
# are not secrets and not meant to be unguessable.
_RANDOM = os.urandom(8).hex()
_PREFIX = f"{_RANDOM[:8]}-{_RANDOM[8:12]}-4{_RANDOM[12:15]}-{'89ab'[int(_RANDOM[15], 16) & 3]}"
_COUNTER = itertools.count(int.from_bytes(os.urandom(8), "big") >> 4)


def new_request_id() -> str:
    n = next(_COUNTER) & 0xFFFF_FFFF_FFFF_FFF
    return f"{_PREFIX}{n >> 48:03x}-{n & 0xFFFF_FFFF_FFFF:012x}"


@dataclass(slots=True)
class InferenceRequest:
    """One client request for one model version.

    ``headers`` are forwarded to the handler as request headers (names as sent);
    ``params`` become the handler's ``data[i]`` dict.
    """

    model: str
    version: str | None
    params: list[Param]
    headers: list[tuple[str, str]] = field(default_factory=list)
    request_id: str = field(default_factory=new_request_id)
    # The (trio clock) time by which the answer must have come; None = no deadline. A
    # request still queued then is failed unrun; one running is cancelled.
    deadline: float | None = None
    # The sequence the request belongs to (TorchServe's sequence id); None = none.
    sequence_id: str | None = None
    # The client ends the sequence with this request (closed once it is answered).
    ends_sequence: bool = False
    # Answered as a stream with a bounded window of unread replies, and (for a streamed
    # input) fed more inputs while it runs (``Call.send_input``).
    streamed: bool = False

    def work_item(self) -> WorkItem:
        return WorkItem(self.request_id, self.headers, self.params)


class Outcome(enum.Enum):
    """How a request ended, as the response-class metrics (``Requests2XX``...) count it."""

    OK = "ok"
    CLIENT_ERROR = "client_error"
    SERVER_ERROR = "server_error"

    @staticmethod
    def of_status(status: int) -> Outcome:
        """The class of a reply whose handler chose its status code."""
        if status < 400:
            return Outcome.OK
        return Outcome.CLIENT_ERROR if status < 500 else Outcome.SERVER_ERROR
