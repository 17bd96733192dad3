"""TorchServe's handler API, hosted in the worker.

A handler (a module function or the one class of a module, :mod:`.loader`) gets a
TorchServe-compatible :class:`~.context.Context` and is called with each batch in the
handler thread (:mod:`.batch`); its answers become replies (:mod:`.replies`, :mod:`.codec`)
and its failures status codes (:mod:`.errors`). Unmodified handlers ``import ts.*`` through
an import hook (:mod:`.ts_shim`) that maps those names onto the modules here: ``Context``,
:mod:`.base_handler`, the built-in handlers (:mod:`.builtin`), the request envelopes
(:mod:`.envelopes`), ``ts.utils.util`` (:mod:`.util`), the metrics cache (:mod:`.metrics`),
the ``timed`` decorator (:mod:`.timer`) and intermediate responses (:mod:`.streaming`).
KServe v1 and Open Inference Protocol requests reach a handler as rows, the way TorchServe's
``kserve`` and ``kservev2`` envelopes show them (:mod:`.kserve`, :mod:`.oip`).
"""
