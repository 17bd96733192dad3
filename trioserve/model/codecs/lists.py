"""Helpers for payloads that are a list of strings / bytes, or a single one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["ListElement", "ListPayload", "as_list", "is_list_of"]

ListElement = bytes | str
ListPayload = ListElement | list[ListElement]


def is_list_of(payload: Any, instance_type: type | tuple[type, ...]) -> bool:
    """Whether ``payload`` is a list whose every element is an ``instance_type``."""
    return isinstance(payload, list) and all(isinstance(e, instance_type) for e in payload)


def as_list(payload: Any) -> Iterator[Any]:
    """The elements of a list payload, or a single element as a one-item sequence."""
    if isinstance(payload, list):
        yield from payload
    else:
        yield payload
