"""``ts.torch_handler.request_envelope.*``: TorchServe's envelope classes, for handlers that
import them.

:class:`BaseEnvelope` works as TorchServe's: ``handle(data, context)`` runs ``parse_input``,
the wrapped entry point, then ``format_output``, so a custom envelope written against it
runs unchanged. ``BodyEnvelope``, ``JSONEnvelope``, ``KServeEnvelope`` and
``KServev2Envelope`` run trioserve's envelopes of those names
(:mod:`trioserve.worker.envelopes`) whole; their ``parse_input`` and ``format_output`` are
not separate steps here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

from trioserve.worker import envelopes

Entry = Callable[[Any, Any], Any]


class BaseEnvelope(ABC):
    def __init__(self, handle_fn: Entry) -> None:
        self._handle_fn = handle_fn
        self.context: Any = None

    def handle(self, data: Any, context: Any) -> Any:
        self.context = context
        if data:
            data = self.parse_input(data)
        results = self._handle_fn(data, context)
        if results:
            results = self.format_output(results)
        return results

    @abstractmethod
    def parse_input(self, data: Any) -> Any: ...

    @abstractmethod
    def format_output(self, data: Any) -> Any: ...


class _Builtin(BaseEnvelope):
    name: ClassVar[str]

    def handle(self, data: Any, context: Any) -> Any:
        self.context = context
        return envelopes.wrap(self.name, self._handle_fn)(data, context)

    def parse_input(self, data: Any) -> Any:
        raise NotImplementedError(f"the {self.name} envelope parses and formats in handle()")

    def format_output(self, data: Any) -> Any:
        raise NotImplementedError(f"the {self.name} envelope parses and formats in handle()")


class BodyEnvelope(_Builtin):
    name = "body"


class JSONEnvelope(_Builtin):
    name = "json"


class KServeEnvelope(_Builtin):
    name = "kserve"


class KServev2Envelope(_Builtin):
    name = "kservev2"


__all__ = ["BaseEnvelope", "BodyEnvelope", "JSONEnvelope", "KServeEnvelope", "KServev2Envelope"]
