"""``ts.torch_handler.text_handler.TextHandler``: the base of the text handlers.

It loads the archive's vocabulary (``source_vocab.pt``, or the manifest's older
``sourceVocab``) and offers TorchServe's text clean-up steps (HTML tags, contractions,
accents, punctuation) and the ``basic_english`` tokenizer, without torchtext
(:mod:`~trioserve.worker.torchserve.builtin.text_prep`). The vocabulary is read with
``torch.load(weights_only=True)``: a ``{token: index}`` dict or a list of tokens. A pickled
torchtext ``Vocab`` (what older archives hold) cannot be read, since torchtext no longer
exists for current torch: the load fails saying how to re-save it.
"""

from __future__ import annotations

import os
from typing import Any

from trioserve.worker.errors import LoadError
from trioserve.worker.torchserve.base_handler import BaseHandler
from trioserve.worker.torchserve.builtin import text_prep

SOURCE_VOCAB = "source_vocab.pt"


class TextHandler(BaseHandler):
    def __init__(self) -> None:
        super().__init__()
        self.source_vocab: text_prep.Vocabulary | None = None
        self.tokenizer = text_prep.basic_english
        self.input_text: Any = None
        self.lig: Any = None  # captum's LayerIntegratedGradients in TorchServe: not provided

    def initialize(self, context: Any) -> None:
        super().initialize(context)
        model_info = (self.manifest or {}).get("model") or {}
        older = model_info.get("sourceVocab")
        model_dir = context.system_properties.get("model_dir") or "."
        path = os.path.join(model_dir, older) if older else self.get_source_vocab_path(context)
        self.source_vocab = _load_vocabulary(path)

    def get_source_vocab_path(self, context: Any) -> str:
        model_dir = context.system_properties.get("model_dir") or "."
        path = os.path.join(model_dir, SOURCE_VOCAB)
        if not os.path.isfile(path):
            raise LoadError(
                f"the archive has no {SOURCE_VOCAB}: the text handlers need the vocabulary "
                "(add it with --extra-files)"
            )
        return path

    # TorchServe's clean-up steps, under its names.

    def _expand_contractions(self, text: str) -> str:
        return text_prep.expand_contractions(text)

    def _remove_accented_characters(self, text: str) -> str:
        return text_prep.remove_accents(text)

    def _remove_html_tags(self, text: str) -> str:
        return text_prep.remove_html_tags(text)

    def _remove_punctuation(self, text: str) -> str:
        return text_prep.remove_punctuation(text)

    _remove_puncutation = _remove_punctuation  # TorchServe's spelling, kept for subclasses

    def _tokenize(self, text: str) -> list[str]:
        return self.tokenizer(text)


def _load_vocabulary(path: str) -> text_prep.Vocabulary:
    import pickle

    import torch

    try:
        loaded = torch.load(path, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, AttributeError, ModuleNotFoundError) as exc:
        raise LoadError(
            f"{path} cannot be read as a plain vocabulary ({type(exc).__name__}); a torchtext "
            "Vocab cannot be loaded (torchtext no longer exists for current torch): re-save it "
            "with torch.save(vocab.get_stoi(), 'source_vocab.pt')"
        ) from exc
    except OSError as exc:
        raise LoadError(f"{path}: {exc}") from exc
    try:
        return text_prep.vocabulary(loaded, path)
    except TypeError as exc:
        raise LoadError(str(exc)) from exc


__all__ = ["SOURCE_VOCAB", "TextHandler"]
