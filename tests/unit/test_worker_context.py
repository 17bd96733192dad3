"""``Context``: TorchServe's attributes and methods, plus ``is_cancelled``."""

from __future__ import annotations

import pytest

from trioserve.worker.torchserve.context import Context, RequestProcessor
from trioserve.worker.torchserve.metrics import MetricsCache


def make_context() -> Context:
    return Context("resnet", "/models/resnet", {"model": {"modelName": "resnet"}}, 4, 1, "0.12.0")


def batch_context() -> Context:
    ctx = Context("m", "/d", None, 2, None, "0.12.0", metrics=MetricsCache("m"))
    ctx.begin_batch(
        ["id-0", "id-1"],
        [
            {"body": {"content-type": "application/json"}, "Content-Type": "application/json"},
            {"ts_request_sequence_id": "seq-1", "explain": "False"},
        ],
    )
    return ctx


def test_constructor_is_torchserve_compatible() -> None:
    ctx = Context(
        "resnet",
        "/models/resnet",
        {"model": {"modelName": "resnet"}},
        4,
        1,
        "0.12.0",
        False,
        None,
        {"handler": {"k": 1}},
    )
    assert ctx.model_name == "resnet"
    assert ctx.manifest == {"model": {"modelName": "resnet"}}
    assert ctx.system_properties == {
        "model_dir": "/models/resnet",
        "gpu_id": 1,
        "batch_size": 4,
        "server_name": "MMS",
        "server_version": "0.12.0",
        "limit_max_image_pixels": False,
    }
    assert ctx.model_yaml_config == {"handler": {"k": 1}}
    assert ctx.metrics is None
    assert ctx.request_ids is None
    assert ctx.request_processor is None
    assert ctx.stopping_criteria is None
    assert ctx.cl_socket is None


def test_cache_is_the_handlers_own_and_outlives_batches() -> None:
    ctx = batch_context()
    assert ctx.cache == {}
    ctx.cache["seq-1"] = 3
    ctx.end_batch()
    ctx.begin_batch(["id-2"], [{}])
    assert ctx.cache == {"seq-1": 3}
    ctx.cache = {"replaced": True}  # as TorchServe's stateful examples do in initialize
    assert ctx.cache == {"replaced": True}


def test_defaults() -> None:
    ctx = make_context()
    assert ctx.model_yaml_config == {}
    assert ctx.system_properties["limit_max_image_pixels"] is True
    assert ctx.get_request_id() is None
    assert ctx.is_cancelled() is False


def test_sequence_header_names_default_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TS_REQUEST_SEQUENCE_ID", "TS_REQUEST_SEQUENCE_START", "TS_REQUEST_SEQUENCE_END"):
        monkeypatch.delenv(var, raising=False)
    ctx = make_context()
    assert ctx.header_key_sequence_id == "ts_request_sequence_id"
    assert ctx.header_key_sequence_start == "ts_request_sequence_start"
    assert ctx.header_key_sequence_end == "ts_request_sequence_end"
    monkeypatch.setenv("TS_REQUEST_SEQUENCE_ID", "my_seq")
    monkeypatch.setenv("TS_REQUEST_SEQUENCE_START", "my_start")
    monkeypatch.setenv("TS_REQUEST_SEQUENCE_END", "my_end")
    ctx = make_context()
    assert (
        ctx.header_key_sequence_id,
        ctx.header_key_sequence_start,
        ctx.header_key_sequence_end,
    ) == ("my_seq", "my_start", "my_end")
    ctx.begin_batch(["r"], [{"my_seq": "s-9", "ts_request_sequence_id": "other"}])
    assert ctx.get_sequence_id(0) == "s-9"


def test_request_side() -> None:
    ctx = batch_context()
    assert ctx.request_ids == {0: "id-0", 1: "id-1"}
    assert ctx.get_request_id() == "id-0"
    assert ctx.get_request_id(1) == "id-1"
    assert ctx.get_request_id(5) is None
    assert ctx.get_request_header(0, "Content-Type") == "application/json"
    assert ctx.get_request_header(0, "body") == {"content-type": "application/json"}
    assert ctx.get_request_header(1, "missing") is None
    assert ctx.get_all_request_header(1) == {"ts_request_sequence_id": "seq-1", "explain": "False"}
    assert ctx.get_sequence_id(1) == "seq-1"
    assert ctx.get_sequence_id(0) is None
    assert isinstance(ctx.request_processor, list)
    assert all(isinstance(p, RequestProcessor) for p in ctx.request_processor)
    # The metrics cache learns the batch's request ids.
    assert isinstance(ctx.metrics, MetricsCache)
    assert ctx.metrics.request_ids == {0: "id-0", 1: "id-1"}


def test_response_side() -> None:
    ctx = batch_context()
    assert ctx.get_response_status(0) == (200, None)
    ctx.set_response_status(404, "Nope", 1)
    assert ctx.get_response_status(1) == (404, "Nope")
    ctx.set_response_status(202)
    assert ctx.get_response_status(0) == (202, "")
    ctx.set_all_response_status(500, "Bad")
    assert [ctx.get_response_status(i) for i in range(2)] == [(500, "Bad"), (500, "Bad")]

    assert ctx.get_response_headers(0) == {}
    ctx.set_response_header(0, "x-a", "1")
    ctx.set_response_content_type(0, "text/csv")
    assert ctx.get_response_headers(0) == {"x-a": "1", "content-type": "text/csv"}
    assert ctx.get_response_content_type(0) == "text/csv"
    assert ctx.get_response_content_type(1) is None


def test_new_batch_resets_response_state() -> None:
    ctx = batch_context()
    ctx.set_response_status(418, "", 0)
    ctx.set_response_header(0, "x", "y")
    ctx.begin_batch(["n"], [{}])
    assert ctx.get_response_status(0) == (200, None)
    assert ctx.get_response_headers(0) == {}
    assert ctx.request_ids == {0: "n"}


def test_is_cancelled() -> None:
    cancelled = {"id-1"}
    ctx = Context("m", "/d", None, 2, None, "0.12.0")
    ctx.begin_batch(["id-0", "id-1"], [{}, {}], cancel_check=cancelled.__contains__)
    assert ctx.is_cancelled() is False
    assert ctx.is_cancelled(1) is True
    assert ctx.is_cancelled(9) is False
    cancelled.add("id-0")
    assert ctx.is_cancelled(0) is True


def test_channel_is_set_for_the_batch_only() -> None:
    ctx = Context("m", "/d", None, 1, None, "0.12.0")
    marker = object()
    ctx.begin_batch(["r"], [{}], channel=marker)
    assert ctx.cl_socket is marker
    ctx.end_batch()
    assert ctx.cl_socket is None


def test_request_state_outside_a_batch_is_a_clear_error() -> None:
    ctx = make_context()
    with pytest.raises(RuntimeError, match="no batch is being handled"):
        ctx.get_request_header(0, "x")
    ctx.set_response_status(500)  # tolerated, as in TorchServe


def test_request_header_lookup_ignores_letter_case() -> None:
    from trioserve.worker.torchserve.context import RequestProcessor

    processor = RequestProcessor({"content-type": "text/plain", "X-A": "1"})
    assert processor.get_request_property("Content-Type") == "text/plain"
    assert processor.get_request_property("x-a") == "1"
    assert processor.get_request_property("missing") is None


def test_request_header_lookup_follows_edits_to_the_header_dict() -> None:
    """Lookups in any letter case see names a handler adds, removes or renames in the dict
    that get_request_properties returns, also after earlier lookups (and misses)."""
    from trioserve.worker.torchserve.context import RequestProcessor

    processor = RequestProcessor({"x-a": "1", "X-A": "2", "b": "3"})
    assert processor.get_request_property("X-a") == "1"  # the first name in order wins
    assert processor.get_request_property("X-Late") is None
    headers = processor.get_request_properties()
    headers["x-late"] = "4"
    assert processor.get_request_property("X-Late") == "4"
    del headers["x-a"]
    assert processor.get_request_property("X-a") == "2"
    headers["X-A"] = "5"  # a new value under the same name
    assert processor.get_request_property("x-A") == "5"
    del headers["X-A"]
    headers["Other"] = "6"  # as many names as before, but different ones
    assert processor.get_request_property("x-a") is None
    assert processor.get_request_property("OTHER") == "6"
