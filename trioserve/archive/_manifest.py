"""``MAR-INF/MANIFEST.json``: the archive's description of the model (spec §6.2)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final

from ._errors import ArchiveError

MANIFEST_PATH: Final = "MAR-INF/MANIFEST.json"
RUNTIMES: Final = ("python", "python3", "LSP")


@dataclass(frozen=True)
class Manifest:
    """The fields the server uses; ``raw`` keeps the whole document, unknown keys included.

    A field is ``None`` when the manifest does not set it. ``Manifest()`` is the empty
    manifest used for an archive that has none.
    """

    model_name: str | None = None
    model_version: str | None = None
    handler: str | None = None
    runtime: str = "python"
    serialized_file: str | None = None
    model_file: str | None = None
    requirements_file: str | None = None
    config_file: str | None = None
    envelope: str | None = None
    description: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, hash=False)


def parse_manifest(data: bytes) -> Manifest:
    """Parse MANIFEST.json bytes. Raises :class:`ArchiveError` (400) when it is unusable."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ArchiveError(400, f"{MANIFEST_PATH} is not UTF-8: {exc}") from None
    try:
        raw = json.loads(text)
        # Numbers are read a second time as their source text, so that a version written
        # as a JSON number keeps its spelling ("1.10" stays "1.10", not "1.1").
        literal = json.loads(text, parse_int=str, parse_float=str)
    except (ValueError, RecursionError) as exc:
        raise ArchiveError(400, f"{MANIFEST_PATH} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ArchiveError(400, f"{MANIFEST_PATH} must hold a JSON object")

    model = raw.get("model")
    model_literal = literal.get("model")
    if model is None:
        model, model_literal = {}, {}
    elif not isinstance(model, dict):
        raise ArchiveError(400, f"{MANIFEST_PATH}: 'model' must be an object")

    def text_field(where: dict[str, Any], where_literal: dict[str, Any], key: str) -> str | None:
        value = where.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            label = key if where is raw else f"model.{key}"
            raise ArchiveError(
                400,
                f"{MANIFEST_PATH}: {label} must be a string, got {type(value).__name__}",
            )
        result = str(where_literal[key])
        return result or None

    def model_field(key: str) -> str | None:
        return text_field(model, model_literal, key)

    runtime = raw.get("runtime")
    if runtime is None:
        runtime = "python"
    elif runtime not in RUNTIMES:
        raise ArchiveError(
            400,
            f"{MANIFEST_PATH}: invalid runtime {runtime!r} (expected one of {', '.join(RUNTIMES)})",
        )

    return Manifest(
        model_name=model_field("modelName"),
        model_version=model_field("modelVersion") or model_field("version"),
        handler=model_field("handler"),
        runtime=runtime,
        serialized_file=model_field("serializedFile"),
        model_file=model_field("modelFile"),
        requirements_file=model_field("requirementsFile"),
        config_file=model_field("configFile"),
        envelope=model_field("envelope"),
        description=model_field("description") or text_field(raw, literal, "description"),
        raw=raw,
    )
