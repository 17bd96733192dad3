"""``ts.torch_handler.image_segmenter.ImageSegmenter``: semantic segmentation.

Preprocessing as :mod:`image_classifier`'s. The model returns a dict whose ``"out"`` holds
class scores per pixel (torchvision's segmentation models); the answer for each image is,
per pixel, ``[class, probability]`` of its most likely class (not every class's score,
which would make answers tens of MB).
"""

from __future__ import annotations

from typing import Any

from trioserve.worker.torchserve.builtin.image_classifier import IMAGENET_MEAN, IMAGENET_STD
from trioserve.worker.torchserve.builtin.vision_handler import VisionHandler, transforms


class ImageSegmenter(VisionHandler):
    image_processing = transforms.Compose(
        [
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD),
        ]
    )

    def postprocess(self, data: Any) -> list[Any]:
        import torch

        scores = data["out"] if isinstance(data, dict) else data
        best = torch.max(torch.nn.functional.softmax(scores, dim=1), dim=1)
        pairs = torch.stack([best.indices.to(best.values.dtype), best.values], dim=3)
        return pairs.tolist()


__all__ = ["ImageSegmenter"]
