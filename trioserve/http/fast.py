"""The inference port's fast path (:mod:`trioserve.http.front`): predictions and
explanations with a raw body, the OIP, KServe v1 and OpenAI routes, answered without Quart.

TorchServe's prediction routes can also be *started* (:meth:`InferenceFastPath.start`):
submitted without a task waiting, their answer written by whoever delivers the reply
(docs/design.md, "The inference port's HTTP server").
"""

from __future__ import annotations

from collections.abc import Callable

from trioserve.auth import TokenStore
from trioserve.core.errors import ServeError
from trioserve.core.http1 import Request
from trioserve.core.messages import Param
from trioserve.core.request import InferenceRequest
from trioserve.http import kserve, oip, openai
from trioserve.http.bodies import Answer
from trioserve.http.errors import error_answer
from trioserve.http.inference import (
    FORMS,
    ROUTES,
    counted,
    first_answer,
    predict,
    prediction_headers,
    sequence_header_of,
    submit,
    with_sequence,
)
from trioserve.runtime.dataplane import Call, Dataplane
from trioserve.runtime.oip_repository import ModelControl

# Routes whose failures answer their protocol's JSON error and which read no forms.
KSERVE_LIKE = oip.OIP_ENDPOINTS | kserve.V1_ENDPOINTS | openai.OPENAI_ENDPOINTS
# Routes whose requests InferenceFastPath.start submits without a task waiting.
TORCHSERVE_PREDICTIONS = frozenset({"predictions", "explanations"})


def _mimetype(content_type: bytes) -> str:
    return content_type.split(b";", 1)[0].strip().lower().decode("latin-1")


class Pending:
    """A prediction submitted by :meth:`InferenceFastPath.start`, its answer not yet known:
    :meth:`poll` gives it once the call's first reply (or its failure) is in."""

    __slots__ = ("_call", "_request_id", "_sequence")

    def __init__(self, call: Call, request_id: str, sequence: tuple[str, str] | None) -> None:
        self._call = call
        self._request_id = request_id
        self._sequence = sequence

    def when_ready(self, wake: Callable[[], object]) -> None:
        self._call.when_ready(wake)

    def cancel(self) -> None:
        self._call.cancel()

    def poll(self) -> Answer | None:
        """The answer (streamed when the handler sends intermediate replies), or None when
        no reply has come yet; as :func:`predict` answers."""
        try:
            item = self._call.poll_reply()
        except ServeError as error:
            answer = error_answer(error, self._request_id)
            return counted(with_sequence(answer, self._sequence))
        if item is None:
            return None
        first, final = item
        return first_answer(first, final, self._call, self._request_id, self._sequence)


class InferenceFastPath:
    """Predictions and explanations with a raw body, answered without Quart (the front's
    fast path): awaited whole (``await fast(request)``), or, for TorchServe's prediction
    routes, begun without a task waiting (:meth:`start`) so that the reply is written by
    whoever delivers it (see :mod:`trioserve.http.connection`)."""

    def __init__(
        self,
        dataplane: Dataplane,
        tokens: TokenStore | None = None,
        management: ModelControl | None = None,
    ) -> None:
        self.dataplane = dataplane
        self.tokens = tokens
        self.management = management
        self.sequence_header = dataplane.sequence_header.lower().encode("latin-1")

    def _refusal(self, endpoint: str, kserve_api: bool, request: Request) -> Answer | None:
        """The answer to a request without the key its route needs (None: it may go on)."""
        if self.tokens is None:
            return None
        try:
            ROUTES.authorize(
                self.tokens,
                endpoint,
                ((n.decode("latin-1"), v.decode("latin-1")) for n, v in request.headers),
            )
        except ServeError as error:
            if endpoint in openai.OPENAI_ENDPOINTS:
                return openai.serve_error_answer(error)
            return oip.oip_error(error) if kserve_api else error_answer(error)
        return None

    def _prediction(
        self, request: Request, endpoint: str, variables: dict[str, str], content_type: bytes | None
    ) -> InferenceRequest:
        rest = variables.get("rest")
        param = Param(
            "body", request.body, None if content_type is None else content_type.decode("latin-1")
        )
        sequence_id = request.header(self.sequence_header)
        return InferenceRequest(
            model=variables["model_name"],
            version=variables.get("model_version"),
            params=[param],
            headers=prediction_headers(request.headers, endpoint == "explanations", rest),
            sequence_id=sequence_id.decode("latin-1") if sequence_id else None,
        )

    def _admit(
        self, request: Request, endpoints: frozenset[str] | None = None
    ) -> tuple[str, dict[str, str], bytes | None] | Answer | None:
        """The endpoint, variables and content type of a request the fast path answers; the
        refusal of one without the key its route needs; None for a request that is not the
        fast path's (an unknown route, a form, an endpoint not in ``endpoints``)."""
        matched = ROUTES.match(request.method, request.path)
        if matched is None:
            return None
        route, variables = matched
        endpoint = route.endpoint
        if endpoints is not None and endpoint not in endpoints:
            return None
        # KServe's protocols (v2 and v1) answer {"error"} bodies and read no forms.
        kserve_api = endpoint in KSERVE_LIKE
        content_type = request.header(b"content-type")
        if not kserve_api and content_type is not None and _mimetype(content_type) in FORMS:
            return None  # forms go through the Quart app
        refusal = self._refusal(endpoint, kserve_api, request)
        return refusal if refusal is not None else (endpoint, variables, content_type)

    def start(self, request: Request) -> Answer | Pending | None:
        """Submit a TorchServe prediction or explanation without waiting for it: its answer
        at once (a refusal), or the pending call. None for every other request (the
        awaited path or the app answers those)."""
        admitted = self._admit(request, TORCHSERVE_PREDICTIONS)
        if admitted is None or isinstance(admitted, Answer):
            return admitted
        endpoint, variables, content_type = admitted
        infer = self._prediction(request, endpoint, variables, content_type)
        call = submit(self.dataplane, infer)
        if isinstance(call, Answer):
            return call
        sequence = sequence_header_of(self.dataplane, call.sequence_id)
        return Pending(call, infer.request_id, sequence)

    async def __call__(self, request: Request) -> Answer | None:
        admitted = self._admit(request)
        if admitted is None or isinstance(admitted, Answer):
            return admitted
        endpoint, variables, content_type = admitted
        dataplane = self.dataplane
        if endpoint in openai.OPENAI_ENDPOINTS:
            return await openai.answer(dataplane, endpoint, request.body)
        if endpoint in kserve.V1_ENDPOINTS:
            return await kserve.answer(
                dataplane, endpoint, variables, request.headers, request.body
            )
        if endpoint in oip.OIP_ENDPOINTS:
            return await oip.answer(
                dataplane, endpoint, variables, request.headers, request.body, self.management
            )
        infer = self._prediction(request, endpoint, variables, content_type)
        return await predict(dataplane, infer)


def fast_path(
    dataplane: Dataplane,
    *,
    tokens: TokenStore | None = None,
    management: ModelControl | None = None,
) -> InferenceFastPath:
    """The inference port's fast path (:class:`InferenceFastPath`)."""
    return InferenceFastPath(dataplane, tokens, management)
