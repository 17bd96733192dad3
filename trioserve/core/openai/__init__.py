"""The OpenAI-compatible API, sans-IO: requests, the model mapping, stop strings, answers.

``/v1/completions`` and ``/v1/chat/completions`` (``trioserve/http/openai.py``) parse a
request into a :class:`~.requests.Generation` (:func:`~.requests.parse_completion`,
:func:`~.requests.parse_chat`), turn it into a model's input with the model's
:class:`~.mapping.OpenAIMapping`, read the model's pieces of text through a
:class:`~.stops.PieceCounter` (stop strings, ``max_tokens``, usage) and write the answer with
:mod:`.answers`. Every refusal is an :class:`~.errors.OpenAIError`.
"""
