"""A test handler whose behaviour is chosen by the request body.

crash             the worker kills itself with SIGKILL
sleep:<s>         sleeps, polling context.is_cancelled(); writes a marker file when cancelled
raise             raises ValueError (-> 503 Prediction failed)
pexc:<code>       raises PredictionException with that code
status:<code>     answers with that HTTP status and a custom header
stream:<n>        sends n intermediate responses 0.2 s apart, then "end"
headers           answers the request headers it saw, as JSON
params            answers {name: value} of its inputs, as JSON
pid               answers the worker's pid
pid:<s>           sleeps, then answers the worker's pid
gpu               answers context.system_properties["gpu_id"]
wrongcount        answers twice: the batch has one answer too many
anything else     echoed back
"""

import json
import os
import signal
import time
from pathlib import Path

from ts.handler_utils.utils import send_intermediate_predict_response
from ts.utils.util import PredictionException

MARKERS = os.environ.get("TRIOSERVE_TEST_MARKERS")


def _text(value):
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode()
    if isinstance(value, str):
        return value
    return json.dumps(value)


def _mark(name):
    if MARKERS:
        Path(MARKERS, name).write_text("1")


def handle(data, context):
    if data is None:  # initialisation call
        return None
    if MARKERS:
        with open(Path(MARKERS, "batches.log"), "a") as log:
            log.write(f"{len(data)}\n")
    out = []
    for idx, row in enumerate(data):
        command = _text(row.get("body", row.get("data", "")))
        if command == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        elif command.startswith("sleep:"):
            rid = context.get_request_id(idx)
            _mark(f"started-{rid}")
            deadline = time.monotonic() + float(command.split(":", 1)[1])
            while time.monotonic() < deadline:
                if context.is_cancelled(idx):
                    _mark(f"cancelled-{rid}")
                    break
                time.sleep(0.02)
            out.append("slept")
        elif command == "raise":
            raise ValueError("the handler failed on purpose")
        elif command.startswith("pexc:"):
            raise PredictionException("custom failure", int(command.split(":", 1)[1]))
        elif command.startswith("status:"):
            context.set_response_status(int(command.split(":", 1)[1]), "Custom", idx)
            context.set_response_header(idx, "X-Custom", "yes")
            out.append("custom status")
        elif command.startswith("stream:"):
            n = int(command.split(":", 1)[1])
            rid = context.get_request_id(idx)
            for i in range(n):
                send_intermediate_predict_response([f"part{i};"], {idx: rid}, "ok", 200, context)
                time.sleep(0.2)
            out.append("end")
        elif command == "headers":
            context.set_response_content_type(idx, "application/json")
            out.append(context.get_all_request_header(idx))
        elif command == "params":
            out.append({k: _text(v) for k, v in row.items()})
        elif command == "pid":
            out.append(str(os.getpid()))
        elif command == "gpu":
            out.append(str(context.system_properties.get("gpu_id")))
        elif command.startswith("pid:"):
            time.sleep(float(command.split(":", 1)[1]))
            out.append(str(os.getpid()))
        elif command == "wrongcount":
            out.extend(["one", "too many"])
        else:
            out.append(command)
    return out
