"""The rule that merges streamed answers waiting for a slow client (core.oip.merging)."""

from __future__ import annotations

from trioserve.core.oip import Tensor
from trioserve.core.oip.merging import Answer, merge_answers, mergeable


def text(piece: str, name: str = "text", answer_id: str | None = "r") -> Answer:
    return answer_id, [Tensor.from_values(name, "BYTES", [1], [piece])]


def texts(answers: list[Answer]) -> list[tuple[str | None, list[bytes]]]:
    return [(i, [v for t in outputs for v in t.to_list()]) for i, outputs in answers]


def test_text_pieces_merge_into_one_answer_in_order() -> None:
    merged = merge_answers([text("The"), text(" quick"), text(" fox")])
    assert texts(merged) == [("r", [b"The quick fox"])]
    ((_id, (tensor,)),) = merged
    assert (tensor.name, tensor.datatype, tensor.shape) == ("text", "BYTES", (1,))


def test_several_text_outputs_merge_output_by_output() -> None:
    def two(a: str, b: str) -> Answer:
        return "r", [Tensor.from_values("a", "BYTES", [1, 1], [[a]]),
                     Tensor.from_values("b", "BYTES", [1], [b])]  # fmt: skip

    (merged,) = merge_answers([two("x", "1"), two("y", "2")])
    assert texts([merged]) == [("r", [b"xy", b"12"])]
    assert merged[1][0].shape == (1, 1)


def test_what_cannot_be_merged_stays_apart_and_ends_the_run() -> None:
    numbers: Answer = ("r", [Tensor.from_values("text", "INT64", [1], [7])])
    two_elements: Answer = ("r", [Tensor.from_values("text", "BYTES", [2], ["a", "b"])])
    answers = [
        text("a"), text("b"),
        numbers,
        text("c"), text("d", name="other"),
        text("e", answer_id="s"), text("f", answer_id="s"),
        two_elements, text("g"),
    ]  # fmt: skip
    assert texts(merge_answers(answers)) == [
        ("r", [b"ab"]),
        ("r", [7]),
        ("r", [b"c"]),
        ("r", [b"d"]),
        ("s", [b"ef"]),
        ("r", [b"a", b"b"]),
        ("r", [b"g"]),
    ]


def test_parameters_must_match() -> None:
    tagged: Answer = ("r", [Tensor.from_values("text", "BYTES", [1], ["x"], {"k": 1})])
    assert not mergeable(text("a"), tagged)
    assert not mergeable(("r", []), ("r", []))
    assert mergeable(text("a"), text("b"))


def test_one_answer_or_none_is_left_as_is() -> None:
    one = text("a")
    assert merge_answers([one]) == [one]
    assert merge_answers([]) == []
