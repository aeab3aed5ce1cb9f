"""Tests for observer.wire.jsonseq (concatenated JSON values: consumer Copilot's chat socket).

The consumer Copilot fixtures are in ``tests/fixtures/wire/signalr/`` (``generate.py`` there);
their expected values are written by hand below. Every input is fed whole (one WebSocket message
per feed), one byte at a time and cut at seeded random offsets, and must frame the same.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from observer.records import Violation
from observer.wire.frames import JSONFrame
from observer.wire.jsonseq import JsonSequenceDecoder
from tests.wirefeed import CUT_POINTS, TextForm, bytewise, feed, split_at

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "wire" / "signalr"


def msg(value: bytes, gap: int = 0) -> tuple:
    """The frame of ``value`` preceded by ``gap`` bytes of whitespace/junk since the last one."""
    return (None, value, None, None, len(value) + gap)


def junk(at: int, found: str) -> Violation:
    return Violation(
        kind="invalid_json",
        seq=None,
        detail=f"expected '{{' or '[' at byte {at}, found {found}; skipping to the next '{{' or '['",
    )


def oversize(limit: int) -> Violation:
    return Violation(kind="oversize_event", seq=None, detail=f"JSON value exceeded {limit} bytes")


def unterminated(detail: str) -> Violation:
    return Violation(kind="unterminated_final_event", seq=None, detail=detail)


def each_way(chunks: list[bytes], max_value_bytes: int = 1 << 20) -> list:
    """What fresh decoders give for ``chunks`` fed one per call, one byte per call and cut at
    seeded random offsets; asserts the three agree and returns it."""
    whole = feed(JsonSequenceDecoder(max_value_bytes), chunks)
    stream = b"".join(chunks)
    assert feed(JsonSequenceDecoder(max_value_bytes), bytewise(stream)) == whole, "one byte at a time differs"
    for seed in range(8):
        rng = random.Random(seed)
        cut = split_at(stream, [rng.randrange(len(stream) + 1) for _ in range(rng.randrange(1, 12))])
        assert feed(JsonSequenceDecoder(max_value_bytes), cut) == whole, f"seed {seed} differs"
    return whole


def contents(case: str, from_client: bool) -> list[bytes]:
    doc = json.loads((FIXTURES / f"{case}.ws.json").read_text(encoding="utf-8"))
    return [m["text"].encode() for m in doc["messages"] if m["from_client"] is from_client]


# -- the consumer Copilot fixtures ---------------------------------------------------------------

CLIENT = [
    msg(b'{"event":"setOptions","supportedFeatures":[],"supportedCards":["weather","local"],"ads":null}'),
    msg(b'{"event":"challengeResponse","method":"hashcash","token":"00af31"}'),
    msg(
        b'{"event":"send","conversationId":"c-1","content":[{"type":"text","text":"Wie ist das Wetter in Wien?"}],'
        b'"mode":"smart","context":{}}'
    ),
]
SERVER = [
    msg(b'{"event":"connected","requestId":"rq-1","id":"0"}'),
    msg(b'{"event":"challenge","method":"hashcash","parameter":"3f2a9c:18","id":"1"}'),
    msg(b'{"event":"received","conversationId":"c-1","id":"2"}'),
    msg(b'{"event":"startMessage","conversationId":"c-1","messageId":"m-1","id":"3"}'),
    msg(b'{"event":"appendText","messageId":"m-1","partId":"0","text":"Hallo","id":"4"}'),
    # Two values in one message with no separator; a quote, braces and non-ASCII inside strings.
    msg(b'{"event":"appendText","messageId":"m-1","partId":"0","text":" \\"Wien\\" {sonnig}","id":"5"}'),
    msg('{"event":"appendText","messageId":"m-1","partId":"0","text":", 24 °C – tschüß","id":"6"}'.encode()),
    msg(b'{"event":"partCompleted","messageId":"m-1","partId":"0","id":"7"}'),
    msg(b'{"event":"done","messageId":"m-1","id":"8"}', gap=1),  # after "\n"
    msg(b'{"event":"titleUpdate","title":"Wetter","conversationId":"c-1","id":"9"}'),
    msg(b'{"event":"suggestedFollowups","messageId":"m-1","suggestions":["Und morgen?"],"id":"10"}', gap=1),  # " "
]


@pytest.mark.parametrize(("from_client", "want"), [(True, CLIENT), (False, SERVER)], ids=["client", "server"])
def test_copilot_consumer(from_client, want):
    messages = contents("copilot_consumer", from_client)
    got = each_way(messages)
    assert got == want
    assert sum(m[4] for m in got) == sum(map(len, messages))  # every byte in a frame


def test_copilot_consumer_ok():
    """The public client's fixture: ``{"event":"appendText","text":"-OK"}{"event":"done"}``."""
    got = each_way(contents("copilot_consumer_ok", False))
    assert got == [msg(b'{"event":"appendText","text":"-OK"}'), msg(b'{"event":"done"}')]
    # As the dialect's on_message reads them (observer.wire.frames.text_message).
    assert feed(TextForm(JsonSequenceDecoder()), contents("copilot_consumer_ok", False)) == [
        JSONFrame('{"event":"appendText","text":"-OK"}', 35),
        JSONFrame('{"event":"done"}', 16),
    ]


# -- framing rules ---------------------------------------------------------------------------------


def test_strings_escapes_and_nesting():
    """Brackets inside strings are not counted; ``\\"`` does not end a string; ``\\\\`` before a
    quote does; arrays and nesting; whitespace of every kind between values."""
    values = [
        b'{"a":"}"}',
        b'{"a":"\\"}{"}',
        b'{"a":"x\\\\"}',
        b'[1,{"b":[2,"]"]},[]]',
        b'{"u":"\\u00e9\\ud83d\\ude00","n":-1.5e3,"t":true,"f":false,"z":null}',
        b"{}",
        b"[]",
    ]
    stream = (
        values[0]
        + values[1]
        + b"\r\n"
        + values[2]
        + b"\t "
        + values[3]
        + b"\n\n"
        + values[4]
        + values[5]
        + b" "
        + values[6]
        + b"  \n"
    )
    assert each_way([stream]) == [
        msg(values[0]),
        msg(values[1]),
        msg(values[2], 2),
        msg(values[3], 2),
        msg(values[4], 2),
        msg(values[5]),
        msg(values[6], 1),
    ]
    assert [json.loads(m[1]) for m in each_way([stream])][3] == [1, {"b": [2, "]"]}, []]


def test_value_spanning_messages_is_held_bounded():
    value = b'{"event":"appendText","text":"' + "é".encode() * 50 + b'"}'
    dec = JsonSequenceDecoder()
    assert dec.feed(value[:31]) == []  # cut inside the 2-byte é
    assert dec.feed(value[31:60]) == []
    assert dec.buffered_bytes == 60
    assert dec.feed(value[60:] + b"{") == [msg(value)]
    assert dec.buffered_bytes == 1
    assert dec.close() == [unterminated("stream ended inside a JSON value (1 byte pending, not framed)")]


def test_backslash_at_chunk_end():
    """A string's backslash as the last byte of a chunk escapes the first byte of the next."""
    dec = JsonSequenceDecoder()
    assert dec.feed(b'{"a":"x\\') == []
    assert dec.feed(b'"}') == []  # the quote was escaped: still inside the string
    assert dec.feed(b'"}') == [msg(b'{"a":"x\\"}"}')]


@pytest.mark.parametrize(
    ("stream", "want"),
    [
        # Junk before, between and after values: reported once per run, resync at '{' or '['.
        (b'xx{"a":1}', [junk(0, "'x'"), msg(b'{"a":1}', 2)]),
        (b'{"a":1}}{"b":2}', [msg(b'{"a":1}'), junk(7, "'}'"), msg(b'{"b":2}', 1)]),
        (b'{"a":1} 42 "s" [3]', [msg(b'{"a":1}'), junk(8, "'4'"), msg(b"[3]", 8)]),
        (b'{"a":1}\x1e{"b":2}', [msg(b'{"a":1}'), junk(7, "0x1e"), msg(b'{"b":2}', 1)]),
        (b'\xef\xbb\xbf{"a":1}', [junk(0, "0xef"), msg(b'{"a":1}', 3)]),
        (b'{"a":1}] ', [msg(b'{"a":1}'), junk(7, "']'")]),
        (b"null", [junk(0, "'n'")]),
        # Junk holding a '{' resynchronises there, and what follows is read from that '{' on:
        # here its quotes pair differently and the next value is swallowed into an unfinished
        # one -- documented, the scanner does not guess what the junk meant.
        (
            b'"a{b"}{"c":1}',
            [junk(0, "'\"'"), unterminated("stream ended inside a JSON value (11 bytes pending, not framed)")],
        ),
        (b'"a{b}"{"c":1}', [junk(0, "'\"'"), msg(b"{b}", 2), junk(5, "'\"'"), msg(b'{"c":1}', 1)]),
    ],
)
def test_junk_between_values(stream, want):
    assert each_way([stream]) == want


def test_unterminated_at_close():
    assert each_way([b'{"a":1}{"b":[1,2']) == [
        msg(b'{"a":1}'),
        unterminated("stream ended inside a JSON value (9 bytes pending, not framed)"),
    ]
    assert each_way([b'{"a":1} \n {"b"']) == [
        msg(b'{"a":1}'),
        unterminated("stream ended inside a JSON value (4 bytes pending, not framed)"),
    ]
    assert each_way([b'{"a":"open string']) == [
        unterminated("stream ended inside a JSON value (17 bytes pending, not framed)")
    ]
    assert each_way([b'{"a":1} \n']) == [msg(b'{"a":1}')]
    assert each_way([b"  "]) == []
    assert feed(JsonSequenceDecoder(), []) == []


def test_close_is_idempotent_and_final():
    dec = JsonSequenceDecoder()
    assert dec.feed(b"{") == []
    assert len(dec.close()) == 1
    assert dec.close() == []
    with pytest.raises(ValueError, match="after close"):
        dec.feed(b"{}")
    with pytest.raises(ValueError, match="max_value_bytes"):
        JsonSequenceDecoder(0)


def test_oversize_reported_once_end_tracked():
    """A value over the bound: one violation, its bytes dropped (nothing held), its end found
    through strings and nesting, the next value framed; the same however it is cut."""
    big = b'{"t":"' + b"}" * 40 + b'","n":[{}]}'
    ok = b'{"t":"' + b"x" * 14 + b'"}'
    assert len(ok) == 22
    stream = [big + ok, b" " + big[:10], big[10:] + b"[1]"]
    got = each_way(stream, 22)
    assert got == [oversize(22), msg(ok), oversize(22), msg(b"[1]")]
    dec = JsonSequenceDecoder(22)
    for piece in bytewise(b"".join(stream)):
        dec.feed(piece)
        assert dec.buffered_bytes <= 22
    assert each_way([big[:30]], 22) == [
        oversize(22),
        unterminated("stream ended inside a JSON value already reported as oversize"),
    ]


def test_long_value_in_pieces_is_linear():
    """A 4 MB value fed in 1 KiB pieces, and 100 000 small values in one chunk, are scanned once
    (quadratic would take minutes)."""
    value = b'{"text":"' + b'ab\\"{}[]' * (1 << 19) + b'"}'
    dec = JsonSequenceDecoder(8 << 20)
    start = time.perf_counter()
    out = [m for i in range(0, len(value), 1024) for m in dec.feed(value[i : i + 1024])]
    assert time.perf_counter() - start < 2.0
    assert out == [msg(value)]
    many = b'{"event":"appendText","text":"x"}' * 100_000
    start = time.perf_counter()
    assert len(JsonSequenceDecoder().feed(many)) == 100_000
    assert time.perf_counter() - start < 2.0


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(JSON_VALUES, max_size=4) | st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=4),
            st.sampled_from(["", " ", "\n", "\r\n", "\t"]),
            st.booleans(),
        ),
        max_size=8,
    ),
    CUT_POINTS,
)
def test_any_valid_sequence_any_cut(values, points):
    """Any objects/arrays, any separators, ASCII-escaped or raw UTF-8, cut anywhere: each value
    comes out exactly, and the sizes cover every byte up to the last value."""
    parts = [json.dumps(v, ensure_ascii=ascii).encode() + sep.encode() for v, sep, ascii in values]
    stream = b"".join(parts)
    got = feed(JsonSequenceDecoder(), split_at(stream, points))
    assert [json.loads(m[1]) for m in got] == [v for v, _, _ in values]
    trailing = len(values[-1][1]) if values else 0
    assert sum(m[4] for m in got) == len(stream) - trailing


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=32) | st.binary(min_size=33, max_size=400), CUT_POINTS)
def test_any_bytes(data, points):
    """Any bytes: no exception, the same output however they are cut, bounded holding."""
    whole = feed(JsonSequenceDecoder(32), [data])
    assert feed(JsonSequenceDecoder(32), split_at(data, points)) == whole
    dec = JsonSequenceDecoder(32)
    for piece in split_at(data, points):
        dec.feed(piece)
        assert dec.buffered_bytes <= 32


def test_bytes_like_input():
    """A bytearray or memoryview is taken as its bytes."""
    buf = bytearray(b'{"a":1}[2]')
    out = JsonSequenceDecoder().feed(memoryview(buf))
    buf[2] = ord("b")  # the caller reuses its buffer: the frames are copies
    assert out == [msg(b'{"a":1}'), msg(b"[2]")]
    assert {m[1].__class__ for m in out} == {bytes}
    assert JsonSequenceDecoder().feed(bytearray(b"{}")) == [msg(b"{}")]
