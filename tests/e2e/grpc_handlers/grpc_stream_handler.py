"""A streaming test handler for the gRPC tests.

stream:<n>   sends n intermediate responses ("part<i>;") 0.1 s apart, then "end"; stops early
             when the server cancels the request, writing the marker "stream-cancelled-<id>"
anything    echoed back
"""

import os
import time
from pathlib import Path

from ts.handler_utils.utils import send_intermediate_predict_response

MARKERS = os.environ.get("TRIOSERVE_TEST_MARKERS")


def _mark(name):
    if MARKERS:
        Path(MARKERS, name).write_text("1")


def handle(data, context):
    if data is None:
        return None
    out = []
    for idx, row in enumerate(data):
        value = row.get("data", row.get("body", b""))
        command = bytes(value).decode() if isinstance(value, (bytes, bytearray)) else str(value)
        if command.startswith("stream:"):
            rid = context.get_request_id(idx)
            for i in range(int(command.split(":", 1)[1])):
                if context.is_cancelled(idx):
                    _mark(f"stream-cancelled-{rid}")
                    break
                send_intermediate_predict_response([f"part{i};"], {idx: rid}, "ok", 200, context)
                time.sleep(0.1)
            out.append("end")
        else:
            out.append(command)
    return out
