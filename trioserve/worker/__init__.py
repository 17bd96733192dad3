"""The worker subprocess: ``python -m trioserve.worker --fd N``.

One worker process serves one model. It speaks the frame protocol of
:mod:`trioserve.core.frames` over an inherited Unix socket, loads a TorchServe-style handler
(:mod:`trioserve.worker.loader`), gives it a TorchServe-compatible
:class:`~trioserve.worker.context.Context`, and lets unmodified handlers import ``ts.*``
through an import hook (:mod:`trioserve.worker.ts_shim`).

Nothing here imports torch unless a handler did, or a tensor has to be serialized.
"""
