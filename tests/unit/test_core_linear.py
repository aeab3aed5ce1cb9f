"""The core's hot path stays linear in the stream's length (issue 4), checked by structure, not
by timing (speed lives in bench/core.py, whose ``line/1k`` case is a 300 KB line in 1 KiB chunks):

- a block's text pieces are coalesced every ``_COALESCE_PARTS`` deltas, and a coalesced run is
  never joined again (the bug fixed: the whole accumulated text was re-joined every 256 deltas,
  quadratic in the stream's length);
- an unterminated event arriving in small chunks comes out whole and exact (LF and CRLF)."""

from __future__ import annotations

from observer.reassembly import _COALESCE_PARTS, _append, _Parts
from observer.wire.sse import SSEDecoder


def test_coalesced_runs_are_never_joined_again():
    parts = _Parts()
    for _ in range(_COALESCE_PARTS):
        _append(parts, "ab")
    assert len(parts) == 1 and parts.joined == 1
    first = parts[0]
    assert first == "ab" * _COALESCE_PARTS
    for _ in range(10 * _COALESCE_PARTS):
        _append(parts, "cd")
    assert parts[0] is first  # the first run was not copied again
    assert len(parts) == 11 and parts.joined == 11
    assert "".join(parts) == "ab" * _COALESCE_PARTS + "cd" * (10 * _COALESCE_PARTS)


def test_parts_stay_bounded_by_deltas_over_coalesce_interval():
    parts = _Parts()
    n = 100_000
    for _ in range(n):
        _append(parts, "x")
    assert "".join(parts) == "x" * n
    assert len(parts) <= n // _COALESCE_PARTS + _COALESCE_PARTS


def _line_in_1k_chunks(n: int, end: bytes) -> None:
    data = b"data: " + b"y" * n + end + end
    dec = SSEDecoder(max_event_bytes=16 << 20)
    out = []
    for i in range(0, len(data), 1024):
        out += dec.feed(data[i : i + 1024])
    out += dec.close()
    assert len(out) == 1 and out[0].data == "y" * n and out[0].size_bytes == 6 + n + 2 * len(end)


def test_long_line_in_1k_chunks_lf():
    _line_in_1k_chunks(3_000_000, b"\n")


def test_long_line_in_1k_chunks_crlf():
    _line_in_1k_chunks(3_000_000, b"\r\n")
