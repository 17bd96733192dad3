"""An unmodified TorchServe-style handler: it only knows the ``ts`` package's names."""

import json

from ts.context import Context
from ts.handler_utils.utils import send_intermediate_predict_response
from ts.protocol.otf_message_handler import send_intermediate_predict_response as old_send
from ts.torch_handler.base_handler import BaseHandler


class UpperHandler(BaseHandler):
    def initialize(self, context: Context) -> None:
        self.manifest = context.manifest
        self.prefix = context.model_yaml_config.get("handler", {}).get("prefix", "")
        self.initialized = True

    def preprocess(self, data):
        return [bytes(row.get("body") or row.get("data")).decode() for row in data]

    def inference(self, data, *args, **kwargs):
        return [self.prefix + text.upper() for text in data]

    def describe_handle(self):
        return json.dumps({"purpose": "upper-cases text", "prefix": self.prefix})

    def postprocess(self, data):
        assert callable(send_intermediate_predict_response) and callable(old_send)
        return [{"text": text, "model": self.manifest["model"]["modelName"]} for text in data]
