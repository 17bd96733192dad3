"""The demo classifier: deterministic weights, labelled probabilities, input checks."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import make_model
import pytest

HERE = Path(__file__).resolve().parent
HANDLER = HERE / "classifier_handler.py"
LABELS = json.loads((HERE / "index_to_name.json").read_text(encoding="utf-8"))
SAMPLE = (HERE / "sample.json").read_bytes()
MANIFEST = {
    "runtime": "python",
    "model": {
        "modelName": "classifier",
        "serializedFile": "model.pt",
        "handler": "classifier_handler.py",
        "modelVersion": "1.0",
        "configFile": "model-config.yaml",
    },
}


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """An extracted classifier archive: weights, label map and config."""
    make_model.build(tmp_path)
    shutil.copy(HERE / "index_to_name.json", tmp_path)
    shutil.copy(HERE / "model-config.yaml", tmp_path)
    return tmp_path


@pytest.fixture
def classifier(load_model: Any, model_dir: Path) -> Any:
    return load_model(HANDLER, model_dir, manifest=MANIFEST, batch_size=2)


def _answer(reply: Any) -> dict[str, float]:
    assert reply.status == 200
    answer = json.loads(bytes(reply.body))
    assert isinstance(answer, dict)
    return answer


def test_make_model_is_deterministic(tmp_path: Path) -> None:
    first = make_model.build(tmp_path / "a")
    second = make_model.build(tmp_path / "b")
    assert first == tmp_path / "a" / "model.pt"
    assert first.read_bytes() == second.read_bytes()
    assert len(first.read_bytes()) > 1000


def test_make_model_has_the_documented_shape() -> None:
    linear_in, relu, linear_out = make_model.make_module()
    assert (linear_in.in_features, linear_in.out_features) == (16, 32)
    assert (linear_out.in_features, linear_out.out_features) == (32, 4)
    assert type(relu).__name__ == "ReLU"


def test_make_model_main_writes_to_the_given_folder(tmp_path: Path) -> None:
    assert make_model.main([str(tmp_path)]) == 0
    assert (tmp_path / "model.pt").read_bytes() == make_model.serialize()
    assert make_model.main(["a", "b"]) == 2


def test_label_map_has_four_labels() -> None:
    assert sorted(LABELS) == ["0", "1", "2", "3"]
    assert len(set(LABELS.values())) == 4


def test_sample_gives_probabilities_that_sum_to_one(classifier: Any) -> None:
    result = classifier.infer([(SAMPLE, "application/json")])
    assert result.final.code == 200
    (reply,) = result.final.replies
    assert reply.content_type is None  # like TorchServe: the handler sets none
    answer = _answer(reply)
    assert set(answer) == set(LABELS.values())
    assert math.isclose(sum(answer.values()), 1.0, rel_tol=1e-6)
    assert all(0.0 < p < 1.0 for p in answer.values())
    probabilities = list(answer.values())
    assert probabilities == sorted(probabilities, reverse=True)
    # The seeded weights give a fixed answer for the sample (see README).
    assert list(answer) == ["fish", "dog", "bird", "cat"]
    assert answer["fish"] == pytest.approx(0.2715802, abs=1e-5)


def test_batch_of_two_answers_each_request(classifier: Any) -> None:
    plain = [0.5] * 16
    wrapped = {"data": [(-1.0) ** i * i / 4 for i in range(16)]}
    result = classifier.infer(
        [
            (json.dumps(plain).encode(), "application/json"),
            # A body without a JSON content type reaches the handler as bytes.
            (json.dumps(wrapped).encode(), None),
        ]
    )
    assert result.final.code == 200
    first, second = (_answer(r) for r in result.final.replies)
    assert [r.request_id for r in result.final.replies] == ["req-1-0", "req-1-1"]
    for answer in (first, second):
        assert set(answer) == set(LABELS.values())
        assert math.isclose(sum(answer.values()), 1.0, rel_tol=1e-6)
    assert first != second

    # Each answer in the batch is the one that request gets on its own.
    alone = _answer(classifier.infer([(json.dumps(wrapped).encode(), None)]).final.replies[0])
    assert alone.keys() == second.keys()
    for label, p in alone.items():
        assert second[label] == pytest.approx(p, abs=1e-6)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([1.0, 2.0, 3.0], "request 0: expected 16 numbers, got 3"),
        ({"data": [0.0] * 17}, "request 0: expected 16 numbers, got 17"),
        ({"values": [0.0] * 16}, 'or {"data": [...]}'),
        ({"data": "not a list"}, "expected a JSON list of 16 numbers, got str"),
        (42, "expected a JSON list of 16 numbers, got int"),
        ("not json", "body is not valid JSON"),
        ([0.0] * 15 + ["x"], "element 15 is 'x', expected a number"),
        ([0.0] * 15 + [True], "element 15 is True, expected a number"),
    ],
)
def test_bad_input_raises_a_clear_value_error(classifier: Any, body: Any, message: str) -> None:
    handler = classifier.entry.__self__
    with pytest.raises(ValueError, match=r"^request 0: ") as caught:
        handler.preprocess([{"body": body}])
    assert message in str(caught.value)


def test_invalid_json_bytes_raise_a_clear_value_error(classifier: Any) -> None:
    handler = classifier.entry.__self__
    with pytest.raises(ValueError, match="request 1: body is not valid JSON"):
        handler.preprocess([{"body": [0.0] * 16}, {"body": bytearray(b"[1, 2,")}])


def test_wrong_length_fails_the_batch_in_the_worker(classifier: Any) -> None:
    result = classifier.infer([(b"[1, 2, 3]", "application/json")])
    # TorchServe's worker turns a handler exception into 503 "Prediction failed".
    assert (result.final.code, result.final.message) == (503, "Prediction failed")
    assert result.final.replies == []


def test_labels_come_from_the_archives_label_map(load_model: Any, model_dir: Path) -> None:
    custom = {"0": "alpha", "1": ["n01", "beta"], "2": "gamma", "3": "delta"}
    (model_dir / "index_to_name.json").write_text(json.dumps(custom), encoding="utf-8")
    model = load_model(HANDLER, model_dir, manifest=MANIFEST)
    answer = _answer(model.infer([(SAMPLE, "application/json")]).final.replies[0])
    assert set(answer) == {"alpha", "beta", "gamma", "delta"}
    assert next(iter(answer)) == "delta"  # class 3 ("fish" in the shipped map) ranks first
