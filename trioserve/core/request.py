"""The transport-neutral request that every adapter (HTTP, gRPC) builds."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from trioserve.core.messages import Param, WorkItem


def new_request_id() -> str:
    return str(uuid.uuid4())


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
    # The latest (trio clock) time the request may still start; None = no deadline.
    deadline: float | None = None

    def work_item(self) -> WorkItem:
        return WorkItem(self.request_id, self.headers, self.params)
