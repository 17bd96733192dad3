"""The one JSON parser for text trioserve does not write itself.

Every JSON document that comes from a client (request bodies, form fields a handler gets
decoded), from a handler (its answers, its described metadata) or through the worker
protocol from either of them is parsed here, never with ``json.loads``: the standard
library's scanner recurses once per nesting level and a body of 100,000 ``[`` raises
``RecursionError``, which no caller expects and which surfaced as 500s and failed
predictions. :func:`parse` uses pydantic's parser (``pydantic_core.from_json``, jiter), which
stops at :data:`MAX_DEPTH` levels with an ordinary error, and is faster than ``json`` on
number arrays. Every failure is one :class:`JSONError` (a ``ValueError``) whose message says
what is wrong and where. ``tests/unit/test_jsontext.py`` checks that nothing else in
``trioserve/`` parses JSON, except the files it names as trusted (configuration, key and
archive files the operator writes).

What it accepts is RFC 8259 JSON in UTF-8 (a ``str`` too), plus ``NaN`` and ``Infinity`` as
``json.loads`` does; unlike ``json.loads`` on bytes it does not guess UTF-16 or skip a
byte-order mark, and it refuses an escaped lone surrogate (``"\\ud800"``).
"""

from __future__ import annotations

from typing import Any, Final

from pydantic_core import from_json

# jiter's own recursion limit, fixed in the parser (pydantic_core offers no setting):
# 200 levels of objects and arrays parse, 201 objects or 202 arrays do not (jiter counts
# the innermost array one lower). test_jsontext.py pins it.
MAX_DEPTH: Final = 200

# jiter's words for the two failures said differently here.
_JITER_DEPTH = "recursion limit exceeded"
_JITER_UTF8 = "invalid unicode code point"


class JSONError(ValueError):
    """The text is not JSON, or nests deeper than :data:`MAX_DEPTH`."""


def parse(text: bytes | bytearray | memoryview | str) -> Any:
    """The value of the JSON document ``text``; :class:`JSONError` when it is not one."""
    if isinstance(text, memoryview):
        text = text.tobytes()
    try:
        return from_json(text, cache_strings="keys")
    except ValueError as exc:
        raise JSONError(_explain(str(exc))) from None


def _explain(detail: str) -> str:
    """jiter's error text, its depth limit and bad UTF-8 said in words."""
    if detail.startswith(_JITER_DEPTH):
        where = detail[len(_JITER_DEPTH) :].strip()
        return f"nested deeper than {MAX_DEPTH} levels ({where})"
    if detail.startswith(_JITER_UTF8):
        return "invalid UTF-8" + detail[len(_JITER_UTF8) :]
    return detail
