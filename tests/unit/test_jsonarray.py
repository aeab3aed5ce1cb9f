"""Tests for observer.wire.jsonarray (elements of one streamed JSON array: Gemini without alt=sse)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from observer.records import Violation
from observer.wire.frames import JSONFrame
from observer.wire.jsonarray import JSONArrayDecoder
from tests.wirefeed import CUT_POINTS, TextForm, bytewise, feed, feed_each_way, split_at

UNTERMINATED = "unterminated_final_event"
OVERSIZE = "oversize_event"
INVALID = "invalid_json"
BAD_UTF8 = Violation(kind="invalid_utf8", seq=None, detail="invalid UTF-8 replaced by U+FFFD")


def fr(data: str, size: int) -> JSONFrame:
    return JSONFrame(data=data, size_bytes=size)


def invalid(detail: str) -> Violation:
    return Violation(kind=INVALID, seq=None, detail=detail)


def oversize(limit: int) -> Violation:
    return Violation(kind=OVERSIZE, seq=None, detail=f"array element exceeded {limit} bytes")


def open_element(pending: str) -> Violation:
    return Violation(
        kind=UNTERMINATED,
        seq=None,
        detail=f"stream ended inside an array element ({pending} pending, not framed); no closing ']'",
    )


def open_array(pending: str) -> Violation:
    return Violation(
        kind=UNTERMINATED,
        seq=None,
        detail=f"stream ended before the closing ']' of the array ({pending} pending, no element open)",
    )


def junk(at: int, found: str, expected: str = "',' or ']' after an array element") -> Violation:
    return invalid(f"expected {expected} at byte {at}, found {found}; skipping to the next '{{' or ']'")


def decode(chunks, *, max_element_bytes: int = 1 << 20, close: bool = True) -> list:
    """Everything one decoder returns for ``chunks`` (``tests.wirefeed.feed``)."""
    return feed(TextForm(JSONArrayDecoder(max_element_bytes=max_element_bytes)), chunks, close=close)


def decoder(max_element_bytes: int = 1 << 20) -> Callable[[], TextForm]:
    """A factory of fresh decoders for ``tests.wirefeed.feed_each_way``."""
    return lambda: TextForm(JSONArrayDecoder(max_element_bytes=max_element_bytes))


def frames(out: list) -> list[JSONFrame]:
    return [o for o in out if isinstance(o, JSONFrame)]


def assert_exact_substrings(body: bytes, out: list, start: int = 0) -> int:
    """Each frame's data is the body's bytes ending where its size_bytes ends; returns the end."""
    pos = start
    for f in frames(out):
        pos += f.size_bytes
        if "\ufffd" not in f.data:  # replaced invalid UTF-8 cannot be compared byte for byte
            raw = f.data.encode()
            assert body[pos - len(raw) : pos] == raw
    return pos


# -- a Gemini streamGenerateContent body (reference §5, no alt=sse), written by hand ----------
# Pretty-printed elements, ",\r\n" between them; strings holding ] } , \" \\ and \u escapes,
# raw 2-, 3- and 4-byte UTF-8; a functionCall with an args object (nested array, a string with
# brackets and escaped quotes); the last text is a lone escaped backslash right before '"'.
GEMINI = (
    b"[{\n"
    b'  "candidates": [\n'
    b"    {\n"
    b'      "content": {\n'
    b'        "parts": [\n'
    b"          {\n"
    b'            "text": "Okay: a]b}c,d \\"quoted\\" back\\\\slash \\u003ctag\\u003e'
    b' caf\xc3\xa9 \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x99\x82"\n'
    b"          }\n"
    b"        ],\n"
    b'        "role": "model"\n'
    b"      },\n"
    b'      "index": 0\n'
    b"    }\n"
    b"  ],\n"
    b'  "usageMetadata": {\n'
    b'    "promptTokenCount": 9,\n'
    b'    "candidatesTokenCount": 12,\n'
    b'    "totalTokenCount": 21\n'
    b"  },\n"
    b'  "modelVersion": "gemini-2.5-flash",\n'
    b'  "responseId": "IZI2aKfXBqSo1PIPj9GnmAg"\n'
    b"}\n"
    b",\r\n"
    b"{\n"
    b'  "candidates": [\n'
    b"    {\n"
    b'      "content": {\n'
    b'        "parts": [\n'
    b"          {\n"
    b'            "functionCall": {\n'
    b'              "name": "getWeather",\n'
    b'              "args": {\n'
    b'                "location": "Tokyo [JP], {\\"ward\\": \\"Minato\\"}",\n'
    b'                "days": [1, 2, [3]]\n'
    b"              }\n"
    b"            },\n"
    b'            "thoughtSignature": "CikB0e2Kb8Q="\n'
    b"          }\n"
    b"        ],\n"
    b'        "role": "model"\n'
    b"      },\n"
    b'      "index": 0\n'
    b"    }\n"
    b"  ],\n"
    b'  "modelVersion": "gemini-2.5-flash"\n'
    b"}\n"
    b",\r\n"
    b"{\n"
    b'  "candidates": [\n'
    b"    {\n"
    b'      "content": {\n'
    b'        "parts": [\n'
    b"          {\n"
    b'            "text": "\\\\"\n'
    b"          }\n"
    b"        ],\n"
    b'        "role": "model"\n'
    b"      },\n"
    b'      "finishReason": "STOP",\n'
    b'      "index": 0\n'
    b"    }\n"
    b"  ],\n"
    b'  "usageMetadata": {\n'
    b'    "promptTokenCount": 9,\n'
    b'    "candidatesTokenCount": 23,\n'
    b'    "totalTokenCount": 217,\n'
    b'    "thoughtsTokenCount": 185\n'
    b"  },\n"
    b'  "modelVersion": "gemini-2.5-flash"\n'
    b"}\n"
    b"]"
)

GEMINI_1 = {
    "candidates": [
        {
            "content": {
                "parts": [{"text": 'Okay: a]b}c,d "quoted" back\\slash <tag> caf\u00e9 \u4e16\u754c \U0001f642'}],
                "role": "model",
            },
            "index": 0,
        }
    ],
    "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 12, "totalTokenCount": 21},
    "modelVersion": "gemini-2.5-flash",
    "responseId": "IZI2aKfXBqSo1PIPj9GnmAg",
}
GEMINI_2 = {
    "candidates": [
        {
            "content": {
                "parts": [
                    {
                        "functionCall": {
                            "name": "getWeather",
                            "args": {"location": 'Tokyo [JP], {"ward": "Minato"}', "days": [1, 2, [3]]},
                        },
                        "thoughtSignature": "CikB0e2Kb8Q=",
                    }
                ],
                "role": "model",
            },
            "index": 0,
        }
    ],
    "modelVersion": "gemini-2.5-flash",
}
GEMINI_3 = {
    "candidates": [{"content": {"parts": [{"text": "\\"}], "role": "model"}, "finishReason": "STOP", "index": 0}],
    "usageMetadata": {
        "promptTokenCount": 9,
        "candidatesTokenCount": 23,
        "totalTokenCount": 217,
        "thoughtsTokenCount": 185,
    },
    "modelVersion": "gemini-2.5-flash",
}
# Element sizes: "[" + 445 bytes; "\n,\r\n" + 468 bytes; "\n,\r\n" + 396 bytes; "\n]" in no frame.
GEMINI_SIZES = [446, 472, 400]
GEMINI_ELEMENT_BYTES = [445, 468, 396]


def test_gemini_elements():
    out = decode([GEMINI])
    assert [type(o) for o in out] == [JSONFrame] * 3
    assert [json.loads(f.data) for f in out] == [GEMINI_1, GEMINI_2, GEMINI_3]
    assert [f.size_bytes for f in out] == GEMINI_SIZES
    assert [len(f.data.encode()) for f in out] == GEMINI_ELEMENT_BYTES
    assert out[0].data.startswith('{\n  "candidates": [') and out[0].data.endswith('"IZI2aKfXBqSo1PIPj9GnmAg"\n}')
    assert assert_exact_substrings(GEMINI, out) == len(GEMINI) - 2
    assert sum(GEMINI_SIZES) + len(b"\n]") == len(GEMINI)


def test_gemini_one_byte_at_a_time():
    assert decode(bytewise(GEMINI)) == decode([GEMINI])


def test_gemini_every_two_way_split():
    expected = decode([GEMINI])
    for i in range(len(GEMINI) + 1):
        assert decode([GEMINI[:i], GEMINI[i:]]) == expected, i


def test_gemini_elements_come_out_as_soon_as_complete():
    d = TextForm(JSONArrayDecoder())
    last = GEMINI.index(b"\n,\r\n") - 1  # the first element's closing '}'
    assert d.feed(GEMINI[:last]) == []
    assert [json.loads(f.data) for f in d.feed(GEMINI[last : last + 1])] == [GEMINI_1]
    assert d.feed(b"\n,\r\n{") == []


# -- small bodies, expected output written by hand --------------------------------------------

EXPECTED: dict[str, tuple[bytes, list]] = {
    "gemini": (GEMINI, decode([GEMINI])),  # checked by hand above
    "empty_array": (b"[]", []),
    "empty_array_spaced": (b" \r\n[ \r\n ]\r\n", []),
    "single": (b'[{"a":1}]', [fr('{"a":1}', 8)]),
    "nested_arrays": (
        b'[[1,[2,[3]]],[],[[]], [ "]" ] ]',
        [fr("[1,[2,[3]]]", 12), fr("[]", 3), fr("[[]]", 5), fr('[ "]" ]', 9)],
    ),
    "scalars": (
        b'[1, -2.5e3,"s", true,false,\r\nnull ,"x,]\\"{" ,0]',
        [
            fr("1", 2),
            fr("-2.5e3", 8),
            fr('"s"', 4),
            fr("true", 6),
            fr("false", 6),
            fr("null", 7),
            fr('"x,]\\"{"', 10),
            fr("0", 3),
        ],
    ),
    "escapes": (
        b'[{"k":"\\\\"},{"k":"\\"]"},{"k":"\\\\\\"}"},"\\u005d\\\\",{"k\\"}":["\\\\\\\\"]}]',
        [
            fr('{"k":"\\\\"}', 11),
            fr('{"k":"\\"]"}', 12),
            fr('{"k":"\\\\\\"}"}', 14),
            fr('"\\u005d\\\\"', 11),
            fr('{"k\\"}":["\\\\\\\\"]}', 18),
        ],
    ),
    "bom_and_crlf": (
        b'\xef\xbb\xbf\r\n[\r\n  {"t": "\xc3\xa9"},\r\n  {"t": "\xf0\x9f\x99\x82"}\r\n]\r\n',
        [fr('{"t": "\u00e9"}', 18), fr('{"t": "\U0001f642"}', 18)],
    ),
    "junk_after_close": (
        b'[{"a":1}]\n, {"b":2}]',
        [fr('{"a":1}', 8), invalid("data after the closing ']' of the array at byte 10: ','")],
    ),
    "missing_comma": (
        b'[{"a":1}\n{"b":2}, 3 4]',
        [
            fr('{"a":1}', 8),
            invalid("missing ',' between array elements at byte 9"),
            fr('{"b":2}', 8),
            fr("3", 3),
            invalid("missing ',' between array elements at byte 20"),
            fr("4", 2),
        ],
    ),
    "junk_between": (
        b'[{"a":1} oops, "x" {"b":[]},, {"c":{}} }, {"d":0}]',
        [
            fr('{"a":1}', 8),
            junk(9, "'o'"),
            fr('{"b":[]}', 19),
            junk(28, "','", "an array element"),
            fr('{"c":{}}', 11),
            junk(39, "'}'"),
            fr('{"d":0}', 11),
        ],
    ),
    "junk_then_close": (b"[1 ?? ]", [fr("1", 2), junk(3, "'?'")]),
    "trailing_comma": (b"[1,\n]", [fr("1", 2), invalid("trailing ',' before the closing ']' at byte 4")]),
    "leading_comma": (b'[,{"a":1}]', [junk(1, "','", "an element or ']'"), fr('{"a":1}', 9)]),
    "not_an_array": (
        b'{"error":{"code":429,"message":"[quota]"}}',
        [invalid("body is not a JSON array: expected '[' at byte 0, found '{'")],
    ),
    "not_an_array_html": (
        b"\n<html>[1]</html>",
        [invalid("body is not a JSON array: expected '[' at byte 1, found '<'")],
    ),
    "truncated_mid_string": (
        b'[{"a":1},\r\n{"text": "Tok[yo\\"',
        [fr('{"a":1}', 8), open_element("18 bytes")],
    ),
    "truncated_after_backslash": (b'["ab\\', [open_element("4 bytes")]),
    "truncated_scalar": (b"[1, 23", [fr("1", 2), open_element("2 bytes")]),
    "truncated_after_comma": (b'[{"a":1},\n', [fr('{"a":1}', 8), open_array("2 bytes")]),
    "truncated_after_open": (b"[", [open_array("1 byte")]),
    "invalid_utf8": (b'["\xff", 1]', [fr('"\ufffd"', 4), BAD_UTF8, fr("1", 3)]),
    "whitespace_only": (b" \r\n\t ", []),
    "empty": (b"", []),
}
NAMES = sorted(EXPECTED)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=40, deadline=None)
@given(points=CUT_POINTS)
def test_each_way(name, points):
    """Each body fed whole, one byte at a time and in random splits gives its hand-written
    frames."""
    body, expected = EXPECTED[name]
    assert feed_each_way(decoder(), body, points) == expected


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(NAMES), points=CUT_POINTS, limit=st.integers(1, 500))
def test_chunking_independent_with_small_limits(name, points, limit):
    """Oversize detection and recovery do not depend on where chunks are cut either."""
    feed_each_way(decoder(limit), EXPECTED[name][0], points)


@pytest.mark.parametrize("name", NAMES)
def test_data_is_the_exact_input_text(name):
    body, expected = EXPECTED[name]
    start = 3 if body.startswith(b"\xef\xbb\xbf") else 0
    assert_exact_substrings(body, expected, start)
    for f in frames(expected):
        if "\ufffd" not in f.data:
            json.loads(f.data)


def test_sizes_add_up():
    # Well-formed bodies: every byte but the BOM and what follows the last element is in a frame.
    for name, trailer in [("single", b"]"), ("nested_arrays", b" ]"), ("escapes", b"]"), ("scalars", b"]")]:
        body, expected = EXPECTED[name]
        assert sum(f.size_bytes for f in expected) + len(trailer) == len(body), name
    body, expected = EXPECTED["bom_and_crlf"]
    assert sum(f.size_bytes for f in expected) == len(body) - 3 - len(b"\r\n]\r\n")


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    elements=st.lists(json_values, max_size=6),
    indent=st.sampled_from([None, 0, 2]),
    ascii_only=st.booleans(),
    sep=st.sampled_from([",", ", ", ",\r\n", "\n,\r\n", " ,\t"]),
    points=CUT_POINTS,
)
def test_generated_arrays(elements, indent, ascii_only, sep, points):
    # Any JSON array, however formatted: one frame per element, each the exact element text.
    texts = [json.dumps(e, indent=indent, ensure_ascii=ascii_only) for e in elements]
    body = ("[" + sep.join(texts) + "]").encode()
    out = decode(split_at(body, points))  # random splits only: bytewise is slow on large arrays
    assert [f.data for f in out] == texts
    assert [json.loads(f.data) for f in out] == [json.loads(t) for t in texts]
    assert sum(f.size_bytes for f in out) == (len(body) - 1 if texts else 0)


# -- details ----------------------------------------------------------------------------------


@pytest.mark.parametrize("cut", range(1, 10))
def test_escape_split_across_chunks(cut):
    body = b'[{"a":"\\\\"},"\\"]"]'  # ["{\"a\":\"\\\\\"}", "\"]"] : a backslash, then a quote
    assert decode([body[:cut], body[cut:]]) == [fr('{"a":"\\\\"}', 11), fr('"\\"]"', 6)]


def test_not_an_array_ignores_everything_after():
    d = TextForm(JSONArrayDecoder())
    assert d.feed(b"data: {}") == [invalid("body is not a JSON array: expected '[' at byte 0, found 'd'")]
    assert d.feed(b"[1]") == []
    assert d.close() == []


def test_bom_split_across_chunks():
    assert decode([b"\xef", b"\xbb", b"\xbf[1]"]) == [fr("1", 2)]
    assert decode([b"\xef\xbb"]) == [invalid("body is not a JSON array: expected '[' at byte 0, found 0xef")]


def test_close_idempotent_feed_after_close_raises():
    d = TextForm(JSONArrayDecoder())
    d.feed(b"[1,")
    assert d.close() == [fr("1", 2), open_array("1 byte")][1:]
    assert d.close() == []
    with pytest.raises(ValueError):
        d.feed(b"2]")


def test_bytes_like_input_accepted():
    assert decode([bytearray(b"[1,"), memoryview(b"2]")]) == [fr("1", 2), fr("2", 2)]


# -- oversize ---------------------------------------------------------------------------------


def test_oversize_element_skipped_and_framing_resumes():
    # The big element holds brackets, quotes and escapes that must still be tracked while skipped.
    big = b'{"t":"' + b"x]}{[" * 20 + b'\\"]", "n":[[{}]]}'
    body = b"[" + big + b', {"b":"]"}, 123456789012, "' + b"y" * 40 + b'", 5]'
    expected = [oversize(30), fr('{"b":"]"}', 11), fr("123456789012", 14), oversize(30), fr("5", 3)]
    assert decode([body], max_element_bytes=30) == expected
    assert decode(bytewise(body), max_element_bytes=30) == expected


def test_element_exactly_at_limit_is_kept():
    assert decode([b'[{"a":12}]'], max_element_bytes=9) == [fr('{"a":12}', 9)]
    assert decode([b'[{"a":12}]'], max_element_bytes=7) == [oversize(7)]


def test_oversize_then_eof():
    assert decode([b'[{"a":"' + b"x" * 100], max_element_bytes=10) == [
        oversize(10),
        Violation(
            kind=UNTERMINATED,
            seq=None,
            detail="stream ended inside an array element already reported as oversize; no closing ']'",
        ),
    ]


def test_oversize_memory_bounded_for_10mb_element_in_4kb_pieces():
    cap = 1 << 20
    d = TextForm(JSONArrayDecoder(max_element_bytes=cap))
    out = d.feed(b'[{"a":1},\r\n{"big":["')
    piece = b'x]}\\"{[' * 585 + b"y"  # 4096 bytes of a string full of brackets and escaped quotes
    for _ in range((10 << 20) // 4096):
        out += d.feed(piece)
        assert d.buffered_bytes <= cap
    assert d.buffered_bytes == 0  # skipping: nothing held
    out += d.feed(b'"]},\r\n{"next":2}\r\n]')
    out += d.close()
    assert out == [fr('{"a":1}', 8), oversize(cap), fr('{"next":2}', 13)]


def test_buffered_bytes_tracks_the_open_element():
    d = TextForm(JSONArrayDecoder())
    d.feed(b'[{"a":1},{"b"')
    assert d.buffered_bytes == 4
    d.feed(b":2}")
    assert d.buffered_bytes == 0


# -- cost -------------------------------------------------------------------------------------


def test_large_element_in_16kb_chunks():
    element = b'{"x":"' + b"y]" * 150_000 + b'"}'
    body = b"[" + element + b"]"
    chunks = [body[i : i + 16384] for i in range(0, len(body), 16384)]
    assert decode(chunks) == [fr(element.decode(), 300_009)]


def test_long_element_is_not_rescanned():
    # 8 MB in 1 KB pieces: linear is tens of milliseconds; rescanning held bytes would not be.
    d = TextForm(JSONArrayDecoder(max_element_bytes=16 << 20))
    d.feed(b'[{"s":"')
    piece = b"z{" * 512
    t = time.perf_counter()
    for _ in range(8192):
        d.feed(piece)
    out = d.feed(b'"}]')
    assert time.perf_counter() - t < 2.0
    assert len(out) == 1 and out[0].size_bytes == (8 << 20) + 9


def test_throughput_floor():
    # A loose floor (the measured figure is far higher) against per-byte Python regressions.
    body = b"[" + b",\r\n".join(GEMINI.strip(b"[]").split(b"\n,\r\n") * 800) + b"]"
    chunks = [body[i : i + 4096] for i in range(0, len(body), 4096)]
    d = TextForm(JSONArrayDecoder())
    t = time.perf_counter()
    n = 0
    for c in chunks:
        n += len(d.feed(c))
    elapsed = time.perf_counter() - t
    assert n == 2400 and d.close() == []
    assert len(body) / elapsed > 5e6, f"{len(body) / elapsed / 1e6:.1f} MB/s"


def test_frame_shape():
    assert decode([b"[1]"])[0].event == ""


@pytest.mark.parametrize("bad", [0, -1, 1.5, None, True])
def test_max_element_bytes_validated(bad):
    with pytest.raises(ValueError):
        TextForm(JSONArrayDecoder(max_element_bytes=bad))  # type: ignore[arg-type]


def test_message_shape():
    """The framer's messages are ``(None, element bytes undecoded, None, None, size_bytes)``."""
    assert JSONArrayDecoder().feed(b'[ {"a":1}, "\xff"]') == [
        (None, b'{"a":1}', None, None, 9),
        (None, b'"\xff"', None, None, 5),
    ]
