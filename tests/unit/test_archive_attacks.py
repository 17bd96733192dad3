"""Hostile archives: each is refused with a message naming the problem, leaving nothing."""

from __future__ import annotations

import io
import stat
import struct
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trioserve.archive import ArchiveError, unpack_archive

MB = 1 << 20


@pytest.fixture
def work(tmp_path: Path) -> Iterator[Path]:
    work = tmp_path / "work"
    yield work
    # nothing may ever land next to the work folder
    assert sorted(p.name for p in tmp_path.iterdir()) in (["work"], ["archives", "work"])


@pytest.fixture
def archives(tmp_path: Path) -> Path:
    path = tmp_path / "archives"
    path.mkdir()
    return path


def refused(source: Path, work: Path, status: int, message: str, **limits: int) -> ArchiveError:
    with pytest.raises(ArchiveError) as info:
        unpack_archive(source, work, **limits)
    assert info.value.status == status, info.value.message
    assert message in info.value.message
    assert list(work.iterdir()) == []  # the partial extraction is gone
    return info.value


def make_zip(
    path: Path,
    entries: list[tuple[str | zipfile.ZipInfo, bytes]],
    compression: int = zipfile.ZIP_DEFLATED,
) -> Path:
    with zipfile.ZipFile(path, "w", compression) as z:
        for name, data in entries:
            z.writestr(name, data)
    return path


def make_tgz(path: Path, members: list[tarfile.TarInfo | tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w:gz") as t:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                t.addfile(member)
            else:
                name, data = member
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return path


def tar_member(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info


GOOD = ("handler.py", b"def handle(d, c): return d\n")


# -- zip -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["../evil.txt", "model/../../evil.txt", "..\\evil.txt"])
def test_zip_dotdot_entry(archives: Path, work: Path, name: str) -> None:
    mar = make_zip(archives / "a.mar", [GOOD, (name, b"pwned")])
    err = refused(mar, work, 400, "has a '..' component")
    assert repr(name) in err.message


@pytest.mark.parametrize("name", ["/tmp/evil.txt", "\\evil.txt", "C:/evil.txt"])
def test_zip_absolute_entry(archives: Path, work: Path, name: str) -> None:
    mar = make_zip(archives / "a.mar", [GOOD, (name, b"pwned")])
    with zipfile.ZipFile(mar) as z:
        assert name in z.namelist()  # really stored that way
    refused(mar, work, 400, f"archive entry {name!r} has an absolute path")


def test_zip_symlink_entry(archives: Path, work: Path) -> None:
    link = zipfile.ZipInfo("model.pt")
    link.create_system = 3
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    mar = make_zip(archives / "a.mar", [GOOD, (link, b"/etc/passwd")])
    refused(mar, work, 400, "archive entry 'model.pt' is a symbolic link")


def test_zip_device_entry(archives: Path, work: Path) -> None:
    fifo = zipfile.ZipInfo("pipe")
    fifo.create_system = 3
    fifo.external_attr = (stat.S_IFIFO | 0o644) << 16
    mar = make_zip(archives / "a.mar", [(fifo, b"")])
    refused(mar, work, 400, "archive entry 'pipe' is not a regular file or directory")


def test_zip_bomb_with_honest_header(archives: Path, work: Path) -> None:
    mar = make_zip(archives / "bomb.mar", [GOOD, ("bomb.bin", bytes(8 * MB))])
    assert mar.stat().st_size < 64 * 1024  # highly compressible
    refused(
        mar,
        work,
        413,
        "declares 8388635 unpacked bytes, over the limit of 1048576",
        max_unpacked_bytes=MB,
    )


def _patch_headers(mar: Path, name: str, field: str, value: int) -> None:
    """Set ``field`` ("flags" or "size", the unpacked size) in both headers of entry ``name``."""
    # signature -> (offset of the name length, offset of the name, offsets of the fields)
    layouts = {
        b"PK\x03\x04": (26, 30, {"flags": (6, "<H"), "size": (22, "<I")}),  # local header
        b"PK\x01\x02": (28, 46, {"flags": (8, "<H"), "size": (24, "<I")}),  # central directory
    }
    data = bytearray(mar.read_bytes())
    patched = 0
    for signature, (len_at, name_at, fields) in layouts.items():
        at = data.find(signature)
        while at != -1:
            (name_len,) = struct.unpack_from("<H", data, at + len_at)
            if data[at + name_at : at + name_at + name_len] == name.encode():
                offset, fmt = fields[field]
                if field == "flags":
                    value |= struct.unpack_from(fmt, data, at + offset)[0]
                struct.pack_into(fmt, data, at + offset, value)
                patched += 1
            at = data.find(signature, at + 1)
    assert patched == 2
    mar.write_bytes(bytes(data))


def _lie_about_size(mar: Path, name: str, size: int) -> None:
    _patch_headers(mar, name, "size", size)


def test_zip_bomb_with_lying_header(archives: Path, work: Path) -> None:
    mar = make_zip(archives / "liar.mar", [GOOD, ("bomb.bin", bytes(8 * MB))])
    _lie_about_size(mar, "bomb.bin", 100)
    with zipfile.ZipFile(mar) as z:
        assert z.getinfo("bomb.bin").file_size == 100  # the declared total looks harmless
    refused(
        mar,
        work,
        400,
        "archive entry 'bomb.bin' unpacks to more than the 100 bytes its header declares",
        max_unpacked_bytes=MB,
    )


def test_zip_bomb_with_lying_header_hits_the_real_size_limit(archives: Path, work: Path) -> None:
    mar = make_zip(archives / "liar.mar", [GOOD, ("bomb.bin", bytes(8 * MB))])
    _lie_about_size(mar, "bomb.bin", 100)
    refused(
        mar,
        work,
        413,
        "archive unpacks to more than 1000 bytes (max_unpacked_bytes), reached while "
        "extracting 'bomb.bin'",
        max_unpacked_bytes=1000,
    )


def test_zip_stored_entry_with_lying_header(archives: Path, work: Path) -> None:
    mar = make_zip(archives / "liar.mar", [("big.bin", bytes(5000))], zipfile.ZIP_STORED)
    _lie_about_size(mar, "big.bin", 10)
    refused(mar, work, 400, "'big.bin' unpacks to more than the 10 bytes")


def test_zip_too_many_entries(archives: Path, work: Path) -> None:
    mar = make_zip(archives / "many.mar", [(f"f{i}.txt", b"x") for i in range(11)])
    refused(mar, work, 413, "archive has more than 10 entries (max_entries)", max_entries=10)
    assert unpack_archive(mar, work, max_entries=11).extracted  # the limit is inclusive


def test_zip_name_too_long_for_the_filesystem(archives: Path, work: Path) -> None:
    mar = make_zip(archives / "long.mar", [GOOD, ("d/" + "x" * 300, b"")])
    refused(mar, work, 400, "cannot be created: [Errno 36]")


def test_zip_duplicate_entry(archives: Path, work: Path) -> None:
    with pytest.warns(UserWarning, match="Duplicate name"):
        mar = make_zip(archives / "dup.mar", [GOOD, GOOD])
    refused(mar, work, 400, "archive entry 'handler.py' clashes with another entry")


def test_zip_file_and_folder_with_one_name(archives: Path, work: Path) -> None:
    mar = make_zip(archives / "clash.mar", [("a", b"file"), ("a/b", b"below a file")])
    refused(mar, work, 400, "archive entry 'a/b' clashes with another entry")


def test_zip_crc_mismatch(archives: Path, work: Path) -> None:
    mar = make_zip(archives / "crc.mar", [GOOD, ("data.bin", b"A" * 100)], zipfile.ZIP_STORED)
    data = mar.read_bytes()
    mar.write_bytes(data.replace(b"A" * 100, b"A" * 99 + b"B"))
    refused(mar, work, 400, "archive entry 'data.bin' is corrupt: CRC-32 mismatch")


def test_zip_encrypted_and_unsupported_method(archives: Path, work: Path) -> None:
    mar = make_zip(archives / "enc.mar", [GOOD, ("secret.bin", b"x")])
    _patch_headers(mar, "secret.bin", "flags", 0x1)
    refused(mar, work, 400, "archive entry 'secret.bin' is encrypted")
    bz = make_zip(archives / "bz.mar", [("x.bin", b"x" * 100)], zipfile.ZIP_BZIP2)
    refused(bz, work, 400, "uses compression method 12")


@pytest.mark.parametrize("data", [b"", b"not a zip at all", b"PK\x03\x04" + bytes(40)])
def test_corrupt_zip(archives: Path, work: Path, data: bytes) -> None:
    (archives / "bad.mar").write_bytes(data)
    refused(archives / "bad.mar", work, 400, "bad.mar is not a valid zip archive")


def test_truncated_zip_data(archives: Path, work: Path) -> None:
    mar = make_zip(archives / "cut.mar", [GOOD, ("data.bin", bytes(range(256)) * 400)])
    data = mar.read_bytes()
    with zipfile.ZipFile(mar) as z:
        info = z.getinfo("data.bin")
    # keep the central directory, blank out the middle of the compressed data
    start = info.header_offset + 30 + len("data.bin") + 10
    mar.write_bytes(data[:start] + bytes(40) + data[start + 40 :])
    refused(mar, work, 400, "archive entry 'data.bin' is corrupt")


# -- tar -------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["/etc/passwd", "../../outside", "handler.py"])
def test_tar_symlink(archives: Path, work: Path, target: str) -> None:
    tgz = make_tgz(archives / "a.tar.gz", [GOOD, tar_member("model.pt", tarfile.SYMTYPE, target)])
    refused(tgz, work, 400, f"archive entry 'model.pt' is a symbolic link to {target!r}")


def test_tar_hardlink(archives: Path, work: Path) -> None:
    tgz = make_tgz(
        archives / "a.tgz", [GOOD, tar_member("model.pt", tarfile.LNKTYPE, "/etc/shadow")]
    )
    refused(tgz, work, 400, "archive entry 'model.pt' is a hard link to '/etc/shadow'")


@pytest.mark.parametrize(
    ("kind", "what"),
    [
        (tarfile.CHRTYPE, "is a device file"),
        (tarfile.BLKTYPE, "is a device file"),
        (tarfile.FIFOTYPE, "is a FIFO"),
    ],
)
def test_tar_special_files(archives: Path, work: Path, kind: bytes, what: str) -> None:
    tgz = make_tgz(archives / "a.tgz", [GOOD, tar_member("dev", kind)])
    refused(tgz, work, 400, f"archive entry 'dev' {what}")


@pytest.mark.parametrize("name", ["../evil.txt", "m/../../evil.txt"])
def test_tar_dotdot(archives: Path, work: Path, name: str) -> None:
    tgz = make_tgz(archives / "a.tgz", [GOOD, (name, b"pwned")])
    refused(tgz, work, 400, f"archive entry {name!r} has a '..' component")


def test_tar_absolute(archives: Path, work: Path) -> None:
    tgz = make_tgz(archives / "a.tgz", [GOOD, ("/tmp/evil.txt", b"pwned")])
    refused(tgz, work, 400, "archive entry '/tmp/evil.txt' has an absolute path")


def test_tar_bomb(archives: Path, work: Path) -> None:
    tgz = make_tgz(archives / "bomb.tgz", [GOOD, ("bomb.bin", bytes(8 * MB))])
    assert tgz.stat().st_size < 64 * 1024
    refused(
        tgz,
        work,
        413,
        "over the limit of 1048576 bytes (max_unpacked_bytes)",
        max_unpacked_bytes=MB,
    )


def test_tar_too_many_entries(archives: Path, work: Path) -> None:
    tgz = make_tgz(archives / "many.tgz", [(f"m/f{i}", b"") for i in range(6)])
    refused(tgz, work, 413, "archive has more than 5 entries", max_entries=5)


def test_tar_duplicate_entry_removes_what_was_extracted(archives: Path, work: Path) -> None:
    tgz = make_tgz(archives / "dup.tgz", [GOOD, ("other.py", b""), GOOD])
    refused(tgz, work, 400, "archive entry 'handler.py' clashes with another entry")


@pytest.mark.parametrize("cut", [10, 200])
def test_corrupt_tgz(archives: Path, work: Path, cut: int) -> None:
    good = make_tgz(archives / "good.tgz", [GOOD, ("data.bin", bytes(range(256)) * 400)])
    bad = archives / "bad.tgz"
    bad.write_bytes(good.read_bytes()[:cut])
    refused(bad, work, 400, "bad.tgz is not a valid tar archive")


# -- fuzzing ---------------------------------------------------------------------------


def _sample_mar() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("MAR-INF/MANIFEST.json", '{"model": {"modelName": "m", "handler": "h.py"}}')
        z.writestr("h.py", "def handle(d, c):\n    return d\n" * 20)
        z.writestr("w/model.pt", bytes(range(256)) * 8)
    return buf.getvalue()


def _sample_tar() -> bytes:
    """An uncompressed tar: ``r:*`` opens it under a .tgz name, so every header byte counts."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, data in [
            ("m/MAR-INF/MANIFEST.json", b'{"model": {"modelName": "m"}}'),
            ("m/h.py", b"def handle(d, c):\n    return d\n"),
            ("m/w/model.pt", bytes(range(256)) * 8),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


SAMPLES = {"fuzz.mar": _sample_mar(), "fuzz.tgz": _sample_tar()}
edits = st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), min_size=1, max_size=6)


@pytest.mark.parametrize("file_name", list(SAMPLES))
@settings(max_examples=300, deadline=None)
@given(edits=edits)
def test_damaged_archive_is_either_loaded_or_refused_cleanly(
    file_name: str, edits: list[tuple[int, int]]
) -> None:
    data = bytearray(SAMPLES[file_name])
    for at, value in edits:
        data[at % len(data)] = value
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / file_name
        source.write_bytes(bytes(data))
        work = Path(tmp) / "work"
        try:
            loaded = unpack_archive(source, work, max_unpacked_bytes=MB)
        except ArchiveError as exc:
            error: ArchiveError | None = exc
        else:
            error = None
            assert loaded.model_dir.is_relative_to(work.resolve())
            assert sum(p.stat().st_size for p in loaded.model_dir.rglob("*")) <= MB
        if error is not None:
            assert error.status in (400, 413), error.message
            assert list(work.iterdir()) == []
        assert sorted(p.name for p in Path(tmp).iterdir()) == [file_name, "work"]
