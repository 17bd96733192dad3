"""MLServer's exception classes (``mlserver.errors``), each with its HTTP status code."""

from __future__ import annotations

__all__ = [
    "InferenceError",
    "InvalidModelURI",
    "MLServerError",
    "ModelNotFound",
    "ModelNotReady",
    "ModelParametersMissing",
]


class MLServerError(Exception):
    """The base of MLServer's errors; ``status_code`` is what the HTTP front answers.

    As in MLServer, the default is 400 (the request's fault), not 500.
    """

    def __init__(self, msg: str, status_code: int = 400) -> None:
        super().__init__(msg)
        self.status_code = status_code


class InvalidModelURI(MLServerError):
    def __init__(self, name: str, model_uri: str | None = None) -> None:
        msg = f"Invalid URI specified for model {name}"
        if model_uri:
            msg = f"{msg} ({model_uri})"
        super().__init__(msg, 422)


class ModelNotFound(MLServerError):
    def __init__(self, name: str, version: str | None = None) -> None:
        if version is None:
            msg = f"Model {name} not found"
        else:
            msg = f"Model {name} with version {version} not found"
        super().__init__(msg, 404)


class ModelNotReady(MLServerError):
    def __init__(self, name: str, version: str | None = None) -> None:
        if version is None:
            msg = f"Model {name} is not ready yet."
        else:
            msg = f"Model {name} with version {version} is not ready yet."
        super().__init__(msg, 400)


class InferenceError(MLServerError):
    def __init__(self, msg: str) -> None:
        super().__init__(msg, 400)


class ModelParametersMissing(MLServerError):
    def __init__(self, model_name: str) -> None:
        super().__init__(f"Parameters missing for model {model_name}", 400)
