"""Helpers handlers import from ``ts.utils.util``.

``PredictionException`` fails a batch with a chosen code; ``list_classes_from_module`` is the
class rule the loader and :class:`~trioserve.worker.torchserve.base_handler.BaseHandler` use;
the label helpers read ``index_to_name.json`` and turn class probabilities into
``{label: prob}``.
"""

from __future__ import annotations

import inspect
import itertools
import json
import logging
import os
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from trioserve.worker.torchserve.errors import PredictionException

__all__ = [
    "PredictionException",
    "get_yaml_config",
    "list_classes_from_module",
    "load_label_mapping",
    "map_class_to_label",
]

log = logging.getLogger("trioserve.worker")


def list_classes_from_module(module: ModuleType, parent_class: type | None = None) -> list[type]:
    """Classes defined in ``module`` itself (not imported into it), optionally subclasses of
    ``parent_class``, sorted by name."""
    found = [
        cls
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if cls.__module__ == module.__name__
    ]
    if parent_class is not None:
        found = [cls for cls in found if issubclass(cls, parent_class)]
    return found


def load_label_mapping(mapping_file_path: str) -> dict[str, str] | None:
    """``{class index: label}`` from a JSON file, or None if the file does not exist.

    Values may be a label or a list whose last element is the label (ImageNet style); a file
    of the form ``{"object_type_names": [...]}`` is also accepted.
    """
    if not os.path.isfile(mapping_file_path):
        log.warning("%r is missing; answers will not carry class names", mapping_file_path)
        return None
    with open(mapping_file_path, encoding="utf-8") as f:
        mapping = json.load(f)
    if not isinstance(mapping, dict):
        raise ValueError(f"{mapping_file_path}: expected a JSON object of index -> label")
    names = mapping.get("object_type_names")
    if isinstance(names, list):
        return {str(i): str(name) for i, name in enumerate(names)}
    result: dict[str, str] = {}
    for key, value in mapping.items():
        label = value[-1] if isinstance(value, list) and value else value
        if not isinstance(label, str):
            raise ValueError(
                f"{mapping_file_path}: the label of {key!r} must be a string or a list of strings"
            )
        result[str(key)] = label
    return result


def map_class_to_label(
    probs: list[list[Any]],
    mapping: dict[str, str] | None = None,
    lbl_classes: Iterable[Iterable[Any]] | None = None,
) -> list[dict[str, Any]]:
    """One ``{label: probability}`` dict per row of ``probs``.

    ``lbl_classes`` gives each row's class indices (default ``0..n-1``); labels come from
    ``mapping`` (by ``str(index)``) or are the index itself as a string.
    """
    if not isinstance(probs, list):
        raise TypeError("convert the probabilities to a list before mapping them to labels")
    if mapping is not None and not isinstance(mapping, dict):
        raise TypeError("the label mapping must be a dict")
    if lbl_classes is None:
        width = len(probs[0]) if probs else 0
        lbl_classes = itertools.repeat(range(width), len(probs))
    results: list[dict[str, Any]] = []
    for classes, row in zip(lbl_classes, probs, strict=False):
        results.append(
            {
                (mapping[str(c)] if mapping is not None else str(c)): p
                for c, p in zip(classes, row, strict=False)
            }
        )
    return results


def get_yaml_config(yaml_file_path: str) -> dict[str, Any]:
    """The YAML file as a dict (empty for an empty file)."""
    import yaml

    with open(yaml_file_path, encoding="utf-8") as f:
        loaded = yaml.safe_load(f)
    return loaded if isinstance(loaded, dict) else {}
