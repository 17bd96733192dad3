"""Merging the streamed answers that wait for a slow client into one (sans-IO).

When a model streams text one token per answer and its client reads slower than the model
writes, answers pile up for that client. With a model's ``merge_stream_replies`` on, the
adapters (SSE events, gRPC messages) send the answers already waiting as one, as vLLM's
frontend does, instead of one each: fewer events to encode, frame and write, and the client
catches up. Only answers that can be merged without losing anything are:

- consecutive answers with the same response id;
- whose outputs have the same names, in the same order, the same datatypes, shapes and
  parameters;
- where every output is BYTES with one element (a piece of text): the merged output has the
  same name, datatype, shape and parameters, and the pieces' bytes concatenated in order.

Any other answer (numbers, several elements, another id) stays on its own, and ends the run
it follows. The adapters send the first answer of a stream on its own, at once, and merge
only what has already arrived (nothing waits for more).
"""

from __future__ import annotations

from collections.abc import Sequence

from trioserve.core.oip.tensor import Tensor

# One streamed answer as the adapters hold it: its response id and its output tensors.
Answer = tuple[str | None, list[Tensor]]


def _text_piece(tensor: Tensor) -> bool:
    return tensor.datatype == "BYTES" and tensor.element_count == 1


def mergeable(first: Answer, second: Answer) -> bool:
    """Whether ``second`` can be appended to ``first`` (see the module's rule)."""
    first_id, first_outputs = first
    second_id, second_outputs = second
    if first_id != second_id or len(first_outputs) != len(second_outputs) or not first_outputs:
        return False
    return all(
        _text_piece(a)
        and _text_piece(b)
        and (a.name, a.shape, a.parameters) == (b.name, b.shape, b.parameters)
        for a, b in zip(first_outputs, second_outputs, strict=True)
    )


def merge_answers(answers: Sequence[Answer]) -> list[Answer]:
    """``answers`` with each run of mergeable neighbours merged into one, in order."""
    merged: list[Answer] = []
    run: list[Answer] = []
    for answer in answers:
        if run and not mergeable(run[-1], answer):
            merged.append(_joined(run))
            run = []
        run.append(answer)
    if run:
        merged.append(_joined(run))
    return merged


def _joined(run: list[Answer]) -> Answer:
    if len(run) == 1:
        return run[0]
    answer_id, first = run[0]
    outputs = [
        Tensor.from_values(
            tensor.name,
            tensor.datatype,
            tensor.shape,
            [b"".join(bytes(outputs[index].to_list()[0]) for _id, outputs in run)],
            tensor.parameters,
            role="output",
        )
        for index, tensor in enumerate(first)
    ]
    return answer_id, outputs


__all__ = ["Answer", "merge_answers", "mergeable"]
