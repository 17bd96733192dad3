"""BATCH frames that carry collated tensors, built by the C collator in place.

For a model that declares ``tensorInputs``, each batch's frame gets, besides the usual
per-request parameters, one blob per declared input holding the whole batch as a row-major
tensor (stacked, or zero-padded with an int64 lengths blob), described in the frame's
``tensors`` metadata. The frame is laid out first (:func:`trioserve.collate.plan` and
:func:`~trioserve.collate.pack`, with the tensor blob reserved) and the collator then writes
the tensor straight into its place in the frame: one copy from the request bodies to the
bytes that go on the socket, none in the worker (``torch.frombuffer``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Any

from trioserve import collate
from trioserve.core.frames import Kind
from trioserve.core.messages import Param
from trioserve.core.tensor_inputs import TensorInput
from trioserve.runtime.jobs import Job


def _param(job: Job, name: str) -> Param:
    for param in job.request.params:
        if param.name == name:
            return param
    raise KeyError(name)  # submit() checked every declared input is present


def tensor_frame_builder(
    specs: Mapping[str, TensorInput],
) -> Callable[[int, list[Job]], bytes | bytearray]:
    """A frame builder for a model with these tensor inputs."""

    def build(batch_id: int, jobs: list[Job]) -> bytes | bytearray:
        payloads: list[Any] = []
        requests = []
        for job in jobs:
            params = []
            for p in job.request.params:
                params.append({"name": p.name, "ct": p.content_type, "blob": len(payloads)})
                payloads.append(p.value)
            requests.append(
                {
                    "id": job.request.request_id,
                    "headers": [list(h) for h in job.request.headers],
                    "params": params,
                }
            )
        tensors: dict[str, Any] = {}
        fills: list[tuple[int, list[Any], list[tuple[int, ...]], int]] = []
        for name, spec in specs.items():
            inputs = [_param(job, name).value for job in jobs]
            shapes = [(spec.rows(memoryview(value).nbytes), *spec.trailing) for value in inputs]
            layout = collate.plan(shapes, spec.itemsize)
            entry: dict[str, Any] = {
                "dtype": spec.dtype,
                "shape": list(layout.shape),
                "blob": len(payloads),
                "lengths": None,
            }
            fills.append((len(payloads), inputs, shapes, spec.itemsize))
            payloads.append(layout.nbytes)  # reserved, filled by the collator below
            if spec.first is None:
                entry["lengths"] = len(payloads)
                payloads.append(struct.pack(f"<{len(shapes)}q", *(s[0] for s in shapes)))
            tensors[name] = entry
        meta = {"batch_id": batch_id, "requests": requests, "tensors": tensors}
        frame = collate.pack(payloads, meta, kind=Kind.BATCH)
        blobs = collate.unpack(frame)
        for index, inputs, shapes, itemsize in fills:
            collate.collate(inputs, shapes, itemsize, out=blobs[index])
        return frame

    return build
