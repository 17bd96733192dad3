"""Token authorization (TorchServe's ``key_file.json``, spec §3.4).

On start the server generates three keys and writes them to ``key_file.json`` (mode 0600):

* the **inference** key guards the inference port (HTTP and gRPC),
* the **management** key guards the management port (HTTP and gRPC),
* the **API** key only guards ``/token``, which regenerates one of the other two.

Each key is 6 random bytes in URL-safe base64 (8 characters). Inference and management keys
expire ``token_expiration_min`` minutes after they were generated; the API key never expires.
Requests carry ``Authorization: Bearer <key>``.

Unlike TorchServe (400 / ``PERMISSION_DENIED``), a missing, malformed, wrong or expired key
is HTTP 401, which the gRPC transport maps to ``UNAUTHENTICATED``. Keys are compared in
constant time. This module does no network I/O and is not thread-safe: the server uses it
from its single Trio thread.
"""

from __future__ import annotations

import base64
import contextlib
import enum
import hmac
import json
import math
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from trioserve.core.errors import ErrorKind, ServeError

__all__ = ["KeyKind", "TokenStore", "bearer", "unauthorized"]

KEY_BYTES: Final = 6
FILE_MODE: Final = 0o600

_BEARER: Final = re.compile(r"Bearer\s+(\S+)", re.ASCII)
_REGENERABLE: Final = ("management", "inference")
_MAX_KEY_TRIES: Final = 16


class KeyKind(enum.Enum):
    """The three keys of ``key_file.json``; the value is the key's name in the file."""

    MANAGEMENT = "management"
    INFERENCE = "inference"
    API = "API"


def unauthorized() -> ServeError:
    """The error for a missing, malformed, wrong or expired key."""
    return ServeError(
        ErrorKind.UNAUTHENTICATED,
        "Token Authorization failed. Token either incorrect, expired, or not provided correctly",
    )


def _bad_token_type() -> ServeError:
    return ServeError(
        ErrorKind.BAD_INPUT,
        "Token Authentication failed. Token type must be one of management, inference",
        reason="InvalidKeyException",
    )


def bearer(headers: Iterable[tuple[str, str]]) -> str | None:
    """The value of the ``Authorization`` header (name matched case-insensitively).

    ``None`` when there is none, and also when there are several: an ambiguous credential is
    treated as a missing one, so it is rejected.
    """
    found: str | None = None
    for name, value in headers:
        if name.lower() == "authorization":
            if found is not None:
                return None
            found = value
    return found


def _iso_instant(timestamp: float) -> str:
    """A UTC ISO-8601 instant as Java's ``Instant.toString`` writes it (``...Z``)."""
    moment = datetime.fromtimestamp(timestamp, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class _Key:
    value: str
    expires_at: float | None  # POSIX seconds; None: never expires


class TokenStore:
    """The server's three keys and the file that publishes them.

    ``TokenStore(...)`` generates the keys in memory only; :meth:`create` also writes the
    file. ``clock`` (POSIX seconds) and ``rand`` (``n`` -> ``n`` random bytes) are injectable
    for tests.
    """

    def __init__(
        self,
        path: Path,
        *,
        expiration_min: float,
        clock: Callable[[], float] = time.time,
        rand: Callable[[int], bytes] = os.urandom,
    ) -> None:
        if not math.isfinite(expiration_min) or expiration_min <= 0:
            raise ValueError(f"expiration_min must be a positive number, got {expiration_min!r}")
        self.path = Path(path)
        self.expiration_min = expiration_min
        self._clock = clock
        self._rand = rand
        self._keys: dict[KeyKind, _Key] = {}
        for kind in KeyKind:
            self._keys[kind] = self._new_key(kind)

    @classmethod
    def create(
        cls,
        path: Path,
        *,
        expiration_min: float,
        clock: Callable[[], float] = time.time,
        rand: Callable[[int], bytes] = os.urandom,
    ) -> TokenStore:
        """Generate all three keys and write them to ``path`` (mode 0600, atomically)."""
        store = cls(path, expiration_min=expiration_min, clock=clock, rand=rand)
        store._write(store._keys)
        return store

    # -- queries ---------------------------------------------------------------------------

    def key(self, kind: KeyKind) -> str:
        """The current value of one key."""
        return self._keys[kind].value

    def check(self, kind: KeyKind, authorization: str | None) -> None:
        """Accept ``Bearer <key>`` carrying the current, unexpired ``kind`` key.

        Raises :func:`unauthorized` otherwise (missing or malformed header, another kind's
        key, a wrong or expired key).
        """
        if authorization is None:
            raise unauthorized()
        match = _BEARER.fullmatch(authorization)
        if match is None:
            raise unauthorized()
        expected = self._keys[kind]
        # Both sides are bytes: compare_digest refuses non-ASCII str, and a header may hold any.
        given = match.group(1).encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(given, expected.value.encode("ascii")):
            raise unauthorized()
        if expected.expires_at is not None and self._clock() >= expected.expires_at:
            raise unauthorized()

    # -- changes ---------------------------------------------------------------------------

    def regenerate(self, kind_name: str, authorization: str | None) -> None:
        """``/token?type=<kind_name>``: replace the management or inference key.

        The request must carry the API key (else 401); ``kind_name`` must be ``management``
        or ``inference`` (else 400). The new key gets a fresh expiry and the file is
        rewritten; if writing fails the old key stays in force.
        """
        self.check(KeyKind.API, authorization)
        if kind_name not in _REGENERABLE:
            raise _bad_token_type()
        kind = KeyKind(kind_name)
        keys = dict(self._keys)
        keys[kind] = self._new_key(kind)
        self._write(keys)
        self._keys = keys

    def publish(self) -> None:
        """Write the keys to the file (mode 0600, atomically), as :meth:`create` does.

        The server calls this once every listener is bound, so a server that fails to start
        (a port in use) never replaces the file of one that is running.
        """
        self._write(self._keys)

    def remove_file(self) -> None:
        """Delete the key file at shutdown, if it still holds this store's keys.

        A missing file is fine; a file that another server has written since is left alone.
        """
        try:
            held = json.loads(self.path.read_text(encoding="utf-8"))
            mine = held[KeyKind.API.value]["key"] == self._keys[KeyKind.API].value
        except (OSError, ValueError, KeyError, TypeError):
            return
        if mine:
            self.path.unlink(missing_ok=True)

    # -- several serving processes ---------------------------------------------------------

    def export(self) -> dict[str, tuple[str, float | None]]:
        """The keys as the other serving processes take them (:meth:`adopt`)."""
        return {kind.value: (key.value, key.expires_at) for kind, key in self._keys.items()}

    def adopt(self, keys: dict[str, tuple[str, float | None]]) -> None:
        """Check with the control process's keys from now on (never writes the file)."""
        self._keys = {
            KeyKind(kind): _Key(value, expires) for kind, (value, expires) in keys.items()
        }

    # -- internals -------------------------------------------------------------------------

    def _new_key(self, kind: KeyKind) -> _Key:
        """A fresh key for ``kind``, different from every key currently held."""
        taken = {held.value for held in self._keys.values()}
        for _ in range(_MAX_KEY_TRIES):
            raw = self._rand(KEY_BYTES)
            if len(raw) != KEY_BYTES:
                raise ValueError(f"rand({KEY_BYTES}) returned {len(raw)} bytes")
            value = base64.urlsafe_b64encode(raw).decode("ascii")
            if value not in taken:
                break
        else:
            raise RuntimeError("could not generate a distinct key; is the random source broken?")
        if kind is KeyKind.API:
            return _Key(value, None)
        return _Key(value, self._clock() + self.expiration_min * 60.0)

    def _document(self, keys: dict[KeyKind, _Key]) -> dict[str, dict[str, str]]:
        doc: dict[str, dict[str, str]] = {}
        for kind in KeyKind:
            key = keys[kind]
            entry = {"key": key.value}
            if key.expires_at is not None:
                entry["expiration time"] = _iso_instant(key.expires_at)
            doc[kind.value] = entry
        return doc

    def _write(self, keys: dict[KeyKind, _Key]) -> None:
        """Write the key file atomically; it is 0600 from its creation, never wider."""
        data = (json.dumps(self._document(keys), indent=2) + "\n").encode("utf-8")
        directory = self.path.parent
        # mkstemp creates the file with O_EXCL and mode 0600 before any content is written.
        fd, tmp_name = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as tmp:
                os.fchmod(tmp.fileno(), FILE_MODE)  # exactly 0600 whatever the umask
                tmp.write(data)
                tmp.flush()
                os.fsync(tmp.fileno())
            os.replace(tmp_name, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
            raise
        with contextlib.suppress(OSError):
            dir_fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
