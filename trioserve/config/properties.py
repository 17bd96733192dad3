"""Reading the Java ``.properties`` format of ``config.properties``.

This is hand-written rather than built on ``jproperties``: that library keeps unescaped
blanks at the end of a value (trioserve drops them, so ``job_queue_size=7 `` still reads),
treats ``#:`` comment lines as its own metadata (a bare ``#:`` line is a parse error, where
``java.util.Properties`` sees a comment) and lets Python's ``int()`` decide ``\\uXXXX``
escapes, so ``\\u+123`` or ``\\u 12a`` pass where Java reports a malformed escape.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Final

from trioserve.config.errors import ConfigError

__all__ = ["parse_properties"]

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_WS: Final = " \t\f"
_HEX: Final = frozenset("0123456789abcdefABCDEF")
_SIMPLE_ESCAPES: Final = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """Yield (first line number, logical line) with comments and blank lines dropped."""
    lines = _LINE_BREAK.split(text)
    i = 0
    while i < len(lines):
        lineno = i + 1
        line = lines[i].lstrip(_WS)
        i += 1
        if not line or line[0] in "#!":
            continue
        parts: list[str] = []
        while True:
            backslashes = len(line) - len(line.rstrip("\\"))
            if backslashes % 2 == 0:
                parts.append(line)
                break
            parts.append(line[:-1])
            if i >= len(lines):
                break
            line = lines[i].lstrip(_WS)
            i += 1
        yield lineno, "".join(parts)


def _unescape(raw: str, lineno: int, *, trim_end: bool) -> str:
    out: list[str] = []
    significant = 0  # length of `out` up to the last non-blank or escaped character
    i = 0
    n = len(raw)
    while i < n:
        c = raw[i]
        i += 1
        if c != "\\":
            out.append(c)
            if c not in _WS:
                significant = len(out)
            continue
        if i >= n:
            break  # a lone trailing backslash is dropped, as Java does
        c = raw[i]
        i += 1
        if c == "u":
            digits = raw[i : i + 4]
            if len(digits) != 4 or not _HEX.issuperset(digits):
                raise ConfigError(
                    f"config file line {lineno}: malformed \\uXXXX escape {raw[i - 2 : i + 4]!r}"
                )
            out.append(chr(int(digits, 16)))
            i += 4
        else:
            out.append(_SIMPLE_ESCAPES.get(c, c))
        significant = len(out)
    if trim_end:
        del out[significant:]
    text = "".join(out)
    if any("\ud800" <= ch <= "\udfff" for ch in text):
        # \uD83D\uDE00 style pairs become one character; lone halves stay as they are
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    return text


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java ``.properties`` text into a dict (a later duplicate key wins).

    Handles ``#`` / ``!`` comment lines, ``key=value``, ``key:value`` and ``key value``,
    backslash line continuation (leading blanks of the next line are dropped), the
    escapes ``\\t \\n \\r \\f \\uXXXX`` and ``\\<any char>`` (e.g. ``\\\\``, ``\\=``,
    ``\\ ``), and ``\\n``, ``\\r\\n`` or ``\\r`` line ends. Unlike Java, unescaped
    blanks at the end of a value are removed too. A malformed ``\\u`` escape raises
    :class:`ConfigError`.
    """
    result: dict[str, str] = {}
    for lineno, line in _logical_lines(text):
        n = len(line)
        i = 0
        while i < n:
            c = line[i]
            if c == "\\":
                i += 2
                continue
            if c in "=:" or c in _WS:
                break
            i += 1
        key_end = min(i, n)
        j = key_end
        while j < n and line[j] in _WS:
            j += 1
        if j < n and line[j] in "=:":
            j += 1
        while j < n and line[j] in _WS:
            j += 1
        key = _unescape(line[:key_end], lineno, trim_end=False)
        result[key] = _unescape(line[j:], lineno, trim_end=True)
    return result
