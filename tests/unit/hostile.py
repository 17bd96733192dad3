"""What the hostile-input property tests share (test_hostile_parsers.py, test_hostile_protobuf.py):
the measuring harness, its bound, and the byte-level mutations.

Every parse runs under :mod:`tracemalloc`, started for that parse alone (objects made before
are not traced, so garbage freed during the parse cannot hide what it allocates), and must
end in a value or a :class:`ServeError` of kind BAD_INPUT or TOO_LARGE with a bounded
message; any other exception escapes to hypothesis, which reports it with the body. Its peak
of traced allocations must stay within :func:`bound` of the body's size.

The bound, ``AMPLIFICATION * len(body) + ALLOWANCE``, from measurements (CPython 3.11):

* ``AMPLIFICATION`` (40): turning bytes into Python objects costs up to ~32 times their size
  in every parser, and nothing trioserve does can go below it: JSON text ``[[[[...]]]]`` is
  an empty list (56 bytes) and its slot (8) per two bytes, ``[{},{},...]`` a dict (64) and a
  slot per three (24x); a packed protobuf varint of one byte becomes a list slot in the
  message and another in the tensor's element list, plus its packed form (32x for INT32).
  The tensors built after the parse add less than that on top (FP64 data given as ``0``: a
  float, a slot and 8 packed bytes per two bytes of JSON, 24x with the parse's slot). 40 is
  that floor with a quarter of margin; an amplification the request limits exist to stop is
  above it (``test_the_bound_fails_*``: 12,000 one-element gRPC inputs, ~70x; 100,000 named
  REST outputs, ~49x), and so was each bug this test found (a JSON body of 100,000 ``{}``
  inputs made ~640x in pydantic's error list).
* ``ALLOWANCE`` (4 MiB): what the request limits let a small body build, independent of its
  size: ``max_request_inputs`` (2048) inputs and as many outputs, ~1.5 KiB a gRPC input with
  its contents message and tensor, ~0.8 KiB a REST output, measured at up to ~3.4 MB for a
  48 KB message of 2048 one-element inputs; and the fixed cost of a parse (a pydantic error,
  a decoder's first use: a few KiB).

``tracemalloc`` sees what goes through Python's allocators: every Python object and buffer,
not the parsers' own native scratch memory (jiter's and pydantic-core's Rust heap), which the
e2e tests' RSS checks cover.
"""

from __future__ import annotations

import os
import tracemalloc
from collections.abc import Callable
from typing import Any, Final

from hypothesis import HealthCheck, currently_in_test_context, event, settings
from hypothesis import strategies as st

from trioserve.core.errors import MAX_MESSAGE, ErrorKind, ServeError

AMPLIFICATION: Final = 40
ALLOWANCE: Final = 4 << 20
# The most bytes a "huge count" mutation grows a body to.
BUDGET: Final = 256 << 10

# TRIOSERVE_HOSTILE_EXAMPLES=5000 runs each property with that many examples instead.
EXAMPLES: Final = int(os.environ.get("TRIOSERVE_HOSTILE_EXAMPLES", "0")) or None
HOSTILE = settings(
    max_examples=EXAMPLES or 200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
NEUTRAL: Final = (ErrorKind.BAD_INPUT, ErrorKind.TOO_LARGE)


def bound(size: int) -> int:
    return AMPLIFICATION * size + ALLOWANCE


def measure(parse: Callable[[bytes], Any], body: bytes) -> tuple[Any, int]:
    """``parse(body)``'s value (or its ServeError) and the peak of what it allocated; any
    other exception propagates."""
    running = tracemalloc.is_tracing()
    if running:  # python -X tracemalloc: measure from here, keep it running
        tracemalloc.clear_traces()
    else:
        tracemalloc.start()
    try:
        try:
            result: Any = parse(body)
        except ServeError as error:
            result = error
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        if not running:
            tracemalloc.stop()
    return result, peak


def parsed(parse: Callable[[bytes], Any], body: bytes) -> Any:
    """``parse(body)`` under the property's assertions: bounded memory, and a value or a
    neutral bad-input error with a bounded message (returned, not raised)."""
    result, peak = measure(parse, body)
    assert peak <= bound(len(body)), (
        f"parsing {len(body)} bytes allocated {peak} bytes at the peak "
        f"({peak / max(len(body), 1):.0f}x), over the bound of {bound(len(body))}"
    )
    if isinstance(result, ServeError):
        assert result.kind in NEUTRAL, repr(result)
        assert len(result.message) <= MAX_MESSAGE
    if currently_in_test_context():  # how the examples divide (--hypothesis-show-statistics)
        event("refused" if isinstance(result, ServeError) else "parsed")
        event("body over 64 KiB" if len(body) > 64 << 10 else "body up to 64 KiB")
    return result


# -- byte-level mutations ------------------------------------------------------------------

# Sequences that are not UTF-8: a lone continuation byte, a cut two-byte sequence, an
# encoded surrogate, a code point over U+10FFFF, an overlong slash, bytes never used.
INVALID_UTF8: Final = (b"\x80", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\xff")


@st.composite
def mutated_bytes(draw: st.DrawFn, data: bytes, most: int = 3) -> bytes:
    """``data`` with up to ``most`` byte-level changes: a flipped bit, a cut, random bytes or
    invalid UTF-8 inserted, a range deleted, a slice copied elsewhere."""
    out = bytearray(data)
    for _ in range(draw(st.sampled_from([0, 0, 0, *range(1, most + 1)]))):
        where = draw(st.integers(0, len(out)))
        how = draw(st.sampled_from(["flip", "cut", "insert", "utf8", "delete", "splice"]))
        if how == "flip" and where < len(out):
            out[where] ^= 1 << draw(st.integers(0, 7))
        elif how == "cut":
            del out[where:]
        elif how == "insert":
            out[where:where] = draw(st.binary(min_size=1, max_size=8))
        elif how == "utf8":
            out[where:where] = draw(st.sampled_from(INVALID_UTF8))
        elif how == "delete":
            del out[where : where + draw(st.integers(1, 8))]
        elif how == "splice" and out:
            start = draw(st.integers(0, len(out) - 1))
            out[where:where] = out[start : start + draw(st.integers(1, 64))]
    return bytes(out)


def repeats(unit_size: int, fixed: int = 0, budget: int = BUDGET) -> st.SearchStrategy[int]:
    """How many times to repeat a ``unit_size``-byte piece: often as many as fit the budget."""
    most = max(1, (budget - fixed) // max(unit_size, 1))
    return st.one_of(st.just(most), st.integers(1, most))
