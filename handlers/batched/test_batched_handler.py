"""The batched reference handler: deterministic weights, batch answers, both input paths."""

from __future__ import annotations

import importlib.util
import json
import shutil
import signal
import struct
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import yaml

HERE = Path(__file__).resolve().parent
HANDLER = HERE / "batched_handler.py"
SAMPLE_JSON = (HERE / "sample.json").read_bytes()
SAMPLE_BIN = (HERE / "sample.bin").read_bytes()
CONFIG = yaml.safe_load((HERE / "model-config.yaml").read_text(encoding="utf-8"))
MANIFEST = {
    "runtime": "python",
    "model": {
        "modelName": "batched",
        "serializedFile": "model.pt",
        "handler": "batched_handler.py",
        "modelVersion": "1.0",
        "configFile": "model-config.yaml",
    },
}
OCTET = "application/octet-stream"


def _load_make_model() -> ModuleType:
    # Not ``import make_model``: handlers/classifier has a module of the same name.
    spec = importlib.util.spec_from_file_location("batched_make_model", HERE / "make_model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_model = _load_make_model()


def _features(seed: int, count: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(count, 256, generator=generator)


def _binary(row: torch.Tensor) -> bytes:
    return struct.pack("<256f", *row.tolist())


def _expected(rows: torch.Tensor) -> list[tuple[int, float]]:
    """The model called directly on ``rows``: (argmax, its probability) per row."""
    with torch.inference_mode():
        probabilities = torch.softmax(make_model.make_module()(rows), dim=1)
    best, classes = probabilities.max(dim=1)
    return list(zip(classes.tolist(), best.tolist(), strict=True))


def _answers(result: Any) -> list[tuple[int, float]]:
    assert (result.final.code, result.final.message) == (200, "Prediction success")
    out = []
    for reply in result.final.replies:
        assert reply.status == 200
        answer = json.loads(bytes(reply.body))
        assert set(answer) == {"class", "probability"}
        assert isinstance(answer["class"], int)
        out.append((answer["class"], answer["probability"]))
    return out


def _assert_close(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> None:
    assert [c for c, _ in got] == [c for c, _ in want]
    for (_, p), (_, q) in zip(got, want, strict=True):
        assert p == pytest.approx(q, abs=1e-5)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Weights and config, built once for this module."""
    folder = tmp_path_factory.mktemp("batched-build")
    make_model.build(folder)
    shutil.copy(HERE / "model-config.yaml", folder)
    return folder


@pytest.fixture
def model_dir(built: Path, tmp_path: Path) -> Path:
    """An extracted batched archive: weights and config."""
    target = tmp_path / "model"
    shutil.copytree(built, target)
    return target


@pytest.fixture
def batched(load_model: Any, model_dir: Path) -> Any:
    return load_model(
        HANDLER, model_dir, manifest=MANIFEST, model_yaml_config=CONFIG, batch_size=16
    )


class PlainContext:
    """A context without trioserve's batch-tensor additions (like TorchServe's)."""

    def __init__(self) -> None:
        self.metrics = None
        self.system_properties: dict[str, Any] = {"model_dir": ".", "batch_size": 16}

    def get_request_header(self, idx: int, key: str) -> Any:
        return None


class RecordingMetrics:
    def __init__(self) -> None:
        self.added: list[tuple[Any, ...]] = []

    def add_metric(self, name: str, value: float, unit: str, *args: Any) -> None:
        self.added.append((name, value, unit))

    def add_time(self, *args: Any) -> None:
        pass


# -- the model -------------------------------------------------------------------------------


def test_make_model_is_deterministic(tmp_path: Path) -> None:
    first = make_model.build(tmp_path / "a")
    second = make_model.build(tmp_path / "b")
    assert first == tmp_path / "a" / "model.pt"
    assert first.read_bytes() == second.read_bytes()
    assert len(first.read_bytes()) > 4 * 4_000_000  # about 4.7 M float32 parameters


def test_make_model_has_the_documented_shape() -> None:
    layers = list(make_model.make_module())
    assert [type(m).__name__ for m in layers] == ["Linear", "ReLU", "Linear", "ReLU", "Linear"]
    shapes = [(m.in_features, m.out_features) for m in layers[::2]]
    assert shapes == [(256, 2048), (2048, 2048), (2048, 10)]
    assert not make_model.make_module().training


def test_make_model_main_writes_to_the_given_folder(tmp_path: Path) -> None:
    assert make_model.main([str(tmp_path)]) == 0
    assert (tmp_path / "model.pt").read_bytes() == make_model.serialize()
    assert make_model.main(["a", "b"]) == 2


def test_model_config_declares_batching_and_the_tensor_input() -> None:
    assert CONFIG == {
        "minWorkers": 1,
        "maxWorkers": 1,
        "batchSize": 16,
        "maxBatchDelay": 50,
        "responseTimeout": 30,
        "tensorInputs": {"body": {"dtype": "float32", "shape": [256]}},
    }


def test_samples_hold_the_same_256_values() -> None:
    values = json.loads(SAMPLE_JSON)
    assert len(values) == 256 and len(SAMPLE_BIN) == 1024
    assert struct.pack("<256f", *values) == SAMPLE_BIN


# -- answers ---------------------------------------------------------------------------------


def test_batch_of_16_matches_the_model_called_directly(batched: Any) -> None:
    rows = _features(1, 16)
    result = batched.infer([(_binary(row), OCTET) for row in rows])
    assert [r.request_id for r in result.final.replies] == [f"req-1-{i}" for i in range(16)]
    assert all(r.content_type is None for r in result.final.replies)
    got = _answers(result)
    _assert_close(got, _expected(rows))
    assert len({c for c, _ in got}) > 1  # the inputs do not all land in one class

    # Each answer in the batch is the one that request gets on its own.
    alone = _answers(batched.infer([(_binary(rows[5]), OCTET)]))
    _assert_close(alone, [got[5]])


def test_json_and_binary_inputs_agree(batched: Any) -> None:
    values = json.loads(SAMPLE_JSON)
    result = batched.infer(
        [
            (SAMPLE_BIN, OCTET),
            (SAMPLE_JSON, "application/json"),  # decoded by the worker into a list
            (SAMPLE_JSON, None),  # bytes that are not 1024 long: parsed as JSON
            (SAMPLE_JSON, "text/plain"),  # a str
            (SAMPLE_BIN, None),
        ]
    )
    answers = _answers(result)
    assert len(set(answers)) == 1
    _assert_close(answers[:1], _expected(torch.tensor([values], dtype=torch.float32)))
    # The README quotes this answer.
    assert answers[0][0] == 4
    assert answers[0][1] == pytest.approx(0.107754, abs=1e-5)


def test_collated_batch_tensor_is_used_without_decoding(
    batched: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = _features(2, 16)
    handler = batched.entry.__self__
    asked: list[str] = []

    def get_batch_tensor(name: str) -> torch.Tensor:
        asked.append(name)
        return rows

    def no_decoding(*args: Any) -> Any:
        raise AssertionError("the handler decoded a body although the tensor was offered")

    monkeypatch.setattr(batched.context, "batch_tensor_names", lambda: ["body"], raising=False)
    monkeypatch.setattr(batched.context, "get_batch_tensor", get_batch_tensor, raising=False)
    monkeypatch.setattr(handler, "parse_features", no_decoding)
    result = batched.infer([(_binary(row), OCTET) for row in rows])
    assert asked == ["body"]
    _assert_close(_answers(result), _expected(rows))


def test_collated_tensor_from_a_batch_frame_is_used_in_place(
    batched: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's own path: ``meta["tensors"]`` of a BATCH frame -> the context's tensor."""
    tensors = pytest.importorskip("trioserve.worker.tensors")
    from trioserve.core.messages import Param, WorkItem
    from trioserve.worker.torchserve.batch import prepare, run_batch

    rows = _features(7, 16)
    bodies = [_binary(row) for row in rows]
    blob = bytearray(b"".join(bodies))
    meta = {"tensors": {"body": {"dtype": "float32", "shape": [16, 256], "blob": 0}}}
    collated = tensors.parse_batch_tensors(meta, [memoryview(blob)], 16)
    items = [
        WorkItem(request_id=f"r{i}", headers=[], params=[Param("body", body, OCTET)])
        for i, body in enumerate(bodies)
    ]
    handler = batched.entry.__self__
    seen: list[int] = []
    real_collated = handler.collated

    def spy(data: list[Any]) -> Any:
        tensor = real_collated(data)
        seen.append(tensor.data_ptr())
        return tensor

    def no_decoding(*args: Any) -> Any:
        raise AssertionError("the handler decoded a body although the tensor was offered")

    monkeypatch.setattr(handler, "collated", spy)
    monkeypatch.setattr(handler, "parse_features", no_decoding)
    data = prepare(batched.context, items, tensors=collated)
    reply = run_batch(batched.entry, batched.context, 1, items, data)
    batched.context.end_batch()
    assert reply.code == 200
    got = [(a["class"], a["probability"]) for a in (json.loads(r.body) for r in reply.replies)]
    _assert_close(got, _expected(rows))
    # Zero-copy: the handler's input is the frame's memory.
    assert seen == [torch.frombuffer(blob, dtype=torch.uint8).data_ptr()]


@pytest.mark.parametrize(
    ("names", "tensor"),
    [
        ([], None),  # nothing collated
        (["body"], torch.zeros(3, 256)),  # not this batch's shape
        (["body"], torch.zeros(4, 256, dtype=torch.float64)),  # not float32
        (["body"], [[0.0] * 256] * 4),  # not a tensor
    ],
)
def test_unusable_batch_tensor_falls_back_to_decoding(
    batched: Any, monkeypatch: pytest.MonkeyPatch, names: list[str], tensor: Any
) -> None:
    rows = _features(3, 4)

    def get_batch_tensor(name: str) -> Any:
        if tensor is None:
            raise KeyError(name)
        return tensor

    monkeypatch.setattr(batched.context, "batch_tensor_names", lambda: names, raising=False)
    monkeypatch.setattr(batched.context, "get_batch_tensor", get_batch_tensor, raising=False)
    result = batched.infer([(_binary(row), OCTET) for row in rows])
    _assert_close(_answers(result), _expected(rows))


def test_batch_tensor_is_ignored_when_a_body_was_decoded(
    batched: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = _features(4, 2)
    monkeypatch.setattr(batched.context, "batch_tensor_names", lambda: ["body"], raising=False)
    monkeypatch.setattr(
        batched.context, "get_batch_tensor", lambda name: torch.zeros(2, 256), raising=False
    )
    result = batched.infer(
        [(_binary(rows[0]), OCTET), (json.dumps(rows[1].tolist()).encode(), "application/json")]
    )
    _assert_close(_answers(result), _expected(rows))


def test_fallback_path_on_a_context_without_batch_tensors(batched: Any) -> None:
    handler = batched.entry.__self__
    rows = _features(5, 16)
    data: list[Any] = [{"body": bytearray(_binary(row))} for row in rows[:8]]
    data += [{"body": row.tolist()} for row in rows[8:12]]  # decoded JSON
    data += [{"data": _binary(row)} for row in rows[12:]]  # a form field / gRPC input
    answers = handler.handle(data, PlainContext())
    got = [(a["class"], a["probability"]) for a in answers]
    _assert_close(got, _expected(rows))


# -- batch bookkeeping -----------------------------------------------------------------------


def test_batch_sizes_are_logged_and_measured(
    batched: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log_file = tmp_path / "batches.log"
    monkeypatch.setenv("TRIOSERVE_BATCH_LOG", str(log_file))
    metrics = RecordingMetrics()
    monkeypatch.setattr(batched.context, "metrics", metrics)
    rows = _features(6, 16)
    for size in (3, 16, 1):
        _answers(batched.infer([(_binary(row), OCTET) for row in rows[:size]]))
    assert log_file.read_text() == "3\n16\n1\n"
    assert metrics.added == [("BatchSize", n, "count") for n in (3, 16, 1)]


def test_no_batch_log_without_the_variable(
    batched: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRIOSERVE_BATCH_LOG", raising=False)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    _answers(batched.infer([(SAMPLE_BIN, OCTET)]))
    assert list(cwd.iterdir()) == []


def test_wrong_length_control_fails_the_whole_batch(batched: Any) -> None:
    result = batched.infer(
        [(SAMPLE_BIN, OCTET), (b'{"wrong_length": true}', "application/json"), (SAMPLE_BIN, None)]
    )
    assert (result.final.code, result.final.message) == (503, "number of batch response mismatched")
    assert result.final.replies == []
    # The next batch is unaffected; the control also works as undecoded bytes.
    _answers(batched.infer([(SAMPLE_BIN, OCTET)]))
    bytes_control = batched.infer([(b'{"wrong_length": true}', None)])
    assert bytes_control.final.code == 503


def test_wrong_length_control_by_header(batched: Any) -> None:
    # With tensorInputs declared, trioserve only lets 1024-byte bodies through: the header
    # asks for the control on an ordinary request. (A request is (body, type, headers).)
    control = (SAMPLE_BIN, OCTET, {"x-batched-control": "wrong_length"})
    result = batched.infer([(SAMPLE_BIN, OCTET), control])
    assert (result.final.code, result.final.message) == (503, "number of batch response mismatched")
    _answers(batched.infer([(SAMPLE_BIN, OCTET, {"X-Batched-Control": "none"})]))


def test_crash_control_by_header(batched: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    kills: list[tuple[int, int]] = []
    monkeypatch.setattr("os.kill", lambda pid, sig: kills.append((pid, sig)))
    batched.infer([(SAMPLE_BIN, OCTET, {"X-Batched-Control": " Crash "}), (SAMPLE_BIN, OCTET)])
    assert [sig for _, sig in kills] == [signal.SIGKILL]


def test_crash_control_kills_the_worker_with_sigkill(
    batched: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    kills: list[tuple[int, int]] = []
    monkeypatch.setattr("os.kill", lambda pid, sig: kills.append((pid, sig)))
    batched.infer([(SAMPLE_BIN, OCTET), (b'{"crash": true}', "application/json")])
    assert len(kills) == 1 and kills[0][1] == signal.SIGKILL
    # Other JSON objects are not controls.
    handler = batched.entry.__self__
    assert handler.control({"crash": False}) is None
    assert handler.control(bytearray(b'{"crash": 1}')) is None
    assert handler.control("[1, 2]") is None
    assert handler.control(bytearray(b"{" + b"\0" * 1023)) is None  # 1024 bytes: binary
    assert handler.control(bytearray(b'  {"crash": true}')) == "crash"


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (bytearray(1020), "request 0: body is 1020 bytes: expected 1024 bytes (256 little-endian"),
        (bytearray(2048), "request 0: body is 2048 bytes: expected 1024 bytes"),
        (b"", "request 0: body is 0 bytes"),
        ([1.0, 2.0, 3.0], "request 0: expected a JSON list of 256 numbers, got 3"),
        (b"[" + b"0," * 256 + b"0]", "request 0: expected a JSON list of 256 numbers, got 257"),
        ("[1, 2", "request 0: body is not valid JSON"),
        ({"data": [0.0] * 256}, "or a JSON list of 256 numbers, got a JSON dict"),
        ([0.0] * 255 + ["x"], "request 0: element 255 is 'x', expected a number"),
        ([0.0] * 255 + [True], "request 0: element 255 is True, expected a number"),
    ],
)
def test_wrong_input_raises_a_clear_value_error(batched: Any, body: Any, message: str) -> None:
    handler = batched.entry.__self__
    with pytest.raises(ValueError, match=r"^request 0: ") as caught:
        handler.preprocess([{"body": body}])
    assert message in str(caught.value)


def test_error_names_the_bad_request_of_the_batch(batched: Any) -> None:
    handler = batched.entry.__self__
    with pytest.raises(ValueError, match=r"^request 2: body is 1000 bytes"):
        handler.preprocess([{"body": SAMPLE_BIN}, {"body": SAMPLE_BIN}, {"body": bytes(1000)}])


def test_non_finite_values_are_refused(batched: Any) -> None:
    handler = batched.entry.__self__
    bad = struct.pack("<256f", *([0.0] * 10 + [float("nan")] + [0.0] * 245))
    with pytest.raises(ValueError, match=r"^request 1: the input holds a NaN or infinite"):
        handler.preprocess([{"body": SAMPLE_BIN}, {"body": bad}])


@pytest.mark.parametrize(
    "values",
    [
        [float("inf")] + [0.0] * 255,
        [float("-inf")] + [1.0] * 255,
        [float("inf"), float("-inf")] + [0.0] * 254,  # the sum is NaN, not infinite
    ],
)
def test_infinities_are_refused(batched: Any, values: list[float]) -> None:
    handler = batched.entry.__self__
    bad = struct.pack("<256f", *values)
    with pytest.raises(ValueError, match=r"^request 0: the input holds a NaN or infinite"):
        handler.preprocess([{"body": bad}, {"body": SAMPLE_BIN}])


def test_huge_finite_values_whose_sum_overflows_are_accepted(batched: Any) -> None:
    handler = batched.entry.__self__
    huge = struct.pack("<256f", *([3.0e38] * 256))  # finite; their float32 sum is not
    batch = handler.preprocess([{"body": SAMPLE_BIN}, {"body": huge}])
    assert tuple(batch.shape) == (2, 256)
    assert bool(torch.isfinite(batch).all())


def test_wrong_length_body_fails_the_batch_in_the_worker(batched: Any) -> None:
    result = batched.infer([(SAMPLE_BIN, OCTET), (bytes(1000), OCTET)])
    # TorchServe's worker turns a handler exception into 503 "Prediction failed".
    assert (result.final.code, result.final.message) == (503, "Prediction failed")
    assert result.final.replies == []
