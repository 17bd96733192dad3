"""OpenAPI 3.0.1 descriptions of the HTTP APIs: TorchServe's three (inference, management,
metrics) and the Open Inference Protocol's REST routes on the inference port (oip).

TorchServe's are the documents served by ``OPTIONS /`` and ``GET /api-description``; the OIP
one is served by ``GET /v2/docs/dataplane.json`` (where MLServer serves its own). They are data,
not code: ``api/inference.yaml``, ``api/management.yaml``, ``api/metrics.yaml`` and
``api/oip.yaml`` next to this module (package data, shipped in the wheel and the sdist). The
inference app's routes are those of ``inference.yaml`` and ``oip.yaml`` together. This module
only loads them: each file is read with importlib.resources and parsed with PyYAML's safe loader
once per process; every call then gets a copy with the server's version in ``info.version``,
where the files hold :data:`VERSION_PLACEHOLDER`. Nothing here imports a web framework, so the
module can be used anywhere, including tests that compare the documented routes with an
application's URL map (:func:`documented_routes` and :func:`werkzeug_rule_to_openapi`).

Every call returns a freshly built document: callers may mutate the result freely. No dict or
list object is shared between two places of one document either (a part the YAML file writes once
and reuses through an alias gets a copy per use), so the result can be dumped as YAML without
anchors.
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any, Final

import yaml

try:  # libyaml's parser when PyYAML was built with it: the same documents, ten times faster
    from yaml import CSafeLoader as _SafeLoader
except ImportError:  # pragma: no cover - PyYAML without libyaml
    from yaml import SafeLoader as _SafeLoader  # type: ignore[assignment]

__all__ = [
    "DOCUMENT_FILES",
    "OIP_TITLE",
    "OPENAPI_VERSION",
    "TITLE",
    "TITLES",
    "VERSION_PLACEHOLDER",
    "documented_routes",
    "documents_folder",
    "inference_document",
    "management_document",
    "metrics_document",
    "oip_document",
    "werkzeug_rule_to_openapi",
]

# What every document declares (the files say so; the tests check it).
OPENAPI_VERSION: Final = "3.0.1"
# TorchServe clients recognise the server by this title.
TITLE: Final = "TorchServe APIs"
# The Open Inference Protocol's document is not TorchServe's.
OIP_TITLE: Final = "Open Inference Protocol (REST)"

# ``info.version`` in the files; replaced with the server's version on every call.
VERSION_PLACEHOLDER: Final = "SERVER_VERSION"

# The file of each API, in the folder ``api`` of this package.
DOCUMENT_FILES: Final = {
    "inference": "inference.yaml",
    "management": "management.yaml",
    "metrics": "metrics.yaml",
    "oip": "oip.yaml",
}
# The title each document declares (the files say so; the tests check it).
TITLES: Final = {"inference": TITLE, "management": TITLE, "metrics": TITLE, "oip": OIP_TITLE}

HTTP_METHODS: Final = frozenset(
    {"get", "put", "post", "delete", "options", "head", "patch", "trace"}
)


def documents_folder() -> Traversable:
    """The package folder that holds the YAML documents."""
    return resources.files("trioserve.http").joinpath("api")


@functools.cache
def _template(file_name: str) -> dict[str, Any]:
    """The parsed file. Cached, so it must never be handed out: :func:`_copy` it."""
    text = documents_folder().joinpath(file_name).read_text(encoding="utf-8")
    doc = yaml.load(text, Loader=_SafeLoader)  # a safe loader: plain data only
    if not isinstance(doc, dict):
        raise ValueError(f"{file_name}: an OpenAPI document must be a YAML mapping")
    return doc


def _copy(node: Any) -> Any:
    """A deep copy that also unshares: an object met twice (a YAML alias) is copied twice."""
    if isinstance(node, dict):
        return {key: _copy(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_copy(item) for item in node]
    return node  # str, int, float, bool, None: immutable


def _document(api: str, version: str) -> dict[str, Any]:
    doc: dict[str, Any] = _copy(_template(DOCUMENT_FILES[api]))
    doc["info"]["version"] = version
    return doc


def inference_document(version: str) -> dict[str, Any]:
    """The OpenAPI document of the inference API (default port 8080)."""
    return _document("inference", version)


def management_document(version: str) -> dict[str, Any]:
    """The OpenAPI document of the management API (default port 8081)."""
    return _document("management", version)


def metrics_document(version: str) -> dict[str, Any]:
    """The OpenAPI document of the metrics API (default port 8082; never token protected)."""
    return _document("metrics", version)


def oip_document(version: str) -> dict[str, Any]:
    """The OpenAPI document of the Open Inference Protocol (KServe v2) REST routes, which
    the inference port serves beside TorchServe's inference API."""
    return _document("oip", version)


# ----------------------------------------------------------------------------------------------
# Route helpers.


def documented_routes(doc: dict[str, Any]) -> set[tuple[str, str]]:
    """``{(METHOD, path)}`` of every operation in ``doc``.

    For example ``("GET", "/models/{model_name}")``; methods are upper case.
    """
    routes: set[tuple[str, str]] = set()
    for path, item in doc.get("paths", {}).items():
        for key in item:
            if key in HTTP_METHODS:
                routes.add((key.upper(), path))
    return routes


# <name>, <converter:name> or <converter(args):name>
_WERKZEUG_VARIABLE: Final = re.compile(r"<(?:[A-Za-z_]\w*(?:\([^)]*\))?:)?([A-Za-z_]\w*)>")


def werkzeug_rule_to_openapi(rule: str) -> str:
    """``/models/<model_name>/<path:rest>`` -> ``/models/{model_name}/{rest}``."""
    return _WERKZEUG_VARIABLE.sub(r"{\1}", rule)
