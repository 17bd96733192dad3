"""Build the batched reference model's TorchScript weights (``model.pt``).

The model is an MLP, 256 inputs -> 2048 hidden (ReLU) -> 2048 hidden (ReLU) -> 10 logits,
initialised from ``torch.manual_seed(0)`` (about 4.7 M parameters, 19 MB). It is an
``nn.Sequential`` of stock modules, so the scripted code names only ``torch.nn`` classes and the
saved bytes do not depend on where this file lives or how it is run; building twice gives
identical files.

Why this size: one request is a matrix-vector product that streams every weight from memory
once, while a batch of 16 reuses each weight 16 times, so on one CPU thread a batch of 16 costs
only about 4x one request (see README.md). The model is also heavy enough per request that a
serving benchmark measures the server's batching, not only its HTTP parsing.

    python handlers/batched/make_model.py [DEST_DIR]   # default: this folder
"""

from __future__ import annotations

import io
import sys
import warnings
from pathlib import Path

import torch
from torch import nn

NUM_FEATURES = 256
HIDDEN = 2048
NUM_CLASSES = 10
SEED = 0
MODEL_FILE = "model.pt"


def make_module(hidden: int = HIDDEN) -> nn.Module:
    """The untrained, seeded MLP (eval mode); ``hidden`` other than 2048 is for benchmarks."""
    torch.manual_seed(SEED)
    model = nn.Sequential(
        nn.Linear(NUM_FEATURES, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, NUM_CLASSES),
    )
    return model.eval()


def serialize(hidden: int = HIDDEN) -> bytes:
    """The TorchScript archive bytes of :func:`make_module`."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        # torch.jit is deprecated in favour of torch.export, but TorchScript is still what
        # TorchServe's BaseHandler loads from a ``.pt`` serializedFile.
        warnings.filterwarnings("ignore", category=DeprecationWarning, message=r".*torch\.jit")
        scripted = torch.jit.script(make_module(hidden))
        torch.jit.save(scripted, buffer)
    return buffer.getvalue()


def build(dest_dir: Path, hidden: int = HIDDEN) -> Path:
    """Write ``model.pt`` into ``dest_dir`` (created if missing) and return its path."""
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    target = dest_dir / MODEL_FILE
    target.write_bytes(serialize(hidden))
    return target


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1:
        print("usage: make_model.py [DEST_DIR]", file=sys.stderr)
        return 2
    dest = Path(args[0]) if args else Path(__file__).resolve().parent
    print(build(dest))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
