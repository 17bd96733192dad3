"""Extracting a ``.mar`` (a zip archive, stored or deflated) with every entry checked.

The central directory is only trusted for names and for the up-front size check. Entry
data is read from its local header on and inflated here in bounded chunks, so the bytes
written are counted as they are produced and an entry that inflates past the size its
header declares is caught at once (a zip bomb with a lying header).
"""

from __future__ import annotations

import stat
import struct
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Final

from ._entries import CHUNK, Limits, creating, entry_parts, target_path
from ._errors import ArchiveError

_LOCAL_HEADER: Final = struct.Struct("<4s22xHH")  # signature, ..., name length, extra length
_LOCAL_SIGNATURE: Final = b"PK\x03\x04"
_METHODS: Final = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)


def extract_zip(source: Path, root: Path, limits: Limits) -> None:
    """Extract the zip archive ``source`` into the empty real directory ``root``."""
    with open(source, "rb") as fh:
        try:
            archive = zipfile.ZipFile(fh)
        except (zipfile.BadZipFile, ValueError, struct.error, EOFError, NotImplementedError) as exc:
            raise ArchiveError(400, f"{source.name} is not a valid zip archive: {exc}") from None
        with archive:
            size = fh.seek(0, 2)
            infos = archive.infolist()
            limits.check_entries(len(infos))
            plan = [(info, _vet(info)) for info in infos]
            limits.check_declared(sum(info.file_size for info in infos if not info.is_dir()))
            for info, parts in plan:
                target = target_path(root, parts, info.filename)
                with creating(info.filename):
                    if info.is_dir():
                        target.mkdir(parents=True, exist_ok=True)
                        continue
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with open(target, "xb") as out:
                        _copy_entry(fh, size, info, out, limits)


def _vet(info: zipfile.ZipInfo) -> tuple[str, ...]:
    name = info.filename
    if not name:  # also what zipfile leaves of a name that starts with a NUL byte
        raise ArchiveError(400, "archive has an entry with an empty name")
    parts = entry_parts(name)
    kind = stat.S_IFMT(info.external_attr >> 16)
    if kind == stat.S_IFLNK:
        raise ArchiveError(400, f"archive entry {name!r} is a symbolic link; links are not allowed")
    if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
        raise ArchiveError(400, f"archive entry {name!r} is not a regular file or directory")
    if info.is_dir():
        return parts
    if not parts:
        raise ArchiveError(400, f"archive entry {name!r} has no file name")
    if info.flag_bits & 0x1:
        raise ArchiveError(400, f"archive entry {name!r} is encrypted")
    if info.compress_type not in _METHODS:
        raise ArchiveError(
            400,
            f"archive entry {name!r} uses compression method {info.compress_type}; "
            "only stored and deflated entries are supported",
        )
    return parts


def _copy_entry(
    fh: BinaryIO, size: int, info: zipfile.ZipInfo, out: BinaryIO, limits: Limits
) -> None:
    name = info.filename
    written = 0
    crc = 0
    for chunk in _inflate(fh, size, info):
        limits.count(len(chunk), name)
        written += len(chunk)
        if written > info.file_size:
            raise ArchiveError(
                400,
                f"archive entry {name!r} unpacks to more than the {info.file_size} bytes "
                "its header declares",
            )
        crc = zlib.crc32(chunk, crc)
        out.write(chunk)
    if written != info.file_size:
        raise ArchiveError(
            400,
            f"archive entry {name!r} is corrupt: {written} bytes, its header declares "
            f"{info.file_size}",
        )
    if crc != info.CRC:
        raise ArchiveError(400, f"archive entry {name!r} is corrupt: CRC-32 mismatch")


def _inflate(fh: BinaryIO, size: int, info: zipfile.ZipInfo) -> Iterator[bytes]:
    """Yield the entry's data in chunks of at most :data:`CHUNK` bytes.

    ``size`` is the size of the archive file, which the entry's data must lie within.
    """
    name = info.filename
    if not 0 <= info.header_offset < size:
        raise ArchiveError(400, f"archive entry {name!r} is corrupt: bad header offset")
    fh.seek(info.header_offset)
    header = fh.read(_LOCAL_HEADER.size)
    if len(header) < _LOCAL_HEADER.size:
        raise ArchiveError(400, f"archive entry {name!r} is corrupt: local header is truncated")
    signature, name_len, extra_len = _LOCAL_HEADER.unpack(header)
    if signature != _LOCAL_SIGNATURE:
        raise ArchiveError(400, f"archive entry {name!r} is corrupt: bad local header")
    start = info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
    if start + info.compress_size > size:
        raise ArchiveError(400, f"archive entry {name!r} is corrupt: data is truncated")
    fh.seek(start)

    left = info.compress_size

    def read() -> bytes:
        nonlocal left
        if not left:
            return b""
        buf = fh.read(min(CHUNK, left))
        if not buf:
            raise ArchiveError(400, f"archive entry {name!r} is corrupt: data is truncated")
        left -= len(buf)
        return buf

    if info.compress_type == zipfile.ZIP_STORED:
        while buf := read():
            yield buf
        return

    inflater = zlib.decompressobj(-zlib.MAX_WBITS)
    while not inflater.eof:
        buf = inflater.unconsumed_tail or read()
        try:
            out = inflater.decompress(buf, CHUNK)
        except zlib.error as exc:
            raise ArchiveError(400, f"archive entry {name!r} is corrupt: {exc}") from None
        if out:
            yield out
        elif not buf:
            raise ArchiveError(
                400, f"archive entry {name!r} is corrupt: compressed data ends early"
            )
