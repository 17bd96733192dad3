"""The OIP datatype table, and the codec package staying sans-IO."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_layering import IO_MODULES, imported_roots
from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.oip import DATATYPES, lookup_datatype

OIP = Path(__file__).resolve().parents[2] / "trioserve" / "core" / "oip"

EXPECTED = {
    # name: (itemsize, struct format, JSON type, InferTensorContents field)
    "BOOL": (1, "<?", bool, "bool_contents"),
    "UINT8": (1, "<B", int, "uint_contents"),
    "UINT16": (2, "<H", int, "uint_contents"),
    "UINT32": (4, "<I", int, "uint_contents"),
    "UINT64": (8, "<Q", int, "uint64_contents"),
    "INT8": (1, "<b", int, "int_contents"),
    "INT16": (2, "<h", int, "int_contents"),
    "INT32": (4, "<i", int, "int_contents"),
    "INT64": (8, "<q", int, "int64_contents"),
    "FP16": (2, "<e", float, None),
    "FP32": (4, "<f", float, "fp32_contents"),
    "FP64": (8, "<d", float, "fp64_contents"),
    "BF16": (2, None, float, None),
    "BYTES": (None, None, str, "bytes_contents"),
}


def test_the_table() -> None:
    assert list(DATATYPES) == list(EXPECTED)
    for name, (itemsize, fmt, json_type, field) in EXPECTED.items():
        dt = DATATYPES[name]
        assert (dt.name, dt.itemsize, dt.struct_format, dt.json_type, dt.contents_field) == (
            name,
            itemsize,
            fmt,
            json_type,
            field,
        )
        if fmt is not None:
            assert struct.calcsize(fmt) == itemsize
            assert dt.struct_code == fmt[1:]


@pytest.mark.parametrize(
    ("name", "low", "high"),
    [
        ("UINT8", 0, 255),
        ("UINT64", 0, 2**64 - 1),
        ("INT8", -128, 127),
        ("INT16", -32768, 32767),
        ("INT64", -(2**63), 2**63 - 1),
    ],
)
def test_integer_ranges(name: str, low: int, high: int) -> None:
    dt = DATATYPES[name]
    assert dt.int_range == (low, high) and dt.is_integer and not dt.is_float


def test_float_and_other_kinds() -> None:
    assert all(DATATYPES[n].is_float for n in ("FP16", "FP32", "FP64", "BF16"))
    assert not DATATYPES["BOOL"].is_integer and DATATYPES["BYTES"].int_range is None


def test_unknown_datatype() -> None:
    with pytest.raises(ServeError) as caught:
        lookup_datatype("FLOAT32", context="input 'x': ")
    assert caught.value.kind is ErrorKind.BAD_INPUT
    assert caught.value.message == (
        "input 'x': unknown datatype 'FLOAT32'; valid datatypes: BOOL, UINT8, UINT16, "
        "UINT32, UINT64, INT8, INT16, INT32, INT64, FP16, FP32, FP64, BF16, BYTES"
    )
    assert lookup_datatype("FP32") is DATATYPES["FP32"]


def test_oip_modules_import_no_io_library() -> None:
    offenders = {
        path.name: sorted(imported_roots(path) & (IO_MODULES | {"numpy"}))
        for path in OIP.glob("*.py")
    }
    assert {name: found for name, found in offenders.items() if found} == {}
    assert len(offenders) >= 9


def test_importing_the_codec_loads_no_io_library() -> None:
    """(pydantic itself loads the stdlib's ``socket`` through ``email.utils``; it does no
    IO, and the codec's own modules import no IO module, as the test above checks.)"""
    code = (
        "import sys, trioserve.core.oip; "
        "print(sorted(m for m in ('trio', 'torch', 'numpy', 'asyncio', 'quart') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
