"""Build the demo classifier's TorchScript weights (``model.pt``).

The model is a tiny MLP, 16 inputs -> 32 hidden (ReLU) -> 4 logits, initialised from
``torch.manual_seed(0)``. It is an ``nn.Sequential`` of stock modules, so the scripted code
names only ``torch.nn`` classes and the saved bytes do not depend on where this file lives or
how it is run; building twice gives identical files.

    python handlers/classifier/make_model.py [DEST_DIR]   # default: this folder
"""

from __future__ import annotations

import io
import sys
import warnings
from pathlib import Path

import torch
from torch import nn

NUM_FEATURES = 16
HIDDEN = 32
NUM_CLASSES = 4
SEED = 0
MODEL_FILE = "model.pt"


def make_module() -> nn.Module:
    """The untrained, seeded MLP (eval mode)."""
    torch.manual_seed(SEED)
    model = nn.Sequential(
        nn.Linear(NUM_FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, NUM_CLASSES),
    )
    return model.eval()


def serialize() -> bytes:
    """The TorchScript archive bytes of :func:`make_module`."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        # torch.jit is deprecated in favour of torch.export, but TorchScript is still what
        # TorchServe's BaseHandler loads from a ``.pt`` serializedFile.
        warnings.filterwarnings("ignore", category=DeprecationWarning, message=r".*torch\.jit")
        scripted = torch.jit.script(make_module())
        torch.jit.save(scripted, buffer)
    return buffer.getvalue()


def build(dest_dir: Path) -> Path:
    """Write ``model.pt`` into ``dest_dir`` (created if missing) and return its path."""
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    target = dest_dir / MODEL_FILE
    target.write_bytes(serialize())
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
