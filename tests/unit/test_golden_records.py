"""The capture path's records stay what they were (``tests/golden.py``): every wire fixture,
ended cleanly and aborted halfway, through the addon's hooks in the in-process mode and in
the worker mode, gives the golden record byte for byte."""

from __future__ import annotations

import pytest

from tests.golden import all_cases, dumps, golden_path, records


@pytest.fixture(scope="module", params=[False, True], ids=["in_process", "worker"])
def made(request) -> dict:
    return records(worker=request.param)


def test_every_fixture_has_golden_records(made):
    assert len(made) == 3 * len(all_cases())
    missing = [k for k in made if not golden_path(*k).exists()]
    assert missing == [], "new fixtures: write (and review) their golden records with python -m tests.golden --missing"


def test_records_equal_the_golden_records(made):
    differ = [k for k, rec in made.items() if dumps(rec) != golden_path(*k).read_text(encoding="utf-8")]
    assert differ == [], f"{len(differ)} records differ, first {differ[:5]}"
