"""A handler written for TorchServe that subclasses its built-in TextClassifier: unigrams
only, and the most likely label alone."""

from ts.torch_handler.text_classifier import TextClassifier


class ReviewClassifier(TextClassifier):
    ngrams = 1

    def postprocess(self, data):
        return [max(scores, key=scores.get) for scores in super().postprocess(data)]
