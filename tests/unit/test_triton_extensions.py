"""Triton's model configuration and statistics extensions, sans IO: the configuration derived
from declared tensors and batching (core/triton_config.py), the statistics counters
(core/model_stats.py), the batch hook of the in-flight book, and the gRPC messages, checked
by decoding their bytes with tritonclient's own protobuf classes (Triton's
model_config.proto and grpc_service.proto, compiled by NVIDIA: an independent decoder)."""

from __future__ import annotations

from typing import Any

import pytest
import tritonclient.grpc.model_config_pb2 as triton_config_pb2
import tritonclient.grpc.service_pb2 as triton_service_pb2
from google.protobuf import descriptor

from trioserve._proto import inference as ours
from trioserve.core.errors import ServeError
from trioserve.core.inflight import InFlight
from trioserve.core.messages import BatchReply, Reply
from trioserve.core.model_stats import ModelStats
from trioserve.core.oip.raw import TensorMeta
from trioserve.core.triton_config import Batching, triton_config, triton_type
from trioserve.grpc.triton import config_response, statistics_response
from trioserve.runtime.triton import VersionStats

X = TensorMeta("x", "FP32", (-1, 3))
TEXT = TensorMeta("text", "BYTES", (1,))


def config(batching: Batching, inputs: tuple[TensorMeta, ...] = (X,)) -> Any:
    return triton_config(
        name="m", platform="p", backend="b", inputs=inputs, outputs=(TEXT,), batching=batching
    )


# -- configuration ------------------------------------------------------------------------


def test_datatypes_are_tritons_names() -> None:
    assert triton_type("FP32") == "TYPE_FP32"
    assert triton_type("BYTES") == "TYPE_STRING"
    assert triton_type("BF16") == "TYPE_BF16"
    assert triton_type("COMPLEX") == "TYPE_INVALID"


def test_a_model_that_does_not_batch() -> None:
    body = config(Batching()).json()
    assert body["max_batch_size"] == 0
    assert body["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1, 3]}]
    assert body["output"] == [{"name": "text", "data_type": "TYPE_STRING", "dims": [1]}]
    assert "dynamic_batching" not in body and "sequence_batching" not in body
    assert body["model_transaction_policy"] == {"decoupled": False}


def test_merging_along_the_first_dimension_makes_it_the_batch_dimension() -> None:
    body = config(Batching(batch_size=8, window_us=200_000, merges_first_dim=True)).json()
    assert body["max_batch_size"] == 8
    assert body["input"][0]["dims"] == [3]
    assert body["output"][0]["dims"] == []
    assert body["dynamic_batching"] == {"max_queue_delay_microseconds": 200_000}


def test_batching_requests_without_merging_keeps_the_whole_shape() -> None:
    body = config(Batching(batch_size=4, window_us=50_000)).json()
    assert body["max_batch_size"] == 0
    assert body["input"][0]["dims"] == [-1, 3]
    assert body["dynamic_batching"] == {"max_queue_delay_microseconds": 50_000}


def test_a_stateful_model_shows_sequence_batching_only() -> None:
    body = config(Batching(batch_size=4, window_us=1000, sequence_idle_us=0)).json()
    assert body["sequence_batching"] == {"max_sequence_idle_microseconds": 0}
    assert "dynamic_batching" not in body


def test_decoupled_and_no_declared_inputs() -> None:
    body = config(Batching(decoupled=True), inputs=()).json()
    assert body["input"] == []
    assert body["model_transaction_policy"] == {"decoupled": True}


# -- statistics ---------------------------------------------------------------------------


def test_statistics_accumulate() -> None:
    stats = ModelStats()
    stats.request_succeeded(total_ns=1000, queue_ns=100, now_ms=5)
    stats.request_succeeded(total_ns=3000, queue_ns=300, now_ms=7)
    stats.request_failed(total_ns=50, now_ms=9)
    stats.batch_done(2, compute_ns=400)
    stats.batch_done(1, compute_ns=100)
    stats.batch_done(2, compute_ns=600)
    body = stats.json("m", "1")
    assert (body["name"], body["version"], body["last_inference"]) == ("m", "1", 9)
    assert (body["inference_count"], body["execution_count"]) == (5, 3)
    infer = body["inference_stats"]
    assert infer["success"] == {"count": 2, "ns": 4000}
    assert infer["fail"] == {"count": 1, "ns": 50}
    assert infer["queue"] == {"count": 2, "ns": 400}
    # Each request of a batch is counted with the batch's time.
    assert infer["compute_infer"] == {"count": 5, "ns": 2 * 400 + 100 + 2 * 600}
    # perf_analyzer needs the three compute counts equal.
    assert infer["compute_input"] == infer["compute_output"] == {"count": 5, "ns": 0}
    assert body["batch_stats"] == [
        {
            "batch_size": 1,
            "compute_input": {"count": 1, "ns": 0},
            "compute_infer": {"count": 1, "ns": 100},
            "compute_output": {"count": 1, "ns": 0},
        },
        {
            "batch_size": 2,
            "compute_input": {"count": 2, "ns": 0},
            "compute_infer": {"count": 2, "ns": 1000},
            "compute_output": {"count": 2, "ns": 0},
        },
    ]


class FakeJob:
    def __init__(self, request_id: str, on_deliver: Any = None) -> None:
        self.request_id = request_id
        self.final: list[bool] = []
        self.on_deliver = on_deliver

    def start(self, on_cancel: Any) -> None:
        pass

    def unstart(self) -> None:
        pass

    def deliver(self, reply: Reply, *, final: bool) -> None:
        self.final.append(final)
        if self.on_deliver is not None:
            self.on_deliver()

    def fail(self, error: ServeError) -> None:
        pass


def _reply(batch_id: int, ids: list[str], *, final: bool = True, code: int = 200) -> BatchReply:
    replies = [Reply(request_id=i, status=200, reason="OK", headers={}, body=b"") for i in ids]
    return BatchReply(batch_id=batch_id, code=code, message="", final=final, replies=replies)


def test_the_in_flight_book_reports_each_answered_batch_with_its_run_time() -> None:
    now = [10.0]
    ended: list[tuple[int, float]] = []
    book: InFlight[FakeJob] = InFlight(
        on_cancel=lambda _id: None,
        clock=lambda: now[0],
        on_batch_end=lambda size, seconds: ended.append((size, seconds)),
    )

    def adapter_writes() -> None:  # an adapter answering from the delivery takes its time
        now[0] += 5.0

    first = book.send([FakeJob("a", adapter_writes), FakeJob("b")])
    now[0] = 10.5
    assert not book.reply(_reply(first, ["a"], final=False))  # an intermediate answer
    assert ended == []
    now[0] = 11.0
    assert book.reply(_reply(first, ["a", "b"]))
    assert ended == [(2, 1.0)]  # the worker's time, not the adapter's writing
    failed = book.send([FakeJob("c")])
    assert book.reply(_reply(failed, ["c"], code=500))
    assert ended == [(2, 1.0)]  # a failed batch is no execution


# -- gRPC messages, decoded by Triton's own classes ---------------------------------------


def test_the_config_message_decodes_with_tritons_model_config_proto() -> None:
    value = config(Batching(batch_size=8, window_us=200_000, merges_first_dim=True))
    wire = bytes(config_response(value))
    decoded = triton_service_pb2.ModelConfigResponse.FromString(wire).config
    assert (decoded.name, decoded.platform, decoded.backend) == ("m", "p", "b")
    assert decoded.max_batch_size == 8
    assert [(i.name, i.data_type, list(i.dims)) for i in decoded.input] == [
        ("x", triton_config_pb2.TYPE_FP32, [3])
    ]
    assert [(o.name, o.data_type, list(o.dims)) for o in decoded.output] == [
        ("text", triton_config_pb2.TYPE_STRING, [])
    ]
    assert decoded.WhichOneof("scheduling_choice") == "dynamic_batching"
    assert decoded.dynamic_batching.max_queue_delay_microseconds == 200_000
    assert decoded.model_transaction_policy.decoupled is False

    stateful = config(Batching(sequence_idle_us=5_000_000, decoupled=True))
    decoded = triton_service_pb2.ModelConfigResponse.FromString(
        bytes(config_response(stateful))
    ).config
    assert decoded.WhichOneof("scheduling_choice") == "sequence_batching"
    assert decoded.sequence_batching.max_sequence_idle_microseconds == 5_000_000
    assert decoded.model_transaction_policy.decoupled is True


def test_the_statistics_message_decodes_with_tritons_grpc_service_proto() -> None:
    stats = ModelStats()
    stats.request_succeeded(total_ns=2_000, queue_ns=500, now_ms=1_700_000_000_000)
    stats.request_failed(total_ns=70, now_ms=1_700_000_000_001)
    stats.batch_done(3, compute_ns=900)
    wire = bytes(statistics_response([VersionStats("m", "1", stats)]))
    (decoded,) = triton_service_pb2.ModelStatisticsResponse.FromString(wire).model_stats
    assert (decoded.name, decoded.version) == ("m", "1")
    assert decoded.last_inference == 1_700_000_000_001
    assert (decoded.inference_count, decoded.execution_count) == (3, 1)
    infer = decoded.inference_stats
    assert (infer.success.count, infer.success.ns) == (1, 2_000)
    assert (infer.fail.count, infer.fail.ns) == (1, 70)
    assert (infer.queue.count, infer.queue.ns) == (1, 500)
    assert (infer.compute_infer.count, infer.compute_infer.ns) == (3, 2_700)
    assert (infer.compute_input.count, infer.compute_output.count) == (3, 3)
    (batch,) = decoded.batch_stats
    assert (batch.batch_size, batch.compute_infer.count, batch.compute_infer.ns) == (3, 1, 900)


TRITON_MESSAGES = [
    ("ModelInput", triton_config_pb2.ModelInput),
    ("ModelOutput", triton_config_pb2.ModelOutput),
    ("ModelDynamicBatching", triton_config_pb2.ModelDynamicBatching),
    ("ModelSequenceBatching", triton_config_pb2.ModelSequenceBatching),
    ("ModelTransactionPolicy", triton_config_pb2.ModelTransactionPolicy),
    ("ModelConfig", triton_config_pb2.ModelConfig),
    ("ModelConfigRequest", triton_service_pb2.ModelConfigRequest),
    ("ModelConfigResponse", triton_service_pb2.ModelConfigResponse),
    ("ModelStatisticsRequest", triton_service_pb2.ModelStatisticsRequest),
    ("StatisticDuration", triton_service_pb2.StatisticDuration),
    ("InferStatistics", triton_service_pb2.InferStatistics),
    ("InferBatchStatistics", triton_service_pb2.InferBatchStatistics),
    ("ModelStatistics", triton_service_pb2.ModelStatistics),
    ("ModelStatisticsResponse", triton_service_pb2.ModelStatisticsResponse),
]


@pytest.mark.parametrize(("name", "triton"), TRITON_MESSAGES)
def test_every_field_we_declare_has_tritons_number_and_type(name: str, triton: Any) -> None:
    """Each field of our subset (proto/grpc_predict_v2.proto, as compiled by protoc) is the
    field of that name in Triton's message: same number, type and repetition."""
    ours_descriptor = _compiled_descriptor(name)
    theirs: descriptor.Descriptor = triton.DESCRIPTOR
    assert ours_descriptor, name
    for field_name, number, kind, repeated in ours_descriptor:
        field = theirs.fields_by_name[field_name]
        assert (field.number, field.type, _repeated(field)) == (number, kind, repeated), field_name


def _repeated(field: descriptor.FieldDescriptor) -> bool:
    return bool(field.is_repeated)


_COMPILED: dict[str, list[tuple[str, int, int, bool]]] = {}


def _compiled_descriptor(name: str) -> list[tuple[str, int, int, bool]]:
    if not _COMPILED:
        import subprocess
        import sys
        import tempfile
        from pathlib import Path

        from google.protobuf import descriptor_pb2

        repo = Path(__file__).resolve().parents[2]
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder) / "oip.pb"
            subprocess.run(
                [sys.executable, "-m", "grpc_tools.protoc", f"-I{repo / 'proto'}",
                 f"--descriptor_set_out={out}", "grpc_predict_v2.proto"],
                check=True, capture_output=True, timeout=60,
            )  # fmt: skip
            (proto,) = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
        label = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
        for message in proto.message_type:
            _COMPILED[message.name] = [
                (f.name, f.number, f.type, f.label == label) for f in message.field
            ]
    return _COMPILED[name]


def test_the_generated_datatype_enum_is_tritons() -> None:
    for member in ours.DataType:
        assert triton_config_pb2.DataType.Value(member.name) == member.value
