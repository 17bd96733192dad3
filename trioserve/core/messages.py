"""Typed messages carried by frames, and their conversion to and from frames.

These are the only shapes that cross the server/worker boundary. Keeping the conversion
here (sans-IO) means the worker and the server share one definition.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trioserve.core.frames import FLAG_FINAL, Frame, FrameError, Kind, encode
from trioserve.core.limits import DEFAULT_LIMITS, RequestLimits

DEFAULT_MAX_RESPONSE_SIZE = 6553500  # TorchServe's max_response_size default


@dataclass(slots=True)
class Param:
    """One named handler input (a form field, the raw body, a gRPC input key)."""

    name: str
    value: bytes | bytearray | memoryview
    content_type: str | None = None


@dataclass(slots=True)
class WorkItem:
    """One request inside a batch, as the worker sees it."""

    request_id: str
    headers: list[tuple[str, str]]
    params: list[Param]


@dataclass(slots=True)
class Reply:
    """One answer (intermediate or final) to one request."""

    request_id: str
    body: bytes | bytearray | memoryview
    status: int = 200
    reason: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str | None = None


@dataclass(slots=True)
class BatchReply:
    """A RESPONSE frame: batch-level code plus per-request replies."""

    batch_id: int
    code: int
    message: str
    replies: list[Reply]
    final: bool


def _expect(frame: Frame, kind: Kind) -> None:
    if frame.kind is not kind:
        raise FrameError(f"expected a {kind.name} frame, got {frame.kind.name}")


def _str(meta: dict[str, Any], key: str) -> str:
    value = meta.get(key)
    if not isinstance(value, str):
        raise FrameError(f"field {key!r} must be a string")
    return value


def _int(meta: dict[str, Any], key: str) -> int:
    value = meta.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise FrameError(f"field {key!r} must be an integer")
    return value


def _blob(blobs: list[memoryview], index: object) -> memoryview:
    if not isinstance(index, int) or not 0 <= index < len(blobs):
        raise FrameError(f"blob index {index!r} is out of range")
    return blobs[index]


def encode_batch(batch_id: int, items: list[WorkItem]) -> bytes:
    blobs: list[bytes | bytearray | memoryview] = []
    requests = []
    for item in items:
        params = []
        for p in item.params:
            params.append({"name": p.name, "ct": p.content_type, "blob": len(blobs)})
            blobs.append(p.value)
        requests.append(
            {"id": item.request_id, "headers": [list(h) for h in item.headers], "params": params}
        )
    return encode(Kind.BATCH, {"batch_id": batch_id, "requests": requests}, blobs)


def decode_batch(frame: Frame) -> tuple[int, list[WorkItem]]:
    _expect(frame, Kind.BATCH)
    return _int(frame.meta, "batch_id"), _decode_items(frame)


def encode_stream_input(
    request_id: str,
    params: list[Param],
    *,
    end: bool,
    headers: list[tuple[str, str]] | None = None,
) -> bytes:
    """The next input of the streamed request ``request_id`` (``params`` and ``headers`` as a
    work item's; ``end``: none will follow, and ``params`` may be empty)."""
    blobs: list[bytes | bytearray | memoryview] = []
    described = []
    for p in params:
        described.append({"name": p.name, "ct": p.content_type, "blob": len(blobs)})
        blobs.append(p.value)
    head = [list(h) for h in headers or ()]
    meta = {"requests": [{"id": request_id, "headers": head, "params": described}], "end": end}
    return encode(Kind.STREAM_INPUT, meta, blobs)


def decode_stream_input(frame: Frame) -> tuple[WorkItem, bool]:
    """``(the input as a work item, end)`` of a STREAM_INPUT frame."""
    _expect(frame, Kind.STREAM_INPUT)
    items = _decode_items(frame)
    end = frame.meta.get("end")
    if len(items) != 1 or not isinstance(end, bool):
        raise FrameError("a STREAM_INPUT frame holds one request and a boolean 'end'")
    return items[0], end


def encode_stream_ack(request_id: str, count: int) -> bytes:
    """``count`` more intermediate replies of ``request_id`` were read by its client."""
    return encode(Kind.STREAM_ACK, {"id": request_id, "n": count})


def decode_stream_ack(frame: Frame) -> tuple[str, int]:
    _expect(frame, Kind.STREAM_ACK)
    return _str(frame.meta, "id"), _int(frame.meta, "n")


def _decode_items(frame: Frame) -> list[WorkItem]:
    raw = frame.meta.get("requests")
    if not isinstance(raw, list):
        raise FrameError("field 'requests' must be a list")
    items: list[WorkItem] = []
    for req in raw:
        if not isinstance(req, dict):
            raise FrameError("each request must be an object")
        headers_raw = req.get("headers", [])
        if not isinstance(headers_raw, list) or not all(
            isinstance(h, list) and len(h) == 2 and all(isinstance(x, str) for x in h)
            for h in headers_raw
        ):
            raise FrameError("request headers must be a list of [name, value] strings")
        params_raw = req.get("params", [])
        if not isinstance(params_raw, list):
            raise FrameError("request params must be a list")
        params: list[Param] = []
        for p in params_raw:
            if not isinstance(p, dict):
                raise FrameError("each param must be an object")
            ct = p.get("ct")
            if ct is not None and not isinstance(ct, str):
                raise FrameError("param content type must be a string or null")
            params.append(Param(_str(p, "name"), _blob(frame.blobs, p.get("blob")), ct))
        items.append(WorkItem(_str(req, "id"), [(h[0], h[1]) for h in headers_raw], params))
    return items


def encode_reply(reply: BatchReply) -> bytes:
    blobs: list[bytes | bytearray | memoryview] = []
    items = []
    for r in reply.replies:
        items.append(
            {
                "id": r.request_id,
                "status": r.status,
                "reason": r.reason,
                "headers": r.headers,
                "ct": r.content_type,
                "blob": len(blobs),
            }
        )
        blobs.append(r.body)
    meta = {
        "batch_id": reply.batch_id,
        "code": reply.code,
        "message": reply.message,
        "items": items,
    }
    return encode(Kind.RESPONSE, meta, blobs, flags=FLAG_FINAL if reply.final else 0)


def decode_reply(frame: Frame) -> BatchReply:
    _expect(frame, Kind.RESPONSE)
    meta = frame.meta
    raw = meta.get("items", [])
    if not isinstance(raw, list):
        raise FrameError("field 'items' must be a list")
    replies: list[Reply] = []
    for item in raw:
        if not isinstance(item, dict):
            raise FrameError("each reply item must be an object")
        headers = item.get("headers", {})
        if not isinstance(headers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            raise FrameError("reply headers must map strings to strings")
        ct = item.get("ct")
        if ct is not None and not isinstance(ct, str):
            raise FrameError("reply content type must be a string or null")
        replies.append(
            Reply(
                request_id=_str(item, "id"),
                body=_blob(frame.blobs, item.get("blob")),
                status=_int(item, "status"),
                reason=_str(item, "reason"),
                headers=headers,
                content_type=ct,
            )
        )
    return BatchReply(
        batch_id=_int(meta, "batch_id"),
        code=_int(meta, "code"),
        message=_str(meta, "message"),
        replies=replies,
        final=frame.final,
    )


@dataclass(slots=True)
class LoadSpec:
    """What a worker needs to load a model."""

    model_name: str
    model_version: str
    model_dir: str
    handler: str
    batch_size: int = 1
    envelope: str | None = None
    manifest: dict[str, Any] | None = None
    model_yaml_config: dict[str, Any] = field(default_factory=dict)
    gpu_id: int | None = None
    limit_max_image_pixels: bool = True
    # An MLServer model: its model-settings.json (``handler`` is its implementation).
    model_settings: dict[str, Any] | None = None
    # The largest answer to one request the server takes (a larger one is refused, not sent),
    # and what one request may expand to (the worker parses some bodies itself).
    max_response_size: int = DEFAULT_MAX_RESPONSE_SIZE
    request_limits: RequestLimits = DEFAULT_LIMITS
    # The largest RESPONSE frame the server reads from this worker (0: derived from
    # ``max_response_size`` and ``batch_size``); the server sends the number it uses.
    max_response_frame: int = 0

    def to_meta(self) -> dict[str, Any]:
        return {
            "model_name": self.model_name,
            "model_version": self.model_version,
            "model_dir": self.model_dir,
            "handler": self.handler,
            "batch_size": self.batch_size,
            "envelope": self.envelope,
            "manifest": self.manifest,
            "model_yaml_config": self.model_yaml_config,
            "gpu_id": self.gpu_id,
            "limit_max_image_pixels": self.limit_max_image_pixels,
            "model_settings": self.model_settings,
            "max_response_size": self.max_response_size,
            "request_limits": self.request_limits.to_meta(),
            "max_response_frame": self.max_response_frame,
        }

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> LoadSpec:
        gpu = meta.get("gpu_id")
        manifest = meta.get("manifest")
        yaml_config = meta.get("model_yaml_config") or {}
        envelope = meta.get("envelope")
        if gpu is not None and not isinstance(gpu, int):
            raise FrameError("gpu_id must be an integer or null")
        if manifest is not None and not isinstance(manifest, dict):
            raise FrameError("manifest must be an object or null")
        if not isinstance(yaml_config, dict):
            raise FrameError("model_yaml_config must be an object")
        if envelope is not None and not isinstance(envelope, str):
            raise FrameError("envelope must be a string or null")
        model_settings = meta.get("model_settings")
        if model_settings is not None and not isinstance(model_settings, dict):
            raise FrameError("model_settings must be an object or null")
        return cls(
            model_name=_str(meta, "model_name"),
            model_version=_str(meta, "model_version"),
            model_dir=_str(meta, "model_dir"),
            handler=_str(meta, "handler"),
            batch_size=_int(meta, "batch_size"),
            envelope=envelope,
            manifest=manifest,
            model_yaml_config=yaml_config,
            gpu_id=gpu,
            limit_max_image_pixels=bool(meta.get("limit_max_image_pixels", True)),
            model_settings=model_settings,
            max_response_size=_int(meta, "max_response_size")
            if "max_response_size" in meta
            else DEFAULT_MAX_RESPONSE_SIZE,
            request_limits=RequestLimits.from_meta(meta.get("request_limits")),
            max_response_frame=_int(meta, "max_response_frame")
            if "max_response_frame" in meta
            else 0,
        )


def encode_load(spec: LoadSpec) -> bytes:
    return encode(Kind.LOAD, spec.to_meta())


def encode_load_result(code: int, message: str, streams: bool | None = None) -> bytes:
    """``streams``: whether the loaded model answers a stream with its own code (an MLServer
    runtime's ``predict_stream``); None: not known (a TorchServe handler), left out."""
    meta: dict[str, Any] = {"code": code, "message": message}
    if streams is not None:
        meta["streams"] = streams
    return encode(Kind.LOAD_RESULT, meta)


def load_result_streams(frame: Frame) -> bool | None:
    """A LOAD_RESULT's ``streams`` (None when absent or not a boolean)."""
    streams = frame.meta.get("streams")
    return streams if isinstance(streams, bool) else None


def encode_cancel(request_ids: list[str]) -> bytes:
    return encode(Kind.CANCEL, {"ids": request_ids})


def decode_cancel(frame: Frame) -> list[str]:
    _expect(frame, Kind.CANCEL)
    ids = frame.meta.get("ids")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise FrameError("field 'ids' must be a list of strings")
    return ids
