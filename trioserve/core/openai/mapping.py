"""How a model opts in to the OpenAI API, and how a request becomes its input (sans-IO).

A model opts in with an ``openai`` section: in an MLServer model folder's
``model-settings.json`` under ``parameters.extra.openai``, in a TorchServe archive's
``model-config.yaml`` at the top level (``openai: {}`` takes every default). Keys:

- ``input`` (default ``"prompt"``): the BYTES input tensor that gets the prompt (an
  MLServer-style model; a TorchServe handler gets a JSON body instead);
- ``output`` (default ``"text"``): the BYTES output tensor whose text is the answer;
- ``separator`` (default ``""``): put between two streamed pieces (``" "`` for a model that
  streams bare words), so that the pieces read in a row give the same text a non-streamed
  answer does;
- ``chat_template``: a Jinja2 template that renders ``messages`` into the prompt of a chat
  request, as Hugging Face's and vLLM's chat templates do (variables ``messages``,
  ``add_generation_prompt`` (true), ``bos_token`` and ``eos_token``, function
  ``raise_exception``); default :data:`DEFAULT_CHAT_TEMPLATE`;
- ``bos_token``, ``eos_token`` (default ``""``): the values those template variables take
  (a Hugging Face template copied as it is writes ``{{ bos_token }}`` at the start).


The template runs in Jinja2's immutable sandbox and is compiled once, when the model is
registered: a template that does not compile fails the registration.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, NoReturn

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from trioserve.core.openai.errors import OpenAIError

DEFAULT_CHAT_TEMPLATE: Final = (
    "{% for message in messages %}{{ message.role }}: {{ message.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
KEYS: Final = frozenset({"input", "output", "separator", "chat_template", "bos_token", "eos_token"})


class MappingError(ValueError):
    """An ``openai`` section that cannot be used (the message says why)."""


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.TemplateError(message)


_ENVIRONMENT = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
_ENVIRONMENT.globals["raise_exception"] = _raise_exception


@dataclass(frozen=True, slots=True)
class OpenAIMapping:
    input: str = "prompt"
    output: str = "text"
    separator: str = ""
    chat_template: str = DEFAULT_CHAT_TEMPLATE
    bos_token: str = ""
    eos_token: str = ""
    _compiled: jinja2.Template = field(
        default_factory=lambda: _ENVIRONMENT.from_string(DEFAULT_CHAT_TEMPLATE),
        compare=False,
        repr=False,
    )

    def render_chat(self, messages: tuple[dict[str, str], ...]) -> str:
        """The prompt of a chat request; a template that fails is a 400 saying why."""
        try:
            return self._compiled.render(
                messages=[dict(m) for m in messages],
                add_generation_prompt=True,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except jinja2.TemplateError as exc:
            raise OpenAIError(
                400, f"the model's chat template refused the messages: {exc}", param="messages"
            ) from None


def parse_mapping(section: Any) -> OpenAIMapping:
    """The mapping an ``openai`` section declares (raises :class:`MappingError`)."""
    if section is None or section is True:
        section = {}
    if not isinstance(section, dict):
        raise MappingError(f"the openai section must be a mapping of settings, not {section!r}")
    unknown = sorted(set(section) - KEYS)
    if unknown:
        raise MappingError(
            f"unknown key(s) in the openai section: {', '.join(unknown)} "
            f"(known: {', '.join(sorted(KEYS))})"
        )
    values: dict[str, str] = {}
    for key in KEYS:
        value = section.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or (key in ("input", "output") and not value):
            raise MappingError(
                f"openai.{key} must be a {'' if key == 'separator' else 'non-empty '}string, "
                f"not {value!r}"
            )
        values[key] = value
    template = values.get("chat_template", DEFAULT_CHAT_TEMPLATE)
    try:
        compiled = _ENVIRONMENT.from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise MappingError(
            f"openai.chat_template does not compile: {exc} (line {exc.lineno})"
        ) from None
    return OpenAIMapping(
        input=values.get("input", "prompt"),
        output=values.get("output", "text"),
        separator=values.get("separator", ""),
        chat_template=template,
        bos_token=values.get("bos_token", ""),
        eos_token=values.get("eos_token", ""),
        _compiled=compiled,
    )


def mapping_of(
    mlserver_raw: dict[str, Any] | None, yaml_raw: dict[str, Any]
) -> OpenAIMapping | None:
    """The mapping a model declares, or None when it does not opt in: an MLServer folder's
    ``parameters.extra.openai``, else model-config.yaml's ``openai``."""
    if mlserver_raw is not None:
        parameters = mlserver_raw.get("parameters")
        extra = parameters.get("extra") if isinstance(parameters, dict) else None
        if isinstance(extra, dict) and "openai" in extra:
            return parse_mapping(extra["openai"])
        return None
    if "openai" in yaml_raw:
        return parse_mapping(yaml_raw["openai"])
    return None


__all__ = ["DEFAULT_CHAT_TEMPLATE", "MappingError", "OpenAIMapping", "mapping_of", "parse_mapping"]
