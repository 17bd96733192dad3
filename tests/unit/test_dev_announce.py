"""trioserve dev: the curl line and the status lines it prints."""

from __future__ import annotations

import json
import shlex
from pathlib import PurePath

from trioserve.archive import TensorDeclaration
from trioserve.dev.announce import (
    changed,
    curl_command,
    load_failed,
    oip_body,
    reloaded,
    superseded,
)


def test_the_curl_line_of_a_handler_carries_the_key_and_the_sample() -> None:
    line = curl_command(
        "http://127.0.0.1:8080",
        "my model",
        key="Ab-3_x9Z",
        oip=False,
        sample=PurePath("/data/it's here/sample.json"),
    )
    assert shlex.split(line) == [
        "curl", "-sS", "-X", "POST", "http://127.0.0.1:8080/predictions/my%20model",
        "-H", "Authorization: Bearer Ab-3_x9Z",
        "-H", "Content-Type: application/json",
        "--data-binary", "@/data/it's here/sample.json",
    ]  # fmt: skip


def test_without_tokens_or_sample_it_posts_text() -> None:
    args = shlex.split(curl_command("http://0.0.0.0:9000/", "m", key=None, oip=False))
    assert args[4:] == [
        "http://127.0.0.1:9000/predictions/m",
        "-H", "Content-Type: text/plain",
        "--data-binary", "hello",
    ]  # fmt: skip


def test_an_image_sample_is_sent_with_its_type() -> None:
    args = shlex.split(
        curl_command("http://[::]:80", "m", key=None, oip=False, sample=PurePath("/s/sample.png"))
    )
    assert args[4] == "http://[::1]:80/predictions/m"
    assert "Content-Type: image/png" in args


def test_a_unix_socket_listener_is_reached_through_curl_s_option() -> None:
    args = shlex.split(curl_command("unix:/run/ts.sock", "m", key=None, oip=False))
    assert args[4:7] == ["--unix-socket", "/run/ts.sock", "http://localhost/predictions/m"]


def test_an_mlserver_model_gets_an_oip_request_built_from_its_inputs() -> None:
    inputs = (
        TensorDeclaration("x", "FP32", (-1, 3)),
        TensorDeclaration("prompt", "BYTES", (1,)),
        TensorDeclaration("flag", "BOOL", ()),
    )
    args = shlex.split(curl_command("http://127.0.0.1:1", "d", key="k", oip=True, inputs=inputs))
    assert args[4] == "http://127.0.0.1:1/v2/models/d/infer"
    assert json.loads(args[-1]) == {
        "inputs": [
            {"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [0, 0, 0]},
            {"name": "prompt", "shape": [1], "datatype": "BYTES", "data": ["hello"]},
            {"name": "flag", "shape": [1], "datatype": "BOOL", "data": [False]},
        ]
    }
    assert oip_body(())["inputs"][0]["name"] == "input-0"


def test_status_lines() -> None:
    assert reloaded("m", 0.42) == "[dev] reloaded m in 0.4 s"
    assert superseded("m") == "[dev] newer edits came while m was loading: reloading again"
    assert load_failed("SyntaxError: bad\n  File x\n") == (
        "[dev] load failed: SyntaxError: bad\n      File x"
    )
    assert load_failed("") == "[dev] load failed: unknown error"
    assert (
        changed({"b.py", "a.py", "c", "d"}) == "[dev] changed: a.py, b.py, c and 1 more; reloading"
    )
