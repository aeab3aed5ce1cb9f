"""Tests for observer.wire.ndjson (NDJSON line framing: Ollama, AI SDK v4 data stream)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from observer.records import Violation
from observer.wire.frames import JSONFrame
from observer.wire.ndjson import NDJSONDecoder
from tests.wirefeed import CUT_POINTS, TextForm, bytewise, feed, feed_each_way

UNTERMINATED = "unterminated_final_event"
OVERSIZE = "oversize_event"
BAD_UTF8 = Violation(kind="invalid_utf8", seq=None, detail="invalid UTF-8 replaced by U+FFFD")


def fr(data: str, size: int) -> JSONFrame:
    return JSONFrame(data=data, size_bytes=size)


def oversize(limit: int) -> Violation:
    return Violation(kind=OVERSIZE, seq=None, detail=f"line exceeded {limit} bytes")


def unterminated(size: int) -> Violation:
    n = "1 byte" if size == 1 else f"{size} bytes"
    return Violation(kind=UNTERMINATED, seq=None, detail=f"stream ended without a line feed after the final line ({n})")


def decode(chunks, *, max_line_bytes: int = 1 << 20, close: bool = True) -> list:
    """Everything one decoder returns for ``chunks`` (``tests.wirefeed.feed``)."""
    return feed(TextForm(NDJSONDecoder(max_line_bytes=max_line_bytes)), chunks, close=close)


def decoder(max_line_bytes: int = 1 << 20) -> Callable[[], TextForm]:
    """A factory of fresh decoders for ``tests.wirefeed.feed_each_way``."""
    return lambda: TextForm(NDJSONDecoder(max_line_bytes=max_line_bytes))


# -- bodies with expected output written by hand ----------------------------------------------

# Ollama /api/chat (reference §6): text, thinking, a complete tool call, the final line with
# usage. Raw UTF-8 (EUR sign) and a \u escape inside the JSON.
OLLAMA_1 = (
    '{"model":"llama3.2","created_at":"2023-08-04T08:52:19.385406455-07:00",'
    '"message":{"role":"assistant","content":"The"},"done":false}'
)
OLLAMA_2 = (
    '{"model":"llama3.2","created_at":"2023-08-04T08:52:19.612334871-07:00",'
    '"message":{"role":"assistant","content":" sky \\u00e9 \u20ac"},"done":false}'
)
OLLAMA_3 = (
    '{"model":"qwen3","created_at":"2023-08-04T08:52:19.801120004-07:00",'
    '"message":{"role":"assistant","content":"","thinking":"Let me think\\n"},"done":false}'
)
OLLAMA_4 = (
    '{"model":"llama3.2","created_at":"2023-08-04T08:52:20.000000001-07:00",'
    '"message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"get_current_weather",'
    '"arguments":{"format":"celsius","location":"Paris, FR"}}}]},"done":false}'
)
OLLAMA_5 = (
    '{"model":"llama3.2","created_at":"2023-08-04T08:52:24.269140916-07:00",'
    '"message":{"role":"assistant","content":""},"done":true,"done_reason":"stop",'
    '"total_duration":4883583458,"load_duration":1334875,"prompt_eval_count":26,'
    '"prompt_eval_duration":342546000,"eval_count":282,"eval_duration":4535599000}'
)
OLLAMA = "".join(line + "\n" for line in (OLLAMA_1, OLLAMA_2, OLLAMA_3, OLLAMA_4, OLLAMA_5)).encode()

# AI SDK <= 4 data stream (reference §7, last bullet): "<code>:<JSON>" lines -- not JSON texts,
# so the framer must frame them without parsing. CRLF line ends here.
V4 = (
    b'f:{"messageId":"msg-123"}\r\n'
    b'0:"Hello"\r\n'
    b'0:", w\xc3\xb6rld"\r\n'
    b'9:{"toolCallId":"call_1","toolName":"getWeather","args":{"city":"Paris"}}\r\n'
    b'a:{"toolCallId":"call_1","result":{"temp":21}}\r\n'
    b'e:{"finishReason":"stop","usage":{"promptTokens":10,"completionTokens":5},"isContinued":false}\r\n'
    b'd:{"finishReason":"stop","usage":{"promptTokens":10,"completionTokens":5}}\r\n'
)

# Mixed line ends, blank lines of every kind, a lone CR inside a line, a BOM, no final LF.
MIXED = b'\xef\xbb\xbf{"a":1}\r\n\n   \n\t \r\n\r\n{"b":"x\ry"}\n\n{"c":[1,2]}'

EXPECTED: dict[str, tuple[bytes, list]] = {
    "ollama": (
        OLLAMA,
        [fr(OLLAMA_1, 132), fr(OLLAMA_2, 144), fr(OLLAMA_3, 154), fr(OLLAMA_4, 244), fr(OLLAMA_5, 301)],
    ),
    "v4": (
        V4,
        [
            fr('f:{"messageId":"msg-123"}', 27),
            fr('0:"Hello"', 11),
            fr('0:", w\u00f6rld"', 14),
            fr('9:{"toolCallId":"call_1","toolName":"getWeather","args":{"city":"Paris"}}', 75),
            fr('a:{"toolCallId":"call_1","result":{"temp":21}}', 48),
            fr('e:{"finishReason":"stop","usage":{"promptTokens":10,"completionTokens":5},"isContinued":false}', 96),
            fr('d:{"finishReason":"stop","usage":{"promptTokens":10,"completionTokens":5}}', 76),
        ],
    ),
    "mixed": (
        MIXED,
        [fr('{"a":1}', 9), fr('{"b":"x\ry"}', 12), fr('{"c":[1,2]}', 11), unterminated(11)],
    ),
}
NAMES = sorted(EXPECTED)


def test_sizes_add_up():
    # Every byte but the BOM and the blank lines is in a frame.
    for name in ("ollama", "v4"):
        body, expected = EXPECTED[name]
        assert sum(f.size_bytes for f in expected) == len(body)
    frames = [f for f in EXPECTED["mixed"][1] if isinstance(f, JSONFrame)]
    assert sum(f.size_bytes for f in frames) == len(MIXED) - 3 - len(b"\n   \n\t \r\n\r\n") - 1


def test_ollama_lines_are_the_json_objects():
    out = decode([OLLAMA])
    assert json.loads(out[1].data)["message"]["content"] == " sky \u00e9 \u20ac"
    assert json.loads(out[3].data)["message"]["tool_calls"][0]["function"]["arguments"] == {
        "format": "celsius",
        "location": "Paris, FR",
    }
    assert json.loads(out[4].data)["eval_count"] == 282


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=40, deadline=None)
@given(points=CUT_POINTS)
def test_each_way(name, points):
    """Each body fed whole, one byte at a time and in random splits gives its hand-written
    frames."""
    body, expected = EXPECTED[name]
    assert feed_each_way(decoder(), body, points) == expected


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(NAMES), points=CUT_POINTS, limit=st.integers(1, 160))
def test_chunking_independent_with_small_limits(name, points, limit):
    """Oversize detection and recovery do not depend on where chunks are cut either."""
    feed_each_way(decoder(limit), EXPECTED[name][0], points)


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(
        st.text(st.characters(blacklist_characters="\n\r", blacklist_categories=("Cs",)), max_size=30), max_size=8
    ),
    crlf=st.booleans(),
    points=CUT_POINTS,
)
def test_generated_lines(lines, crlf, points):
    eol = "\r\n" if crlf else "\n"
    body = "".join(line + eol for line in lines).encode()
    expected = [fr(line, len(line.encode()) + len(eol)) for line in lines if line.strip(" \t")]
    assert feed_each_way(decoder(), body, points) == expected


# -- line ends --------------------------------------------------------------------------------


def test_crlf_split_across_chunks_is_one_line_end():
    d = TextForm(NDJSONDecoder())
    assert d.feed(b'{"a":1}\r') == []
    assert d.feed(b'\n{"b":2}\r') == [fr('{"a":1}', 9)]
    assert d.feed(b"\n") == [fr('{"b":2}', 9)]
    assert d.close() == []


def test_lone_cr_is_data_not_a_line_end():
    # NDJSON separates lines with LF only; a CR not followed by LF stays in the line.
    assert decode([b"a\rb\n"]) == [fr("a\rb", 4)]
    assert decode([b"a\r", b"b\n"]) == [fr("a\rb", 4)]
    # Only ONE CR before the LF is the line end.
    assert decode([b"x\r\r\n"]) == [fr("x\r", 4)]


def test_cr_at_end_of_stream_is_a_cut_crlf():
    assert decode([b'{"a":1}\r']) == [fr('{"a":1}', 8), unterminated(8)]


@pytest.mark.parametrize("blank", [b"\n", b"\r\n", b"   \n", b"\t\r\n", b" \t \r\n", b"\r\r\n"])
def test_blank_lines_skipped(blank):
    data = blank + b"1\n" + blank * 3 + b"2\n" + blank
    assert decode([data]) == [fr("1", 2), fr("2", 2)]
    assert decode(bytewise(data)) == [fr("1", 2), fr("2", 2)]


def test_other_whitespace_is_not_blank():
    # Only RFC 8259 whitespace makes a blank line; a form feed line is a (bad) message.
    assert decode([b"\x0c\n"]) == [fr("\x0c", 2)]


def test_only_lf_ends_lines():
    data = "a\u2028b\u0085c\x0bd\x0ce\x1cf\n".encode()
    assert decode([data]) == [fr("a\u2028b\u0085c\x0bd\x0ce\x1cf", len(data))]


# -- end of stream ----------------------------------------------------------------------------


def test_unterminated_final_line_framed_then_reported():
    assert decode([b'{"a":1}\n{"done":tr']) == [fr('{"a":1}', 8), fr('{"done":tr', 10), unterminated(10)]


@pytest.mark.parametrize("tail", [b" ", b"\t\t", b"\r", b" \r"])
def test_whitespace_only_final_line_is_nothing(tail):
    assert decode([b'{"a":1}\n' + tail]) == [fr('{"a":1}', 8)]


def test_empty_body():
    assert decode([]) == []
    assert decode([b""]) == []


def test_close_idempotent_feed_after_close_raises():
    d = TextForm(NDJSONDecoder())
    d.feed(b"x")
    assert d.close() == [fr("x", 1), unterminated(1)]
    assert d.close() == []
    with pytest.raises(ValueError):
        d.feed(b"y")


def test_bytes_like_input_accepted():
    assert decode([bytearray(b"a\n"), memoryview(b"b\n")]) == [fr("a", 2), fr("b", 2)]


# -- UTF-8 and BOM ----------------------------------------------------------------------------


def test_multibyte_utf8_split_at_every_pair_of_positions():
    text = '0:"h\u00e9 \u20ac \U0001f642 \u4e16\u754c"'
    data = (text + "\n" + text + "\r\n").encode()
    n = len(text.encode())
    expected = [fr(text, n + 1), fr(text, n + 2)]
    for i in range(len(data) + 1):
        for j in range(i, len(data) + 1):
            assert decode([data[:i], data[i:j], data[j:]]) == expected, (i, j)


def test_invalid_utf8_replaced_and_reported_after_the_frame():
    assert decode([b'{"t":"\xff\xe2\x82"}\nok\n']) == [fr('{"t":"\ufffd\ufffd"}', 12), BAD_UTF8, fr("ok", 3)]
    # An invalid byte in an unterminated final line: frame, UTF-8 violation, unterminated.
    assert decode([b"\xc3"]) == [fr("\ufffd", 1), BAD_UTF8, unterminated(1)]


def test_bom_stripped_once_and_not_counted():
    assert decode([b"\xef\xbb\xbf1\n"]) == [fr("1", 2)]
    assert decode([b"\xef", b"\xbb", b"\xbf1\n\xef\xbb\xbf2\n"]) == [fr("1", 2), fr("\ufeff2", 5)]


def test_bom_prefix_that_is_not_a_bom_is_content():
    assert decode([b"\xef\xbb"]) == [fr("\ufffd", 2), BAD_UTF8, unterminated(2)]
    assert decode([b"\xef", b"x\n"]) == [fr("\ufffdx", 3), BAD_UTF8]


# -- oversize ---------------------------------------------------------------------------------


def test_oversize_reported_once_and_recovers():
    data = b"1\n" + b"x" * 200 + b"\n2\n"
    expected = [fr("1", 2), oversize(64), fr("2", 2)]
    assert decode([data], max_line_bytes=64) == expected
    assert decode(bytewise(data), max_line_bytes=64) == expected


def test_limit_counts_the_line_end():
    assert decode([b"12345\n"], max_line_bytes=6) == [fr("12345", 6)]
    assert decode([b"12345\n"], max_line_bytes=5) == [oversize(5)]
    assert decode([b"1234\r\n"], max_line_bytes=5) == [oversize(5)]
    # An unterminated final line at the limit fits (it has no terminator).
    assert decode([b"12345"], max_line_bytes=5) == [fr("12345", 5), unterminated(5)]
    assert decode([b"123456"], max_line_bytes=5) == [oversize(5)]


def test_oversize_cr_split_from_lf():
    assert decode([b"1234\r", b"\nok\n"], max_line_bytes=5) == [oversize(5), fr("ok", 3)]


def test_oversize_memory_bounded_for_10mb_line_in_4kb_pieces():
    cap = 1 << 20
    d = TextForm(NDJSONDecoder(max_line_bytes=cap))
    out = d.feed(b'{"a":1}\n{"big":"')
    piece = b"x" * 4096
    for _ in range((10 << 20) // 4096):
        out += d.feed(piece)
        assert d.buffered_bytes <= cap
    assert d.buffered_bytes == 0  # skipping: nothing held
    out += d.feed(b'"}\n{"next":2}\n')
    out += d.close()
    assert out == [fr('{"a":1}', 8), oversize(cap), fr('{"next":2}', 11)]


def test_oversize_then_eof_reports_nothing_more():
    assert decode([b"x" * 100], max_line_bytes=10) == [oversize(10)]


def test_buffered_bytes_tracks_partial():
    d = TextForm(NDJSONDecoder())
    d.feed(b'{"a":1}\n{"b"')
    assert d.buffered_bytes == 4
    d.feed(b":2}\n")
    assert d.buffered_bytes == 0


# -- cost -------------------------------------------------------------------------------------


def test_large_line_in_16kb_chunks():
    line = b'{"x":"' + b"y" * 300_000 + b'"}'
    data = line + b"\n"
    chunks = [data[i : i + 16384] for i in range(0, len(data), 16384)]
    assert decode(chunks) == [fr(line.decode(), 300_009)]


def test_long_line_is_not_rescanned():
    # 8 MB in 1 KB pieces: linear is milliseconds; rescanning the held bytes per chunk would
    # touch ~32 GB.
    d = TextForm(NDJSONDecoder(max_line_bytes=16 << 20))
    piece = b"z" * 1024
    t = time.perf_counter()
    for _ in range(8192):
        d.feed(piece)
    out = d.feed(b"\n")
    assert time.perf_counter() - t < 2.0
    assert len(out) == 1 and out[0].size_bytes == (8 << 20) + 1


def test_frame_shape():
    """The framer's messages are ``(None, line bytes undecoded, None, None, size_bytes)``."""
    d = NDJSONDecoder()
    assert d.feed(b'1\n{"t":"\xff"}\r\n') == [(None, b"1", None, None, 2), (None, b'{"t":"\xff"}', None, None, 11)]
    assert d.feed(b"x") == [] and d.close()[0] == (None, b"x", None, None, 1)
    assert decode([b"1\n"])[0].event == ""


@pytest.mark.parametrize("bad", [0, -1, 1.5, None, True])
def test_max_line_bytes_validated(bad):
    with pytest.raises(ValueError):
        TextForm(NDJSONDecoder(max_line_bytes=bad))  # type: ignore[arg-type]
