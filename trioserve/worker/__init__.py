"""The worker subprocess: ``python -m trioserve.worker --fd N``.

One worker process serves one model. It speaks the frame protocol of
:mod:`trioserve.core.frames` over an inherited Unix socket and hosts the model through the
API it was written against, one subpackage each:

* :mod:`trioserve.worker.torchserve`: TorchServe's handler API (a handler and its
  ``Context``, ``ts.*`` through an import hook, the built-in handlers, the envelopes, and the
  rows that KServe v1 and OIP requests become for a handler);
* :mod:`trioserve.worker.mlserver`: MLServer's runtime API (an ``MLModel`` on its own event
  loop, ``mlserver.*`` through an import hook).

The modules here are what both share: the frame loop (:mod:`~trioserve.worker.loop`, the one
module that knows both APIs), the connection to the server, the BATCH frame's decoding and
collated tensors, the handler thread, cancellations, the RESPONSE frames and their limits
(:mod:`~trioserve.worker.responses`), load failures (:mod:`~trioserve.worker.errors`) and the
import hooks' loader. Neither API package imports the other, and nothing here but the loop
imports either (``tests/unit/test_layering.py``).

Nothing here imports torch unless a handler did, or a tensor has to be serialized.
"""
