"""``ts.torch_handler.vision_handler.VisionHandler``: the base of the image handlers.

Each request's ``data`` (or ``body``) becomes one image tensor: bytes (or a base64 string)
are decoded with Pillow and passed through the class's ``image_processing`` transform; a
list (already pixel values) becomes a float tensor as it is. The batch is stacked on the
handler's device. Bytes that are not an image Pillow can read fail the batch with a 400
that says so (TorchServe's worker answers 503 with the Pillow error). Pillow's limit on image
size (its decompression-bomb check) stays on unless the server sets
``limit_max_image_pixels=false``, as in TorchServe. Explanations (``/explanations``) are
captum's integrated gradients of each image for the request's ``target`` class, when captum
is installed; without it they answer 501 saying so.
"""

from __future__ import annotations

import base64
import binascii
import importlib
import io
from typing import Any

from trioserve.worker.torchserve.base_handler import BaseHandler
from trioserve.worker.torchserve.builtin import vision_libraries
from trioserve.worker.torchserve.errors import PredictionException

Image, transforms = vision_libraries()


class VisionHandler(BaseHandler):
    """Decodes images and stacks them; subclasses set ``image_processing``."""

    image_processing: Any = None

    def initialize(self, context: Any) -> None:
        super().initialize(context)
        self.ig: Any = None  # captum's IntegratedGradients, for explanations
        try:
            attribution = importlib.import_module("captum.attr")
        except ImportError:
            pass  # explanations answer 501 naming captum
        else:
            self.ig = attribution.IntegratedGradients(self.model)
        if not context.system_properties.get("limit_max_image_pixels", True):
            Image.MAX_IMAGE_PIXELS = None

    def get_insights(self, tensor_data: Any, raw_input: Any, target: Any = 0) -> Any:
        """Integrated gradients of each image for class ``target`` (captum), as TorchServe's."""
        if self.ig is None:
            raise PredictionException(
                "explanations of the built-in image handlers need captum, which is not "
                "installed: pip install captum",
                501,
            )
        return self.ig.attribute(tensor_data, target=int(target), n_steps=15).tolist()

    def preprocess(self, data: list[Any]) -> Any:
        import torch

        images = []
        for index, row in enumerate(data):
            value = (row.get("data") or row.get("body")) if isinstance(row, dict) else row
            if isinstance(value, str):
                value = _base64(value, index)
            if isinstance(value, bytes | bytearray):
                images.append(self._image_tensor(bytes(value), index))
            else:
                images.append(torch.FloatTensor(value))
        return torch.stack(images).to(self.device)

    def _image_tensor(self, data: bytes, index: int) -> Any:
        try:
            image = Image.open(io.BytesIO(data))
            image.load()
        except (OSError, SyntaxError, ValueError) as exc:  # UnidentifiedImageError is an OSError
            raise PredictionException(
                f"request {index} of the batch is not an image Pillow can read: {exc}", 400
            ) from exc
        processing = self.image_processing
        return processing(image) if processing is not None else transforms.ToTensor()(image)


def _base64(text: str, index: int) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise PredictionException(
            f"request {index} of the batch is a string but not base64 image data: {exc}", 400
        ) from exc


__all__ = ["VisionHandler"]
