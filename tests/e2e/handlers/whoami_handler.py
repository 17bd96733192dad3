"""Says where the worker's Python found trioserve, trio and torch (the one-file binary's test,
tests/e2e/test_binary.py): every request is answered with the same JSON object."""

import sys

import trio

import trioserve


def handle(data, context):
    if data is None:  # the call at load time
        return None
    try:
        import torch
    except ImportError:
        torch_file = None
    else:
        torch_file = torch.__file__
    answer = {
        "executable": sys.executable,
        "trioserve": trioserve.__file__,
        "trio": trio.__file__,
        "torch": torch_file,
    }
    return [answer for _ in data]
