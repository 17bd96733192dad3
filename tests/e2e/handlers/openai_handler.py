"""A TorchServe handler that answers the OpenAI API (tests/e2e/test_openai.py).

Its body is the JSON trioserve makes of an OpenAI request (``prompt``, ``max_tokens``...).
It streams the prompt's words back reversed, one intermediate response per word (each with
a trailing space), at most ``max_tokens`` of them, then returns ``"."`` as its last piece.
A prompt of ``fail`` raises.
"""

from ts.handler_utils.utils import send_intermediate_predict_response


def handle(data, context):
    if data is None:
        return None
    answers = []
    for idx, row in enumerate(data):
        body = row.get("body") or row.get("data")
        prompt = body["prompt"]
        if prompt.strip() == "fail":
            raise ValueError("the handler failed on purpose")
        words = prompt.split()[::-1][: body.get("max_tokens", 64)]
        rid = context.get_request_id(idx)
        for word in words:
            send_intermediate_predict_response([word + " "], {idx: rid}, "ok", 200, context)
        answers.append(".")
    return answers
