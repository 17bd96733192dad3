"""A handler written for TorchServe, as its MNIST example's is: it subclasses the built-in
ImageClassifier, with its own image transform, and answers each image's digit."""

from torchvision import transforms
from ts.torch_handler.image_classifier import ImageClassifier


class DigitClassifier(ImageClassifier):
    image_processing = transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))]
    )

    def postprocess(self, data):
        return data.argmax(1).tolist()
