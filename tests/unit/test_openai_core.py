"""The OpenAI API's sans-IO parts: requests, stop strings, the model mapping, the answers."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trioserve.core.openai import answers
from trioserve.core.openai.errors import OpenAIError
from trioserve.core.openai.mapping import MappingError, mapping_of, parse_mapping
from trioserve.core.openai.requests import parse_chat, parse_completion
from trioserve.core.openai.stops import PieceCounter, StopScanner


def body(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

# -- requests ----------------------------------------------------------------------------


def test_a_completion_request_is_read_with_every_setting() -> None:
    g = parse_completion(
        body(model="m", prompt=["once"], max_tokens=5, stop="\n", temperature=0.5, top_p=1,
             seed=7, presence_penalty=-1, stream=True, stream_options={"include_usage": True},
             user="u", unknown_field=1)
    )  # fmt: skip
    assert (g.kind, g.model, g.prompt, g.max_tokens, g.stop) == (
        "completion",
        "m",
        "once",
        5,
        ("\n",),
    )
    assert g.stream and g.include_usage
    assert g.sampling == {"temperature": 0.5, "top_p": 1, "seed": 7, "presence_penalty": -1}


def test_chat_content_parts_are_joined_and_max_completion_tokens_wins() -> None:
    g = parse_chat(
        body(model="m", max_tokens=3, max_completion_tokens=9, messages=[
            {"role": "developer", "content": [{"type": "text", "text": "a"},
                                              {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": None},
        ])
    )  # fmt: skip
    assert g.messages == (
        {"role": "developer", "content": "ab"},
        {"role": "assistant", "content": ""},
    )
    assert g.max_tokens == 9


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"prompt": "x"}, "model", "'model' is required"),
        ({"model": "m"}, "prompt", "'prompt' is required"),
        ({"model": "m", "prompt": ["a", "b"]}, "prompt", "several prompts"),
        ({"model": "m", "prompt": [1, 2]}, "prompt", "token ids"),
        ({"model": "m", "prompt": "x", "n": 3}, "n", "'n' must be 1"),
        ({"model": "m", "prompt": "x", "max_tokens": 0}, "max_tokens", "at least 1"),
        ({"model": "m", "prompt": "x", "max_tokens": True}, "max_tokens", "integer"),
        ({"model": "m", "prompt": "x", "stop": ["a"] * 5}, "stop", "at most 4"),
        ({"model": "m", "prompt": "x", "stop": 3}, "stop", "string or a list"),
        ({"model": "m", "prompt": "x", "stop": "s" * 257}, "stop", "at most 256 characters"),
        ({"model": "m", "prompt": "x", "temperature": 3}, "temperature", "from 0 to 2"),
        ({"model": "m", "prompt": "x", "top_p": -0.1}, "top_p", "from 0 to 1"),
        ({"model": "m", "prompt": "x", "seed": 1.5}, "seed", "integer"),
        ({"model": "m", "prompt": "x", "stream": "yes"}, "stream", "true or false"),
        ({"model": "m", "prompt": "x", "stream_options": {}}, "stream_options", "only allowed"),
        ({"model": "m", "prompt": "x", "echo": True}, "echo", "not supported"),
        ({"model": "m", "prompt": "x", "suffix": "s"}, "suffix", "not supported"),
        ({"model": "m", "prompt": "x", "best_of": 2}, "best_of", "not supported"),
        ({"model": "m", "prompt": "x", "logprobs": 2}, "logprobs", "not supported"),
        ({"model": "m", "prompt": "x", "logit_bias": {"1": 2}}, "logit_bias", "not supported"),
    ],
)
def test_a_bad_completion_request_names_its_field(
    fields: dict[str, Any], param: str, words: str
) -> None:
    with pytest.raises(OpenAIError) as refused:
        parse_completion(json.dumps(fields).encode())
    assert refused.value.status == 400 and refused.value.param == param
    assert words in refused.value.message


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"messages": []}, "messages", "non-empty list"),
        ({"messages": "hi"}, "messages", "non-empty list"),
        ({"messages": ["hi"]}, "messages[0]", "an object"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "must be one of"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "string or a list"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
         "messages[0].content[0]", "image inputs are not supported"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
         "messages[0].content[0]", "not supported"),
        ({"tools": [{"type": "function"}]}, "tools", "function calling"),
        ({"functions": [{"name": "f"}]}, "functions", "function calling"),
        ({"tool_choice": "auto"}, "tool_choice", "function calling"),
        ({"response_format": {"type": "json_object"}}, "response_format", "not supported"),
        ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{}]}]},
         "messages[0].tool_calls", "function calling"),
    ],
)  # fmt: skip
def test_a_bad_chat_request_names_its_field(fields: dict[str, Any], param: str, words: str) -> None:
    with pytest.raises(OpenAIError) as refused:
        parse_chat(json.dumps({**CHAT, **fields}).encode())
    assert refused.value.param == param and words in refused.value.message


@pytest.mark.parametrize("raw", [b"{", b"[1]", b"\xff", b""])
def test_a_body_that_is_not_a_json_object_is_refused(raw: bytes) -> None:
    with pytest.raises(OpenAIError) as refused:
        parse_chat(raw)
    assert refused.value.status == 400 and refused.value.param is None


def test_the_error_object_has_openais_fields() -> None:
    error = OpenAIError(404, "gone", param="model", code="model_not_found")
    assert json.loads(error.body()) == {
        "error": {"message": "gone", "type": "invalid_request_error", "param": "model",
                  "code": "model_not_found"},
    }  # fmt: skip
    assert OpenAIError(503, "busy").type == "server_error"
    assert OpenAIError(401, "who").type == "authentication_error"


# -- stop strings ------------------------------------------------------------------------


def cut(text: str, stops: list[str]) -> tuple[str, bool]:
    found = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return (text[: min(found)], True) if found else (text, False)


@given(
    pieces=st.lists(st.text(alphabet="abc", max_size=4), max_size=12),
    stops=st.lists(st.text(alphabet="abc", min_size=1, max_size=4), max_size=4),
)
def test_the_text_let_out_is_the_whole_text_cut_at_the_earliest_stop(
    pieces: list[str], stops: list[str]
) -> None:
    scanner = StopScanner(tuple(stops))
    out = []
    for piece in pieces:
        out.append(scanner.feed(piece))
        if scanner.stopped:
            break
    out.append(scanner.flush())
    assert ("".join(out), scanner.stopped) == cut("".join(pieces), stops)


@given(
    pieces=st.lists(st.text(alphabet="ab ", max_size=3), max_size=10),
    stops=st.lists(st.text(alphabet="ab ", min_size=1, max_size=3), max_size=2),
)
def test_nothing_let_out_is_taken_back(pieces: list[str], stops: list[str]) -> None:
    """Each piece of output is final: the output so far is always a prefix of the answer."""
    scanner = StopScanner(tuple(stops))
    expected, _ = cut("".join(pieces), stops)
    so_far, fed = "", ""
    for piece in pieces:
        fed += piece
        so_far += scanner.feed(piece)
        assert expected.startswith(so_far)
        held = len(fed) - len(so_far)  # never more than the longest stop string less one
        assert scanner.stopped or held < max((len(s) for s in stops), default=1)


def test_the_counter_joins_pieces_and_stops_at_max_tokens() -> None:
    counter = PieceCounter((), 3, " ")
    assert [counter.feed(w) for w in ("a", "b", "c")] == ["a", " b", " c"]
    assert counter.done and counter.finish_reason == "length" and counter.tokens == 3
    assert counter.feed("d") == ""
    short = PieceCounter(("b",), 10, " ")
    assert short.feed("a") + short.feed("b") == "a "
    assert short.done and short.finish_reason == "stop"
    ended = PieceCounter((), None)
    ended.feed("x")
    assert not ended.done and ended.finish_reason == "stop"


# -- the mapping -------------------------------------------------------------------------


def test_a_model_opts_in_with_an_openai_section() -> None:
    folder = {"parameters": {"extra": {"openai": {"separator": " ", "output": "out"}}}}
    mapping = mapping_of(folder, {})
    assert mapping is not None
    assert (mapping.input, mapping.output, mapping.separator) == ("prompt", "out", " ")
    assert mapping_of({"parameters": {"extra": {}}}, {"openai": {}}) is None  # a folder's own
    assert mapping_of(None, {"openai": None}) is not None  # `openai:` alone takes the defaults
    assert mapping_of(None, {"minWorkers": 1}) is None


@pytest.mark.parametrize(
    ("section", "words"),
    [
        ({"inputs": "x"}, "unknown key(s) in the openai section: inputs"),
        ({"input": ""}, "openai.input must be a non-empty string"),
        ({"separator": 1}, "openai.separator must be a string"),
        ({"chat_template": "{% for %}"}, "does not compile"),
        ("yes", "must be a mapping"),
    ],
)
def test_a_bad_openai_section_says_what_is_wrong(section: Any, words: str) -> None:
    with pytest.raises(MappingError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_mapping(section)


def test_chat_templates_render_in_a_sandbox() -> None:
    messages = ({"role": "system", "content": "be kind"}, {"role": "user", "content": "hi"})
    assert parse_mapping({}).render_chat(messages) == "system: be kind\nuser: hi\nassistant:"
    custom = parse_mapping({"chat_template": "{{ bos_token }}{{ messages[-1]['content'] }}!"})
    assert custom.render_chat(messages) == "hi!"
    strict = parse_mapping(
        {"chat_template": "{% if messages[0].role == 'system' %}"
                          "{{ raise_exception('no system messages') }}{% endif %}"}
    )  # fmt: skip
    with pytest.raises(OpenAIError, match="no system messages") as refused:
        strict.render_chat(messages)
    assert refused.value.status == 400
    tokens = parse_mapping(
        {"chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}"
                          "{% endfor %}", "bos_token": "<s>", "eos_token": "</s>"}
    )  # fmt: skip
    assert tokens.render_chat(messages) == "<s>be kind</s>hi</s>"
    escape = parse_mapping({"chat_template": "{{ messages.__class__.__mro__ }}"})
    with pytest.raises(OpenAIError, match="chat template"):
        escape.render_chat(messages)


# -- answers -----------------------------------------------------------------------------


def events(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(e.removeprefix(b"data: ")) for e in raw.split(b"\n\n") if e]


def test_chat_chunks_have_openais_shape() -> None:
    g = parse_chat(
        json.dumps({**CHAT, "stream": True, "stream_options": {"include_usage": True}}).encode()
    )
    w = answers.ChunkWriter(g, "chatcmpl-1", 42)
    chunks = events(
        w.first() + w.text('say "hi"\n') + w.finish("length") + w.usage(answers.usage(2, 1))
    )
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[1] == {
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 42, "model": "m",
        "system_fingerprint": None, "usage": None,
        "choices": [{"index": 0, "delta": {"content": 'say "hi"\n'}, "logprobs": None,
                     "finish_reason": None}],
    }  # fmt: skip
    assert (
        chunks[2]["choices"][0]["delta"] == {}
        and chunks[2]["choices"][0]["finish_reason"] == "length"
    )
    assert chunks[3]["choices"] == [] and chunks[3]["usage"]["total_tokens"] == 3


def test_completion_chunks_and_whole_answers() -> None:
    g = parse_completion(body(model="m", prompt="p", stream=True))
    w = answers.ChunkWriter(g, "cmpl-1", 1)
    assert w.first() == b"" and w.usage(answers.usage(1, 1)) == b""  # no role, no usage asked
    (chunk,) = events(w.text("é"))
    assert chunk["object"] == "text_completion" and chunk["choices"][0]["text"] == "é"
    assert "usage" not in chunk
    whole = json.loads(answers.response(g, "cmpl-1", 1, "t", "stop", answers.usage(1, 1)))
    assert whole["choices"] == [
        {"index": 0, "text": "t", "logprobs": None, "finish_reason": "stop"}
    ]
    chat = json.loads(answers.response(parse_chat(body(**CHAT)), "c", 1, "t", "stop", {}))
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"] == {"role": "assistant", "content": "t", "refusal": None}
    assert answers.prompt_tokens("  two words ") == 2
