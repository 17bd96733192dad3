"""What a serving process does to match the control process's registry
(``runtime.mirror.changes``, no I/O): whatever it had, afterwards it has exactly the
state's versions, each default is one of them, and nothing is both added and dropped."""

from __future__ import annotations

from typing import Any, cast

from hypothesis import given
from hypothesis import strategies as st

from trioserve.core.model_settings import ModelSettings
from trioserve.runtime.mirror import State, VersionState, changes

keys = st.tuples(st.sampled_from("abc"), st.sampled_from(["1.0", "2.0", "3.0"]))


def version(name: str, number: str) -> VersionState:
    settings = ModelSettings(
        name=name, version=number, url=f"{name}.mar", handler="h.py", runtime="python",
        batch_size=1, max_batch_delay=100, min_workers=1, max_workers=1,
        response_timeout=30, startup_timeout=5, job_queue_size=10, loaded_at_startup=False,
    )  # fmt: skip
    return VersionState(settings, cast("Any", None), ((9000, f"W-9000-{name}", None),))


@given(st.sets(keys), st.sets(keys), st.data())
def test_after_the_changes_exactly_the_states_versions_are_registered(
    have: set[tuple[str, str]], wanted: set[tuple[str, str]], data: st.DataObject
) -> None:
    names = {name for name, _ in wanted}
    defaults = tuple(
        (name, data.draw(st.sampled_from(sorted(v for n, v in wanted if n == name))))
        for name in sorted(names)
    )
    # A stale default (a version the state does not have) must never be taken.
    defaults += (("z", "9.9"),)
    state = State(tuple(version(*key) for key in sorted(wanted)), defaults)
    plan = changes(have, state)
    added = {v.key for v in plan.add}
    kept = {v.key for v in plan.keep}
    assert added.isdisjoint(have) and kept <= have
    assert (have | added) - set(plan.drop) == wanted
    assert set(plan.drop).isdisjoint(wanted)
    assert set(plan.defaults) <= wanted
    assert {name for name, _ in plan.defaults} == names


def test_nothing_to_do_when_the_state_is_what_is_registered() -> None:
    state = State((version("a", "1.0"),), (("a", "1.0"),))
    plan = changes([("a", "1.0")], state)
    assert (plan.add, plan.drop, [v.key for v in plan.keep]) == ((), (), [("a", "1.0")])
