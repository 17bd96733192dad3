"""TorchServe's built-in text handlers without torchtext, in-process, with a tiny
EmbeddingBag model."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from trioserve.worker.errors import LoadError
from trioserve.worker.torchserve.builtin import text_prep
from trioserve.worker.torchserve.context import Context
from trioserve.worker.torchserve.errors import PredictionException
from trioserve.worker.torchserve.metrics import MetricsCache

MODEL_FILE = Path(__file__).resolve().parents[1] / "e2e" / "handlers" / "text" / "bag_model.py"
WORDS = ["<unk>", "good", "bad", "movie", "is", "not", "it", "very", "good movie", "is not"]


def test_basic_english_splits_as_torchtext_does() -> None:
    text = 'It\'s "Great", (really)! Yes; no: <br />done.'
    assert text_prep.basic_english(text) == [
        "it", "'", "s", "great", ",", "(", "really", ")", "!", "yes", "no", "done", ".",
    ]  # fmt: skip


def test_ngrams_are_the_tokens_then_each_longer_gram() -> None:
    assert list(text_prep.ngrams(["a", "b", "c"], 3)) == ["a", "b", "c", "a b", "b c", "a b c"]
    assert list(text_prep.ngrams(["a"], 2)) == ["a"]


def test_clean_up_steps() -> None:
    assert text_prep.expand_contractions("it's what we're") == "it is what we are"
    assert text_prep.remove_accents("café naïve") == "cafe naive"
    assert text_prep.remove_html_tags("<b>bold</b> move") == "bold move"
    assert text_prep.remove_punctuation("a, b! c?") == "a b c"


def test_vocabulary_from_a_dict_or_a_list() -> None:
    by_list = text_prep.Vocabulary(["<unk>", "x", "y"])
    assert (by_list["y"], by_list["nope"], len(by_list)) == (2, 0, 3)
    by_dict = text_prep.Vocabulary({"x": 5, "<unk>": 7})
    assert (by_dict["x"], by_dict["zzz"]) == (5, 7)
    with pytest.raises(TypeError, match=r"a .*dict or a list of tokens"):
        text_prep.vocabulary(3.5, "v.pt")


class _NotAVocabulary:
    pass


def _model_dir(tmp_path: Path, vocab: Any = None) -> Any:
    shutil.copy(MODEL_FILE, tmp_path / "bag_model.py")
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module("bag_model")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("bag_model", None)
    torch.manual_seed(3)
    model = module.BagClassifier().eval()
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    torch.save(
        {w: i for i, w in enumerate(WORDS)} if vocab is None else vocab,
        tmp_path / "source_vocab.pt",
    )
    (tmp_path / "index_to_name.json").write_text(json.dumps({"0": "neg", "1": "neu", "2": "pos"}))
    return model


def _handler(tmp_path: Path) -> Any:
    manifest = {"model": {"serializedFile": "weights.pt", "modelFile": "bag_model.py"}}
    ctx = Context("t", str(tmp_path), manifest, 4, None, "0.12.0", metrics=MetricsCache("t"))
    module = importlib.import_module("trioserve.worker.torchserve.builtin.text_classifier")
    handler = module.TextClassifier()
    handler.initialize(ctx)
    return handler, ctx


def _expected(model: Any, ids: list[list[int]]) -> list[list[float]]:
    flat = torch.tensor([i for row in ids for i in row], dtype=torch.long)
    offsets, start = [], 0
    for row in ids:
        offsets.append(start)
        start += len(row)
    with torch.no_grad():
        scores = model(flat, torch.tensor(offsets, dtype=torch.long))
    return torch.softmax(scores, dim=1).tolist()  # type: ignore[no-any-return]


def test_text_classifier_classifies_every_request_of_a_batch(tmp_path: Path) -> None:
    model = _model_dir(tmp_path)
    handler, ctx = _handler(tmp_path)
    ctx.begin_batch(["a", "b"], [{}, {}])
    answers = handler.handle([{"data": b"<p>It's a GOOD movie!</p>"}, {"body": "is not bad"}], ctx)
    index = {w: i for i, w in enumerate(WORDS)}
    first = ["it", "is", "a", "good", "movie", "it is", "is a", "a good", "good movie"]
    second = ["is", "not", "bad", "is not", "not bad"]
    want = _expected(model, [[index.get(t, 0) for t in first], [index.get(t, 0) for t in second]])
    assert [list(a) for a in answers] == [["neg", "neu", "pos"]] * 2
    for answer, probabilities in zip(answers, want, strict=True):
        assert list(answer.values()) == pytest.approx(probabilities, abs=1e-6)


def test_text_that_is_not_utf8_is_a_400(tmp_path: Path) -> None:
    _model_dir(tmp_path)
    handler, _ = _handler(tmp_path)
    with pytest.raises(PredictionException, match="not UTF-8") as info:
        handler.preprocess([{"data": b"\xff\xfe"}])
    assert info.value.error_code == 400


def test_a_torchtext_vocabulary_is_refused_with_how_to_resave_it(tmp_path: Path) -> None:
    _model_dir(tmp_path, vocab=_NotAVocabulary())
    with pytest.raises(LoadError, match=r"torch\.save\(vocab\.get_stoi\(\)"):
        _handler(tmp_path)


def test_a_missing_vocabulary_is_refused(tmp_path: Path) -> None:
    _model_dir(tmp_path)
    (tmp_path / "source_vocab.pt").unlink()
    with pytest.raises(LoadError, match=r"no source_vocab\.pt"):
        _handler(tmp_path)
