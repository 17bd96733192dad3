"""The worker's fast path for BATCH frames: :func:`decode_batch`.

:func:`trioserve.core.messages.decode_batch` is the definition; this is the same function for
the frames the server actually sends, with a fraction of its per-request cost (it runs for
every batch, in the trio thread). Every field is checked with exact type tests (what
``json.loads`` produces); the first thing that does not fit -- anything the core function
would reject, and the few odd values it accepts (a ``bool`` blob index) -- hands the whole
frame to the core function, so results and error messages are the core's in every case.
"""

from __future__ import annotations

from trioserve.core import messages
from trioserve.core.frames import Frame, Kind
from trioserve.core.messages import Param, WorkItem

_EMPTY: list[object] = []


def decode_batch(frame: Frame) -> tuple[int, list[WorkItem]]:
    """``(batch id, work items)`` of a BATCH frame, exactly as
    :func:`trioserve.core.messages.decode_batch` returns them (or raises)."""
    meta = frame.meta
    batch_id = meta.get("batch_id")
    requests = meta.get("requests")
    if frame.kind is not Kind.BATCH or type(batch_id) is not int or type(requests) is not list:
        return messages.decode_batch(frame)
    blobs = frame.blobs
    count = len(blobs)
    items: list[WorkItem] = []
    for req in requests:
        if type(req) is not dict:
            return messages.decode_batch(frame)
        headers_raw = req.get("headers", _EMPTY)
        params_raw = req.get("params", _EMPTY)
        request_id = req.get("id")
        if (
            type(headers_raw) is not list
            or type(params_raw) is not list
            or type(request_id) is not str
        ):
            return messages.decode_batch(frame)
        headers: list[tuple[str, str]] = []
        for pair in headers_raw:
            if type(pair) is not list or len(pair) != 2:
                return messages.decode_batch(frame)
            name, value = pair
            if type(name) is not str or type(value) is not str:
                return messages.decode_batch(frame)
            headers.append((name, value))
        params: list[Param] = []
        for p in params_raw:
            if type(p) is not dict:
                return messages.decode_batch(frame)
            name = p.get("name")
            index = p.get("blob")
            content_type = p.get("ct")
            if (
                type(name) is not str
                or type(index) is not int
                or not 0 <= index < count
                or (content_type is not None and type(content_type) is not str)
            ):
                return messages.decode_batch(frame)
            params.append(Param(name, blobs[index], content_type))
        items.append(WorkItem(request_id, headers, params))
    return batch_id, items
