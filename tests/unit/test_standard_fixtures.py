"""Wire fixtures of the draft standard (``llm-stream-1.0``) through the whole sans-IO pipeline,
fed whole, one byte at a time, in random splits and gzip-compressed: always the same record,
equal to the expected record written by hand from the draft (§5.5 complete example, §4.8 tool
flow, and one fixture per lifecycle violation)."""

from __future__ import annotations

import re
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.wirefeed import assert_matches, cases, load_case, observe, split_at

DIALECT = "llm-stream-1.0"
CASES = cases(DIALECT)


def test_fixture_set_is_complete():
    """The hand-written cases the skeleton issue names are all present."""
    assert {"complete_example", "tool_flow", "violations", "unterminated_final"} <= set(CASES)


@pytest.mark.parametrize("case", CASES)
def test_whole(case):
    """The body fed as one chunk gives the hand-written record."""
    body, request, expected = load_case(DIALECT, case)
    assert_matches(observe(DIALECT, request, [body]), expected)


@pytest.mark.parametrize("case", CASES)
def test_byte_by_byte(case):
    """One byte per chunk gives the same record (CR/LF, UTF-8 and JSON split everywhere)."""
    body, request, expected = load_case(DIALECT, case)
    assert_matches(observe(DIALECT, request, [body[i : i + 1] for i in range(len(body))]), expected)


@pytest.mark.parametrize("case", CASES)
@settings(max_examples=60, deadline=None)
@given(points=st.lists(st.integers(min_value=0, max_value=5000), max_size=40))
def test_random_splits(case, points):
    """Any chunking gives the same record."""
    body, request, expected = load_case(DIALECT, case)
    assert_matches(observe(DIALECT, request, split_at(body, points)), expected)


@pytest.mark.parametrize("case", ["complete_example", "crlf_comments_bom"])
@settings(max_examples=40, deadline=None)
@given(points=st.lists(st.integers(min_value=0, max_value=3000), max_size=30))
def test_gzip_random_splits(case, points):
    """A gzip-encoded body (flushed per event, as servers do) in any chunking gives the same record."""
    body, request, expected = load_case(DIALECT, case)
    parts = re.findall(rb".*?\n\n|.+", body, re.S)  # one piece per event, separators kept
    assert b"".join(parts) == body
    comp = zlib.compressobj(wbits=31)
    wire = b"".join(comp.compress(part) + comp.flush(zlib.Z_SYNC_FLUSH) for part in parts)
    wire += comp.flush()
    record = observe(DIALECT, request, split_at(wire, points), content_encoding="gzip")
    assert_matches(record, expected)
    assert record["response_bytes"] == len(wire)
