"""TorchServe's built-in handlers, served under their ``ts.torch_handler.*`` names.

Each module defines one handler class (the loader instantiates the one class a handler
module defines), so ``--handler image_classifier`` and ``from
ts.torch_handler.image_classifier import ImageClassifier`` both reach it. The vision handlers
need the ``vision`` extra (torchvision and Pillow); without it they fail to load with a
message naming the extra (:func:`vision_libraries`).
"""

from __future__ import annotations

import importlib
from typing import Any

from trioserve.worker.errors import LoadError

VISION_EXTRA = "pip install 'trioserve[vision]'"


def vision_libraries() -> tuple[Any, Any]:
    """``(PIL.Image, torchvision.transforms)``; a :class:`LoadError` naming the extra when
    either is missing or broken."""
    try:
        image = importlib.import_module("PIL.Image")
        transforms = importlib.import_module("torchvision.transforms")
    except Exception as exc:  # torchvision's import fails with RuntimeError too (torch mismatch)
        raise LoadError(
            "TorchServe's built-in vision handlers need torchvision and Pillow, which did not "
            f"import ({type(exc).__name__}: {exc}); install them with: {VISION_EXTRA}"
        ) from exc
    return image, transforms


__all__ = ["VISION_EXTRA", "vision_libraries"]
