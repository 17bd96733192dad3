"""Demo classifier handler: a TorchServe ``BaseHandler`` subclass for a 16-feature MLP.

Runs unchanged on TorchServe and on trioserve. ``BaseHandler`` loads the TorchScript
``model.pt`` named by the manifest's ``serializedFile`` and the ``index_to_name.json`` label
map; this class only turns request bodies into a tensor and logits into labelled probabilities.

Request body (JSON), one per request:
    [16 numbers]            or            {"data": [16 numbers]}
Response, one per request: ``{label: probability}`` for all 4 classes, most likely first.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import torch
from ts.torch_handler.base_handler import BaseHandler

NUM_FEATURES = 16
MAPPING_FILE = "index_to_name.json"


class ClassifierHandler(BaseHandler):
    """Softmax classifier over ``index_to_name.json`` labels."""

    def initialize(self, context: Any) -> None:
        super().initialize(context)
        if not self.mapping:
            # BaseHandler loads the map too; this keeps the handler correct on a base class
            # that does not.
            model_dir = context.system_properties.get("model_dir") or "."
            path = os.path.join(model_dir, MAPPING_FILE)
            if os.path.isfile(path):
                with open(path, encoding="utf-8") as f:
                    self.mapping = json.load(f)

    # -- request -> tensor -------------------------------------------------------------------

    @staticmethod
    def _request_value(row: Any) -> Any:
        """The request's payload: the raw body, or a form field / gRPC input named ``data``."""
        if isinstance(row, dict):
            for key in ("body", "data"):
                if key in row:
                    return row[key]
            if len(row) == 1:
                return next(iter(row.values()))
        return row

    @staticmethod
    def parse_features(value: Any, idx: int = 0) -> list[float]:
        """Validate one request payload; raise ValueError saying what is wrong."""
        where = f"request {idx}"
        if isinstance(value, bytes | bytearray):
            try:
                value = bytes(value).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{where}: body is not UTF-8 JSON: {exc}") from None
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: body is not valid JSON: {exc}") from None
        if isinstance(value, dict):
            if "data" not in value:
                raise ValueError(
                    f"{where}: expected a JSON list of {NUM_FEATURES} numbers or "
                    f'{{"data": [...]}}, got an object with keys {sorted(value)}'
                )
            value = value["data"]
        if not isinstance(value, list):
            raise ValueError(
                f"{where}: expected a JSON list of {NUM_FEATURES} numbers, "
                f"got {type(value).__name__}"
            )
        if len(value) != NUM_FEATURES:
            raise ValueError(f"{where}: expected {NUM_FEATURES} numbers, got {len(value)}")
        features: list[float] = []
        for pos, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, int | float):
                raise ValueError(f"{where}: element {pos} is {item!r}, expected a number")
            number = float(item)
            if not math.isfinite(number):
                raise ValueError(f"{where}: element {pos} is not a finite number")
            features.append(number)
        return features

    def preprocess(self, data: list[Any]) -> torch.Tensor:
        rows = [self.parse_features(self._request_value(row), idx) for idx, row in enumerate(data)]
        return torch.tensor(rows, dtype=torch.float32, device=self.device)

    # -- logits -> response ------------------------------------------------------------------

    def _label(self, index: int) -> str:
        mapping = self.mapping or {}
        label = mapping.get(str(index))
        if isinstance(label, list) and label:
            # ImageNet-style maps hold [synset_id, name]: the name is last.
            label = label[-1]
        return str(label) if label is not None else str(index)

    def postprocess(self, data: torch.Tensor) -> list[dict[str, float]]:
        probabilities = torch.softmax(data.float(), dim=1).tolist()
        results: list[dict[str, float]] = []
        for row in probabilities:
            ranked = sorted(enumerate(row), key=lambda pair: (-pair[1], pair[0]))
            results.append({self._label(index): prob for index, prob in ranked})
        return results
