"""TorchServe's built-in ``text_classifier`` end to end: archives made by ``trioserve
archive`` and by TorchServe's ``torch-model-archiver`` (``--handler text_classifier``, an
EmbeddingBag model file with its weights, ``source_vocab.pt`` and ``index_to_name.json``),
called over HTTP and gRPC, each answer compared with the same model called here."""

from __future__ import annotations

import asyncio
import importlib
import itertools
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from trioserve.client import Client

from .server import HANDLERS, Server, running

pytestmark = pytest.mark.e2e

TEXT = HANDLERS / "text"
WORDS = ["<unk>", "good", "bad", "movie", "is", "not", "it", "very", "good movie", "is not"]
LABELS = {"0": "neg", "1": "neu", "2": "pos"}


def _model() -> torch.nn.Module:
    sys.path.insert(0, str(TEXT))
    try:
        module = importlib.import_module("bag_model")
    finally:
        sys.path.remove(str(TEXT))
    torch.manual_seed(3)
    return module.BagClassifier().eval()  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def text_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("text-store")
    files = tmp_path_factory.mktemp("text-files")
    torch.save(_model().state_dict(), files / "weights.pt")
    torch.save({w: i for i, w in enumerate(WORDS)}, files / "source_vocab.pt")
    (files / "index_to_name.json").write_text(json.dumps(LABELS))
    extra = f"{files / 'source_vocab.pt'},{files / 'index_to_name.json'}"
    common = [
        "--version", "1.0", "--handler", "text_classifier",
        "--model-file", str(TEXT / "bag_model.py"),
        "--serialized-file", str(files / "weights.pt"),
        "--extra-files", extra, "--export-path", str(store), "-f",
    ]  # fmt: skip
    archivers = {
        "reviews": [sys.executable, "-m", "trioserve", "archive"],
        "reviews_tma": [str(Path(sys.executable).parent / "torch-model-archiver")],
    }
    for name, command in archivers.items():
        subprocess.run(
            [*command, "--model-name", name, *common], check=True, capture_output=True, timeout=120
        )
        # A subclass of the built-in handler, from the same archiver.
        own = [
            str(TEXT / "review_handler.py") if arg == "text_classifier" else arg for arg in common
        ]
        subprocess.run(
            [*command, "--model-name", f"{name}_own", *own],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
    return store


@pytest.fixture
def text_server(tmp_path: Path, text_store: Path) -> Iterator[Server]:
    models = "reviews.mar,reviews_tma.mar,reviews_own.mar,reviews_tma_own.mar"
    server = Server(tmp_path, text_store, models)
    with running(server):
        yield server


def _expected(tokens: list[str], bigrams: bool = True) -> list[tuple[str, float]]:
    index = {w: i for i, w in enumerate(WORDS)}
    grams = tokens + ([f"{a} {b}" for a, b in itertools.pairwise(tokens)] if bigrams else [])
    ids = torch.tensor([index.get(g, 0) for g in grams], dtype=torch.long)
    with torch.no_grad():
        probabilities = torch.softmax(_model()(ids, torch.tensor([0])), dim=1)[0].tolist()
    return [(LABELS[str(i)], p) for i, p in enumerate(probabilities)]


@pytest.mark.parametrize("model", ["reviews", "reviews_tma"])
def test_text_classifier_answers_as_the_model_does(text_server: Server, model: str) -> None:
    cases = {
        b"It's a very GOOD movie!": ["it", "is", "a", "very", "good", "movie"],
        b"<i>not bad</i>, is it?": ["not", "bad", "is", "it"],
    }
    with httpx.Client(base_url=text_server.url, timeout=60) as client:
        for body, tokens in cases.items():
            r = client.post(f"/predictions/{model}", content=body)
            assert r.status_code == 200, r.text
            answer = r.json()
            want = _expected(tokens)
            assert list(answer) == [label for label, _ in want]
            assert list(answer.values()) == pytest.approx([p for _, p in want], abs=1e-6)

    async def over_grpc() -> bytes:
        async with Client(inference_port=text_server.grpc_inference_port, timeout=60) as c:
            return await c.predictions(model, {"data": b"good movie"})

    answer = json.loads(asyncio.run(over_grpc()))
    assert list(answer.values()) == pytest.approx(
        [p for _, p in _expected(["good", "movie"])], abs=1e-6
    )


@pytest.mark.parametrize("model", ["reviews_own", "reviews_tma_own"])
def test_a_subclass_of_the_text_classifier_answers_as_the_model_does(
    text_server: Server, model: str
) -> None:
    tokens = ["it", "is", "not", "a", "bad", "movie"]
    want = max(_expected(tokens, bigrams=False), key=lambda pair: pair[1])[0]
    r = httpx.post(f"{text_server.url}/predictions/{model}", content=b"It isn't a bad movie.")
    assert (r.status_code, r.text) == (200, want)
