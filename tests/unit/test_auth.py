"""Token authorization: key file, header parsing, expiry, /token regeneration (spec §3.4)."""

from __future__ import annotations

import itertools
import json
import os
import re
import stat
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trioserve.auth import KeyKind, TokenStore, bearer, unauthorized
from trioserve.core.errors import ServeError
from trioserve.grpc.errors import grpc_code
from trioserve.http.errors import error_body, http_status

URLSAFE_8 = re.compile(r"[A-Za-z0-9_-]{8}")
START = 1_700_000_000.0  # 2023-11-14T22:13:20Z
AUTH_MESSAGE = (
    "Token Authorization failed. Token either incorrect, expired, or not provided correctly"
)


class FakeClock:
    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def counting_rand() -> Iterator[bytes]:
    for n in itertools.count(1):
        yield n.to_bytes(6, "big")


def make(tmp_path: Path, clock: FakeClock | None = None, minutes: float = 60) -> TokenStore:
    return TokenStore.create(
        tmp_path / "key_file.json", expiration_min=minutes, clock=clock or FakeClock()
    )


def assert_unauthorized(info: pytest.ExceptionInfo[ServeError]) -> None:
    err = info.value
    assert http_status(err) == 401
    assert error_body(err) == {"code": 401, "type": "InvalidKeyException", "message": AUTH_MESSAGE}
    assert grpc_code(err) == 16  # UNAUTHENTICATED


# -- the key file ----------------------------------------------------------------------------


def test_key_file_mode_and_exact_shape(tmp_path: Path) -> None:
    store = make(tmp_path, minutes=60)
    path = tmp_path / "key_file.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    doc = json.loads(path.read_text())
    assert list(doc) == ["management", "inference", "API"]
    assert list(doc["management"]) == ["key", "expiration time"]
    assert list(doc["inference"]) == ["key", "expiration time"]
    assert list(doc["API"]) == ["key"]
    assert doc["management"]["key"] == store.key(KeyKind.MANAGEMENT)
    assert doc["inference"]["key"] == store.key(KeyKind.INFERENCE)
    assert doc["API"]["key"] == store.key(KeyKind.API)
    # START + 60 min, as Java's Instant.toString writes it.
    assert doc["management"]["expiration time"] == "2023-11-14T23:13:20.000Z"
    assert doc["inference"]["expiration time"] == "2023-11-14T23:13:20.000Z"
    parsed = datetime.fromisoformat(doc["inference"]["expiration time"])
    assert parsed.timestamp() == START + 3600
    # no temporary file left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["key_file.json"]


def test_key_file_is_0600_even_with_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        make(tmp_path)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "key_file.json").stat().st_mode) == 0o600


def test_key_file_never_world_readable_while_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every file created in the directory is 0600 at the moment content is written."""
    modes: list[int] = []
    real_fsync = os.fsync

    def spying_fsync(fd: int) -> None:
        st_mode = os.fstat(fd).st_mode
        if stat.S_ISREG(st_mode):
            modes.append(stat.S_IMODE(st_mode))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spying_fsync)
    old = os.umask(0)
    try:
        make(tmp_path)
    finally:
        os.umask(old)
    assert modes == [0o600]


def test_create_replaces_a_world_readable_file(tmp_path: Path) -> None:
    path = tmp_path / "key_file.json"
    path.write_text("old")
    path.chmod(0o644)
    make(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "old" not in path.read_text()


def test_keys_are_8_char_urlsafe_and_distinct(tmp_path: Path) -> None:
    store = make(tmp_path)
    keys = [store.key(kind) for kind in KeyKind]
    assert all(URLSAFE_8.fullmatch(k) for k in keys)
    assert len(set(keys)) == 3


def test_keys_use_the_random_source(tmp_path: Path) -> None:
    calls: list[int] = []

    def rand(n: int) -> bytes:
        calls.append(n)
        return bytes([0xFB, 0xFF, 0xBF, len(calls), 0, 0])

    store = TokenStore.create(
        tmp_path / "key_file.json", expiration_min=1, clock=FakeClock(), rand=rand
    )
    assert calls == [6, 6, 6]
    assert store.key(KeyKind.MANAGEMENT) == "-_-_AQAA"  # URL-safe alphabet, no padding


def test_colliding_random_values_are_retried(tmp_path: Path) -> None:
    values = iter([b"\x00" * 6, b"\x00" * 6, b"\x01" * 6, b"\x01" * 6, b"\x02" * 6])
    store = TokenStore.create(
        tmp_path / "key_file.json",
        expiration_min=1,
        clock=FakeClock(),
        rand=lambda n: next(values),
    )
    assert len({store.key(kind) for kind in KeyKind}) == 3


def test_a_stuck_random_source_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="distinct"):
        TokenStore(tmp_path / "k.json", expiration_min=1, rand=lambda n: b"\x00" * n)


@pytest.mark.parametrize("minutes", [0, -1, float("nan"), float("inf")])
def test_bad_expiration_is_refused(tmp_path: Path, minutes: float) -> None:
    with pytest.raises(ValueError, match="expiration_min"):
        TokenStore(tmp_path / "k.json", expiration_min=minutes)


def test_constructor_alone_writes_nothing(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "key_file.json", expiration_min=60)
    assert URLSAFE_8.fullmatch(store.key(KeyKind.API))
    assert not (tmp_path / "key_file.json").exists()


def test_remove_file(tmp_path: Path) -> None:
    store = make(tmp_path)
    assert store.path.exists()
    store.remove_file()
    assert not store.path.exists()
    store.remove_file()  # already gone: fine


# -- check -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(KeyKind))
def test_right_key_for_right_kind(tmp_path: Path, kind: KeyKind) -> None:
    store = make(tmp_path)
    store.check(kind, f"Bearer {store.key(kind)}")


@pytest.mark.parametrize(("kind", "other"), list(itertools.permutations(KeyKind, 2)))
def test_another_kinds_key_is_refused(tmp_path: Path, kind: KeyKind, other: KeyKind) -> None:
    store = make(tmp_path)
    with pytest.raises(ServeError) as info:
        store.check(kind, f"Bearer {store.key(other)}")
    assert_unauthorized(info)


@pytest.mark.parametrize("kind", list(KeyKind))
def test_wrong_key_is_refused(tmp_path: Path, kind: KeyKind) -> None:
    store = make(tmp_path)
    key = store.key(kind)
    for wrong in ("AAAAAAAA", key[:-1], key + "x", key.lower() if key != key.lower() else "zz"):
        with pytest.raises(ServeError) as info:
            store.check(kind, f"Bearer {wrong}")
        assert_unauthorized(info)


def test_missing_header_is_refused(tmp_path: Path) -> None:
    store = make(tmp_path)
    with pytest.raises(ServeError) as info:
        store.check(KeyKind.INFERENCE, None)
    assert_unauthorized(info)


@pytest.mark.parametrize(
    "template",
    [
        "",
        "Bearer",
        "Bearer ",
        "Basic {key}",
        "bearer {key}",
        "Bearer{key}",
        "{key}",
        " Bearer {key}",
        "Bearer {key} ",
        "Bearer {key} extra",
        "Bearer {key}\n",
        "Token {key}",
    ],
)
def test_malformed_header_is_refused(tmp_path: Path, template: str) -> None:
    store = make(tmp_path)
    header = template.format(key=store.key(KeyKind.INFERENCE))
    with pytest.raises(ServeError) as info:
        store.check(KeyKind.INFERENCE, header)
    assert_unauthorized(info)


@pytest.mark.parametrize("sep", [" ", "  ", "\t", " \t "])
def test_any_whitespace_run_after_bearer_is_accepted(tmp_path: Path, sep: str) -> None:
    store = make(tmp_path)
    store.check(KeyKind.INFERENCE, f"Bearer{sep}{store.key(KeyKind.INFERENCE)}")


def test_non_ascii_token_is_refused_not_crashing(tmp_path: Path) -> None:
    store = make(tmp_path)
    with pytest.raises(ServeError) as info:
        store.check(KeyKind.INFERENCE, "Bearer ключключ")
    assert_unauthorized(info)


@given(header=st.one_of(st.none(), st.text(max_size=40)))
def test_arbitrary_headers_only_ever_give_401(header: str | None) -> None:
    store = TokenStore(Path("unused.json"), expiration_min=60, clock=FakeClock())
    key = store.key(KeyKind.MANAGEMENT)
    if header is not None and re.fullmatch(rf"Bearer\s+{re.escape(key)}", header, re.ASCII):
        store.check(KeyKind.MANAGEMENT, header)
        return
    with pytest.raises(ServeError) as info:
        store.check(KeyKind.MANAGEMENT, header)
    assert_unauthorized(info)


@pytest.mark.parametrize("kind", [KeyKind.MANAGEMENT, KeyKind.INFERENCE])
def test_keys_expire(tmp_path: Path, kind: KeyKind) -> None:
    clock = FakeClock()
    store = make(tmp_path, clock, minutes=1.5)
    header = f"Bearer {store.key(kind)}"
    clock.now = START + 89.9
    store.check(kind, header)
    clock.now = START + 90
    with pytest.raises(ServeError) as info:
        store.check(kind, header)
    assert_unauthorized(info)


def test_api_key_never_expires(tmp_path: Path) -> None:
    clock = FakeClock()
    store = make(tmp_path, clock, minutes=1)
    clock.now = START + 10 * 365 * 24 * 3600
    store.check(KeyKind.API, f"Bearer {store.key(KeyKind.API)}")


def test_unauthorized_error() -> None:
    err = unauthorized()
    assert (http_status(err), err.reason, err.message) == (401, "InvalidKeyException", AUTH_MESSAGE)


# -- regenerate (/token) -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [KeyKind.MANAGEMENT, KeyKind.INFERENCE])
def test_regenerate_rotates_only_that_key_and_persists(tmp_path: Path, kind: KeyKind) -> None:
    clock = FakeClock()
    store = make(tmp_path, clock, minutes=60)
    before = {k: store.key(k) for k in KeyKind}
    doc_before = json.loads(store.path.read_text())

    clock.now = START + 1800
    store.regenerate(kind.value, f"Bearer {before[KeyKind.API]}")

    after = {k: store.key(k) for k in KeyKind}
    assert after[kind] != before[kind]
    assert URLSAFE_8.fullmatch(after[kind])
    assert len(set(after.values())) == 3
    assert {k: v for k, v in after.items() if k is not kind} == {
        k: v for k, v in before.items() if k is not kind
    }

    doc = json.loads(store.path.read_text())
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert doc[kind.value] == {"key": after[kind], "expiration time": "2023-11-14T23:43:20.000Z"}
    for other in KeyKind:
        if other is not kind:
            assert doc[other.value] == doc_before[other.value]

    # the new key works with a fresh expiry; the old one no longer does
    store.check(kind, f"Bearer {after[kind]}")
    with pytest.raises(ServeError) as info:
        store.check(kind, f"Bearer {before[kind]}")
    assert_unauthorized(info)
    clock.now = START + 1800 + 3599
    store.check(kind, f"Bearer {after[kind]}")


def test_regenerate_revives_an_expired_kind(tmp_path: Path) -> None:
    clock = FakeClock()
    store = make(tmp_path, clock, minutes=1)
    clock.now = START + 3600
    with pytest.raises(ServeError):
        store.check(KeyKind.INFERENCE, f"Bearer {store.key(KeyKind.INFERENCE)}")
    store.regenerate("inference", f"Bearer {store.key(KeyKind.API)}")
    store.check(KeyKind.INFERENCE, f"Bearer {store.key(KeyKind.INFERENCE)}")


@pytest.mark.parametrize(
    "header_kind", [None, KeyKind.MANAGEMENT, KeyKind.INFERENCE, "wrong", "malformed"]
)
def test_regenerate_needs_the_api_key(tmp_path: Path, header_kind: KeyKind | str | None) -> None:
    store = make(tmp_path)
    before = store.path.read_bytes()
    if header_kind is None:
        header = None
    elif isinstance(header_kind, KeyKind):
        header = f"Bearer {store.key(header_kind)}"
    elif header_kind == "wrong":
        header = "Bearer AAAAAAAA"
    else:
        header = store.key(KeyKind.API)
    old = store.key(KeyKind.MANAGEMENT)
    with pytest.raises(ServeError) as info:
        store.regenerate("management", header)
    assert_unauthorized(info)
    assert store.key(KeyKind.MANAGEMENT) == old
    assert store.path.read_bytes() == before


def test_regenerate_unauthorized_beats_bad_type(tmp_path: Path) -> None:
    store = make(tmp_path)
    with pytest.raises(ServeError) as info:
        store.regenerate("nope", None)
    assert_unauthorized(info)


@pytest.mark.parametrize("kind_name", ["", "API", "api", "Management", "INFERENCE", "metrics"])
def test_regenerate_bad_type_is_400(tmp_path: Path, kind_name: str) -> None:
    store = make(tmp_path)
    before = {k: store.key(k) for k in KeyKind}
    file_before = store.path.read_bytes()
    with pytest.raises(ServeError) as info:
        store.regenerate(kind_name, f"Bearer {store.key(KeyKind.API)}")
    assert error_body(info.value) == {
        "code": 400,
        "type": "InvalidKeyException",
        "message": "Token Authentication failed. Token type must be one of management, inference",
    }
    assert {k: store.key(k) for k in KeyKind} == before
    assert store.path.read_bytes() == file_before


def test_failed_write_keeps_the_old_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = make(tmp_path)
    old = store.key(KeyKind.INFERENCE)
    file_before = store.path.read_bytes()

    def broken_replace(src: object, dst: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        store.regenerate("inference", f"Bearer {store.key(KeyKind.API)}")
    assert store.key(KeyKind.INFERENCE) == old
    store.check(KeyKind.INFERENCE, f"Bearer {old}")
    assert store.path.read_bytes() == file_before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["key_file.json"]


def test_regenerated_key_differs_from_every_held_key(tmp_path: Path) -> None:
    gen = counting_rand()
    # After the initial three keys, the source repeats the API key's bytes once.
    values = iter([next(gen), next(gen), next(gen), (3).to_bytes(6, "big"), next(gen)])
    store = TokenStore.create(
        tmp_path / "key_file.json", expiration_min=1, clock=FakeClock(), rand=lambda n: next(values)
    )
    store.regenerate("management", f"Bearer {store.key(KeyKind.API)}")
    assert len({store.key(k) for k in KeyKind}) == 3


# -- bearer() ----------------------------------------------------------------------------------


def test_bearer_finds_the_header_case_insensitively() -> None:
    assert bearer([("Content-Type", "x"), ("Authorization", "Bearer abc")]) == "Bearer abc"
    assert bearer([("AUTHORIZATION", "Bearer abc")]) == "Bearer abc"
    assert bearer([("authorization", "Bearer abc")]) == "Bearer abc"


def test_bearer_none_when_absent_or_ambiguous() -> None:
    assert bearer([]) is None
    assert bearer([("x-authorization", "Bearer abc"), ("auth", "y")]) is None
    assert bearer([("authorization", "Bearer a"), ("Authorization", "Bearer b")]) is None


def test_bearer_works_with_check(tmp_path: Path) -> None:
    store = make(tmp_path)
    headers = {"authorization": f"Bearer {store.key(KeyKind.INFERENCE)}"}.items()
    store.check(KeyKind.INFERENCE, bearer(headers))


def test_keys_reach_the_file_only_when_published(tmp_path: Path) -> None:
    path = tmp_path / "key_file.json"
    store = TokenStore(path, expiration_min=5)
    assert not path.exists()
    store.publish()
    held = json.loads(path.read_text())
    assert held["API"]["key"] == store.key(KeyKind.API)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_remove_file_leaves_a_file_another_server_wrote(tmp_path: Path) -> None:
    path = tmp_path / "key_file.json"
    mine = TokenStore(path, expiration_min=5)
    mine.publish()
    other = TokenStore.create(path, expiration_min=5)  # a later server took the file over
    mine.remove_file()
    assert json.loads(path.read_text())["API"]["key"] == other.key(KeyKind.API)
    other.remove_file()
    assert not path.exists()
    other.remove_file()  # a missing file is fine
