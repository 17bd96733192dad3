"""KServe v1 requests in the worker: TorchServe's ``kserve`` envelope, for the request only.

A work item marked with :data:`~trioserve.core.kserve.V1_HEADER` carries a v1 body,
``{"instances": [...]}``. The handler sees each instance as one row of ``data`` (the instance
itself, as TorchServe's ``kserve`` envelope passes it), with its request's id and headers, so
``context.get_request_header(idx, "explain")`` answers for the row's request. Its answers,
one per row, are joined in order into ``{"predictions": [...]}`` (``{"explanations": [...]}``
for ``:explain``), one reply per request. A row whose answer is not JSON fails its request
(500, saying why), not the batch; the first failed row of a request is its answer.

Other requests of the same batch keep their rows: plain requests one each, OIP requests one
per input (:mod:`trioserve.worker.torchserve.oip`), so requests of every protocol batch together.

A model whose own envelope already reads ``{"instances"}`` bodies (``json``, ``kserve``)
gets v1 requests as they are: the envelope answers them (:func:`handled_here` is false).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.kserve import EXPLAIN_HEADER, V1_HEADER, answer_body, answer_key, instances_of
from trioserve.core.limits import DEFAULT_LIMITS, RequestLimits
from trioserve.core.messages import BatchReply, Reply, WorkItem
from trioserve.worker.responses import error_reply
from trioserve.worker.torchserve import oip
from trioserve.worker.torchserve.batch import Entry

Runner = Callable[..., BatchReply]

# Envelopes that read {"instances": [...]} bodies themselves.
INSTANCE_ENVELOPES = frozenset({"json", "kserve"})


def is_v1(item: WorkItem) -> bool:
    return any(name == V1_HEADER for name, _value in item.headers)


def handled_here(items: Sequence[WorkItem], envelope: str | None) -> bool:
    """Whether this module runs the batch: it holds a v1 request and the model's envelope
    does not read instances itself."""
    return envelope not in INSTANCE_ENVELOPES and any(is_v1(item) for item in items)


def rows_runner(
    items: Sequence[WorkItem], envelope: str | None, limits: RequestLimits = DEFAULT_LIMITS
) -> Runner | None:
    """What runs a batch whose requests are not one row each: :func:`run_batch` when
    :func:`handled_here` (holding v1 bodies to ``limits``), else
    :func:`trioserve.worker.torchserve.oip.run_batch` when it holds an OIP request; None for a
    batch of plain requests."""
    if handled_here(items, envelope):
        return functools.partial(run_batch, limits=limits)
    if any(oip.is_oip(item) for item in items):
        return oip.run_batch
    return None


def _body(item: WorkItem) -> bytes:
    return b"" if not item.params else bytes(item.params[0].value)


def expand(
    items: Sequence[WorkItem], decode: bool, limits: RequestLimits = DEFAULT_LIMITS
) -> tuple[oip.Expanded, list[bool]]:
    """The rows of the batch, and for each row whether it is a v1 instance (raises the
    body's ``ServeError`` when a v1 body is not ``{"instances": [...]}`` or has more
    instances than ``limits`` allow: the server checked both, the worker does not rely on
    it)."""
    rows = oip.Expanded()
    instance_rows: list[bool] = []
    for owner, item in enumerate(items):
        if is_v1(item):
            headers = [(k, v) for k, v in item.headers if k != V1_HEADER]
            for instance in instances_of(_body(item), limits):
                rows.items.append(WorkItem(item.request_id, headers, []))
                rows.data.append(instance)
                rows.owners.append(owner)
                rows.inputs.append(None)
                instance_rows.append(True)
            continue
        own = oip.expand([item], decode)  # a plain request's row, or an OIP request's
        rows.items.extend(own.items)
        rows.data.extend(own.data)
        rows.owners.extend(owner for _ in own.items)
        rows.inputs.extend(own.inputs)
        instance_rows.extend(False for _ in own.items)
    return rows, instance_rows


def _jsonable(value: Any) -> Any:
    tolist = getattr(value, "tolist", None)  # torch tensors, numpy arrays and scalars
    if callable(tolist):
        return tolist()
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def wrap_entry(entry: Entry, instance_rows: list[bool]) -> Entry:
    """``entry`` whose answers to instance rows become JSON text (an answer of the wrong
    length is left for the usual checks)."""

    def call(data: Any, context: Any) -> Any:
        answers = entry(data, context)
        if not isinstance(answers, list) or len(answers) != len(instance_rows):
            return answers
        for idx, is_instance in enumerate(instance_rows):
            if not is_instance:
                continue
            try:
                answers[idx] = json.dumps(answers[idx], default=_jsonable).encode()
            except (TypeError, ValueError) as exc:
                context.set_response_status(500, "Invalid model output", idx)
                answers[idx] = f"prediction {idx} is not JSON: {exc}"
        return answers

    return call


def run_batch(
    entry: Entry,
    context: Any,
    batch_id: int,
    items: Sequence[WorkItem],
    *,
    decode: bool,
    cancel_check: Callable[[str], bool],
    channel: Any,
    tensors: Mapping[str, Any],
    limits: RequestLimits = DEFAULT_LIMITS,
) -> BatchReply:
    """Run a batch holding v1 requests: instances become rows, each request's rows join
    into its answer again (OIP requests of the batch are expanded and joined as usual)."""
    try:
        rows, instance_rows = expand(items, decode, limits)
    except ServeError as error:
        return error_reply(
            batch_id, 413 if error.kind is ErrorKind.TOO_LARGE else 400, error.message
        )
    reply = oip.run_rows(
        wrap_entry(oip.wrap_entry(entry, rows), instance_rows),
        context,
        batch_id,
        rows,
        cancel_check=cancel_check,
        channel=channel,
        tensors=tensors,
    )
    return merge(reply, items, rows, instance_rows)


def merge(
    reply: BatchReply, items: Sequence[WorkItem], rows: oip.Expanded, instance_rows: list[bool]
) -> BatchReply:
    """One reply per request again: a v1 request's rows join into its answer; the other
    rows are merged as :func:`trioserve.worker.torchserve.oip.merge` does."""
    if reply.code != 200 or len(reply.replies) != len(rows.items):
        return reply
    parts: dict[int, list[Reply]] = {}
    rest = oip.Expanded()
    rest_replies: list[Reply] = []
    for idx, row in enumerate(reply.replies):
        if instance_rows[idx]:
            parts.setdefault(rows.owners[idx], []).append(row)
            continue
        rest.items.append(rows.items[idx])
        rest.data.append(rows.data[idx])
        rest.owners.append(rows.owners[idx])
        rest.inputs.append(rows.inputs[idx])
        rest_replies.append(row)
    merged = oip.merge(
        BatchReply(reply.batch_id, 200, reply.message, rest_replies, reply.final), items, rest
    )
    joined = [_join(item, parts.get(owner, [])) for owner, item in enumerate(items) if is_v1(item)]
    return BatchReply(reply.batch_id, 200, reply.message, merged.replies + joined, reply.final)


def _join(item: WorkItem, parts: list[Reply]) -> Reply:
    failed = next((part for part in parts if part.status >= 400), None)
    if failed is not None:
        return failed
    explain = any(k == EXPLAIN_HEADER and v == "True" for k, v in item.headers)
    headers: dict[str, str] = {}
    for part in parts:
        headers.update(part.headers)
    body = answer_body(answer_key(explain), (bytes(part.body) for part in parts))
    return Reply(item.request_id, body, 200, "", headers, "application/json")


__all__ = [
    "INSTANCE_ENVELOPES",
    "expand",
    "handled_here",
    "is_v1",
    "merge",
    "rows_runner",
    "run_batch",
]
