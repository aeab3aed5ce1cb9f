"""Tests for observer.wire.eventstream (AWS event stream: Bedrock ConverseStream / InvokeModel...).

Fixtures: ``tests/fixtures/wire/binary/*.eventstream``, made by that folder's ``generate.py``
(stdlib encoder). Expected values are written here by hand from the format (reference
``binary-formats.md`` §8: frame = 16 bytes of framing + headers + payload; a header is
``1 + len(name) + 1 + value``, a string value ``2 + len``), and every good stream is also decoded
by botocore's ``EventStreamBuffer`` (the oracle) and compared.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import random
import struct
import zlib
from datetime import datetime, timezone
from pathlib import Path

import pytest
from botocore.eventstream import ChecksumMismatch, EventStreamBuffer
from hypothesis import given, settings
from hypothesis import strategies as st

from observer.records import Violation
from observer.wire.eventstream import MAX_FRAME_BYTES, EventStreamDecoder, EventStreamMessage
from tests.wirefeed import CUT_POINTS, bytewise, feed, feed_each_way

BINARY = Path(__file__).resolve().parent.parent / "fixtures" / "wire" / "binary"
_spec = importlib.util.spec_from_file_location("binary_fixture_generator", BINARY / "generate.py")
gen = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(gen)  # type: ignore[union-attr]

CHECKSUM = "checksum_mismatch"
MALFORMED = "malformed_frame"
OVERSIZE = "oversize_event"
UNTERMINATED = "unterminated_final_event"


def fixture(name: str) -> bytes:
    return (BINARY / f"{name}.eventstream").read_bytes()


def seeded_points(seed: int) -> list[int]:
    """40 cut points drawn from a seeded generator (bounded, reproducible)."""
    rng = random.Random(seed)
    return [rng.randrange(10_000) for _ in range(40)]


def decoded_each_way(data: bytes, seeds=range(5), **kw) -> list:
    """The decoder's output for ``data`` whole, byte by byte and cut at several seeded random
    points (all asserted equal by ``feed_each_way``)."""
    outs = [feed_each_way(lambda: EventStreamDecoder(**kw), data, seeded_points(s)) for s in seeds]
    assert all(o == outs[0] for o in outs)
    return outs[0]


def botocore_messages(data: bytes, *, bytewise_feed: bool = False) -> list[tuple[dict, bytes]]:
    """The oracle: botocore's incremental buffer, fed whole or one byte at a time."""
    buf = EventStreamBuffer()
    out = []
    for chunk in bytewise(data) if bytewise_feed else [data]:
        buf.add_data(chunk)
        out += [(m.headers, m.payload) for m in buf]
    return out


def event_headers(event_type: str, *, order: str = "generator") -> dict:
    if order == "reference":  # the verified frame's order
        return {":message-type": "event", ":content-type": "application/json", ":event-type": event_type}
    return {":event-type": event_type, ":content-type": "application/json", ":message-type": "event"}


def event_frame_size(event_type: str, payload: bytes) -> int:
    """16 framing bytes + the three string headers + the payload (reference §8)."""
    headers = (1 + 11 + 1 + 2 + len(event_type)) + (1 + 13 + 1 + 2 + 16) + (1 + 13 + 1 + 2 + 5)
    return 16 + headers + len(payload)


MESSAGE_START = EventStreamMessage(
    event_headers("messageStart", order="reference"), b'{"p": "abcd", "role": "assistant"}', 132
)

# The Converse stream's payloads after messageStart, written by hand (compact JSON, ASCII escapes).
CONVERSE = [
    ("contentBlockDelta", b'{"contentBlockIndex":0,"delta":{"text":"Hello"},"p":"abcdefgh"}'),
    ("contentBlockDelta", b'{"contentBlockIndex":0,"delta":{"text":" w\\u00f6rld"},"p":"ab"}'),
    ("contentBlockStop", b'{"contentBlockIndex":0,"p":"abcdefghijk"}'),
    (
        "contentBlockStart",
        b'{"contentBlockIndex":1,"start":{"toolUse":{"toolUseId":"tooluse_1","name":"get_weather"}},"p":"a"}',
    ),
    ("contentBlockDelta", b'{"contentBlockIndex":1,"delta":{"toolUse":{"input":"{\\"city\\":"}},"p":"abc"}'),
    ("contentBlockDelta", b'{"contentBlockIndex":1,"delta":{"toolUse":{"input":"\\"Paris\\"}"}},"p":"abcd"}'),
    ("contentBlockStop", b'{"contentBlockIndex":1,"p":"abcdefg"}'),
    ("messageStop", b'{"stopReason":"tool_use","p":"abcdef"}'),
    (
        "metadata",
        b'{"usage":{"inputTokens":12,"outputTokens":7,"totalTokens":19},"metrics":{"latencyMs":321},"p":"ab"}',
    ),
]


def converse_message(i: int) -> EventStreamMessage:
    t, p = CONVERSE[i]
    return EventStreamMessage(event_headers(t), p, event_frame_size(t, p))


# -- the verified frame ---------------------------------------------------------------------------


def test_verified_message_start_frame_byte_by_byte():
    """The reference's verified 132-byte first frame of a Converse stream: prelude
    ``00000084 00000052 a421f9e3``, three string headers, the payload, CRC ``fad68ebb``; the
    test helper's stdlib encoder makes exactly these bytes; botocore and the decoder agree."""
    data = fixture("eventstream_message_start")
    assert len(data) == 132
    assert data[:12] == bytes.fromhex("00000084 00000052 a421f9e3")
    assert data[-4:] == bytes.fromhex("fad68ebb")
    assert data[12:29] == b"\x0d:message-type\x07\x00\x05"
    encoded = gen.es_frame(
        gen.es_header(":message-type", 7, "event")
        + gen.es_header(":content-type", 7, "application/json")
        + gen.es_header(":event-type", 7, "messageStart"),
        b'{"p": "abcd", "role": "assistant"}',
    )
    assert encoded == data
    out = decoded_each_way(data)
    assert out == [MESSAGE_START]
    msg = out[0]
    assert (msg.message_type, msg.event_type, msg.exception_type, msg.content_type) == (
        "event",
        "messageStart",
        None,
        "application/json",
    )
    assert botocore_messages(data) == [(MESSAGE_START.headers, MESSAGE_START.payload)]


def test_every_split_point_of_the_verified_frame():
    """The frame cut in two at every offset (and in three at every pair of offsets 11 apart)."""
    data = fixture("eventstream_message_start")
    for cut in range(len(data) + 1):
        assert feed(EventStreamDecoder(), [data[:cut], data[cut:]]) == [MESSAGE_START], cut
        assert feed(EventStreamDecoder(), [data[:cut], data[cut : cut + 11], data[cut + 11 :]]) == [MESSAGE_START]


# -- whole streams ----------------------------------------------------------------------------------


def test_converse_stream_matches_hand_written_and_botocore():
    data = fixture("bedrock_converse")
    want = [MESSAGE_START] + [converse_message(i) for i in range(len(CONVERSE))]
    assert sum(m.size_bytes for m in want) == len(data)
    out = decoded_each_way(data)
    assert out == want
    oracle = [(m.headers, m.payload) for m in want]
    assert botocore_messages(data) == oracle
    assert botocore_messages(data, bytewise_feed=True) == oracle
    assert json.loads(out[2].payload)["delta"]["text"] == " w\u00f6rld"


def test_invoke_stream_chunks_wrap_the_model_json_in_base64():
    data = fixture("bedrock_invoke")
    out = decoded_each_way(data)
    assert [m.event_type for m in out] == ["chunk", "chunk", "chunk"]
    inner = [json.loads(base64.b64decode(json.loads(m.payload)["bytes"])) for m in out]
    assert inner == [
        {"type": "message_start", "message": {"id": "msg_1", "role": "assistant", "usage": {"input_tokens": 9}}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
        {"type": "message_stop", "amazon-bedrock-invocationMetrics": {"inputTokenCount": 9, "outputTokenCount": 1}},
    ]
    assert botocore_messages(data) == [(m.headers, m.payload) for m in out]


def test_exception_frame_mid_stream():
    data = fixture("bedrock_exception")
    out = decoded_each_way(data)
    payload = b'{"message":"Too many tokens, please wait before trying again."}'
    headers = {
        ":exception-type": "throttlingException",
        ":content-type": "application/json",
        ":message-type": "exception",
    }
    size = 16 + (1 + 15 + 1 + 2 + 19) + (1 + 13 + 1 + 2 + 16) + (1 + 13 + 1 + 2 + 9) + len(payload)
    assert out == [MESSAGE_START, converse_message(0), EventStreamMessage(headers, payload, size)]
    assert (out[2].message_type, out[2].exception_type, out[2].event_type) == ("exception", "throttlingException", None)
    assert botocore_messages(data) == [(m.headers, m.payload) for m in out]


def test_all_ten_header_types():
    """Types 0-9 (reference §8): true, false, int8, int16, int32, int64, bytes, string, timestamp
    (ms -> aware UTC datetime), uuid (16 raw bytes, as botocore returns it)."""
    data = fixture("eventstream_header_types")
    uuid = bytes(range(0x10, 0x20))
    want = {
        "t": True,
        "f": False,
        "i8": -2,
        "i16": -300,
        "i32": 70000,
        "i64": -(2**40),
        "bin": b"\x00\xff",
        "str": "\u00e9t\u00e9",
        "ts": datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=timezone.utc),  # 1_700_000_000_123 ms
        "id": uuid,
    }
    size = 16 + (1 + 1 + 1) * 2 + (1 + 2 + 1 + 1) + (1 + 3 + 1 + 2) + (1 + 3 + 1 + 4) + (1 + 3 + 1 + 8)
    size += (1 + 3 + 1 + 2 + 2) + (1 + 3 + 1 + 2 + 5) + (1 + 2 + 1 + 8) + (1 + 2 + 1 + 16)
    assert decoded_each_way(data) == [EventStreamMessage(want, b"", size)]
    # botocore: the timestamp as int milliseconds, everything else the same.
    assert botocore_messages(data) == [({**want, "ts": 1_700_000_000_123}, b"")]


def test_timestamp_outside_datetime_range_kept_as_milliseconds():
    frame = gen.es_frame(gen.es_header("ts", 8, 2**63 - 1) + gen.es_header("neg", 8, -(2**63)), b"x")
    (msg,) = feed(EventStreamDecoder(), [frame])
    assert msg.headers == {"ts": 2**63 - 1, "neg": -(2**63)}


def test_empty_frame_and_no_message_type():
    """The smallest frame: 16 bytes, no headers, no payload."""
    frame = gen.es_frame(b"", b"")
    assert len(frame) == 16
    assert feed(EventStreamDecoder(), bytewise(frame)) == [EventStreamMessage({}, b"", 16)]
    assert EventStreamMessage({}, b"", 16).message_type is None


# -- corruption ---------------------------------------------------------------------------------


def test_bad_message_crc_skips_exactly_that_frame():
    """The prelude was good, so its total_length is trusted: the frame is skipped, the next
    decoded. botocore raises ChecksumMismatch on the same frame (and stays stuck there)."""
    data = fixture("eventstream_bad_message_crc")
    good = gen.es_event(*gen.CONVERSE_EVENTS[0])
    true_crc = zlib.crc32(good[:-4])
    sent = true_crc ^ 0xFF
    want = [
        MESSAGE_START,
        Violation(
            CHECKSUM,
            None,
            f"message CRC mismatch in the frame at byte 132 (166 bytes): expected 0x{sent:08x},"
            f" calculated 0x{true_crc:08x}; frame skipped",
        ),
        converse_message(1),
    ]
    assert decoded_each_way(data) == want
    buf = EventStreamBuffer()
    buf.add_data(data)
    assert next(buf).payload == MESSAGE_START.payload
    with pytest.raises(ChecksumMismatch):
        next(buf)


def test_bad_prelude_crc_hunts_for_the_next_valid_prelude():
    """The lengths of a bad prelude cannot be trusted: every later offset is tried until 12
    bytes form a prelude whose CRC matches; here the next frame, 166 bytes on."""
    data = fixture("eventstream_bad_prelude_crc")
    # The sent prelude: total 166, headers_length 87 (0x57) with its low bit flipped -> 86.
    assert data[132:140] == struct.pack(">II", 166, 86)
    sent_crc = zlib.crc32(struct.pack(">II", 166, 87))
    calc = zlib.crc32(struct.pack(">II", 166, 86))
    want = [
        MESSAGE_START,
        Violation(
            CHECKSUM,
            None,
            f"prelude CRC mismatch at byte 132: expected 0x{sent_crc:08x}, calculated 0x{calc:08x};"
            " 166 bytes skipped to the next valid prelude at byte 298",
        ),
        converse_message(1),
    ]
    assert decoded_each_way(data) == want
    buf = EventStreamBuffer()
    buf.add_data(data)
    next(buf)
    with pytest.raises(ChecksumMismatch):
        next(buf)


def test_hunt_holds_at_most_eleven_bytes():
    data = fixture("eventstream_bad_prelude_crc")
    d = EventStreamDecoder()
    held = []
    for chunk in bytewise(data):
        d.feed(chunk)
        held.append(d.buffered_bytes)
    assert max(held[145:297]) <= 11  # while hunting (bad prelude at 132 read once 144 arrived)
    assert max(held) <= 165


def test_hunt_that_finds_nothing_before_the_end():
    bad = bytearray(fixture("eventstream_message_start"))
    bad[0] ^= 0x01  # total_length 0x01000084: prelude CRC mismatch
    data = bytes(bad[:40])
    out = decoded_each_way(data)
    assert len(out) == 1 and out[0].kind == CHECKSUM
    assert out[0].detail.endswith("; the stream ended 40 bytes later without another valid prelude")


def test_hunt_gives_up_after_max_resync_bytes_and_stops_cleanly():
    """With ``max_resync_bytes=100`` a valid frame 200 bytes after a bad prelude is not looked
    for: decoding stops, all later input is dropped unread and nothing is held."""
    bad = bytearray(fixture("eventstream_message_start"))
    bad[9] ^= 0x01
    data = bytes(bad) + b"\xff" * 68 + fixture("eventstream_message_start") * 2
    out = decoded_each_way(data, max_resync_bytes=100)
    assert len(out) == 1 and out[0].kind == CHECKSUM
    assert out[0].detail.endswith("; no valid prelude in the next 100 bytes: decoding stopped")
    d = EventStreamDecoder(max_resync_bytes=100)
    d.feed(data)
    assert d.buffered_bytes == 0
    assert d.feed(fixture("eventstream_message_start")) == []
    assert d.close() == []
    # With the default budget the same stream resynchronises on the first good frame.
    out = decoded_each_way(data)
    assert [o.kind if isinstance(o, Violation) else "msg" for o in out] == [CHECKSUM, "msg", "msg"]
    assert out[0].detail.endswith("; 200 bytes skipped to the next valid prelude at byte 200")


def test_impossible_lengths_behind_a_good_prelude_crc():
    """total_length 8 (< 16): no extent to skip, so hunt; headers_length 200 > total 40 - 16:
    the extent is kept and those 40 bytes are skipped."""
    data = fixture("eventstream_impossible_lengths")
    want = [
        Violation(
            MALFORMED,
            None,
            "frame at byte 0: total_length 8 is below the 16-byte minimum;"
            " 12 bytes skipped to the next valid prelude at byte 12",
        ),
        MESSAGE_START,
        Violation(
            MALFORMED, None, "frame at byte 144: headers_length 200 does not fit in total_length 40; 40 bytes skipped"
        ),
        MESSAGE_START,
    ]
    assert decoded_each_way(data) == want


def test_headers_length_boundary():
    """headers_length may be total_length - 16 (an empty payload), not one byte more."""
    header = gen.es_header("abcdefghij", 7, "0123456789")  # 1 + 10 + 1 + 2 + 10 = 24 bytes
    fits = gen.es_frame(header, b"")
    assert struct.unpack(">II", fits[:8]) == (40, 24)
    assert feed(EventStreamDecoder(), [fits]) == [EventStreamMessage({"abcdefghij": "0123456789"}, b"", 40)]
    wide = struct.pack(">II", 40, 25)
    wide += struct.pack(">I", zlib.crc32(wide))
    data = wide + fits[12:] + fits
    assert feed(EventStreamDecoder(), [data]) == [
        Violation(
            MALFORMED, None, "frame at byte 0: headers_length 25 does not fit in total_length 40; 40 bytes skipped"
        ),
        EventStreamMessage({"abcdefghij": "0123456789"}, b"", 40),
    ]


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        (b"\x01a\x0a", "header 'a' has unknown value type 10"),
        (gen.es_header("a", 0) + gen.es_header("a", 1), "duplicate header 'a'"),
        (b"\x05ab", "a header name of 5 bytes runs past the header block"),
        (b"\x02\xff\xfe\x00", "a header name is not UTF-8"),
        (b"\x01a", "header 'a' has no value type"),
        (b"\x01a\x07\x00\x02\xff\xfe", "header 'a': string value is not UTF-8"),
        (b"\x01a\x07\x00\x09abc", "header 'a': its value runs past the header block"),
        (b"\x01a\x04\x00\x00", "header 'a': its value runs past the header block"),
        (b"\x01a\x09" + b"\x00" * 15, "header 'a': its value runs past the header block"),
        (b"\x01a\x08" + b"\x00" * 7, "header 'a': its value runs past the header block"),
        (b"\x01a\x06\x00", "header 'a': its value runs past the header block"),
    ],
)
def test_unreadable_headers_drop_the_frame_and_decoding_goes_on(headers, reason):
    bad = gen.es_frame(headers, b"payload")
    data = bad + fixture("eventstream_message_start")
    want = [Violation(MALFORMED, None, f"frame at byte 0: {reason}; frame skipped"), MESSAGE_START]
    assert decoded_each_way(data, seeds=range(2)) == want


def test_truncated_frame_at_close():
    data = fixture("eventstream_truncated")
    want = [MESSAGE_START, Violation(UNTERMINATED, None, "stream ended inside the frame at byte 132 (50 bytes of 166)")]
    assert decoded_each_way(data) == want
    d = EventStreamDecoder()
    d.feed(data)
    assert d.buffered_bytes == 50
    inside_prelude = fixture("eventstream_message_start") + gen.es_event(*gen.CONVERSE_EVENTS[0])[:5]
    assert decoded_each_way(inside_prelude)[1] == Violation(
        UNTERMINATED, None, "stream ended inside the prelude of the frame at byte 132 (5 bytes of 12)"
    )


def test_oversize_length_is_skipped_without_buffering():
    """A CRC-valid prelude claiming 32 MiB (botocore's payload bound is 24 MiB): reported at once,
    its bytes dropped as they come; the stream ends inside it: nothing more is reported."""
    data = fixture("eventstream_oversize")
    want = [
        MESSAGE_START,
        Violation(
            OVERSIZE,
            None,
            f"frame at byte 132 of 33554432 bytes (headers 0, payload 33554416) exceeds the bounds"
            f" (frame {16 + 128 * 1024 + 24 * 1024 * 1024}, headers 131072, payload 25165824); skipped",
        ),
    ]
    assert decoded_each_way(data) == want
    d = EventStreamDecoder()
    for chunk in bytewise(data[132:]):
        d.feed(chunk)
        assert d.buffered_bytes <= 11
    assert d.close() == []


def test_frames_over_a_small_bound_are_skipped_and_the_rest_decoded():
    data = fixture("bedrock_converse")
    sizes = [132] + [event_frame_size(t, p) for t, p in CONVERSE]
    out = decoded_each_way(data, max_frame_bytes=150)
    want_kinds = ["msg" if s <= 150 else OVERSIZE for s in sizes]
    assert [o.kind if isinstance(o, Violation) else "msg" for o in out] == want_kinds
    assert "msg" in want_kinds[1:] and OVERSIZE in want_kinds  # both paths taken
    kept = [o for o in out if isinstance(o, EventStreamMessage)]
    assert [m.size_bytes for m in kept] == [s for s in sizes if s <= 150]
    # The header and payload bounds apply on their own.
    out = feed(EventStreamDecoder(max_headers_bytes=81), [fixture("eventstream_message_start")])
    assert [o.kind for o in out] == [OVERSIZE]  # its headers are 82 bytes
    out = feed(EventStreamDecoder(max_payload_bytes=33), [fixture("eventstream_message_start")])
    assert [o.kind for o in out] == [OVERSIZE]  # its payload is 34 bytes
    assert feed(EventStreamDecoder(max_headers_bytes=82, max_payload_bytes=34, max_frame_bytes=132), [data[:132]]) == [
        MESSAGE_START
    ]


def test_default_bound_is_botocores():
    assert MAX_FRAME_BYTES == 16 + 128 * 1024 + 24 * 1024 * 1024


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "10"])
def test_bounds_must_be_positive_ints(bad):
    with pytest.raises(ValueError):
        EventStreamDecoder(max_frame_bytes=bad)
    with pytest.raises(ValueError):
        EventStreamDecoder(max_resync_bytes=bad)


def test_feed_after_close_raises_and_close_is_idempotent():
    d = EventStreamDecoder()
    assert d.feed(b"") == []
    assert d.feed(fixture("eventstream_truncated"))[0] == MESSAGE_START
    assert [v.kind for v in d.close()] == [UNTERMINATED]
    assert d.close() == []
    with pytest.raises(ValueError):
        d.feed(b"x")


def test_bytes_like_input():
    data = fixture("bedrock_converse")
    assert feed(EventStreamDecoder(), [memoryview(data)]) == feed(EventStreamDecoder(), [bytearray(data)])


# -- properties ------------------------------------------------------------------------------------

NAMES = [
    "bedrock_converse",
    "bedrock_exception",
    "bedrock_invoke",
    "eventstream_bad_message_crc",
    "eventstream_bad_prelude_crc",
    "eventstream_impossible_lengths",
    "eventstream_truncated",
    "eventstream_oversize",
]


@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from(NAMES),
    points=CUT_POINTS,
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), max_size=4),
    limit=st.sampled_from([100, 170, MAX_FRAME_BYTES]),
)
def test_corrupted_fixtures_never_raise_and_do_not_depend_on_chunking(name, points, flips, limit):
    data = bytearray(fixture(name))
    for at, mask in flips:
        data[at % len(data)] ^= mask
    data = bytes(data)
    feed_each_way(lambda: EventStreamDecoder(max_frame_bytes=limit, max_resync_bytes=64), data, points)
    d = EventStreamDecoder(max_frame_bytes=limit)
    for chunk in bytewise(data):
        d.feed(chunk)
        assert d.buffered_bytes < max(limit, 12)
    d.close()


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=600), points=CUT_POINTS)
def test_arbitrary_bytes_never_raise(data, points):
    out = feed_each_way(lambda: EventStreamDecoder(max_resync_bytes=256), data, points)
    assert all(isinstance(o, EventStreamMessage | Violation) for o in out)


def test_fixture_files_are_the_generators_output():
    """Every binary fixture on disk is what ``generate.py`` makes now (no stale or hand-edited
    file); its ``--check`` mode agrees."""
    for name, make in gen.FIXTURES.items():
        assert (BINARY / name).read_bytes() == make(), name
    assert gen.main(["--check"]) == 0
