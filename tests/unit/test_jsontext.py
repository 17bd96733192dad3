"""The one JSON entry point (trioserve/core/jsontext.py): its depth limit and errors, and the
structural rule that nothing else in ``trioserve/`` parses JSON."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest

from trioserve.core import jsontext

PACKAGE = Path(__file__).resolve().parents[2] / "trioserve"


def nested(depth: int, open_: str = "[", close: str = "]") -> str:
    return open_ * depth + close * depth


def nested_objects(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


# -- the parser -------------------------------------------------------------------------------


def test_parses_what_json_loads_parses() -> None:
    document = {
        "inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [0.1, -2.5e-8]}],
        "id": "é \u2603",
        "big": 12345678901234567890123456789,
        "flags": [True, False, None],
    }
    text = json.dumps(document)
    assert jsontext.parse(text) == json.loads(text) == document
    for given in (text.encode(), bytearray(text.encode()), memoryview(text.encode())):
        assert jsontext.parse(given) == document


def test_nan_and_infinity_are_read_as_json_loads_reads_them() -> None:
    nan, inf, minus_inf = jsontext.parse("[NaN, Infinity, -Infinity]")
    assert math.isnan(nan) and inf == math.inf and minus_inf == -math.inf


def test_the_depth_limit_is_200_levels() -> None:
    assert jsontext.MAX_DEPTH == 200
    assert jsontext.parse(nested(200)) == json.loads(nested(200))
    assert jsontext.parse(nested_objects(200)) == json.loads(nested_objects(200))
    with pytest.raises(jsontext.JSONError, match=r"nested deeper than 200 levels \(at line 1"):
        jsontext.parse(nested_objects(201))
    with pytest.raises(jsontext.JSONError, match=r"nested deeper than 200 levels \(at line 1"):
        jsontext.parse(nested(202))


@pytest.mark.parametrize(
    "text",
    [nested(100_000), nested_objects(100_000), nested(100_000, "[", "")],
    ids=["arrays", "objects", "unclosed"],
)
def test_a_body_nested_100000_deep_is_an_ordinary_error(text: str) -> None:
    """json.loads raises RecursionError here (the bug); the entry point a ValueError."""
    with pytest.raises(RecursionError):
        json.loads(text)
    with pytest.raises(jsontext.JSONError, match="nested deeper than 200 levels") as caught:
        jsontext.parse(text.encode())
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (b"", "EOF while parsing a value"),
        (b'{"a": ', "EOF while parsing a value"),
        (b"[1] x", "trailing characters at line 1 column 5"),
        (b'["\xc3\x28"]', "invalid UTF-8 at line 1 column 3"),
        (b"{'a': 1}", "key must be a string"),
    ],
)
def test_errors_say_what_and_where(text: bytes, says: str) -> None:
    with pytest.raises(jsontext.JSONError, match=says):
        jsontext.parse(text)


# -- the rule: every other parse goes through the entry point ---------------------------------

# Files that may parse JSON themselves, and why: text trioserve or the operator wrote.
TRUSTED = {
    "core/jsontext.py": "the entry point itself",
    "core/frames.py": "frame metadata, written by trioserve's own code on both sides",
    "config/values.py": "values of the operator's config.properties",
    "auth.py": "the server's own key file",
    "model/settings.py": "model-settings.json read from a folder (MLServer's API)",
    "worker/torchserve/util.py": "index_to_name.json from the model's own files",
    "archive/_manifest.py": "an archive's MANIFEST.json (literal numbers need json's hooks)",
    "archive/_model_settings.py": "model-settings.json of a store folder",
    "client/cli.py": "a file the user names on the command line",
}

_PARSE_FUNCTIONS = {"loads", "load", "JSONDecoder", "raw_decode"}
_PARSE_METHODS = {"model_validate_json", "validate_json", "from_json"}
_OTHER_PARSERS = {"orjson", "ujson", "simplejson", "rapidjson"}


def json_parses(source: str) -> list[str]:
    """Where ``source`` parses JSON other than through ``jsontext.parse``: ``json.loads``
    (or ``load``, ``JSONDecoder``, however ``json`` was imported), pydantic's
    ``model_validate_json`` / ``validate_json`` / ``from_json``, and other JSON libraries."""
    tree = ast.parse(source)
    json_names: set[str] = set()
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                root = alias.name.split(".")[0]
                if root == "json":
                    json_names.add(alias.asname or "json")
                if root in _OTHER_PARSERS:
                    found.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            root = node.module.split(".")[0]
            names = {alias.name for alias in node.names}
            if root == "json" and names & (_PARSE_FUNCTIONS | {"decoder"}):
                found.append(f"line {node.lineno}: from {node.module} import {sorted(names)}")
            if root in _OTHER_PARSERS or names & {"from_json"}:
                found.append(f"line {node.lineno}: from {node.module} import {sorted(names)}")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in json_names:
            if node.attr in _PARSE_FUNCTIONS or node.attr == "decoder":
                found.append(f"line {node.lineno}: {owner.id}.{node.attr}")
        elif node.attr in _PARSE_METHODS:
            found.append(f"line {node.lineno}: .{node.attr}")
    return found


def _sources() -> dict[str, str]:
    return {
        str(path.relative_to(PACKAGE)): path.read_text()
        for path in sorted(PACKAGE.rglob("*.py"))
        if "_proto" not in path.parts
    }


def test_nothing_else_parses_json() -> None:
    offenders = {
        name: parses
        for name, source in _sources().items()
        if name not in TRUSTED and (parses := json_parses(source))
    }
    assert offenders == {}, (
        "parse client or handler JSON with trioserve.core.jsontext.parse (its depth limit), "
        "or add the file to TRUSTED saying why its JSON is trusted"
    )


def test_every_trusted_file_still_parses_json() -> None:
    """The allow-list does not outlive its reasons."""
    sources = _sources()
    stale = [
        name for name in TRUSTED if name != "core/jsontext.py" and not json_parses(sources[name])
    ]
    assert stale == []


def test_the_rule_catches_what_it_must() -> None:
    assert json_parses("import json\njson.loads(b)")
    assert json_parses("import json as j\nj.loads(b)")
    assert json_parses("import json\njson.load(f)")
    assert json_parses("import json\njson.JSONDecoder().raw_decode(s)")
    assert json_parses("from json import loads\nloads(b)")
    assert json_parses("def f():\n    import orjson\n    return orjson.loads(b)")
    assert json_parses("Model.model_validate_json(b)")
    assert json_parses("TypeAdapter(int).validate_json(b)")
    assert json_parses("from pydantic_core import from_json")
    assert json_parses("import pydantic_core\npydantic_core.from_json(b)")
    assert not json_parses("import json\njson.dumps(v)")
    assert not json_parses("from trioserve.core import jsontext\njsontext.parse(b)")
    assert not json_parses("from json.encoder import encode_basestring_ascii")
