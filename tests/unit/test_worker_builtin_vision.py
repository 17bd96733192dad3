"""TorchServe's built-in vision handlers (``ts.torch_handler.image_classifier`` ...) with tiny
deterministic models, in-process. torchvision is the tests' stand-in
(``tests/fixtures/vision_standin``): the registry's torchvision does not import beside the
CPU torch these tests run on."""

from __future__ import annotations

import base64
import importlib
import io
import json
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from trioserve.worker.errors import LoadError
from trioserve.worker.torchserve import ts_shim
from trioserve.worker.torchserve.context import Context
from trioserve.worker.torchserve.errors import PredictionException
from trioserve.worker.torchserve.metrics import MetricsCache

STANDIN = Path(__file__).resolve().parents[1] / "fixtures" / "vision_standin"
BUILTIN = (
    "trioserve.worker.torchserve.builtin.vision_handler",
    "trioserve.worker.torchserve.builtin.image_classifier",
    "trioserve.worker.torchserve.builtin.image_segmenter",
    "trioserve.worker.torchserve.builtin.object_detector",
)


def _forget_vision_modules() -> None:
    for name in [*BUILTIN, "torchvision", "torchvision.transforms"]:
        sys.modules.pop(name, None)


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.syspath_prepend(str(STANDIN))
    _forget_vision_modules()
    yield
    _forget_vision_modules()


def png(width: int, height: int, mode: str = "RGB", seed: int = 0) -> bytes:
    generator = torch.Generator().manual_seed(seed)
    channels = 3 if mode == "RGB" else 1
    pixels = torch.randint(0, 256, (height, width, channels), generator=generator)
    image = Image.frombytes(mode, (width, height), bytes(pixels.to(torch.uint8).flatten()))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


class TinyClassifier(torch.nn.Module):
    def __init__(self, classes: int) -> None:
        super().__init__()
        self.pool = torch.nn.AdaptiveAvgPool2d(2)
        self.linear = torch.nn.Linear(12, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.pool(x).flatten(1))


def torchscript(module: torch.nn.Module, path: Path, example: torch.Tensor) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit is deprecated
        torch.jit.save(torch.jit.trace(module.eval(), example), str(path))


def context(model_dir: Path, **system: Any) -> Context:
    manifest = {"model": {"modelName": "tiny", "serializedFile": "model.pt"}}
    ctx = Context("tiny", str(model_dir), manifest, 4, None, "0.12.0", metrics=MetricsCache("t"))
    ctx.system_properties.update(system)
    return ctx


def classifier(tmp_path: Path, classes: int, mapping: dict[str, str] | None = None) -> Any:
    torch.manual_seed(0)
    model = TinyClassifier(classes)
    torchscript(model, tmp_path / "model.pt", torch.zeros(1, 3, 224, 224))
    if mapping is not None:
        (tmp_path / "index_to_name.json").write_text(json.dumps(mapping))
    module = importlib.import_module("trioserve.worker.torchserve.builtin.image_classifier")
    handler = module.ImageClassifier()
    handler.initialize(context(tmp_path))
    return handler, model


def expected_top(
    model: torch.nn.Module, images: list[bytes], k: int
) -> list[list[tuple[int, float]]]:
    """What the classifier should answer, computed here from the stand-in's transforms."""
    transforms = importlib.import_module("torchvision.transforms")
    steps = transforms.Compose(
        [
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ]
    )
    batch = torch.stack([steps(Image.open(io.BytesIO(data))) for data in images])
    with torch.no_grad():
        probabilities = torch.softmax(model(batch), dim=1)
    top, classes = torch.topk(probabilities, k, dim=1)
    return [
        list(zip(c, p, strict=True)) for c, p in zip(classes.tolist(), top.tolist(), strict=True)
    ]


def test_image_classifier_answers_top_five_labels_for_bytes_and_base64(
    standin: None, tmp_path: Path
) -> None:
    mapping = {str(i): f"class-{i}" for i in range(7)}
    handler, model = classifier(tmp_path, 7, mapping)
    images = [png(300, 260, seed=1), png(240, 320, seed=2)]
    rows = [{"data": images[0]}, {"body": base64.b64encode(images[1]).decode()}]
    ctx = handler.context = context(tmp_path)
    ctx.begin_batch(["a", "b"], [{}, {}])
    answers = handler.handle(rows, ctx)
    want = expected_top(model, images, 5)
    assert len(answers) == 2
    for answer, top in zip(answers, want, strict=True):
        assert list(answer) == [f"class-{c}" for c, _ in top]  # most likely first
        assert list(answer.values()) == pytest.approx([p for _, p in top])


def test_fewer_classes_than_topk_answers_every_class(standin: None, tmp_path: Path) -> None:
    handler, model = classifier(tmp_path, 3)  # no index_to_name.json: labels are indices
    answers = handler.postprocess(handler.inference(handler.preprocess([{"data": png(64, 64)}])))
    want = expected_top(model, [png(64, 64)], 3)[0]
    assert list(answers[0]) == [str(c) for c, _ in want]
    handler.set_max_result_classes(1)
    assert handler.get_max_result_classes() == 1
    assert len(handler.postprocess(torch.tensor([[0.1, 0.9, 0.0]]))[0]) == 1


def test_pixel_lists_skip_decoding(standin: None, tmp_path: Path) -> None:
    handler, _ = classifier(tmp_path, 3)
    pixels = torch.rand(3, 224, 224).tolist()
    batch = handler.preprocess([{"data": pixels}])
    assert batch.shape == (1, 3, 224, 224)
    assert torch.allclose(batch[0], torch.tensor(pixels))


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (b"not an image", "is not an image Pillow can read"),
        ("@@not base64@@", "not base64 image data"),
    ],
)
def test_bad_image_input_is_a_400_that_says_what_was_wrong(
    standin: None, tmp_path: Path, value: Any, says: str
) -> None:
    handler, _ = classifier(tmp_path, 3)
    with pytest.raises(PredictionException, match=says) as info:
        handler.preprocess([{"data": png(32, 32)}, {"data": value}])
    assert info.value.error_code == 400
    assert "request 1 of the batch" in str(info.value)


def test_image_size_limit_follows_limit_max_image_pixels(
    standin: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", Image.MAX_IMAGE_PIXELS)
    classifier(tmp_path, 3)
    assert Image.MAX_IMAGE_PIXELS is not None  # kept by default
    module = importlib.import_module("trioserve.worker.torchserve.builtin.image_classifier")
    module.ImageClassifier().initialize(context(tmp_path, limit_max_image_pixels=False))
    assert Image.MAX_IMAGE_PIXELS is None


def test_image_segmenter_answers_class_and_probability_per_pixel(
    standin: None, tmp_path: Path
) -> None:
    module = importlib.import_module("trioserve.worker.torchserve.builtin.image_segmenter")
    handler = module.ImageSegmenter()
    scores = torch.randn(2, 4, 3, 5, generator=torch.Generator().manual_seed(3))
    answers = handler.postprocess({"out": scores})
    probabilities = torch.softmax(scores, dim=1)
    assert len(answers) == 2 and len(answers[0]) == 3 and len(answers[0][0]) == 5
    for image in range(2):
        for y in range(3):
            for x in range(5):
                label, probability = answers[image][y][x]
                best = int(probabilities[image, :, y, x].argmax())
                assert label == best
                assert probability == pytest.approx(float(probabilities[image, best, y, x]))


def test_object_detector_keeps_boxes_above_the_threshold_with_labels(
    standin: None, tmp_path: Path
) -> None:
    module = importlib.import_module("trioserve.worker.torchserve.builtin.object_detector")
    handler = module.ObjectDetector()
    handler.mapping = {"1": "cat", "2": "dog"}
    detections = [
        {
            "boxes": torch.tensor([[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]),
            "labels": torch.tensor([1, 2]),
            "scores": torch.tensor([0.9, 0.2]),
        },
        {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0), "scores": torch.zeros(0)},
    ]
    answers = handler.postprocess(detections)
    assert answers[0] == [{"cat": [0.0, 1.0, 2.0, 3.0], "score": pytest.approx(0.9)}]
    assert answers[1] == []
    handler.mapping = None  # no index_to_name.json: the class index names the box
    assert list(handler.postprocess(detections)[0][0]) == ["1", "score"]


def test_builtin_names_resolve_through_the_ts_shim(standin: None) -> None:
    ts_shim.install()
    for name in ("image_classifier", "image_segmenter", "object_detector", "vision_handler"):
        alias = importlib.import_module(f"ts.torch_handler.{name}")
        assert alias is importlib.import_module(f"trioserve.worker.torchserve.builtin.{name}")
    timer = importlib.import_module("ts.handler_utils.timer")

    class Timed:
        context = context(STANDIN)

        @timer.timed
        def preprocess(self, x: int) -> int:
            return x + 1

    assert Timed().preprocess(1) == 2
    records = Timed.context.metrics.drain()
    assert [(r["name"], r["unit"]) for r in records] == [("Timed.preprocess", "Milliseconds")]


def test_without_the_vision_extra_loading_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _forget_vision_modules()
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import torchvision fails
    try:
        with pytest.raises(LoadError, match=r"pip install 'trioserve\[vision\]'"):
            importlib.import_module("trioserve.worker.torchserve.builtin.image_classifier")
    finally:
        _forget_vision_modules()


def test_explanations_are_captums_integrated_gradients(standin: None, tmp_path: Path) -> None:
    attr = importlib.import_module("captum.attr")
    handler, model = classifier(tmp_path, 4)
    ctx = context(tmp_path)
    ctx.begin_batch(["a"], [{"explain": "True"}])
    image = png(230, 230, seed=5)
    answer = handler.handle([{"data": image, "target": 2}], ctx)
    batch = handler.preprocess([{"data": image}])
    want = attr.IntegratedGradients(model).attribute(batch, target=2, n_steps=15)
    assert torch.allclose(torch.tensor(answer), want, atol=1e-5)


def test_without_captum_explanations_are_a_501_naming_it(
    standin: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "captum.attr", None)
    handler, _ = classifier(tmp_path, 4)
    ctx = context(tmp_path)
    ctx.begin_batch(["a"], [{"explain": "True"}])
    with pytest.raises(PredictionException, match="pip install captum") as info:
        handler.handle([{"data": png(64, 64)}], ctx)
    assert info.value.error_code == 501
