"""What answers on the TorchServe-style HTTP APIs are made of, without any web framework:
the fast path's :class:`Answer`, TorchServe's no-cache headers and its JSON style."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

# Sent on every frontend response, as TorchServe does.
NO_CACHE_HEADERS = {
    "Pragma": "no-cache",
    "Cache-Control": "no-cache; no-store, must-revalidate, private",
    "Expires": "Thu, 01 Jan 1970 00:00:00 UTC",
}


@dataclass(slots=True)
class Answer:
    """A response: a whole body, or chunks as they come."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes | AsyncIterator[bytes]
    close: bool = False  # end the connection after it
    # Its response class (Requests2XX...) is recorded already: the dataplane did it.
    counted: bool = False


def json_text(payload: Any) -> str:
    """TorchServe's JSON style: 2-space indent, no ASCII escaping, trailing newline."""
    return json.dumps(payload, indent=2, ensure_ascii=False) + "\n"


# The no-cache headers, checked and encoded once: every inference answer carries them.
_ENCODED: dict[tuple[str, str], tuple[bytes, bytes]] = {
    (name, value): (name.encode("ascii"), value.encode("latin-1"))
    for name, value in NO_CACHE_HEADERS.items()
}


def encode_headers(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    """Headers for the wire; a name or value that could split the head is refused."""
    out = []
    known = _ENCODED.get
    for pair in headers:
        encoded = known(pair)
        if encoded is None:
            name, value = pair
            if "\r" in value or "\n" in value or "\0" in value or not name.isascii():
                raise ValueError(f"invalid response header {name!r}")
            encoded = (name.encode("ascii"), value.encode("latin-1"))
        out.append(encoded)
    return out
