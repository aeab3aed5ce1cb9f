"""Tests for observer.wire.sse (WHATWG HTML §9.2.6 event stream interpretation)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from observer.records import Violation
from observer.wire.frames import SSEEvent, text_message
from observer.wire.sse import SSEDecoder
from tests.wirefeed import CUT_POINTS, bytewise, feed, feed_each_way

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "wire" / "sse"
UNTERMINATED = "unterminated_final_event"
OVERSIZE = "oversize_event"
NONSTANDARD = "nonstandard_field"


def ignored(name: str, n: int) -> Violation:
    """The ``nonstandard_field`` violation naming an ignored field ``name`` of ``n`` value bytes."""
    size = "1 byte" if n == 1 else f"{n} bytes"
    return Violation(NONSTANDARD, None, f"field {name!r} ({size}) is not an SSE field: ignored, as WHATWG §9.2.6 says")


def ev(data: str, size: int, event: str = "", id: str | None = None, retry: int | None = None) -> tuple:
    """The message ``(event, data, id, retry, size_bytes)`` the decoder returns (bytes undecoded)."""
    return (event.encode(), data.encode(), id, retry, size)


def size(message: tuple) -> int:
    return message[4]


def decode(chunks, *, max_event_bytes: int = 1 << 20, close: bool = True) -> list:
    """Everything one decoder returns for ``chunks`` (``tests.wirefeed.feed``)."""
    return feed(SSEDecoder(max_event_bytes=max_event_bytes), chunks, close=close)


def decoder(max_event_bytes: int = 1 << 20) -> Callable[[], SSEDecoder]:
    """A factory of fresh decoders for ``tests.wirefeed.feed_each_way``."""
    return lambda: SSEDecoder(max_event_bytes=max_event_bytes)


def kinds(out: list) -> list[str]:
    return [o.kind if isinstance(o, Violation) else "event" for o in out]


# -- fixtures: expected output written by hand ------------------------------------------------

EXPECTED: dict[str, list] = {
    # WHATWG stock-ticker example: one "message" event, data lines joined by LF.
    "whatwg_stock.sse": [ev("YHOO\n+2\n10", 30)],
    # WHATWG example: comment-only first block fires nothing; "id" without a value sets the
    # last event ID to ""; only one space after the colon is removed.
    "whatwg_ids.sse": [
        ev("first event", 25, id="1"),
        ev("second event", 22, id=""),
        ev(" third event", 20, id=""),
    ],
    # WHATWG example: "data" alone gives "", two "data" lines give "\n"; the last block has no
    # blank line: WHATWG drops it, we report it.
    "whatwg_empty_data.sse": [
        ev("", 6),
        ev("\n", 11),
        ev("", 5),
        Violation(
            kind=UNTERMINATED,
            seq=None,
            detail="stream ended before the blank line that dispatches the final event (5 bytes)",
        ),
    ],
    # WHATWG example: "data:test" and "data: test" are the same.
    "whatwg_space.sse": [ev("test", 11), ev("test", 12)],
    # CRLF, bare CR and LF mixed, comment inside an event.
    "line_ends_mixed.sse": [ev("1", 21, event="a"), ev("2", 18, event="b"), ev("3", 14)],
    # Leading BOM (not counted), a data-less block (retry, comment) that fires nothing, UTF-8
    # (2-, 3- and 4-byte characters), U+2028/U+0085/VT/FF inside data (not line ends), ids
    # persisting.
    "tokens_utf8.sse": [
        ev('{"text":"h\u00e9llo \u20ac"}', 56, event="content.delta", id="1"),
        ev('{"text":"\U0001d11e \u4e16\u754c"}', 57, event="content.delta", id="2"),
        ev('{"text":"a\u2028b\u0085c\x0bd\x0ce"}', 52, event="content.delta", id="2"),
        ev("[DONE]", 14, id="2"),
    ],
}
NAMES = sorted(EXPECTED)
# Fixtures that end on a blank line (the rest end mid-event).
COMPLETE_NAMES = [n for n in NAMES if not any(isinstance(o, Violation) for o in EXPECTED[n])]


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def test_fixture_sizes_add_up():
    # Every byte but the BOM and the data-less blocks is accounted to an event.
    assert sum(map(size, EXPECTED["tokens_utf8.sse"])) == len(fixture("tokens_utf8.sse")) - 3 - 26
    assert sum(map(size, EXPECTED["line_ends_mixed.sse"])) == len(fixture("line_ends_mixed.sse"))


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=40, deadline=None)
@given(points=CUT_POINTS)
def test_fixture_each_way(name, points):
    """Each fixture fed whole, one byte at a time and in random splits gives its hand-written
    events."""
    assert feed_each_way(decoder(), fixture(name), points) == EXPECTED[name]


@settings(max_examples=200, deadline=None)
@given(
    name=st.sampled_from(NAMES),
    points=CUT_POINTS,
    limit=st.integers(1, 80),
)
def test_chunking_independent_with_small_limits(name, points, limit):
    """Oversize detection and recovery do not depend on where chunks are cut either."""
    feed_each_way(decoder(limit), fixture(name), points)


@settings(max_examples=200, deadline=None)
@given(
    name=st.sampled_from(COMPLETE_NAMES),
    garbage=st.binary(min_size=1, max_size=64).filter(lambda b: b"\r" not in b and b"\n" not in b),
    points=CUT_POINTS,
)
def test_trailing_garbage_gives_same_events_before_it(name, garbage, points):
    """h11 style: what was complete before trailing garbage comes out unchanged."""
    expected = EXPECTED[name]
    assert feed_each_way(decoder(), fixture(name) + garbage, points, close=False) == expected
    out = feed_each_way(decoder(), fixture(name) + garbage, points)
    assert out[: len(expected)] == expected
    # The garbage is a last line: data, another field (named, or surfaced as an event when its
    # value is JSON-like: observer.wire.recovery), or nothing WHATWG reads.
    assert kinds(out[len(expected) :]) in (
        [UNTERMINATED],
        ["event", UNTERMINATED],
        [NONSTANDARD, UNTERMINATED],
        [NONSTANDARD, "event", UNTERMINATED],
    )


@pytest.mark.parametrize("name", COMPLETE_NAMES)
def test_incomplete_event_after_fixture(name):
    data = fixture(name) + b'event: x\ndata: {"trunc'
    expected = EXPECTED[name]
    assert decode([data], close=False) == expected
    assert decode(bytewise(data), close=False) == expected
    last_id = next((e[2] for e in reversed(expected)), None)
    assert decode([data]) == [
        *expected,
        ev('{"trunc', 22, event="x", id=last_id),
        Violation(
            kind=UNTERMINATED,
            detail="stream ended before the blank line that dispatches the final event (22 bytes)",
        ),
    ]


# -- line ends --------------------------------------------------------------------------------


@pytest.mark.parametrize("eol", [b"\n", b"\r", b"\r\n"])
def test_each_line_end(eol):
    data = b"event: e" + eol + b"data: a" + eol + b"data: b" + eol + eol
    size = 8 + 7 + 7 + 4 * len(eol)
    assert decode([data]) == [ev("a\nb", size, event="e")]
    assert decode(bytewise(data)) == [ev("a\nb", size, event="e")]


def test_crlf_split_across_chunks_is_one_line_end():
    d = SSEDecoder()
    assert d.feed(b"data: a\r") == []
    # The LF completes the CRLF: no extra (blank) line, so nothing is dispatched early.
    assert d.feed(b"\ndata: b\r\n") == []
    assert d.feed(b"\r\n") == [ev("a\nb", 20)]
    assert d.close() == []


def test_blank_line_crlf_split_counts_whole_terminator():
    d = SSEDecoder()
    # The blank line's CR is the last byte so far: the dispatch waits for the next byte.
    assert d.feed(b"data: a\r\n\r") == []
    assert d.feed(b"\ndata: b\n\n") == [ev("a", 11), ev("b", 9)]


def test_bare_cr_blank_line_dispatched_by_next_byte_or_close():
    d = SSEDecoder()
    assert d.feed(b"data: a\r\r") == []
    assert d.feed(b"data: b\r") == [ev("a", 9)]
    assert d.feed(b"\r") == []
    assert d.close() == [ev("b", 9)]  # a complete event: no violation


def test_lf_after_cr_in_next_chunk_is_not_a_blank_line():
    assert decode([b"data: a\r", b"\n", b"data: b\n\n"]) == [ev("a\nb", 18)]
    assert decode([b"data: a\n\r", b"\n", b"data: b\n\n"]) == [ev("a", 10), ev("b", 9)]


@pytest.mark.parametrize(
    "sep",
    [
        "\u2028",  # LINE SEPARATOR
        "\u2029",  # PARAGRAPH SEPARATOR
        "\u0085",  # NEXT LINE
        "\x0b",  # VT
        "\x0c",  # FF
        "\x1c",  # FS
        "\x1d",
        "\x1e",
    ],
)
def test_only_cr_lf_crlf_end_lines(sep):
    data = f"data: a{sep}b\n\n".encode()
    assert decode([data]) == [ev(f"a{sep}b", len(data))]
    assert decode(bytewise(data)) == [ev(f"a{sep}b", len(data))]


# -- UTF-8 and BOM ----------------------------------------------------------------------------


def test_multibyte_utf8_split_at_every_pair_of_positions():
    text = "h\u00e9 \u20ac \U0001d11e \u4e16\u754c"
    data = f"event: \u00e9\ndata: {text}\n\n".encode()
    expected = [ev(text, len(data), event="\u00e9")]
    for i in range(len(data) + 1):
        for j in range(i, len(data) + 1):
            assert decode([data[:i], data[i:j], data[j:]]) == expected, (i, j)


def test_invalid_utf8_kept_then_replaced():
    """The decoder keeps data and event bytes as sent (the id buffer is decoded with
    replacement: WHATWG); their text form replaces invalid UTF-8, as WHATWG decodes, and the
    record is told the text differs from the bytes."""
    bad = Violation(kind="invalid_utf8", seq=None, detail="invalid UTF-8 replaced by U+FFFD")
    out = decode([b"data: \xff\xfe ok \xe2\x82\n\n"])
    assert out == [(b"", b"\xff\xfe ok \xe2\x82", None, None, 16)]
    assert text_message(out[0]) == (SSEEvent("", "\ufffd\ufffd ok \ufffd", None, None, 16), bad)
    out = decode([b"event: \xc3\nid: \xc3\ndata: x\n\n"])
    assert out == [(b"\xc3", b"x", "\ufffd", None, 24)]
    assert text_message(out[0]) == (SSEEvent("\ufffd", "x", "\ufffd", None, 24), bad)
    assert text_message(ev("ok", 10, event="e", id="1", retry=5)) == (SSEEvent("e", "ok", "1", 5, 10), None)


def test_bom_stripped_and_not_counted():
    assert decode([b"\xef\xbb\xbfdata: x\n\n"]) == [ev("x", 9)]


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_bom_split_across_chunks(cut):
    data = b"\xef\xbb\xbfdata: x\n\n"
    assert decode([data[:cut], data[cut:]]) == [ev("x", 9)]
    assert decode([data[:1], data[1:cut], data[cut:]]) == [ev("x", 9)]


def test_second_bom_kept():
    # The second BOM is content: it becomes part of the field name, so the field is unknown
    # (and named: a field WHATWG ignores is put on record).
    assert decode([b"\xef\xbb\xbf\xef\xbb\xbfdata: x\n\n"]) == [ignored("\ufeffdata", 1)]
    assert decode(bytewise(b"\xef\xbb\xbf\xef\xbb\xbfdata: x\n\n")) == [ignored("\ufeffdata", 1)]
    # A BOM inside a value is data.
    assert decode([b"\xef\xbb\xbfdata: \xef\xbb\xbfx\n\n"]) == [ev("\ufeffx", 12)]


def test_bom_later_in_stream_is_not_stripped():
    assert decode([b"data: a\n\n", b"\xef\xbb\xbfdata: b\n\n"]) == [ev("a", 9), ignored("\ufeffdata", 1)]


def test_bom_prefix_that_is_not_a_bom():
    assert decode([b"\xef", b"\xbbdata: x\n\ndata: y\n\n"]) == [ignored("\ufffddata", 1), ev("y", 9)]
    assert decode([b"\xef\xbb"]) == [
        ignored("\ufffd", 0),  # the two bytes are a last line: a field (named, with replacement)
        Violation(kind=UNTERMINATED, detail="stream ended inside an event block with no data (2 bytes discarded)"),
    ]


# -- fields -----------------------------------------------------------------------------------


def test_comments_ignored_but_counted():
    assert decode([b": hello\n:\ndata: x\n: mid\n\n"]) == [ev("x", 25)]
    assert decode([b": only a comment\n\n"]) == []


def test_field_without_colon():
    assert decode([b"data\n\n"]) == [ev("", 6)]
    assert decode([b"event\ndata: x\n\n"]) == [ev("x", 15)]
    assert decode([b"id\ndata: x\n\n"]) == [ev("x", 12, id="")]


def test_only_one_space_removed_and_colon_in_value():
    assert decode([b"data:  two\n\n"]) == [ev(" two", 12)]
    assert decode([b"data:\tx\n\n"]) == [ev("\tx", 9)]
    assert decode([b"data: a: b:c\n\n"]) == [ev("a: b:c", 14)]
    assert decode([b"data:\n\n"]) == [ev("", 7)]


def test_unknown_fields_and_case_ignored():
    """Field names are case- and space-sensitive; an unknown field is ignored (WHATWG) but named
    once per stream (observer.wire.recovery)."""
    assert decode([b"Data: x\nfoo: bar\ndata : y\nevent: e\n\n"]) == [
        ignored("Data", 1),
        ignored("foo", 3),
        ignored("data ", 1),
    ]
    assert decode([b"foo: bar\ndata: y\n\n"]) == [ignored("foo", 3), ev("y", 18)]
    assert decode([b"foo: bar\ndata: y\n\nfoo: baz\ndata: z\n\n"]) == [ignored("foo", 3), ev("y", 18), ev("z", 18)]


def test_event_type_last_wins_and_resets():
    assert decode([b"event: a\nevent: b\ndata: x\n\ndata: y\n\n"]) == [ev("x", 27, event="b"), ev("y", 9)]
    # A block without data resets the event type buffer too.
    assert decode([b"event: a\n\ndata: y\n\n"]) == [ev("y", 9)]


def test_id_with_nul_ignored():
    assert decode([b"id: 1\ndata: a\n\nid: x\x00y\ndata: b\n\n"]) == [ev("a", 15, id="1"), ev("b", 17, id="1")]


def test_id_persists_across_events_and_data_less_blocks():
    out = decode([b"data: a\n\nid: 7\n\ndata: b\n\nid: 8\ndata: c\n\nid\ndata: d\n\n"])
    assert out == [ev("a", 9), ev("b", 9, id="7"), ev("c", 15, id="8"), ev("d", 12, id="")]


def test_retry_digits_only_and_per_block():
    out = decode(
        [
            b"retry: 1500\ndata: a\n\n"
            b"data: b\n\n"
            b"retry: 12a\ndata: c\n\n"
            b"retry: -1\ndata: d\n\n"
            b"retry:\ndata: e\n\n"
            b"retry: 1 \ndata: f\n\n"
            + "retry: \u0661\u0662\ndata: g\n\n".encode()
            + b"retry: 0042\nretry: bad\ndata: h\n\n"
        ]
    )
    assert [(e[1].decode(), e[3]) for e in out] == [
        ("a", 1500),
        ("b", None),
        ("c", None),
        ("d", None),
        ("e", None),
        ("f", None),
        ("g", None),
        ("h", 42),
    ]


def test_retry_with_too_many_digits_ignored():
    assert decode([b"retry: " + b"9" * 5000 + b"\ndata: x\n\n"]) == [ev("x", 5008 + 9)]


# -- end of stream ----------------------------------------------------------------------------


def test_unterminated_final_line_without_line_end():
    for chunks in ([b'data: {"x":1}'], bytewise(b'data: {"x":1}')):
        assert decode(chunks) == [
            ev('{"x":1}', 13),
            Violation(
                kind=UNTERMINATED,
                seq=None,
                detail="stream ended before the blank line that dispatches the final event (13 bytes)",
            ),
        ]


def test_unterminated_final_event_with_complete_lines():
    out = decode([b"data: a\n\nevent: e\ndata: b\n"])
    assert out[:2] == [ev("a", 9), ev("b", 17, event="e")]
    assert kinds(out) == ["event", "event", UNTERMINATED]


def test_unterminated_final_event_without_data():
    assert decode([b"data: a\n\nevent: e\n"]) == [
        ev("a", 9),
        Violation(kind=UNTERMINATED, detail="stream ended inside an event block with no data (9 bytes discarded)"),
    ]
    # Only a partial line that is not a data field (a field named "dat", named).
    assert kinds(decode([b"dat"])) == [NONSTANDARD, UNTERMINATED]


def test_close_with_nothing_pending():
    assert decode([b"data: a\n\n"]) == [ev("a", 9)]
    assert decode([]) == []
    assert decode([b""]) == []


def test_close_idempotent_feed_after_close_raises():
    d = SSEDecoder()
    assert d.feed(b"data: a") == []
    assert kinds(d.close()) == ["event", UNTERMINATED]
    assert d.close() == []
    with pytest.raises(ValueError):
        d.feed(b"data: b\n\n")


def test_bytes_like_input_accepted():
    assert decode([bytearray(b"data: a\n"), memoryview(b"\n")]) == [ev("a", 9)]


# -- oversize ---------------------------------------------------------------------------------


def test_oversize_flagged_once_and_recovers():
    data = b"data: " + b"x" * 200 + b"\ndata: more\nid: 9\n\ndata: ok\n\n"
    expected = [Violation(kind=OVERSIZE, seq=None, detail="event exceeded 64 bytes"), ev("ok", 10)]
    assert decode([data], max_event_bytes=64) == expected
    assert decode(bytewise(data), max_event_bytes=64) == expected


def test_oversize_from_many_small_lines():
    data = b"data: abc\n" * 20 + b"\n" + b"data: ok\n\n"
    out = decode([data], max_event_bytes=100)
    assert out == [Violation(kind=OVERSIZE, detail="event exceeded 100 bytes"), ev("ok", 10)]


def test_event_exactly_at_limit_is_kept():
    data = b"data: 12345\n\n"  # 13 bytes
    assert decode([data], max_event_bytes=13) == [ev("12345", 13)]
    assert decode([data + data], max_event_bytes=12) == [
        Violation(kind=OVERSIZE, detail="event exceeded 12 bytes"),
        Violation(kind=OVERSIZE, detail="event exceeded 12 bytes"),
    ]


def test_oversize_by_the_blank_line_does_not_skip_the_next_event():
    # 12 bytes of lines fit, the blank line makes 13: the block ends right there.
    assert decode([b"data: 12345\n\ndata: 6\n\n"], max_event_bytes=12) == [
        Violation(kind=OVERSIZE, detail="event exceeded 12 bytes"),
        ev("6", 9),
    ]
    assert decode([b"data: 12345\r", b"\n\r", b"\ndata: 6\r\n\r\n"], max_event_bytes=13) == [
        Violation(kind=OVERSIZE, detail="event exceeded 13 bytes"),
        ev("6", 11),
    ]


def test_oversize_while_skipping_then_eof_reports_nothing_more():
    assert decode([b"data: " + b"x" * 100], max_event_bytes=10) == [
        Violation(kind=OVERSIZE, detail="event exceeded 10 bytes")
    ]


def test_oversize_memory_bounded_for_10mb_line_in_4kb_pieces():
    cap = 1 << 20
    d = SSEDecoder(max_event_bytes=cap)
    out = d.feed(b"data: a\n\ndata: ")
    piece = b"x" * 4096
    for _ in range((10 << 20) // 4096):
        out += d.feed(piece)
        assert d.buffered_bytes <= cap
    assert d.buffered_bytes == 0
    out += d.feed(b"\nid: 1\n\ndata: next\n\n")
    out += d.close()
    assert out == [ev("a", 9), Violation(kind=OVERSIZE, detail=f"event exceeded {cap} bytes"), ev("next", 12)]


def test_buffered_bytes_tracks_partial_and_data():
    d = SSEDecoder()
    d.feed(b"data: abc\ndata: de")
    assert d.buffered_bytes == 3 + 8
    d.feed(b"\n\n")
    assert d.buffered_bytes == 0


# -- misc -------------------------------------------------------------------------------------


def test_size_bytes_exact_with_comments_and_crlf():
    data = b": c\r\nevent: e\r\ndata: x\r\n\r\n"
    assert len(data) == 26
    assert decode([data]) == [ev("x", 26, event="e")]


def test_large_line_in_16kb_chunks():
    data = b"data: " + b"y" * 300_000 + b"\n\n"
    chunks = [data[i : i + 16384] for i in range(0, len(data), 16384)]
    assert decode(chunks) == [ev("y" * 300_000, 300_008)]


@pytest.mark.parametrize("bad", [0, -1, 1.5, None])
def test_max_event_bytes_validated(bad):
    with pytest.raises(ValueError):
        SSEDecoder(max_event_bytes=bad)  # type: ignore[arg-type]


_LINES = st.sampled_from(
    [
        b'data: {"t":1}',
        b"data:x",
        b"data: ",
        b"data",
        b"event: e",
        b"event:",
        b"id: 3",
        b"retry: 9",
        b": c",
        b"other: z",
        b"",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    blocks=st.lists(st.lists(_LINES, max_size=4), max_size=12),
    eols=st.lists(st.sampled_from([b"\n", b"\r\n", b"\r"]), min_size=1, max_size=3),
    points=CUT_POINTS,
    limit=st.sampled_from([8, 24, 1 << 20]),
)
def test_generated_streams_any_chunking(blocks, eols, points, limit):
    """Streams of every line shape the shortcuts take or leave (one data line, after an event
    line, several lines, comments, id/retry, blank lines) with one kind of line end or mixed
    (between blocks and inside them), under a tight limit: whole (the shortcuts), byte by byte
    and cut anywhere give the same."""
    out = []
    k = 0
    for lines in blocks:
        for line in [*lines, b""]:  # each line's end in turn from ``eols``: mixed inside blocks too
            out.append(line + eols[k % len(eols)])
            k += 1
    feed_each_way(decoder(limit), b"".join(out), points)


def test_crlf_whole_blocks():
    """Many CRLF blocks in one chunk, then a chunk starting inside a block (the pending-block
    shortcut): exact messages and sizes."""
    d = SSEDecoder()
    assert d.feed(b"data: a\r\n\r\nevent: e\r\ndata: b\r\n\r\ndata: c\r\ndata: d\r\n\r\ndata: e") == [
        ev("a", 11),
        ev("b", 21, event="e"),
        ev("c\nd", 20),
    ]
    assert d.feed(b"f\r\n\r\ndata: g\r\n\r\n") == [ev("ef", 12), ev("g", 11)]
    assert d.feed(b"data: h\r\n\r\n") == [ev("h", 11)]


@pytest.mark.parametrize(
    ("chunk", "expected"),
    [
        (b"data: a\rdata: b\r\n\r\n", [ev("a\nb", 19)]),  # a bare CR ends a line inside a CRLF block
        (b"event: e\rdata: x\r\n\r\n", [ev("x", 20, event="e")]),
        (b"event: e\r\ndata: x\ry\r\n\r\n", [ignored("y", 0), ev("x", 23, event="e")]),  # "y": a field, ignored
        (b"event: e\ndata: x\r\n\r\n", [ev("x", 20, event="e")]),
        (b"event: e\rz\r\ndata: x\r\n\r\n", [ignored("z", 0), ev("x", 23, event="e")]),  # "z": a field, ignored
        (b"event: e\nz\r\ndata: x\r\n\r\n", [ignored("z", 0), ev("x", 23, event="e")]),
        (b"data: a\ndata: b\r\n\r\n", [ev("a\nb", 19)]),  # a bare LF
        (b"data: a\r\n\r\n\r\ndata: b\r\n\r\n", [ev("a", 11), ev("b", 11)]),  # an extra blank line
    ],
)
def test_other_line_ends_inside_crlf_blocks(chunk, expected):
    """A chunk with CRLF blocks whose lines also end with a bare CR or LF (each is a line end,
    WHATWG §9.2.5): what the line-by-line path gives, whole or byte by byte."""
    assert decode([chunk]) == expected
    assert decode(bytewise(chunk)) == expected


_ID_OVER_LIMIT = b"id:abc\r\n\r\ndata:\n\n"  # "id:abc\r" is 7 bytes, its LF makes 8 > 7


def test_sse_id_line_over_limit_with_crlf_split_is_chunking_independent():
    """Whole, the id line's 8 bytes exceed max_event_bytes=7: the block is discarded and the id
    line is not acted on (the next event has id None). Regression (found by a trial session):
    cut between the CR and the LF, the line was acted on at the CR (7 bytes, within the limit),
    so the id 'abc' was kept and every later event carried it."""
    whole = feed(SSEDecoder(7), [_ID_OVER_LIMIT])
    assert whole[1] == (b"", b"", None, None, 7)
    assert feed(SSEDecoder(7), [_ID_OVER_LIMIT[:7], _ID_OVER_LIMIT[7:]]) == whole
    assert feed(SSEDecoder(7), bytewise(_ID_OVER_LIMIT)) == whole
