"""A torch-free echo handler for the Open Inference Protocol benchmark (benchmarks/oip_peers.sh).

Under TorchServe's ``kservev2`` envelope, and under trioserve's OIP routes, a handler gets one
row per input tensor (``{"name", "shape", "datatype", "data"}``) and answers one element per
row. This one answers each row's data unchanged. TorchServe calls ``handle`` with no data
while it initialises the worker.
"""


def handle(data, context):
    if data is None:
        return None
    return [row.get("data") for row in data]
