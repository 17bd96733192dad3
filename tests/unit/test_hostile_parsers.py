"""Property: hostile REST bodies to the request parsers (issue 27's "Done when").

Valid OIP inference requests (JSON, the binary tensor extension, raw binary bodies) and
KServe v1 bodies are built from the OIP's datatype table, then mutated: keys dropped,
duplicated or set to null or to a value of the wrong type, values nested deep, lists repeated
up to the byte budget, bodies of the wrong shape, and bytes flipped, cut, inserted, deleted
or spliced, invalid UTF-8 among them. Every parse must end in a value or a neutral bad-input
error (BAD_INPUT, TOO_LARGE) with a bounded message, within the memory bound of
``hostile.py`` (which says how the bound was chosen). The gRPC messages are in
test_hostile_protobuf.py; multipart and urlencoded forms in test_forms.py.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import string
from functools import partial
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from trioserve.core import jsontext
from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.kserve import instances_of
from trioserve.core.limits import RequestLimits, check_elements
from trioserve.core.oip.datatypes import DATATYPES, Datatype
from trioserve.core.oip.raw import TensorMeta, raw_request
from trioserve.core.oip.request import parse_header_length, parse_infer_request
from trioserve.core.oip.tensor import MAX_DIMS, Tensor

from .hostile import HOSTILE, bound, measure, mutated_bytes, parsed, repeats

NAMES = st.one_of(st.sampled_from(["x", "input-0", "", "y"]), st.text(max_size=6))
DATATYPE_NAMES = st.one_of(
    st.sampled_from(list(DATATYPES)), st.sampled_from(list(DATATYPES)), st.text(max_size=5)
)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=6))
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
SOUND_PARAMETERS = st.dictionaries(
    st.text(max_size=5),
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5)),
    max_size=3,
)
PARAMETERS = st.dictionaries(
    st.one_of(
        st.sampled_from(["content_type", "headers", "binary_data_output"]), st.text(max_size=5)
    ),
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(),
        st.text(max_size=5),
        JSON_VALUES,
    ),
    max_size=3,
)


def elements(info: Datatype | None, sound: bool) -> st.SearchStrategy[Any]:
    """Elements of ``info``'s JSON form; not ``sound``: some out of range or of another kind."""
    if info is None or info.name == "BYTES":
        valid: st.SearchStrategy[Any] = st.text(max_size=4)
    elif info.name == "BOOL":
        valid = st.booleans()
    elif info.int_range is not None:
        valid = st.integers(*info.int_range)
    else:
        valid = st.floats(width=32) | st.integers(-1000, 1000)
    return valid if sound else st.one_of(valid, valid, SCALARS)


def nest(flat: list[Any], shape: list[int]) -> list[Any]:
    """``flat`` in ``shape``'s natural nesting (row-major)."""
    if len(shape) <= 1:
        return list(flat)
    step = math.prod(shape[1:])
    return [nest(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


@st.composite
def input_tensors(draw: st.DrawFn, binary: bool) -> tuple[dict[str, Any], bytes | None]:
    """One input: JSON data (flat or nested), or with ``binary`` its bytes for after the JSON."""
    sound = draw(st.integers(0, 3)) > 0  # else anything may be wrong with it
    name = draw(st.text(max_size=6) if sound else NAMES)
    datatype = draw(st.sampled_from(list(DATATYPES)) if sound else DATATYPE_NAMES)
    shape = draw(st.lists(st.integers(0, 3), max_size=3))
    count = math.prod(shape)
    info = DATATYPES.get(datatype)
    matching = st.lists(elements(info, sound), min_size=count, max_size=count)
    flat = draw(matching if sound else matching | st.lists(elements(info, sound), max_size=4))
    if sound and flat and draw(st.integers(0, 5)) == 0:  # large: its elements again and again
        copies = draw(repeats(len(json.dumps(flat))))
        shape, flat = [copies, *shape], flat * copies
    tensor: dict[str, Any] = {"name": name, "shape": shape, "datatype": datatype}
    parameters = draw(SOUND_PARAMETERS if sound else PARAMETERS)
    if binary and draw(st.booleans()):
        try:
            blob = Tensor.from_values(name, datatype, shape, flat).raw.tobytes()
        except ServeError:
            blob = draw(st.binary(max_size=16))
        wrong = st.sampled_from([len(blob) + 1, -1, None, "4"])
        parameters["binary_data_size"] = len(blob) if sound else draw(wrong)
        return tensor | {"parameters": parameters}, blob
    tensor["data"] = nest(flat, shape) if len(flat) == count and draw(st.booleans()) else flat
    if parameters or draw(st.booleans()):
        tensor["parameters"] = parameters or None
    return tensor, None


@st.composite
def outputs(draw: st.DrawFn) -> dict[str, Any]:
    output: dict[str, Any] = {"name": draw(NAMES)}
    if draw(st.booleans()):
        binary = st.one_of(st.booleans(), st.none(), SCALARS)
        output["parameters"] = draw(
            st.none() | st.fixed_dictionaries({"binary_data": binary}) | PARAMETERS
        )
    return output


@st.composite
def oip_requests(draw: st.DrawFn, binary: bool) -> tuple[dict[str, Any], list[bytes]]:
    items = draw(st.lists(input_tensors(binary), max_size=4))
    request: dict[str, Any] = {"inputs": [tensor for tensor, _ in items]}
    if draw(st.booleans()):
        request["id"] = draw(st.none() | st.text(max_size=8))
    if draw(st.booleans()):
        parameters = draw(PARAMETERS)
        parameters["binary_data_output"] = draw(st.booleans() | SCALARS)
        request["parameters"] = parameters
    if draw(st.booleans()):
        request["outputs"] = draw(st.none() | st.lists(outputs(), max_size=3))
    return request, [blob for _, blob in items if blob is not None]


# -- mutations of the JSON tree, then of its text ------------------------------------------

# Placeholders the text gets in place of what json.dumps cannot write: a value nested N
# deep, a key written twice.
_DEEP = re.compile(rb'"\\u0000deep(\d+)\\u0000"')
_DUPLICATE = b'"\\u0000dup\\u0000'


def _containers(tree: Any) -> list[Any]:
    found, stack = [], [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict | list):
            found.append(node)
            stack.extend(node.values() if isinstance(node, dict) else node)
    return found


@st.composite
def mutated_tree(draw: st.DrawFn, tree: Any) -> Any:
    """``tree`` with up to two structural changes (in place), then perhaps one of its lists
    repeated up to the byte budget (last: the copies share their elements)."""
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
        how = draw(st.sampled_from(["drop", "null", "retype", "deep", "duplicate", "shape"]))
        if how == "shape":  # the whole body of the wrong shape
            tree = draw(JSON_VALUES | st.lists(st.dictionaries(st.text(max_size=3), SCALARS)))
            continue
        node = draw(st.sampled_from(_containers(tree) or [[]]))
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        if how == "duplicate" and isinstance(node, dict) and keys:
            key = draw(st.sampled_from(keys))
            node["\x00dup\x00" + key] = draw(st.just(node[key]) | JSON_VALUES)
        elif keys:
            key = draw(st.sampled_from(keys))
            if how == "drop":
                del node[key]
            elif how == "null":
                node[key] = None
            elif how == "retype":
                node[key] = draw(JSON_VALUES)
            elif how == "deep":
                depth = draw(st.sampled_from([199, 200, 201, 202, 100_000]) | st.integers(1, 300))
                node[key] = f"\x00deep{depth}\x00"
    lists = [node for node in _containers(tree) if isinstance(node, list)]
    if lists and draw(st.integers(0, 4)) == 0:
        node = draw(st.sampled_from(lists))
        if not node:
            node.append(draw(JSON_VALUES | st.just({})))
        unit = len(dumps(node, True)) // len(node) + 1
        node[:] = node * draw(repeats(unit, len(dumps(tree, True))))
    return tree


def dumps(tree: Any, ascii: bool) -> bytes:
    text = json.dumps(tree, ensure_ascii=ascii).encode("utf-8", "surrogatepass")
    text = _DEEP.sub(lambda m: b"[" * int(m[1]) + b"0" + b"]" * int(m[1]), text)
    return text.replace(_DUPLICATE, b'"')


@st.composite
def json_bodies(draw: st.DrawFn, tree: Any) -> bytes:
    return draw(mutated_bytes(dumps(draw(mutated_tree(tree)), draw(st.booleans()))))


# -- REST OIP: JSON, binary extension, raw ----------------------------------------------------


def rest_parse(header: str | None, meta: TensorMeta, body: bytes) -> Any:
    """What the REST adapter does with a body (trioserve/http/oip.py ``read_request``)."""
    length = parse_header_length(header)
    if length == 0:
        request = raw_request(body, [meta])
        check_elements(sum(tensor.element_count for tensor in request.inputs))
        return request
    return parse_infer_request(body, header_length=length)


RAW_MODEL = TensorMeta("x", "FP32", (-1, 3))
BAD_SHAPE = (
    b'{"inputs": [{"name": "x", "datatype": "FP32", "data": [], "shape": ['
    + b",".join([b'"1"'] * 100_000)
    + b"]}]}"
)
BAD_PARAMETERS = (
    b'{"inputs": [], "parameters": {' + b",".join(b'"k%d": []' % i for i in range(50_000)) + b"}}"
)
MANY_DIMENSIONS = (
    b'{"inputs": [{"name": "x", "datatype": "BOOL", "data": [], "shape": ['
    + b",".join([b"3"] * 20_000)
    + b"]}]}"
)
INPUTS_100K = b'{"inputs": [' + b",".join([b"{}"] * 100_000) + b"]}"
MEBI_NAME = json.dumps(
    {"inputs": [{"name": "n" * 2**20, "shape": [1], "datatype": "?", "data": [1]}]}
)
MEBI_TYPE = json.dumps(
    {"inputs": [{"name": "x", "shape": [1], "datatype": "T" * 2**20, "data": [1]}]}
)
EMPTY_BYTES = (
    b'{"inputs": [{"name": "x", "shape": [80000], "datatype": "BYTES", "data": ['
    + b",".join([b'""'] * 80_000)
    + b"]}]}"
)


@st.composite
def rest_cases(draw: st.DrawFn) -> tuple[str | None, TensorMeta, bytes]:
    binary = draw(st.booleans())
    request, blobs = draw(oip_requests(binary))
    text = draw(json_bodies(request))
    if not binary:
        return None, RAW_MODEL, text
    size = len(text)
    wrong = [str(size + 1), str(size - 1), "0", "0", "-1", " 7 ", "x", "9" * 30]
    headers = [str(size)] * 10 + wrong
    header = draw(st.one_of(*[st.sampled_from(headers)] * 5, st.text(max_size=4)))
    if header.strip() == "0":  # a raw body: one input's bytes for a model that declares it
        datatype = draw(st.sampled_from(list(DATATYPES)))
        meta = TensorMeta("x", datatype, tuple(draw(st.lists(st.integers(-1, 4), max_size=3))))
        return header, meta, draw(mutated_bytes(b"".join(blobs) or draw(st.binary(max_size=64))))
    return header, RAW_MODEL, draw(mutated_bytes(text + b"".join(blobs)))


@HOSTILE
@given(rest_cases())
@example((None, RAW_MODEL, b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"))
@example((None, RAW_MODEL, MEBI_NAME.encode()))
@example((None, RAW_MODEL, MEBI_TYPE.encode()))
@example(
    (
        None,
        RAW_MODEL,
        b'{"inputs": [{"name": "\xff\xfe", "shape": [1], "datatype": "FP32", "data": [1]}]}',
    )
)
@example((None, RAW_MODEL, INPUTS_100K))
@example((None, RAW_MODEL, BAD_SHAPE))
@example((None, RAW_MODEL, MANY_DIMENSIONS))
@example((None, RAW_MODEL, BAD_PARAMETERS))
@example((None, RAW_MODEL, EMPTY_BYTES))
@example(("4294967296", RAW_MODEL, b'{"inputs": []}'))
@example(("0", TensorMeta("x", "BYTES", (-1, -1)), b"\xff" * 1000))
def test_rest_bodies_parse_or_are_refused_within_the_bound(
    case: tuple[str | None, TensorMeta, bytes],
) -> None:
    header, meta, body = case
    parsed(partial(rest_parse, header, meta), body)


@st.composite
def v1_bodies(draw: st.DrawFn) -> bytes:
    body: dict[str, Any] = {"instances": draw(st.lists(JSON_VALUES, max_size=5))}
    if draw(st.booleans()):
        body[draw(st.text(max_size=4))] = draw(JSON_VALUES)
    return draw(json_bodies(body))


@HOSTILE
@given(v1_bodies())
@example(b'{"instances": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
@example(b'{"instances": [' + b",".join([b"1"] * 262_000) + b"]}")
@example(b'{"instances": ["\xed\xa0\x80"]}')
def test_kserve_v1_bodies_parse_or_are_refused_within_the_bound(body: bytes) -> None:
    parsed(instances_of, body)


# -- the bound is a real one ----------------------------------------------------------------


def test_the_bound_fails_for_a_rest_body_the_limits_would_refuse() -> None:
    """100,000 requested outputs of 3-character names (1.5 MB) build ~49 times their size
    once max_request_inputs is raised to let them through (~730 bytes of envelope, output
    and parameters objects each): ~1.14 times the bound. The default limit refuses them
    having parsed only the JSON."""
    names = itertools.islice(itertools.product(string.ascii_letters, repeat=3), 100_000)
    listed = b",".join(b'{"name":"%s"}' % "".join(name).encode() for name in names)
    body = b'{"inputs":[],"outputs":[' + listed + b"]}"
    unlimited = RequestLimits(max_request_inputs=10**6)
    request, peak = measure(
        lambda b: parse_infer_request(b, header_length=None, limits=unlimited), body
    )
    assert len(request.outputs) == 100_000
    assert peak > bound(len(body))
    refused = parsed(partial(rest_parse, None, RAW_MODEL), body)
    assert refused.kind is ErrorKind.TOO_LARGE


# -- what this test found --------------------------------------------------------------------


def test_many_bad_elements_are_refused_at_the_first_not_with_an_error_each() -> None:
    """pydantic checked every element of an array or object and kept an error for each:
    ~160 times the body for shape entries, ~120 for parameter values, and seconds of CPU per
    megabyte, though the message names only the first."""
    refuse = partial(parsed, partial(rest_parse, None, RAW_MODEL))
    assert refuse(BAD_SHAPE).message == (
        "invalid inference request: inputs[0].shape[0] must be an integer"
    )
    assert refuse(BAD_PARAMETERS).message == (
        "invalid inference request: parameters.k0 must be a string, number or boolean"
    )
    assert refuse(b'{"inputs": [' + b",".join([b"{}"] * 2000) + b"]}").message == (
        "invalid inference request: inputs[0].name is required (and 2 more problems)"
    )


def test_outputs_beyond_the_limit_are_refused_before_they_are_validated() -> None:
    """Counted on the parsed JSON, not after pydantic built an object for each output
    (~4 times what parsing the JSON costs)."""
    body = (
        b'{"inputs": [], "outputs": ['
        + b",".join(b'{"name":"%x"}' % i for i in range(100_000))
        + b"]}"
    )
    _value, parse_only = measure(jsontext.parse, body)
    refused, peak = measure(partial(rest_parse, None, RAW_MODEL), body)
    assert refused.kind is ErrorKind.TOO_LARGE
    assert peak < 1.5 * parse_only


def test_bytes_elements_pack_without_a_buffer_record_each() -> None:
    """80,000 ``""`` elements: ``b"".join`` of a part list held ~200 bytes per element."""
    request = parsed(partial(rest_parse, None, RAW_MODEL), EMPTY_BYTES)
    assert request.inputs[0].nbytes == 4 * 80_000
    assert measure(partial(rest_parse, None, RAW_MODEL), EMPTY_BYTES)[1] < 20 * len(EMPTY_BYTES)


def test_a_shape_of_many_dimensions_is_refused_without_multiplying_them_out() -> None:
    """3**20000 has 9,543 digits: too many for ``str`` (a ValueError, where the message
    named the count), and the exact product of a 6 MB body of dimensions took minutes."""
    refused = parsed(partial(rest_parse, None, RAW_MODEL), MANY_DIMENSIONS)
    assert refused.kind is ErrorKind.TOO_LARGE
    assert "declare 18446744073709551616 or more tensor elements" in refused.message
    # No elements (shape (3, ..., 0)), yet still far more dimensions than a tensor may have.
    zero_last = MANY_DIMENSIONS.replace(b"3]", b"0]")
    refused = parsed(partial(rest_parse, None, RAW_MODEL), zero_last)
    assert refused.kind is ErrorKind.BAD_INPUT
    assert f"at most {MAX_DIMS} are allowed" in refused.message
