"""resolve_url: models can only come from inside the model store (DECISIONS.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trioserve.archive import ArchiveError, resolve_url


@pytest.fixture
def store(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    (store / "sub").mkdir(parents=True)
    (store / "echo.mar").write_bytes(b"zip")
    (store / "sub" / "deep.mar").write_bytes(b"zip")
    (store / "dir_model").mkdir()
    (tmp_path / "secret.mar").write_bytes(b"outside")
    return store


def test_file_name_in_store(store: Path) -> None:
    assert resolve_url(store, "echo.mar") == (store / "echo.mar").resolve()


def test_relative_path_and_directory(store: Path) -> None:
    assert resolve_url(store, "sub/deep.mar") == (store / "sub" / "deep.mar").resolve()
    assert resolve_url(store, "dir_model") == (store / "dir_model").resolve()


def test_file_url_inside_store(store: Path) -> None:
    url = (store / "sub" / "deep.mar").resolve().as_uri()
    assert resolve_url(store, url) == (store / "sub" / "deep.mar").resolve()


def test_file_url_with_localhost_and_escapes(store: Path) -> None:
    (store / "with space.mar").write_bytes(b"zip")
    url = "file://localhost" + str(store.resolve() / "with%20space.mar")
    assert resolve_url(store, url) == (store / "with space.mar").resolve()


def test_store_given_as_a_relative_path(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(store.parent)
    assert resolve_url(Path("store"), "echo.mar") == (store / "echo.mar").resolve()


def _refused(store: Path, url: str, status: int, message: str) -> None:
    with pytest.raises(ArchiveError) as info:
        resolve_url(store, url)
    assert info.value.status == status
    assert message in info.value.message


def test_empty_url(store: Path) -> None:
    _refused(store, "", 404, "empty url")


def test_missing_model(store: Path) -> None:
    _refused(store, "nope.mar", 404, "Model not found at: nope.mar")
    _refused(store, "sub/nope.mar", 404, "Model not found at: sub/nope.mar")


@pytest.mark.parametrize("url", ["../secret.mar", "sub/../../secret.mar", "sub/../echo.mar"])
def test_dotdot_is_refused_even_when_it_stays_inside(store: Path, url: str) -> None:
    _refused(store, url, 404, "'..' is not allowed")


def test_dotdot_in_file_url(store: Path) -> None:
    _refused(store, f"file://{store}/../secret.mar", 404, "'..' is not allowed")


def test_absolute_path_outside_store(store: Path) -> None:
    outside = store.parent / "secret.mar"
    _refused(store, str(outside), 404, "is not inside the model store")
    _refused(store, outside.as_uri(), 404, "is not inside the model store")


def test_symlink_out_of_the_store(store: Path) -> None:
    (store / "link.mar").symlink_to(store.parent / "secret.mar")
    _refused(store, "link.mar", 404, "is not inside the model store")
    (store / "linkdir").symlink_to(store.parent)
    _refused(store, "linkdir/secret.mar", 404, "is not inside the model store")


def test_symlink_inside_the_store_is_followed(store: Path) -> None:
    (store / "alias.mar").symlink_to(store / "echo.mar")
    assert resolve_url(store, "alias.mar") == (store / "echo.mar").resolve()


def test_the_store_itself_is_not_a_model(store: Path) -> None:
    _refused(store, ".", 404, "is not inside the model store")
    _refused(store, store.as_uri(), 404, "is not inside the model store")


@pytest.mark.parametrize("url", ["http://example.com/a.mar", "HTTPS://example.com/a.mar"])
def test_downloads_are_not_supported(store: Path, url: str) -> None:
    _refused(store, url, 400, "downloads are not supported here")


@pytest.mark.parametrize("url", ["s3://bucket/a.mar", "ftp://host/a.mar"])
def test_other_schemes_are_not_allowed(store: Path, url: str) -> None:
    _refused(store, url, 404, "does not match any allowed URL")


def test_file_url_with_a_host(store: Path) -> None:
    _refused(store, f"file://evil.example{store}/echo.mar", 404, "names a host")


def test_nul_byte(store: Path) -> None:
    _refused(store, "echo.mar\x00.txt", 404, "NUL byte")
