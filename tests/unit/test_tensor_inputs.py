import pytest

from trioserve.core.tensor_inputs import TensorSpecError, parse_tensor_inputs


def test_fixed_and_ragged_specs() -> None:
    specs = parse_tensor_inputs(
        {"body": {"dtype": "float32", "shape": [256]}, "tok": {"dtype": "int64", "shape": [-1, 8]}}
    )
    body, tok = specs["body"], specs["tok"]
    assert (body.first, body.trailing, body.itemsize, body.row_bytes) == (256, (), 4, 4)
    assert body.rows(1024) == 256
    assert (tok.first, tok.trailing, tok.row_bytes) == (None, (8,), 64)
    assert tok.rows(64 * 3) == 3
    assert tok.to_meta() == {"dtype": "int64", "shape": [None, 8]}


def test_sizes_that_do_not_fit_are_clear_errors() -> None:
    specs = parse_tensor_inputs(
        {"body": {"dtype": "float32", "shape": [4]}, "tok": {"dtype": "int16", "shape": [None, 3]}}
    )
    with pytest.raises(ValueError, match="must be 16 bytes"):
        specs["body"].rows(12)
    with pytest.raises(ValueError, match="whole number of rows of 6 bytes"):
        specs["tok"].rows(7)


@pytest.mark.parametrize(
    "raw",
    [
        [1, 2],
        {"x": {"dtype": "complex64", "shape": [2]}},
        {"x": {"dtype": "float32", "shape": []}},
        {"x": {"dtype": "float32", "shape": [2, -3]}},
        {"x": {"dtype": "float32", "shape": [-1, 0]}},
        {"x": {"dtype": "float32", "shape": [True]}},
        {"x": "float32"},
    ],
)
def test_malformed_declarations(raw: object) -> None:
    with pytest.raises(TensorSpecError, match="tensorInputs"):
        parse_tensor_inputs(raw)


def test_absent_means_none() -> None:
    assert parse_tensor_inputs(None) == {}
