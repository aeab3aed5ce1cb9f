"""Every wire fixture of every dialect (``tests/fixtures/wire/<dialect>/``) through the whole
sans-IO pipeline, fed whole, one byte at a time, in random splits and gzip-compressed: always
the same record, equal to the expected record written by hand from the draft or the vendor's
documentation. The registry must also pick the fixture's dialect from its request/response."""

from __future__ import annotations

import re
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from observer.dialects.registry import default_registry
from observer.response import ResponseSpec
from tests.wirefeed import (
    CUT_POINTS,
    assert_matches,
    bytewise,
    cases,
    dialect_dirs,
    load,
    observe_case,
    response_bytes,
    split_at,
    view_of,
)

CASES = [(d, c) for d in dialect_dirs() for c in cases(d)]
IDS = [f"{d}/{c}" for d, c in CASES]


def assert_counted(c, record, wire: bytes) -> None:
    """Every encoded byte is in the record; a stream cut into turns (``observer.tap``) counts
    its turns' bytes, and those after its last turn (heartbeats, the stream's end) are in no
    record."""
    spec = ResponseSpec(c.dialect, c.status, c.content_type, path=c.path)
    if getattr(default_registry().get(c.dialect).new_adapter(spec), "multi_turn", False):
        assert 0 < response_bytes(record) <= len(wire)
    else:
        assert response_bytes(record) == len(wire)


def test_fixture_set_is_complete():
    """The hand-written cases the skeleton issue names are all present."""
    assert {"complete_example", "tool_flow", "violations", "unterminated_final"} <= set(cases("llm-stream-1.0"))


@pytest.mark.parametrize(("dialect", "case"), CASES, ids=IDS)
def test_registry_picks_the_dialect(dialect, case):
    c = load(dialect, case)
    registry = default_registry()
    view = view_of(c)
    headers = {k.lower(): v for k, v in c.response_headers.items()}
    found = registry.classify_response(view, headers, registry.classify(view))
    assert found is not None and found.name == dialect


@pytest.mark.parametrize(("dialect", "case"), CASES, ids=IDS)
def test_whole(dialect, case):
    """The body fed as one chunk gives the hand-written record."""
    c = load(dialect, case)
    assert_matches(observe_case(c, [c.body]), c.expected)


@pytest.mark.parametrize(("dialect", "case"), CASES, ids=IDS)
def test_byte_by_byte(dialect, case):
    """One byte per chunk gives the same record (CR/LF, UTF-8 and JSON split everywhere)."""
    c = load(dialect, case)
    assert_matches(observe_case(c, bytewise(c.body)), c.expected)


@pytest.mark.parametrize(("dialect", "case"), CASES, ids=IDS)
@settings(max_examples=40, deadline=None)
@given(points=CUT_POINTS)
def test_random_splits(dialect, case, points):
    """Any chunking gives the same record."""
    c = load(dialect, case)
    assert_matches(observe_case(c, split_at(c.body, points)), c.expected)


@pytest.mark.parametrize(("dialect", "case"), CASES, ids=IDS)
@settings(max_examples=10, deadline=None)
@given(points=st.lists(st.integers(min_value=0, max_value=3000), max_size=20))
def test_gzip_random_splits(dialect, case, points):
    """The body gzip-encoded (flushed per line, as servers do) in any chunking gives the same
    record, and every encoded byte is counted."""
    c = load(dialect, case)
    if c.content_encoding is not None:
        pytest.skip("fixture is already content-encoded")
    parts = re.findall(rb".*?\n|.+", c.body, re.S)  # one piece per line, line ends kept
    assert b"".join(parts) == c.body
    comp = zlib.compressobj(wbits=31)
    wire = b"".join(comp.compress(part) + comp.flush(zlib.Z_SYNC_FLUSH) for part in parts) + comp.flush()
    c.content_encoding = "gzip"
    record = observe_case(c, split_at(wire, points))
    assert_matches(record, c.expected)
    assert_counted(c, record, wire)


@pytest.mark.parametrize(("dialect", "case"), CASES, ids=IDS)
def test_brotli_flushed(dialect, case):
    """The body br-encoded (flushed per line) in 7-byte chunks gives the same record."""
    import brotli

    c = load(dialect, case)
    if c.content_encoding is not None:
        pytest.skip("fixture is already content-encoded")
    comp = brotli.Compressor()
    parts = re.findall(rb".*?\n|.+", c.body, re.S)
    wire = b"".join(comp.process(p) + comp.flush() for p in parts) + comp.finish()
    c.content_encoding = "br"
    record = observe_case(c, [wire[i : i + 7] for i in range(0, len(wire), 7)])
    assert_matches(record, c.expected)
    assert_counted(c, record, wire)
