"""``ts.torch_handler.object_detector.ObjectDetector``: boxes, labels and scores.

Images are only converted to tensors. The model returns one dict per image with
``boxes``, ``labels`` and ``scores`` (torchvision's detection models); the answer for each
image lists the detections scoring at least ``threshold`` (0.5) as ``{label: [x1, y1, x2,
y2], "score": score}``, labels from ``index_to_name.json`` (else the class index as a
string: TorchServe fails without a mapping file).
"""

from __future__ import annotations

from typing import Any

from trioserve.worker.torchserve.builtin.vision_handler import VisionHandler, transforms


class ObjectDetector(VisionHandler):
    threshold = 0.5
    image_processing = transforms.Compose([transforms.ToTensor()])

    def postprocess(self, data: Any) -> list[list[dict[str, Any]]]:
        results = []
        for detections in data:
            keep = detections["scores"] >= self.threshold
            boxes = detections["boxes"][keep].tolist()
            labels = detections["labels"][keep].tolist()
            scores = detections["scores"][keep].tolist()
            found = []
            for label, box, score in zip(labels, boxes, scores, strict=True):
                name = self.mapping[str(label)] if self.mapping else str(label)
                found.append({name: box, "score": score})
            results.append(found)
        return results


__all__ = ["ObjectDetector"]
