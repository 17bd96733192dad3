"""The two OpenAI generation requests, read and checked (sans-IO).

:func:`parse_completion` (``POST /v1/completions``) and :func:`parse_chat` (``POST
/v1/chat/completions``) turn a body into one :class:`Generation`, or raise a 400
:class:`~.errors.OpenAIError` naming the field that is wrong. What the server cannot honour
is refused rather than ignored (``n`` > 1, tools, logprobs, images, ``echo``, ``suffix``,
``best_of`` > 1, ``logit_bias``, a ``response_format`` other than text); fields that do not
change the answer's text (``user``, ``metadata``, ``store``...) and unknown fields are
ignored, as OpenAI's own server ignores the ones it does not use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from trioserve.core import jsontext
from trioserve.core.openai.errors import OpenAIError, bad_request, unsupported

ROLES: Final = frozenset({"system", "developer", "user", "assistant", "tool"})
MAX_STOPS: Final = 4
# The longest stop string: the server holds back up to that much text while it looks for one.
MAX_STOP_LENGTH: Final = 256
# Sampling settings passed to the model as they are, with the range OpenAI accepts.
RANGES: Final = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}

Kind = Literal["completion", "chat"]


@dataclass(frozen=True, slots=True)
class Generation:
    """One checked request: a ``prompt`` (completions) or ``messages`` (chat)."""

    kind: Kind
    model: str
    prompt: str = ""
    messages: tuple[dict[str, str], ...] = ()  # {"role", "content"} (content as text)
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    # temperature, top_p, seed, presence_penalty, frequency_penalty: as given
    sampling: dict[str, int | float] = field(default_factory=dict)


def _body(raw: bytes) -> dict[str, Any]:
    try:
        value = jsontext.parse(raw)
    except jsontext.JSONError as exc:
        raise bad_request(None, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise bad_request(None, "the request body must be a JSON object")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("model", "'model' is required: the name of a model on this server")
    return model


def _common(
    body: dict[str, Any], kind: Kind, prompt: str, messages: tuple[dict[str, str], ...]
) -> Generation:
    n = body.get("n")
    if n is not None and n != 1:
        raise bad_request("n", f"'n' must be 1 (one choice per request), not {n!r}")
    best_of = body.get("best_of")
    if best_of is not None and best_of != 1:
        raise unsupported("best_of", "'best_of' other than 1")
    if body.get("logprobs") not in (None, False) or body.get("top_logprobs") is not None:
        raise unsupported("logprobs", "'logprobs'")
    if body.get("logit_bias"):
        raise unsupported("logit_bias", "'logit_bias'")
    max_tokens = _max_tokens(body)
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request("stream", f"'stream' must be true or false, not {stream!r}")
    include_usage = _stream_options(body.get("stream_options"), stream)
    return Generation(
        kind=kind,
        model=_model(body),
        prompt=prompt,
        messages=messages,
        max_tokens=max_tokens,
        stop=_stop(body.get("stop")),
        stream=stream,
        include_usage=include_usage,
        sampling=_sampling(body),
    )


def _max_tokens(body: dict[str, Any]) -> int | None:
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if not _is_int(value) or value < 1:
            raise bad_request(name, f"'{name}' must be an integer of at least 1, not {value!r}")
        return int(value)
    return None


def _stream_options(options: Any, stream: bool) -> bool:
    if options is None:
        return False
    if not stream:
        raise bad_request("stream_options", "'stream_options' is only allowed with 'stream': true")
    if not isinstance(options, dict):
        raise bad_request("stream_options", "'stream_options' must be an object")
    usage = options.get("include_usage", False)
    if not isinstance(usage, bool):
        raise bad_request("stream_options.include_usage", "'include_usage' must be true or false")
    return usage


def _stop(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request("stop", "'stop' must be a string or a list of strings")
    if len(stops) > MAX_STOPS:
        raise bad_request("stop", f"'stop' may hold at most {MAX_STOPS} strings, not {len(stops)}")
    if any(len(s) > MAX_STOP_LENGTH for s in stops):
        raise bad_request("stop", f"a stop string may be at most {MAX_STOP_LENGTH} characters")
    return tuple(dict.fromkeys(s for s in stops if s))


def _sampling(body: dict[str, Any]) -> dict[str, int | float]:
    sampling: dict[str, int | float] = {}
    for name, (low, high) in RANGES.items():
        value = body.get(name)
        if value is None:
            continue
        if not _is_number(value) or not low <= value <= high:
            raise bad_request(
                name, f"'{name}' must be a number from {low:g} to {high:g}, not {value!r}"
            )
        sampling[name] = value
    seed = body.get("seed")
    if seed is not None:
        if not _is_int(seed):
            raise bad_request("seed", f"'seed' must be an integer, not {seed!r}")
        sampling["seed"] = seed
    return sampling


def parse_completion(raw: bytes) -> Generation:
    """A ``/v1/completions`` body."""
    body = _body(raw)
    if body.get("echo"):
        raise unsupported("echo", "'echo'")
    if body.get("suffix"):
        raise unsupported("suffix", "'suffix'")
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        if len(prompt) != 1 or not isinstance(prompt[0], str):
            raise bad_request(
                "prompt",
                "'prompt' must be one string (a list of several prompts, or of token ids, is "
                "not supported)",
            )
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise bad_request("prompt", "'prompt' is required: a string")
    return _common(body, "completion", prompt, ())


def parse_chat(raw: bytes) -> Generation:
    """A ``/v1/chat/completions`` body."""
    body = _body(raw)
    for name in ("tools", "functions"):
        if body.get(name):
            raise unsupported(name, "function calling ('tools', 'functions')")
    if body.get("tool_choice") not in (None, "none"):
        raise unsupported("tool_choice", "function calling ('tool_choice')")
    response_format = body.get("response_format")
    if response_format is not None and (
        not isinstance(response_format, dict) or response_format.get("type", "text") != "text"
    ):
        raise unsupported("response_format", "a 'response_format' other than text")
    if body.get("audio") is not None or body.get("modalities") not in (None, ["text"]):
        raise unsupported("modalities", "audio output")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages", "'messages' is required: a non-empty list of messages")
    return _common(body, "chat", "", tuple(_message(i, m) for i, m in enumerate(messages)))


def _message(index: int, message: Any) -> dict[str, str]:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise bad_request(where, f"'{where}' must be an object with 'role' and 'content'")
    role = message.get("role")
    if role not in ROLES:
        raise bad_request(
            f"{where}.role",
            f"'{where}.role' must be one of {', '.join(sorted(ROLES))}, not {role!r}",
        )
    content = message.get("content")
    if content is None and role == "assistant":
        if message.get("tool_calls"):
            raise unsupported(f"{where}.tool_calls", "function calling ('tool_calls')")
        content = ""
    if isinstance(content, list):
        content = "".join(_text_part(f"{where}.content[{i}]", p) for i, p in enumerate(content))
    if not isinstance(content, str):
        raise bad_request(
            f"{where}.content", f"'{where}.content' must be a string or a list of text parts"
        )
    return {"role": role, "content": content}


def _text_part(where: str, part: Any) -> str:
    if not isinstance(part, dict):
        raise bad_request(where, f"'{where}' must be an object")
    kind = part.get("type")
    if kind == "text" and isinstance(part.get("text"), str):
        return str(part["text"])
    if kind in ("image_url", "input_image"):
        raise bad_request(
            where, "image inputs are not supported by this server", code="unsupported_parameter"
        )
    if kind in ("input_audio", "file"):
        raise bad_request(
            where, f"{kind} inputs are not supported by this server", code="unsupported_parameter"
        )
    raise bad_request(where, f'\'{where}\' must be {{"type": "text", "text": "..."}}')


__all__ = ["Generation", "OpenAIError", "parse_chat", "parse_completion"]
