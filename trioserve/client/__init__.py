"""Async gRPC client for trioserve (and TorchServe) and the ``trioserve-client`` command."""

from trioserve.client.client import (
    DEFAULT_INFERENCE_PORT,
    DEFAULT_MANAGEMENT_PORT,
    Client,
    Inputs,
    as_inputs,
    prediction_request,
)

__all__ = [
    "DEFAULT_INFERENCE_PORT",
    "DEFAULT_MANAGEMENT_PORT",
    "Client",
    "Inputs",
    "as_inputs",
    "prediction_request",
]
