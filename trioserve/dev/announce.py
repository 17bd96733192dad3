"""The lines ``trioserve dev`` prints (sans-IO): the curl line, reloads, failures.

Every line starts with ``[dev]`` except the curl line itself, which is printed alone on its
line so that it can be copied (or run) as it is.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Collection, Sequence
from pathlib import PurePath
from typing import Any, Final
from urllib.parse import quote, urlsplit

from trioserve.archive import TensorDeclaration

PREFIX: Final = "[dev]"
CONTENT_TYPES: Final = {
    ".json": "application/json",
    ".txt": "text/plain",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".png": "image/png",
}
DEFAULT_TEXT: Final = "hello"
# Wildcard listening addresses are reached on the loopback address of their family.
_WILDCARDS: Final = {"0.0.0.0": "127.0.0.1", "[::]": "[::1]"}


def curl_command(
    bound: str,
    name: str,
    *,
    key: str | None,
    oip: bool,
    sample: PurePath | None = None,
    inputs: Sequence[TensorDeclaration] = (),
) -> str:
    """The curl command line that calls model ``name`` on the inference listener ``bound``
    (a URL of the server's READY report): TorchServe's ``/predictions`` for a handler, the
    Open Inference Protocol's ``/v2/models/NAME/infer`` when ``oip``. The body is
    ``sample``'s when there is one; else a short text, or for OIP a request with one tensor
    per declared input (zeros, or ``"hello"`` for BYTES)."""
    args = ["curl", "-sS", "-X", "POST"]
    base = bound
    if bound.startswith("unix:"):
        args += ["--unix-socket", bound.removeprefix("unix:")]
        base = "http://localhost"
    else:
        parts = urlsplit(bound)
        host = parts.netloc.rsplit(":", 1)
        if host[0] in _WILDCARDS:
            base = f"{parts.scheme}://{_WILDCARDS[host[0]]}:{host[1]}"
    base = base.rstrip("/")
    quoted = quote(name, safe="")
    path = f"/v2/models/{quoted}/infer" if oip else f"/predictions/{quoted}"
    args.append(base + path)
    if key is not None:
        args += ["-H", f"Authorization: Bearer {key}"]
    if sample is not None:
        content_type = CONTENT_TYPES.get(sample.suffix.lower(), "application/octet-stream")
        args += ["-H", f"Content-Type: {content_type}", "--data-binary", f"@{sample}"]
    elif oip:
        body = json.dumps(oip_body(inputs), separators=(",", ":"))
        args += ["-H", "Content-Type: application/json", "--data-binary", body]
    else:
        args += ["-H", "Content-Type: text/plain", "--data-binary", DEFAULT_TEXT]
    return shlex.join(args)


def oip_body(inputs: Sequence[TensorDeclaration]) -> dict[str, Any]:
    """An inference request with one tensor per declared input (any size: 1)."""
    if not inputs:
        inputs = (TensorDeclaration("input-0", "BYTES", (1,)),)
    tensors = []
    for tensor in inputs:
        shape = [d if d > 0 else 1 for d in tensor.shape] or [1]
        count = math.prod(shape)
        value: Any = DEFAULT_TEXT if tensor.datatype == "BYTES" else 0
        if tensor.datatype == "BOOL":
            value = False
        tensors.append(
            {"name": tensor.name, "shape": shape, "datatype": tensor.datatype,
             "data": [value] * count}
        )  # fmt: skip
    return {"inputs": tensors}


def serving(name: str, kind: str, folder: PurePath) -> str:
    return f"{PREFIX} serving {name} ({kind}) from {folder}; edits there reload it"


def reloaded(name: str, seconds: float) -> str:
    return f"{PREFIX} reloaded {name} in {seconds:.1f} s"


def loaded(name: str, seconds: float) -> str:
    return f"{PREFIX} loaded {name} in {seconds:.1f} s"


def superseded(name: str) -> str:
    return f"{PREFIX} newer edits came while {name} was loading: reloading again"


def load_failed(reason: str) -> str:
    """The failure's first line stands out; the rest (a traceback) follows indented."""
    first, *rest = reason.strip().splitlines() or ["unknown error"]
    return "\n".join([f"{PREFIX} load failed: {first}", *(f"    {line}" for line in rest)])


def changed(paths: Collection[str], shown: int = 3) -> str:
    ordered = sorted(paths)
    text = ", ".join(ordered[:shown])
    if len(ordered) > shown:
        text += f" and {len(ordered) - shown} more"
    return f"{PREFIX} changed: {text}; reloading"


__all__ = [
    "changed",
    "curl_command",
    "load_failed",
    "loaded",
    "oip_body",
    "reloaded",
    "serving",
    "superseded",
]
