"""Batches in one pass of C: frames, collated tensors and per-request slices.

This package is the safe surface of the private cffi extension ``trioserve._collate`` (built
from ``native/``). It checks the Python side of every argument (types, contiguity,
writability, integer ranges), owns every buffer it allocates, and turns the C code's error
codes into exceptions; the C code checks every size and bound again, with overflow-checked
arithmetic, and runs without the GIL. ``tests/native/collate_ref.py`` is a pure-Python
implementation of the same functions, used by the tests as the reference.

Frames (the format of :mod:`trioserve.core.frames`, byte for byte):

- :func:`pack` / :func:`pack_into` write one whole frame: metadata plus blobs, each blob on
  a 64-byte boundary of the frame; an ``int`` in place of a payload reserves that many zero
  bytes, to be filled in place (e.g. by :func:`collate`) through :func:`unpack`'s views.
- :func:`unpack` / :func:`unpack_frame` validate a frame and return views of its blobs,
  without copying.

Typed tensors (row-major, one element size of 1, 2, 4 or 8 bytes):

- :func:`collate` stacks N inputs of equal shape into ``[N, *shape]``, or, when their first
  dimensions differ, pads them with zero bytes into ``[N, max_len, *trailing]`` and reports
  the lengths; it writes into the caller's buffer (or one it allocates, 64-byte aligned), so
  ``torch.frombuffer(result.buffer, dtype=...).view(result.shape)`` copies nothing more.
- :func:`split` cuts a batched output back into per-request views.

Errors (all checked before anything is written):

- :class:`CollateError` (a :class:`ValueError`): sizes, shapes, lengths or buffers that do not
  fit together, or a size that overflows 64 bits. The caller's bug.
- :class:`~trioserve.core.frames.FrameError` (a :class:`ValueError`): a malformed frame given
  to :func:`unpack`, or a frame too large for the format. The sender's bug.
- :class:`TypeError`: an argument of the wrong type (e.g. a payload that is not a buffer).
- :class:`ValueError`: a buffer that is not C-contiguous, or not writable where it must be.

The package's modules: :mod:`.native` (the loaded extension and the argument checks),
:mod:`.frames` (pack, unpack) and :mod:`.tensors` (plan, collate, split); every public
name is re-exported here, so ``from trioserve import collate`` is the API.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trioserve.collate.frames import (
    UnpackedFrame,
    frame_size,
    pack,
    pack_into,
    unpack,
    unpack_frame,
)
from trioserve.collate.native import CollateError
from trioserve.collate.tensors import Collated, Layout, aligned_buffer, collate, plan, split
from trioserve.core.frames import ALIGN

if TYPE_CHECKING:
    from trioserve.collate.frames import Meta as Meta
    from trioserve.collate.frames import Payload as Payload

__all__ = [
    "ALIGN",
    "CollateError",
    "Collated",
    "Layout",
    "UnpackedFrame",
    "aligned_buffer",
    "collate",
    "frame_size",
    "pack",
    "pack_into",
    "plan",
    "split",
    "unpack",
    "unpack_frame",
]
