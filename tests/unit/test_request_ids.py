"""Request ids: version-4 UUID strings, unique, without a system call each."""

from __future__ import annotations

import subprocess
import sys
import uuid

from trioserve.core.request import InferenceRequest, new_request_id


def test_ids_are_version_4_uuids_in_canonical_form_and_unique() -> None:
    ids = [new_request_id() for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    for text in ids[:200] + ids[-200:]:
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant) == (4, uuid.RFC_4122)
        assert str(parsed) == text
    assert InferenceRequest("m", None, []).request_id != InferenceRequest("m", None, []).request_id


def test_two_processes_draw_different_ids() -> None:
    code = "from trioserve.core.request import new_request_id; print(new_request_id())"
    drawn = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
        for _ in range(3)
    }
    assert len(drawn) == 3
