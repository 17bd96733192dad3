"""The collated batch tensors of a BATCH frame (``meta["tensors"]``), checked and viewed.

For the inputs a model declares as tensors in its ``model-config.yaml``, the server collates
the batch's per-request tensors (:mod:`trioserve.collate`) straight into blobs of the BATCH
frame and describes them in its metadata::

    "tensors": {NAME: {"dtype": DTYPE, "shape": [N, d1, ...], "blob": I, "lengths": J}}

* ``blob`` is the index of a C-contiguous, row-major, little-endian buffer of exactly
  ``prod(shape) * itemsize`` bytes.
* ``lengths`` is ``null`` when every request had the same shape (stacked); else the index of
  a blob of ``N`` little-endian ``int64`` first-dimension lengths, the data being padded with
  zeros to ``shape[1]`` (the longest).
* ``DTYPE`` is one of :data:`DTYPES`; ``N`` is the number of requests in the batch.

:func:`parse_batch_tensors` checks all of this without touching torch or the data (only the
lengths are read); :class:`~trioserve.worker.torchserve.context.Context` then wraps the blobs with
``torch.frombuffer``, without copying. The worker runs on little-endian hosts only, as the
collator does, so the bytes are read in native order.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any, Final

#: The dtypes a batch tensor may have (torch's names), and their element sizes.
DTYPES: Final[dict[str, int]] = {
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "bool": 1,
}

LENGTH_SIZE: Final = 8  # one little-endian int64 per request


class TensorSpecError(ValueError):
    """A ``tensors`` entry of a BATCH frame that does not follow the wire contract."""


@dataclass(frozen=True, slots=True)
class BatchTensor:
    """One collated input of a batch: checked metadata plus views of its blobs."""

    name: str
    dtype: str
    """One of :data:`DTYPES`."""
    shape: tuple[int, ...]
    """``(N, ...)``; ``(N, max_len, ...)`` when :attr:`lengths` is set."""
    data: memoryview
    """Exactly ``prod(shape) * itemsize`` bytes (format ``B``)."""
    lengths: memoryview | None
    """``N * 8`` bytes of little-endian int64 first dimensions, or ``None`` when stacked."""

    @property
    def padded(self) -> bool:
        return self.lengths is not None


def _index(value: object, blobs: list[memoryview], what: str) -> memoryview:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TensorSpecError(f"{what} must be a blob index (an integer), not {value!r}")
    if not 0 <= value < len(blobs):
        raise TensorSpecError(f"{what} {value} is out of range: the frame has {len(blobs)} blob(s)")
    view = blobs[value]
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _shape(value: object, count: int) -> tuple[int, ...]:
    if not isinstance(value, list) or not value:
        raise TensorSpecError(f"shape must be a non-empty list of integers, not {value!r}")
    for dim in value:
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 0:
            raise TensorSpecError(f"shape {value!r} has {dim!r}: dimensions are integers >= 0")
    if value[0] != count:
        raise TensorSpecError(
            f"shape {value!r} starts with {value[0]} but the batch has {count} request(s)"
        )
    return tuple(value)


def _lengths(view: memoryview, shape: tuple[int, ...], index: object) -> memoryview:
    count = shape[0]
    if len(shape) < 2:
        raise TensorSpecError(
            f"lengths (blob {index}) given for shape {list(shape)}, which has no padded "
            "dimension: a padded tensor is [N, max_len, ...]"
        )
    if view.nbytes != count * LENGTH_SIZE:
        raise TensorSpecError(
            f"lengths blob {index} has {view.nbytes} bytes, expected {count * LENGTH_SIZE} "
            f"({count} int64)"
        )
    limit = shape[1]
    for i, length in enumerate(struct.unpack(f"<{count}q", view)):
        if not 0 <= length <= limit:
            raise TensorSpecError(
                f"length {i} is {length}, outside [0, {limit}] (shape[1] of {list(shape)})"
            )
    return view


def parse_entry(name: str, entry: object, blobs: list[memoryview], count: int) -> BatchTensor:
    """Check one ``tensors`` entry against the frame's blobs and the batch's size."""
    if not name:
        raise TensorSpecError("a batch tensor needs a non-empty name")
    try:
        if not isinstance(entry, dict):
            raise TensorSpecError(f"the entry must be an object, not {entry!r}")
        dtype = entry.get("dtype")
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise TensorSpecError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        shape = _shape(entry.get("shape"), count)
        data = _index(entry.get("blob"), blobs, "blob")
        expected = math.prod(shape) * DTYPES[dtype]
        if data.nbytes != expected:
            raise TensorSpecError(
                f"blob {entry['blob']} has {data.nbytes} bytes but shape {list(shape)} of "
                f"{dtype} needs {expected}"
            )
        raw_lengths = entry.get("lengths")
        lengths = None
        if raw_lengths is not None:
            view = _index(raw_lengths, blobs, "lengths")
            lengths = _lengths(view, shape, raw_lengths)
    except TensorSpecError as exc:
        raise TensorSpecError(f"batch tensor {name!r}: {exc}") from None
    return BatchTensor(name, dtype, shape, data, lengths)


def parse_batch_tensors(
    meta: dict[str, Any], blobs: list[memoryview], count: int
) -> dict[str, BatchTensor]:
    """The checked ``meta["tensors"]`` of a BATCH frame of ``count`` requests.

    A missing (or ``null``) ``tensors`` field means none. Raises :class:`TensorSpecError`
    naming the offending input for anything that breaks the contract.
    """
    raw = meta.get("tensors")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise TensorSpecError(f"field 'tensors' must be an object, not {type(raw).__name__}")
    return {name: parse_entry(name, entry, blobs, count) for name, entry in raw.items()}
