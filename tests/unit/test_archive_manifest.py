"""MANIFEST.json and model-config.yaml parsing (spec §6.2, §6.3)."""

from __future__ import annotations

import json
import logging

import pytest

from trioserve.archive import (
    ArchiveError,
    Manifest,
    ModelConfig,
    parse_manifest,
    parse_model_config,
)

ARCHIVER_MANIFEST = {
    "createdOn": "21/11/2026 19:13:23",
    "runtime": "python",
    "model": {
        "modelName": "echo",
        "serializedFile": "model.pt",
        "handler": "echo_handler.py",
        "modelFile": "model.py",
        "modelVersion": "1.0",
        "requirementsFile": "requirements.txt",
        "configFile": "model-config.yaml",
    },
    "archiverVersion": "0.12.0",
}


def test_manifest_written_by_the_archiver() -> None:
    m = parse_manifest(json.dumps(ARCHIVER_MANIFEST, indent=2).encode())
    assert m == Manifest(
        model_name="echo",
        model_version="1.0",
        handler="echo_handler.py",
        runtime="python",
        serialized_file="model.pt",
        model_file="model.py",
        requirements_file="requirements.txt",
        config_file="model-config.yaml",
        raw=ARCHIVER_MANIFEST,
    )
    assert m.envelope is None
    assert m.description is None


def test_old_manifest_keys_are_kept_and_ignored() -> None:
    doc = {
        "modelServerVersion": "1.0",
        "implementationVersion": "1.0",
        "specificationVersion": "1.0",
        "description": "top level",
        "model": {
            "modelName": "noop",
            "version": "2.0",
            "handler": "service:handle",
            "envelope": "json",
        },
    }
    m = parse_manifest(json.dumps(doc).encode())
    assert m.model_name == "noop"
    assert m.model_version == "2.0"  # the older "version" key
    assert m.handler == "service:handle"
    assert m.envelope == "json"
    assert m.description == "top level"
    assert m.runtime == "python"  # default when absent
    assert m.raw["specificationVersion"] == "1.0"


def test_model_description_wins_over_top_level() -> None:
    doc = {"description": "top", "model": {"modelName": "a", "description": "model"}}
    assert parse_manifest(json.dumps(doc).encode()).description == "model"


def test_numeric_version_keeps_its_spelling() -> None:
    m = parse_manifest(b'{"model": {"modelName": "a", "modelVersion": 1.10}}')
    assert m.model_version == "1.10"


def test_bom_is_accepted() -> None:
    assert parse_manifest(b'\xef\xbb\xbf{"model": {"modelName": "a"}}').model_name == "a"


@pytest.mark.parametrize("runtime", ["python", "python3", "LSP"])
def test_valid_runtimes(runtime: str) -> None:
    assert parse_manifest(json.dumps({"runtime": runtime}).encode()).runtime == runtime


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe\x00", "not UTF-8"),
        (b"[1, 2]", "must hold a JSON object"),
        (b'{"runtime": "java"}', "invalid runtime 'java'"),
        (b'{"runtime": "Python"}', "invalid runtime 'Python'"),
        (b'{"model": "echo"}', "'model' must be an object"),
        (b'{"model": {"handler": ["a.py"]}}', "model.handler must be a string, got list"),
        (b'{"model": {"modelName": true}}', "model.modelName must be a string, got bool"),
    ],
)
def test_bad_manifest(data: bytes, message: str) -> None:
    with pytest.raises(ArchiveError, match=message) as info:
        parse_manifest(data)
    assert info.value.status == 400


def test_full_model_config() -> None:
    text = """
minWorkers: 1
maxWorkers: 4
batchSize: 8
maxBatchDelay: 50
responseTimeout: 300
startupTimeout: 600
jobQueueSize: 10
maxRetryTimeoutInSec: 30
clientTimeoutInMills: 1000
deviceType: GPU
deviceIds: [0, 2]
parallelType: tp
parallelLevel: 2
useJobTicket: true
sequenceBatching: yes
sequenceMaxIdleMSec: 5000
sequenceTimeoutMSec: 60000
maxSequenceJobQueueSize: 3
maxNumSequence: 4
continuousBatching: false
asyncCommunication: true
useVenv: false
handler:
  labels: index_to_name.json
  topk: 3
customKey: [1, 2]
"""
    config = parse_model_config(text)
    assert config == ModelConfig(
        min_workers=1,
        max_workers=4,
        batch_size=8,
        max_batch_delay=50,
        response_timeout=300,
        startup_timeout=600,
        job_queue_size=10,
        max_retry_timeout_in_sec=30,
        client_timeout_in_mills=1000,
        device_type="gpu",
        device_ids=(0, 2),
        parallel_type="tp",
        parallel_level=2,
        use_job_ticket=True,
        sequence_batching=True,
        sequence_max_idle_msec=5000,
        sequence_timeout_msec=60000,
        max_sequence_job_queue_size=3,
        max_num_sequence=4,
        continuous_batching=False,
        async_communication=True,
        use_venv=False,
        raw=config.raw,
    )
    assert config.raw["handler"] == {"labels": "index_to_name.json", "topk": 3}
    assert config.raw["customKey"] == [1, 2]


def test_unset_keys_are_none_and_bytes_are_accepted() -> None:
    config = parse_model_config(b"batchSize: 2\n")
    assert config.batch_size == 2
    assert config.min_workers is None
    assert config.use_job_ticket is None
    assert config.device_ids is None
    assert config.raw == {"batchSize": 2}


def test_empty_document_is_an_empty_mapping() -> None:
    assert parse_model_config("") == ModelConfig()
    assert parse_model_config("# only a comment\n").raw == {}


def test_torchrun_sets_parallel_level() -> None:
    config = parse_model_config("torchrun:\n  nproc-per-node: 4\n")
    assert config.parallel_level == 4
    explicit = parse_model_config("parallelLevel: 2\ntorchrun:\n  nproc-per-node: 4\n")
    assert explicit.parallel_level == 2


@pytest.mark.parametrize(
    ("line", "key", "shown"),
    [
        ("batchSize: '4'", "batchSize", "'4'"),
        ("batchSize: 4.0", "batchSize", "4.0"),
        ("minWorkers: true", "minWorkers", "True"),  # bool is not an int
        ("maxWorkers: -1", "maxWorkers", "-1"),
        ("responseTimeout: [1]", "responseTimeout", "[1]"),
        ("useJobTicket: 1", "useJobTicket", "1"),
        ("sequenceBatching: 'true'", "sequenceBatching", "'true'"),
        ("deviceType: tpu", "deviceType", "'tpu'"),
        ("parallelType: 3", "parallelType", "3"),
        ("deviceIds: [0, true]", "deviceIds", "[0, True]"),
        ("deviceIds: 0", "deviceIds", "0"),
        ("torchrun: {nproc-per-node: two}", "torchrun.nproc-per-node", "'two'"),
    ],
)
def test_wrong_types_are_ignored_with_a_warning(
    caplog: pytest.LogCaptureFixture, line: str, key: str, shown: str
) -> None:
    with caplog.at_level(logging.WARNING, logger="trioserve.archive"):
        config = parse_model_config(f"{line}\nmaxBatchDelay: 7\n")
    assert config.max_batch_delay == 7  # the good key next to it still counts
    fields = {k: v for k, v in vars(config).items() if k not in ("raw", "max_batch_delay")}
    assert set(fields.values()) == {None}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert f"ignoring {key}={shown}" in warnings[0].getMessage()
    assert key.split(".")[0] in config.raw  # still handed to the handler as written


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a\n- b\n", "must be a mapping of keys to values, got list"),
        ("just a string", "must be a mapping of keys to values, got str"),
        ("a: [1, 2\n", "not valid YAML"),
        ("!!python/object/apply:os.system ['true']\n", "not valid YAML"),
    ],
)
def test_bad_model_config(text: str, message: str) -> None:
    with pytest.raises(ArchiveError, match=message) as info:
        parse_model_config(text)
    assert info.value.status == 400
