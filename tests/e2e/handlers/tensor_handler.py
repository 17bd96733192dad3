"""Answers from the batch tensor the server collated (tensorInputs), not from ``data``."""

import time


def handle(data, context):
    if data is None:
        return None
    tensor = context.get_batch_tensor("body")  # [N, max_rows, 2] float32, zero-copy
    lengths = context.get_batch_lengths("body")
    time.sleep(0.3)  # let the next requests queue up into one batch
    out = []
    for i in range(len(data)):
        rows = int(lengths[i])
        out.append(
            {
                "batch": list(tensor.shape),
                "rows": tensor[i, :rows].tolist(),
                "padding_is_zero": bool((tensor[i, rows:] == 0).all()),
            }
        )
    return out
