"""``ts.torch_handler.text_classifier.TextClassifier``: text classification.

Each request's text (``data`` or ``body``, UTF-8) is cleaned as TorchServe's is (HTML tags
removed, lower case, contractions expanded, accents and punctuation removed), tokenized
(``basic_english``) and turned into vocabulary indices of its tokens and 2-grams. The model
is called as an ``EmbeddingBag`` model: ``model(indices, offsets)``. The answer for each
text is ``{label: probability}`` for every class, labels from ``index_to_name.json``.
TorchServe's handler reads only the first request of a batch; this one classifies every
request of the batch in one model call.
"""

from __future__ import annotations

from typing import Any

from trioserve.worker.torchserve.builtin import text_prep
from trioserve.worker.torchserve.builtin.text_handler import TextHandler
from trioserve.worker.torchserve.errors import PredictionException
from trioserve.worker.torchserve.util import map_class_to_label


class TextClassifier(TextHandler):
    ngrams = 2

    def preprocess(self, data: list[Any]) -> Any:
        import torch

        vocab = self.source_vocab
        assert vocab is not None, "initialize() loads the vocabulary"
        pieces, texts, offsets, start = [], [], [], 0
        for index, row in enumerate(data):
            text = (row.get("data") or row.get("body")) if isinstance(row, dict) else row
            if isinstance(text, bytes | bytearray):
                try:
                    text = bytes(text).decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise PredictionException(
                        f"request {index} of the batch is not UTF-8 text: {exc}", 400
                    ) from exc
            if not isinstance(text, str):
                raise PredictionException(f"request {index} of the batch is not text", 400)
            text = self._remove_html_tags(text).lower()
            text = self._expand_contractions(text)
            text = self._remove_accented_characters(text)
            tokens = self._tokenize(self._remove_punctuation(text))
            ids = [vocab[token] for token in text_prep.ngrams(tokens, self.ngrams)]
            pieces.append(torch.as_tensor(ids, dtype=torch.long))
            texts.append(tokens)
            offsets.append(start)
            start += len(ids)
        self._offsets = torch.as_tensor(offsets, dtype=torch.long, device=self.device)
        return torch.cat(pieces).to(self.device), texts

    def inference(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        text_tensor, _texts = data
        return super().inference(text_tensor, self._offsets)

    def postprocess(self, data: Any) -> list[dict[str, float]]:
        import torch

        probabilities = torch.nn.functional.softmax(data, dim=1).tolist()
        return map_class_to_label(probabilities, self.mapping)


__all__ = ["TextClassifier"]
