"""The handler's view of the model and of the batch it is answering (``ts.context``).

:class:`Context` is created once per worker, at load time, and handed to the handler's
initialisation and to every call of its entry point. The worker refreshes the per-batch
state (request ids, request headers, response status and headers) before each batch. The
constructor and every attribute and method follow TorchServe's ``ts.context.Context`` so that
handlers written for TorchServe run unchanged; :meth:`Context.is_cancelled` and the batch
tensor methods (:meth:`Context.batch_tensor_names`, :meth:`Context.get_batch_tensor`,
:meth:`Context.get_batch_lengths`) are trioserve additions.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from trioserve.worker.tensors import BatchTensor

if TYPE_CHECKING:
    import torch

DEFAULT_SEQUENCE_ID_HEADER = "ts_request_sequence_id"
DEFAULT_SEQUENCE_START_HEADER = "ts_request_sequence_start"
DEFAULT_SEQUENCE_END_HEADER = "ts_request_sequence_end"


class RequestProcessor:
    """Request headers in, response status and headers out, for one request of a batch."""

    def __init__(self, request_header: dict[str, Any]) -> None:
        self._status_code = 200
        self._reason_phrase: str | None = None
        self._response_header: dict[str, Any] = {}
        self._request_header = request_header
        # The header names by their lowercase form (the first name of each), with the names
        # they were built from: rebuilt whenever the names change (a handler may edit the dict
        # that get_request_properties returns).
        self._folded: tuple[set[str], dict[str, str]] | None = None

    def get_request_property(self, key: str) -> Any:
        """The header ``key``; an exact match first, then any letter case (HTTP/1.1
        servers lowercase header names, while handlers ask for ``Content-Type``)."""
        headers = self._request_header
        if key in headers:
            return headers[key]
        folded = self._folded
        if folded is None or headers.keys() != folded[0]:
            names: dict[str, str] = {}
            for name in headers:
                if isinstance(name, str):
                    names.setdefault(name.lower(), name)
            folded = self._folded = (set(headers), names)
        found = folded[1].get(key.lower())
        return None if found is None else headers[found]

    def get_request_properties(self) -> dict[str, Any]:
        return self._request_header

    def report_status(self, code: int, reason_phrase: str | None = None) -> None:
        self._status_code = code
        self._reason_phrase = reason_phrase

    def get_response_status_code(self) -> int:
        return self._status_code

    def get_response_status_phrase(self) -> str | None:
        return self._reason_phrase

    def add_response_property(self, key: str, value: Any) -> None:
        self._response_header[key] = value

    def get_response_headers(self) -> dict[str, Any]:
        return self._response_header

    def get_response_header(self, key: str) -> Any:
        return self._response_header.get(key)


class Context:
    """Model facts (fixed at load) plus the state of the batch being handled.

    Collated batch tensors (a trioserve addition). For the inputs a model declares as tensors
    in its ``model-config.yaml``, the server collates the whole batch into one buffer inside
    the frame it sends, and the handler can use it instead of decoding ``data`` request by
    request (``data`` is still passed as usual)::

        x = context.get_batch_tensor("x")          # [N, ...], row i is request i
        lengths = context.get_batch_lengths("x")   # None, or int64 [N] when padded

    * :meth:`batch_tensor_names` -- the collated inputs of the current batch, in the server's
      order (empty when the server sent none, or outside a batch).
    * :meth:`get_batch_tensor` -- input ``name`` as a ``torch.Tensor`` of the declared dtype:
      ``[N, *shape]`` when every request sent the same shape (stacked), else
      ``[N, max_len, *trailing]`` with each request's rows past its length zero. It is a view
      of the received frame, made with ``torch.frombuffer``: no copy, writable, CPU (move it
      with ``.to(device)``). Each call returns a new view of the same memory.
    * :meth:`get_batch_lengths` -- ``None`` for a stacked input; for a padded one, an int64
      tensor ``[N]`` of each request's first dimension (also a view of the frame).

    An unknown name raises ``KeyError`` naming the inputs there are. The tensors belong to
    the batch: the context forgets them when the batch's final answer is out (a tensor the
    handler kept stays valid, and keeps the frame's memory alive). torch is imported only
    when a tensor is asked for.
    """

    def __init__(
        self,
        model_name: str,
        model_dir: str,
        manifest: dict[str, Any] | None,
        batch_size: int,
        gpu: int | None,
        mms_version: str,
        limit_max_image_pixels: bool = True,
        metrics: Any = None,
        model_yaml_config: dict[str, Any] | None = None,
    ) -> None:
        self.model_name = model_name
        self.manifest = manifest
        self._system_properties: dict[str, Any] = {
            "model_dir": model_dir,
            "gpu_id": gpu,
            "batch_size": batch_size,
            "server_name": "MMS",
            "server_version": mms_version,
            "limit_max_image_pixels": limit_max_image_pixels,
        }
        self.model_yaml_config: dict[str, Any] = (
            model_yaml_config if model_yaml_config is not None else {}
        )
        self.request_ids: dict[int, str] | None = None
        self._request_processor: list[RequestProcessor] | None = None
        self.metrics = metrics
        # During a batch: the channel intermediate responses go through (see streaming.py).
        self.cl_socket: Any = None
        # Continuous-batching streaming: one callable per batch index, or None.
        self.stopping_criteria: list[Callable[..., bool | None]] | None = None
        # The handler's own per-worker store (stateful handlers keep sequence state here). Not
        # a TorchServe attribute: its examples assign ``ctx.cache = {...}`` themselves, which
        # replaces this one; the worker never reads or clears it.
        self.cache: dict[Any, Any] = {}
        self.header_key_sequence_id = os.environ.get(
            "TS_REQUEST_SEQUENCE_ID", DEFAULT_SEQUENCE_ID_HEADER
        )
        self.header_key_sequence_start = os.environ.get(
            "TS_REQUEST_SEQUENCE_START", DEFAULT_SEQUENCE_START_HEADER
        )
        self.header_key_sequence_end = os.environ.get(
            "TS_REQUEST_SEQUENCE_END", DEFAULT_SEQUENCE_END_HEADER
        )
        self._cancel_check: Callable[[str], bool] | None = None
        self._batch_tensors: Mapping[str, BatchTensor] = {}

    # -- model facts -----------------------------------------------------------------------

    @property
    def system_properties(self) -> dict[str, Any]:
        return self._system_properties

    # -- per-batch state, set by the worker --------------------------------------------------

    @property
    def request_processor(self) -> list[RequestProcessor] | None:
        return self._request_processor

    @request_processor.setter
    def request_processor(self, value: list[RequestProcessor] | None) -> None:
        self._request_processor = value

    def begin_batch(
        self,
        request_ids: list[str],
        request_headers: list[dict[str, Any]],
        *,
        cancel_check: Callable[[str], bool] | None = None,
        channel: Any = None,
        tensors: Mapping[str, BatchTensor] | None = None,
    ) -> None:
        """Install the state of a new batch (called by the worker before the handler runs).

        ``tensors`` are the batch's collated inputs, already checked against the frame
        (:func:`trioserve.worker.tensors.parse_batch_tensors`).
        """
        self.request_ids = dict(enumerate(request_ids))
        self._request_processor = [RequestProcessor(h) for h in request_headers]
        self._cancel_check = cancel_check
        self.cl_socket = channel
        self._batch_tensors = dict(tensors) if tensors else {}
        set_ids = getattr(self.metrics, "set_request_ids", None)
        if callable(set_ids):
            set_ids(self.request_ids)

    def end_batch(self) -> None:
        """Detach the intermediate-response channel and drop the batch tensors once the
        batch's final answer is out."""
        self.cl_socket = None
        self._batch_tensors = {}

    def _processor(self, idx: int) -> RequestProcessor:
        if self._request_processor is None:
            raise RuntimeError("no batch is being handled: request state is only set during one")
        return self._request_processor[idx]

    # -- request side -----------------------------------------------------------------------

    def get_request_id(self, idx: int = 0) -> str | None:
        if self.request_ids is None:
            return None
        return self.request_ids.get(idx)

    def get_request_header(self, idx: int, key: str) -> Any:
        return self._processor(idx).get_request_property(key)

    def get_all_request_header(self, idx: int) -> dict[str, Any]:
        return self._processor(idx).get_request_properties()

    def get_sequence_id(self, idx: int) -> Any:
        return self._processor(idx).get_request_property(self.header_key_sequence_id)

    def is_cancelled(self, idx: int = 0) -> bool:
        """True once the server has cancelled request ``idx`` (client gone, deadline passed).

        A trioserve addition: a long-running handler can poll it and stop early. The handler
        is never interrupted; whatever it returns for a cancelled request is discarded.
        """
        request_id = self.get_request_id(idx)
        if request_id is None or self._cancel_check is None:
            return False
        return self._cancel_check(request_id)

    # -- collated batch tensors (trioserve) ---------------------------------------------------

    def batch_tensor_names(self) -> list[str]:
        """The names of the current batch's collated tensor inputs (see the class doc)."""
        return list(self._batch_tensors)

    def _batch_tensor(self, name: str) -> BatchTensor:
        try:
            return self._batch_tensors[name]
        except KeyError:
            available = ", ".join(repr(n) for n in self._batch_tensors)
            raise KeyError(
                f"no collated batch tensor named {name!r}; this batch has "
                + (available if available else "none")
                + " (the server collates the inputs declared as tensors in model-config.yaml)"
            ) from None

    def get_batch_tensor(self, name: str) -> torch.Tensor:
        """Input ``name`` of the whole batch as a ``torch.Tensor``, without a copy.

        ``[N, *shape]`` when stacked, ``[N, max_len, *trailing]`` zero-padded when the
        requests' first dimensions differ (see :meth:`get_batch_lengths`). Raises
        ``KeyError`` for a name the batch does not have.
        """
        spec = self._batch_tensor(name)
        return _frombuffer(spec.data, spec.dtype, spec.shape)

    def get_batch_lengths(self, name: str) -> torch.Tensor | None:
        """Each request's first dimension of input ``name`` (int64 ``[N]``) when the batch is
        padded; ``None`` when it is stacked. Raises ``KeyError`` for an unknown name."""
        spec = self._batch_tensor(name)
        if spec.lengths is None:
            return None
        return _frombuffer(spec.lengths, "int64", (spec.shape[0],))

    # -- response side ----------------------------------------------------------------------

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        if self._request_processor is not None and self._request_processor[idx] is not None:
            self._request_processor[idx].report_status(code, reason_phrase=phrase)

    def set_all_response_status(self, code: int = 200, phrase: str = "") -> None:
        for processor in self._request_processor or []:
            processor.report_status(code, reason_phrase=phrase)

    def get_response_status(self, idx: int) -> tuple[int, str | None]:
        processor = self._processor(idx)
        return processor.get_response_status_code(), processor.get_response_status_phrase()

    def set_response_header(self, idx: int, key: str, value: Any) -> None:
        self._processor(idx).add_response_property(key, value)

    def get_response_headers(self, idx: int) -> dict[str, Any]:
        return self._processor(idx).get_response_headers()

    def set_response_content_type(self, idx: int, value: str) -> None:
        self.set_response_header(idx, "content-type", value)

    def get_response_content_type(self, idx: int) -> Any:
        return self.get_response_headers(idx).get("content-type")


def _frombuffer(view: memoryview, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor of ``shape`` over ``view`` (no copy, unless ``view`` is read-only)."""
    import torch

    torch_dtype = getattr(torch, dtype)
    if view.nbytes == 0:  # torch.frombuffer refuses empty buffers
        return torch.empty(shape, dtype=torch_dtype)
    if view.readonly:  # never from the worker's frames; wrapping would let torch write to it
        view = memoryview(bytearray(view))
    return torch.frombuffer(view, dtype=torch_dtype).view(shape)
