"""MLServer's runtime API, hosted in the worker.

An MLServer model (``model-settings.json`` and an ``MLModel`` class) is loaded and run on an
asyncio event loop of its own (:mod:`.mlmodel`); its requests and responses are converted
from and to the worker's OIP work items (:mod:`.mlmodel_io`); unmodified runtimes ``import
mlserver.*`` through an import hook (:mod:`.mlserver_shim`) that maps those names onto
:mod:`trioserve.model`, trioserve's copy of MLServer's model API.
"""
