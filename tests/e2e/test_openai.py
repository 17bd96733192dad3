"""The OpenAI-compatible API end to end, with the official ``openai`` client (sync and async)
and curl: the demo ``textgen`` (an MLServer runtime streaming words), a streaming test runtime
that proves the generator is closed when the client leaves, and a TorchServe handler whose
intermediate responses become the chunks."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from .server import HANDLERS, Server, archive

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
MODELS = Path(__file__).parent / "mlserver_models"


def _opt_in(folder: Path, name: str, section: dict[str, str]) -> None:
    """Name the MLServer model folder ``name`` and give it the ``openai`` section."""
    path = folder / "model-settings.json"
    settings = json.loads(path.read_text())
    settings["name"] = name
    settings.setdefault("parameters", {})["extra"] = {"openai": section}
    path.write_text(json.dumps(settings))


def _streamer(store: Path) -> None:
    """The test streamer runtime, opted in: input ``text``, output ``token``; and the
    folders the tests register through the management API: ``strict`` (the streamer with a
    chat template that refuses system messages), ``badopenai`` (a template that does not
    compile) and ``badoutput`` (textgen naming an output it does not have)."""
    streamer = {"input": "text", "output": "token", "separator": " "}
    shutil.copytree(MODELS / "streamer", store / "streamer")
    _opt_in(store / "streamer", "streamer", {**streamer, "chat_template": LAST_MESSAGE})
    shutil.copytree(MODELS / "streamer", store / "strict")
    _opt_in(store / "strict", "strict", {**streamer, "chat_template": NO_SYSTEM})
    shutil.copytree(ROOT / "handlers" / "textgen", store / "badopenai")
    _opt_in(store / "badopenai", "badopenai", {"chat_template": "{% for %}"})
    shutil.copytree(ROOT / "handlers" / "textgen", store / "badoutput")
    _opt_in(store / "badoutput", "badoutput", {"output": "nosuch", "separator": " "})


LAST_MESSAGE = "{{ messages[-1].content }}"
NO_SYSTEM = (  # refuses system messages through raise_exception
    "{% for m in messages %}{% if m.role == 'system' %}"
    "{{ raise_exception('this model takes no system message') }}{% endif %}"
    "{{ m.content }} {% endfor %}"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    store = tmp_path_factory.mktemp("openai-store")
    shutil.copytree(ROOT / "handlers" / "textgen", store / "textgen")
    _streamer(store)
    archive(store, "tsgen", "openai_handler.py", "-c", str(HANDLERS / "openai-config.yaml"))
    archive(store, "plain", "control_handler.py")
    work = tmp_path_factory.mktemp("openai")
    (work / "markers").mkdir()
    server = Server(
        work, store, "textgen=textgen,streamer=streamer,tsgen=tsgen.mar,plain=plain.mar",
        env={"TRIOSERVE_TEST_MARKERS": str(work / "markers")},
        properties={"enable_model_api": "true"},  # tests register models
    )  # fmt: skip
    server.start()
    yield server
    server.stop()
    server.kill()


CLIENTS: list[openai.OpenAI] = []


@pytest.fixture(autouse=True, scope="module")
def _close_clients() -> Iterator[None]:
    yield
    while CLIENTS:
        CLIENTS.pop().close()


def client(server: Server, api_key: str = "unused") -> openai.OpenAI:
    """An ``openai`` client of ``server`` (closed with the module)."""
    made = openai.OpenAI(base_url=f"{server.url}/v1", api_key=api_key, max_retries=0, timeout=30)
    CLIENTS.append(made)
    return made


def oip_text(server: Server, prompt: str, max_tokens: int) -> str:
    body = {"inputs": [{"name": "prompt", "shape": [1], "datatype": "BYTES", "data": [prompt]}],
            "parameters": {"max_tokens": max_tokens}}  # fmt: skip
    r = httpx.post(f"{server.url}/v2/models/textgen/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return str(r.json()["outputs"][0]["data"][0])


def test_completions_answer_what_the_model_answers_over_oip(server: Server) -> None:
    answer = client(server).completions.create(model="textgen", prompt="hello there", max_tokens=6)
    assert answer.object == "text_completion" and answer.id.startswith("cmpl-")
    assert answer.model == "textgen"
    choice = answer.choices[0]
    assert choice.text == oip_text(server, "hello there", 6)
    assert choice.finish_reason == "length"  # it made max_tokens pieces
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (2, 6)
    assert answer.usage.total_tokens == 8


def test_streamed_chat_deltas_join_to_the_whole_answer(server: Server) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    whole = client(server).chat.completions.create(
        model="textgen",
        messages=messages,
        max_completion_tokens=8,  # type: ignore[arg-type]
    )
    assert whole.object == "chat.completion" and whole.id.startswith("chatcmpl-")
    assert whole.choices[0].message.role == "assistant"
    text = whole.choices[0].message.content
    assert text and len(text.split()) == 8
    stream = client(server).chat.completions.create(
        model="textgen", messages=messages, max_completion_tokens=8, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    deltas = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert deltas == text
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finishing] == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 8
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


def test_stop_strings_cut_the_text_across_pieces(server: Server) -> None:
    full = oip_text(server, "hello there", 12)
    words = full.split()
    # a stop string that spans two streamed words
    stop = f"{words[3][-1]} {words[4][:2]}"
    expected = full[: full.index(stop)]
    api = client(server)
    answer = api.completions.create(
        model="textgen", prompt="hello there", max_tokens=12, stop=[stop]
    )
    assert answer.choices[0].text == expected
    assert answer.choices[0].finish_reason == "stop"
    streamed = api.completions.create(
        model="textgen", prompt="hello there", max_tokens=12, stop=stop, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == expected


def test_async_client_streams_and_lists(server: Server) -> None:
    async def run() -> tuple[list[str], str]:
        api = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        stream = await api.completions.create(
            model="textgen", prompt="async please", max_tokens=4, stream=True
        )
        pieces = [chunk.choices[0].text async for chunk in stream]
        models = await api.models.list()
        await api.close()
        return pieces, ",".join(sorted(m.id for m in models.data))

    pieces, ids = asyncio.run(run())
    assert "".join(pieces) == oip_text(server, "async please", 4)
    assert ids == "streamer,textgen,tsgen"  # the models that opted in


def test_models_list_keeps_kserve_v1s_shape_and_retrieve_works(server: Server) -> None:
    body = httpx.get(f"{server.url}/v1/models", timeout=30).json()
    assert sorted(body["models"]) == ["plain", "streamer", "textgen", "tsgen"]
    assert body["object"] == "list"
    model = client(server).models.retrieve("textgen")
    assert (model.id, model.object, model.owned_by) == ("textgen", "model", "trioserve")
    v1 = httpx.get(f"{server.url}/v1/models/textgen", timeout=30).json()
    assert v1["name"] == "textgen" and v1["ready"] is True


def test_leaving_mid_stream_closes_the_generator_in_the_worker(server: Server) -> None:
    stream = client(server).completions.create(
        model="streamer", prompt="forever", stream=True, extra_body={"ignored": 1}
    )
    first = [next(iter(stream)) for _ in range(3)]
    answer_id = first[0].id
    assert [c.choices[0].text for c in first] == ["tick0", " tick1", " tick2"]
    marker = Path(server.workdir, "markers", f"closed-{answer_id}")
    assert not marker.exists()
    stream.close()
    deadline = time.monotonic() + 10
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "the model's generator was not closed"
    produced = json.loads(marker.read_text())["produced"]
    assert 3 <= produced < 200


def test_an_error_mid_stream_is_an_error_event_the_client_raises(server: Server) -> None:
    stream = client(server).chat.completions.create(
        model="streamer", messages=[{"role": "user", "content": "one two boom"}], stream=True
    )
    got: list[str] = []

    def read() -> None:
        for chunk in stream:
            got.append(chunk.choices[0].delta.content or "")

    with pytest.raises(openai.APIError, match="boom"):
        read()
    assert "".join(got) == "one two"


def test_a_model_failing_before_its_first_piece_answers_with_the_errors_status(
    server: Server,
) -> None:
    with pytest.raises(openai.APIStatusError, match="boom") as failed:
        client(server).completions.create(model="streamer", prompt="boom", stream=True)
    assert failed.value.status_code >= 400
    assert failed.value.response.headers["content-type"].startswith("application/json")


def test_a_torchserve_handler_streams_its_intermediate_responses(server: Server) -> None:
    api = client(server)
    whole = api.chat.completions.create(
        model="tsgen", messages=[{"role": "user", "content": "a b c"}]
    )
    assert whole.choices[0].message.content == "c b a ."
    assert whole.usage is not None and whole.usage.completion_tokens == 4
    stream = api.chat.completions.create(
        model="tsgen", messages=[{"role": "user", "content": "a b c"}], stream=True
    )
    pieces = [c.choices[0].delta.content for c in stream if c.choices[0].delta.content]
    assert pieces == ["c ", "b ", "a ", "."]
    limited = api.completions.create(model="tsgen", prompt="a b c d", max_tokens=2)
    assert limited.choices[0].text == "d c "
    assert limited.choices[0].finish_reason == "length"
    with pytest.raises(openai.InternalServerError):
        api.completions.create(model="tsgen", prompt="fail")


def test_errors_are_openais_objects_and_status_codes(server: Server) -> None:
    api = client(server)
    with pytest.raises(openai.NotFoundError) as missing:
        api.completions.create(model="nope", prompt="x")
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError, match="openai"):
        api.completions.create(model="plain", prompt="x")  # not opted in
    with pytest.raises(openai.BadRequestError) as bad:
        api.completions.create(model="textgen", prompt="x", n=2)
    assert bad.value.param == "n"
    with pytest.raises(openai.BadRequestError, match="image inputs are not supported"):
        api.chat.completions.create(
            model="textgen",
            messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}],
        )  # fmt: skip
    with pytest.raises(openai.BadRequestError, match="function calling"):
        api.chat.completions.create(
            model="textgen", messages=[{"role": "user", "content": "x"}],
            tools=[{"type": "function", "function": {"name": "f"}}],
        )  # fmt: skip
    r = httpx.post(f"{server.url}/v1/chat/completions", content=b"{not json", timeout=30)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and "not valid JSON" in error["message"]


def register(server: Server, folder: str) -> httpx.Response:
    return httpx.post(
        f"{server.management_url}/models",
        params={"url": folder, "initial_workers": "1", "synchronous": "true"},
        timeout=60,
    )


def test_a_chat_template_that_refuses_the_messages_is_a_400(server: Server) -> None:
    assert register(server, "strict").status_code == 200
    try:
        api = client(server)
        words = [{"role": "user", "content": "two words"}]
        stream = api.chat.completions.create(model="strict", messages=words, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == (
            "two words"
        )
        system = [{"role": "system", "content": "be brief"}, *words]
        for streamed in (False, True):
            with pytest.raises(openai.BadRequestError) as refused:
                api.chat.completions.create(model="strict", messages=system, stream=streamed)
            assert refused.value.param == "messages"
            assert "this model takes no system message" in refused.value.message
    finally:
        httpx.delete(f"{server.management_url}/models/strict", timeout=60)


def test_a_malformed_openai_section_fails_the_registration(server: Server) -> None:
    answer = register(server, "badopenai")
    assert answer.status_code == 400, answer.text
    message = answer.json()["message"]
    assert "model-settings.json of badopenai: openai.chat_template does not compile" in message
    listed = httpx.get(f"{server.url}/v1/models", timeout=30).json()
    assert "badopenai" not in listed["models"]


def test_a_model_without_the_configured_output_is_a_500_naming_it(server: Server) -> None:
    assert register(server, "badoutput").status_code == 200
    try:
        api = client(server)
        hello = [{"role": "user", "content": "hello"}]
        with pytest.raises(openai.InternalServerError, match="BYTES output 'nosuch'"):
            api.chat.completions.create(model="badoutput", messages=hello, max_tokens=2)
    finally:
        httpx.delete(f"{server.management_url}/models/badoutput", timeout=60)


def test_the_app_answers_the_paths_the_fast_path_hands_on(server: Server) -> None:
    """A percent-encoded path is not matched by the fast path: the Quart view answers it,
    whole and streamed, and its 404 is OpenAI's error object."""
    url = f"{server.url}/v1/chat/%63ompletions"
    body = {"model": "textgen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    whole = httpx.post(url, json=body, timeout=30)
    assert whole.status_code == 200, whole.text
    assert len(whole.json()["choices"][0]["message"]["content"].split()) == 3
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=30) as streamed:
        assert streamed.headers["content-type"].startswith("text/event-stream")
        events = b"".join(streamed.iter_bytes()).split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    assert len(events) == 2 + 5  # the role chunk, 3 words, the finish chunk
    missing = httpx.post(url, json={**body, "model": "nosuchmodel"}, timeout=30)
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"


def test_curl_sees_the_sse_bytes(server: Server) -> None:
    body = json.dumps({"model": "textgen", "prompt": "curl", "max_tokens": 3, "stream": True})
    out = subprocess.run(
        ["curl", "-sN", "-H", "Content-Type: application/json", "-d", body,
         f"{server.url}/v1/completions"],
        capture_output=True, check=True, timeout=30,
    ).stdout  # fmt: skip
    events = out.split(b"\n\n")
    assert events[-1] == b"" and events[-2] == b"data: [DONE]"
    chunks = [json.loads(e.removeprefix(b"data: ")) for e in events[:-2]]
    assert all(e.startswith(b"data: {") for e in events[:-2])
    assert [c["object"] for c in chunks] == ["text_completion"] * 4
    assert "".join(c["choices"][0]["text"] for c in chunks) == oip_text(server, "curl", 3)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_with_tokens_a_wrong_key_is_an_authentication_error(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    shutil.copytree(ROOT / "handlers" / "textgen", store / "textgen")
    (tmp_path / "w").mkdir()
    server = Server(tmp_path / "w", store, "textgen=textgen", tokens=True)
    server.start()
    try:
        wrong = client(server, "wrong")
        with pytest.raises(openai.AuthenticationError) as refused:
            wrong.chat.completions.create(
                model="textgen", messages=[{"role": "user", "content": "x"}]
            )
        assert refused.value.code == "invalid_api_key"
        right = client(server, server.key("inference"))
        answer = right.chat.completions.create(
            model="textgen", messages=[{"role": "user", "content": "x"}], max_tokens=2
        )
        assert len((answer.choices[0].message.content or "").split()) == 2
    finally:
        server.stop()
        server.kill()
