import pytest

from trioserve.core.errors import ServeError
from trioserve.core.registry import Registry, version_key
from trioserve.http.errors import http_status


def test_first_version_is_default_and_lookup_rules() -> None:
    r: Registry[str] = Registry()
    r.add("m", "1.0", "a")
    r.add("m", "2.0", "b")
    assert r.get("m") == "a"
    assert r.get("m", "2.0") == "b"
    with pytest.raises(ServeError) as e:
        r.get("m", "3.0")
    assert http_status(e.value) == 404
    assert e.value.message == "Model version: 3.0 does not exist for model: m"
    with pytest.raises(ServeError) as e:
        r.get("nope")
    assert (http_status(e.value), e.value.reason) == (404, "ModelNotFoundException")


def test_duplicate_is_conflict() -> None:
    r: Registry[int] = Registry()
    r.add("m", "1", 1)
    with pytest.raises(ServeError) as e:
        r.add("m", "1", 2)
    assert http_status(e.value) == 409


def test_default_cannot_be_removed_while_others_exist() -> None:
    r: Registry[int] = Registry()
    r.add("m", "1", 1)
    r.add("m", "2", 2)
    with pytest.raises(ServeError) as e:
        r.remove("m")
    assert http_status(e.value) == 403
    assert r.remove("m", "2") == 2
    assert r.remove("m") == 1
    assert len(r) == 0
    assert r.names() == []


def test_set_default_and_iteration_order() -> None:
    r: Registry[int] = Registry()
    r.add("b", "10", 3)
    r.add("b", "9", 2)
    r.add("a", "1", 1)
    r.set_default("b", "9")
    assert r.get("b") == 2
    assert [(n, v) for n, v, _ in r] == [("a", "1"), ("b", "9"), ("b", "10")]
    with pytest.raises(ServeError):
        r.set_default("b", "11")


def test_version_key_orders_numbers_numerically() -> None:
    assert sorted(["1.10", "1.9", "1.a"], key=version_key) == ["1.9", "1.10", "1.a"]
