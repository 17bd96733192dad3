"""TorchServe's built-in vision handlers end to end: archives made with ``trioserve archive``
(a TorchServe-style handler subclassing ImageClassifier with an eager model, and the
built-in ``image_classifier`` by name with a TorchScript model) and with TorchServe's own
``torch-model-archiver`` (the latter again), served by real workers,
called over HTTP and gRPC, each answer compared with the same model called here.

torchvision is the tests' stand-in (``tests/fixtures/vision_standin``), put on the workers'
path with PYTHONPATH: the registry's torchvision does not import beside this CPU torch."""

from __future__ import annotations

import asyncio
import importlib
import io
import json
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from PIL import Image

from trioserve.client import Client

from .server import HANDLERS, Server, running

pytestmark = pytest.mark.e2e

STANDIN = Path(__file__).resolve().parents[1] / "fixtures" / "vision_standin"
MNIST = HANDLERS / "mnist"
LABELS = {str(i): f"label-{i}" for i in range(6)}


class TinyClassifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pool = torch.nn.AdaptiveAvgPool2d(2)
        self.linear = torch.nn.Linear(12, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.pool(x).flatten(1))


def _digit_net() -> torch.nn.Module:
    sys.path.insert(0, str(MNIST))
    try:
        module = importlib.import_module("mnist")
    finally:
        sys.path.remove(str(MNIST))
    torch.manual_seed(0)
    return module.DigitNet().eval()  # type: ignore[no-any-return]


def _classifier() -> torch.nn.Module:
    torch.manual_seed(1)
    return TinyClassifier().eval()


def _archive(store: Path, name: str, handler: str, *extra: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "trioserve", "archive", "--model-name", name, "-v", "1.0",
         "--handler", handler, "--export-path", str(store), "-f", *extra],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip


@pytest.fixture(scope="module")
def vision_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("vision-store")
    files = tmp_path_factory.mktemp("vision-files")
    torch.save(_digit_net().state_dict(), files / "mnist.pt")
    _archive(
        store, "mnist", str(MNIST / "mnist_handler.py"),
        "--model-file", str(MNIST / "mnist.py"), "--serialized-file", str(files / "mnist.pt"),
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit is deprecated
        traced = torch.jit.trace(_classifier(), torch.zeros(1, 3, 224, 224))
        torch.jit.save(traced, str(files / "classifier.pt"))
    (files / "index_to_name.json").write_text(json.dumps(LABELS))
    _archive(
        store, "classifier", "image_classifier",
        "--serialized-file", str(files / "classifier.pt"),
        "--extra-files", str(files / "index_to_name.json"),
    )  # fmt: skip
    # The same models archived by TorchServe's own torch-model-archiver.
    subprocess.run(
        [str(Path(sys.executable).parent / "torch-model-archiver"),
         "--model-name", "mnist_tma", "--version", "1.0",
         "--handler", str(MNIST / "mnist_handler.py"), "--model-file", str(MNIST / "mnist.py"),
         "--serialized-file", str(files / "mnist.pt"), "--export-path", str(store), "-f"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    subprocess.run(
        [str(Path(sys.executable).parent / "torch-model-archiver"),
         "--model-name", "classifier_tma", "--version", "1.0", "--handler", "image_classifier",
         "--serialized-file", str(files / "classifier.pt"),
         "--extra-files", str(files / "index_to_name.json"),
         "--export-path", str(store), "-f"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return store


def _serve(tmp_path: Path, store: Path, env: dict[str, str]) -> Iterator[Server]:
    models = "mnist.mar,mnist_tma.mar,classifier.mar,classifier_tma.mar"
    server = Server(tmp_path, store, models, env=env)
    with running(server):
        yield server


@pytest.fixture
def vision(tmp_path: Path, vision_store: Path) -> Iterator[Server]:
    yield from _serve(tmp_path, vision_store, {"PYTHONPATH": str(STANDIN)})


def _image(width: int, height: int, mode: str, seed: int) -> bytes:
    generator = torch.Generator().manual_seed(seed)
    channels = 3 if mode == "RGB" else 1
    pixels = torch.randint(0, 256, (height, width, channels), generator=generator)
    image = Image.frombytes(mode, (width, height), bytes(pixels.to(torch.uint8).flatten()))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def _standin_transforms():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(STANDIN))
    try:
        return importlib.import_module("torchvision.transforms")
    finally:
        sys.path.remove(str(STANDIN))


def _expected_digit(data: bytes) -> int:
    t = _standin_transforms()
    steps = t.Compose([t.ToTensor(), t.Normalize((0.1307,), (0.3081,))])
    with torch.no_grad():
        return int(_digit_net()(steps(Image.open(io.BytesIO(data)))[None]).argmax(1))


def _expected_top5(data: bytes) -> list[tuple[str, float]]:
    t = _standin_transforms()
    steps = t.Compose(
        [
            t.Resize(256),
            t.CenterCrop(224),
            t.ToTensor(),
            t.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ]
    )
    with torch.no_grad():
        probabilities = torch.softmax(_classifier()(steps(Image.open(io.BytesIO(data)))[None]), 1)
    top, classes = torch.topk(probabilities, 5, dim=1)
    return [(LABELS[str(c)], p) for c, p in zip(classes[0].tolist(), top[0].tolist(), strict=True)]


def _grpc(server: Server, model: str, data: bytes) -> bytes:
    async def call() -> bytes:
        async with Client(inference_port=server.grpc_inference_port, timeout=60) as client:
            return await client.predictions(model, {"data": data})

    return asyncio.run(call())


def _assert_top5(answer: dict[str, float], want: list[tuple[str, float]]) -> None:
    assert list(answer) == [label for label, _ in want]
    assert list(answer.values()) == pytest.approx([p for _, p in want], abs=1e-5)


@pytest.mark.parametrize("model", ["mnist", "mnist_tma"])
def test_a_torchserve_style_mnist_handler_answers_as_the_model_does(
    vision: Server, model: str
) -> None:
    digits = [_image(28, 28, "L", seed) for seed in range(4)]
    with httpx.Client(base_url=vision.url, timeout=60) as client:
        for data in digits:
            r = client.post(f"/predictions/{model}", content=data)
            assert r.status_code == 200, r.text
            assert r.json() == _expected_digit(data)
    for data in digits[:2]:
        assert json.loads(_grpc(vision, model, data)) == _expected_digit(data)


@pytest.mark.parametrize("model", ["classifier", "classifier_tma"])
def test_the_builtin_image_classifier_by_name_answers_top_five_labels(
    vision: Server, model: str
) -> None:
    images = [_image(300, 260, "RGB", 7), _image(200, 240, "RGB", 8)]
    with httpx.Client(base_url=vision.url, timeout=60) as client:
        for data in images:
            r = client.post(f"/predictions/{model}", content=data)
            assert r.status_code == 200, r.text
            _assert_top5(r.json(), _expected_top5(data))
        r = client.post(f"/predictions/{model}", content=b"definitely not a png")
        assert r.status_code == 400
        assert "is not an image Pillow can read" in r.json()["message"]
    _assert_top5(json.loads(_grpc(vision, model, images[0])), _expected_top5(images[0]))


def test_without_the_vision_extra_the_load_error_names_it(
    tmp_path: Path, vision_store: Path
) -> None:
    for server in _serve(tmp_path, vision_store, {}):
        with httpx.Client(base_url=server.url, timeout=60) as client:
            r = client.post("/predictions/classifier", content=_image(32, 32, "RGB", 1))
        assert r.status_code == 503
        assert "pip install 'trioserve[vision]'" in r.json()["message"]


def test_explanations_are_the_models_integrated_gradients(vision: Server) -> None:
    attr = importlib.import_module("captum.attr")
    data = _image(28, 28, "L", 11)
    r = httpx.post(f"{vision.url}/explanations/mnist", content=data, timeout=60)
    assert r.status_code == 200, r.text
    t = _standin_transforms()
    steps = t.Compose([t.ToTensor(), t.Normalize((0.1307,), (0.3081,))])
    image = steps(Image.open(io.BytesIO(data)))[None]
    want = attr.IntegratedGradients(_digit_net()).attribute(image, target=0, n_steps=15)
    assert torch.allclose(torch.tensor(r.json()), want[0], atol=1e-4)
