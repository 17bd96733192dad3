"""``ts.torch_handler.image_classifier.ImageClassifier``: ImageNet-style classification.

Images are resized to 256, center-cropped to 224 and normalised with the ImageNet mean and
standard deviation; the answer for each image is ``{label: probability}`` for its ``topk``
(default 5) most likely classes, labels from ``index_to_name.json`` when the archive has one
(else the class index as a string). A model with fewer classes than ``topk`` answers all of
them (TorchServe's ``torch.topk`` fails there).
"""

from __future__ import annotations

from typing import Any

from trioserve.worker.torchserve.builtin.vision_handler import VisionHandler, transforms
from trioserve.worker.torchserve.util import map_class_to_label

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]


class ImageClassifier(VisionHandler):
    topk = 5
    image_processing = transforms.Compose(
        [
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD),
        ]
    )

    def set_max_result_classes(self, topk: int) -> None:
        self.topk = topk

    def get_max_result_classes(self) -> int:
        return self.topk

    def postprocess(self, data: Any) -> list[dict[str, float]]:
        import torch

        probabilities = torch.nn.functional.softmax(data, dim=1)
        k = min(self.topk, probabilities.shape[1])
        top, classes = torch.topk(probabilities, k, dim=1)
        return map_class_to_label(top.tolist(), self.mapping, classes.tolist())


__all__ = ["ImageClassifier"]
