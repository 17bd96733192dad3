"""Tiny pure-Python wheels written by hand, so that ``pip install --no-index`` works offline."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def write_wheel(directory: Path, name: str, version: str, modules: dict[str, str]) -> Path:
    """Write ``<name>-<version>-py3-none-any.whl`` into ``directory``: the distribution
    ``name`` with the top-level ``modules`` (module name -> source)."""
    info = f"{name}-{version}.dist-info"
    files: dict[str, bytes] = {
        f"{module}.py": source.encode() for module, source in modules.items()
    }
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    )
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: trioserve-tests\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n"
    )
    files[f"{info}/top_level.txt"] = "".join(f"{m}\n" for m in modules).encode()
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in files.items())
    record += f"{info}/RECORD,,\n"
    files[f"{info}/RECORD"] = record.encode()
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for member, data in files.items():
            wheel.writestr(member, data)
    return path
