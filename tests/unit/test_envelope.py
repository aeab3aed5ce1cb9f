"""Tests for observer.wire.envelope (the 5-byte envelope of Connect, gRPC, gRPC-Web).

Fixtures: ``tests/fixtures/wire/binary/*.connect|*.grpcweb|grpc_web_text.txt``, made by that
folder's ``generate.py`` (stdlib). Expected payloads are written here by hand as protobuf bytes
(``key = field << 3 | wire type``, then a length or varint: protobuf.dev "Encoding"); the verified
shapes of reference ``binary-formats.md`` §4.1 (``<flags 3><len 22><gzip "{}">``, ``<flags 3><len
89><gzip {"error":...}>``) are checked byte for byte.
"""

from __future__ import annotations

import base64
import gzip
import importlib.util
import random
import tracemalloc
import zlib
from pathlib import Path

import brotli
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from observer.records import Violation
from observer.wire.envelope import (
    CONNECT,
    GRPC,
    GRPC_WEB,
    Envelope,
    EnvelopeDecoder,
    EnvelopeProtocol,
    GrpcWebTextDecoder,
    end_stream_error,
    grpc_status,
    parse_trailers,
    protocol_for,
)
from tests.wirefeed import CUT_POINTS, bytewise, feed, feed_each_way

try:
    from compression import zstd  # type: ignore[import-not-found]
except ImportError:  # Python < 3.14
    from backports import zstd

BINARY = Path(__file__).resolve().parent.parent / "fixtures" / "wire" / "binary"
_spec = importlib.util.spec_from_file_location("binary_fixture_generator", BINARY / "generate.py")
gen = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(gen)  # type: ignore[union-attr]

MALFORMED = "malformed_frame"
OVERSIZE = "oversize_event"
UNTERMINATED = "unterminated_final_event"
DECODING = "content_decoding_error"


def fixture(name: str) -> bytes:
    return (BINARY / name).read_bytes()


def seeded_points(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10_000) for _ in range(40)]


def decoded_each_way(data: bytes, *args, seeds=range(5), text: bool = False, **kw) -> list:
    """Output for ``data`` whole, byte by byte and cut at seeded random points (all equal)."""

    def make():
        return GrpcWebTextDecoder(**kw) if text else EnvelopeDecoder(*args, **kw)

    outs = [feed_each_way(make, data, seeded_points(s)) for s in seeds]
    assert all(o == outs[0] for o in outs)
    return outs[0]


def kinds(out: list) -> list[str]:
    return [o.kind if isinstance(o, Violation) else "env" for o in out]


def env(prefix: bytes, body: bytes) -> bytes:
    """An envelope written by hand: 5-byte prefix as given, then the body."""
    return prefix + body


# Windsurf GetChatMessageResponse messages, by hand: 0a = field 1 LEN, 1a = field 3 LEN,
# 32 = field 6 LEN, 28 = field 5 VARINT, 3a = field 7 LEN, 10/18 = fields 2/3 VARINT.
WS1 = b"\x0a\x05msg_1" + b"\x1a\x03Hel"
WS2 = b"\x1a\x02lo"
WS3 = b"\x32\x27" + b"\x0a\x06call_1" + b"\x12\x0bget_weather" + b'\x1a\x10{"city":"Paris"}'
WS4 = b"\x28\x0a" + b"\x3a\x04\x10\x0c\x18\x07"


def gz_size(data: bytes) -> int:
    """5 + the length of the stdlib gzip member (mtime 0) the generator wrote."""
    return 5 + len(gzip.compress(data, mtime=0))


# -- Connect ---------------------------------------------------------------------------------------


def test_windsurf_gzip_envelopes_and_the_verified_end_stream():
    data = fixture("connect_windsurf.connect")
    # The verified END_STREAM shape: flags 3 (compressed | end-stream), length 22, gzip of "{}".
    assert data[-27:-22] == b"\x03\x00\x00\x00\x16"
    assert gzip.decompress(data[-22:]) == b"{}"
    want = [
        Envelope(1, WS1, gz_size(WS1)),
        Envelope(1, WS2, gz_size(WS2)),
        Envelope(1, WS3, gz_size(WS3)),
        Envelope(1, WS4, gz_size(WS4)),
        Envelope(3, b"{}", 27, end_stream=True),
    ]
    assert sum(e.size_bytes for e in want) == len(data)
    assert decoded_each_way(data, CONNECT, "gzip") == want
    assert end_stream_error(b"{}") is None
    d = EnvelopeDecoder(CONNECT, "gzip")
    d.feed(data)
    assert d.end_stream_seen and d.buffered_bytes == 0
    assert want[0].compressed and not Envelope(0, b"", 5).compressed


def test_every_split_point_of_the_windsurf_stream():
    data = fixture("connect_windsurf.connect")
    whole = feed(EnvelopeDecoder(CONNECT, "gzip"), [data])
    for cut in range(len(data) + 1):
        assert feed(EnvelopeDecoder(CONNECT, "gzip"), [data[:cut], data[cut:]]) == whole, cut


def test_verified_error_end_stream():
    data = fixture("connect_error_end.connect")
    error_json = b'{"error": {"code": "resource_exhausted", "message": "quota exceeded (toy)"}}'
    assert data[-94:-89] == b"\x03\x00\x00\x00\x59"  # flags 3, length 89
    out = decoded_each_way(data, CONNECT, "gzip")
    assert out == [Envelope(1, WS2, gz_size(WS2)), Envelope(3, error_json, 94, end_stream=True)]
    assert end_stream_error(out[1].payload) == ("resource_exhausted", "quota exceeded (toy)")


def test_cursor_uncompressed_envelopes_without_end_stream():
    """Cursor keeps the stream open after turn_ended: no end envelope, and no violation for it."""
    data = fixture("connect_cursor.connect")
    msgs = [
        b"\x0a\x09\x0a\x07\x0a\x05Hello",  # 1 { 1 { 1: "Hello" } }
        b"\x0a\x08\x0a\x06\x0a\x04 the",
        b"\x0a\x04\x42\x02\x08\x02",  # 1 { 8 { 1: 2 } }
        b"\x0a\x06\x72\x04\x08\x78\x10\x06",  # 1 { 14 { 1: 120, 2: 6 } }
        b"\x0a\x02\x6a\x00",  # 1 { 13 {} }
    ]
    assert data == b"".join(b"\x00" + len(m).to_bytes(4, "big") + m for m in msgs)
    out = decoded_each_way(data, CONNECT)
    assert out == [Envelope(0, m, 5 + len(m)) for m in msgs]
    d = EnvelopeDecoder(CONNECT)
    d.feed(data)
    assert not d.end_stream_seen
    assert d.close() == []


def test_truncated_envelope():
    data = fixture("connect_truncated.connect")
    out = decoded_each_way(data, CONNECT, "gzip")
    assert kinds(out) == ["env"] * 4 + [UNTERMINATED]
    assert out[-1].detail == "stream ended inside the envelope at byte 165 (17 bytes of 27)"
    out = decoded_each_way(env(b"\x00\x00\x00\x00\x02", b"hi") + b"\x00\x00\x00", CONNECT)
    assert out == [
        Envelope(0, b"hi", 7),
        Violation(UNTERMINATED, None, "stream ended inside the prefix of the envelope at byte 7 (3 bytes of 5)"),
    ]


@pytest.mark.parametrize(
    ("protocol", "request_", "flags"),
    [
        (CONNECT, False, 0x04),
        (CONNECT, False, 0x80),
        (CONNECT, True, 0x02),  # end-stream is never set on requests
        (GRPC, False, 0x02),
        (GRPC, False, 0x80),
        (GRPC_WEB, False, 0x02),
        (GRPC_WEB, False, 0x40),
        (GRPC_WEB, False, 0x82),
    ],
)
def test_reserved_flags_stop_decoding(protocol, request_, flags):
    one = env(b"\x00\x00\x00\x00\x02", b"hi")
    data = one + bytes([flags]) + b"\x00\x00\x00\x03xyz" + one
    out = decoded_each_way(data, protocol, request=request_, seeds=range(2))
    assert out == [
        Envelope(0, b"hi", 7),
        Violation(
            MALFORMED, None, f"envelope at byte 7: reserved flags 0x{flags:02x} for {protocol.value}; decoding stopped"
        ),
    ]
    d = EnvelopeDecoder(protocol, request=request_)
    d.feed(data)
    assert d.buffered_bytes == 0 and d.feed(one) == [] and d.close() == []


def test_reserved_flag_fixture():
    assert kinds(decoded_each_way(fixture("connect_reserved_flag.connect"), CONNECT)) == ["env", MALFORMED]


def test_bytes_after_the_end_envelope_are_reported_once():
    end = env(b"\x02\x00\x00\x00\x02", b"{}")
    data = end + env(b"\x00\x00\x00\x00\x01", b"x") + b"more"
    out = decoded_each_way(data, CONNECT)
    assert out == [
        Envelope(2, b"{}", 7, end_stream=True),
        Violation(MALFORMED, None, "data after the end envelope (from byte 7) ignored"),
    ]


# -- compression -----------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", [None, "identity", "snappy"])
def test_compressed_flag_without_a_usable_encoding(encoding):
    data = env(b"\x01\x00\x00\x00\x03", b"abc") + env(b"\x00\x00\x00\x00\x02", b"ok")
    out = decoded_each_way(data, GRPC, encoding)
    reason = "no message encoding was declared" if encoding != "snappy" else "unsupported message encoding 'snappy'"
    assert out == [
        Violation(DECODING, None, f"envelope at byte 0 is flagged compressed but {reason}; message dropped"),
        Envelope(0, b"ok", 7),
    ]


def test_corrupt_and_cut_compressed_messages_are_dropped():
    member = gzip.compress(b"hello", mtime=0)
    data = (
        env(b"\x01\x00\x00\x00\x0c", b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\xff\xff")  # header, block type 3
        + env(bytes([1]) + (len(member) - 4).to_bytes(4, "big"), member[:-4])  # no size trailer
        + env(bytes([1]) + len(member).to_bytes(4, "big"), member)
    )
    out = decoded_each_way(data, CONNECT, "gzip")
    assert kinds(out) == [DECODING, DECODING, "env"]
    assert out[0].detail.startswith("envelope at byte 0: corrupt gzip content")
    assert out[1].detail == (
        "envelope at byte 17: its gzip data ends before the end of the compressed stream; message dropped"
    )
    assert out[2] == Envelope(1, b"hello", 5 + len(member))


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [
        ("gzip", lambda b: gzip.compress(b, mtime=0)),
        ("deflate", zlib.compress),  # gRPC "deflate" is the zlib format
        ("br", brotli.compress),
        ("zstd", zstd.compress),
    ],
)
def test_each_envelope_is_its_own_compression_context(encoding, compress):
    msgs = [b"\x1a\x05Hello", b"\x1a\x06 world", b""]
    data = b"".join(env(bytes([1]) + len(c).to_bytes(4, "big"), c) for c in map(compress, msgs))
    out = decoded_each_way(data, GRPC, encoding, seeds=range(2))
    assert [(e.flags, e.payload) for e in out] == [(1, m) for m in msgs]


def test_a_context_carried_across_envelopes_is_not_accepted():
    """Connect: "compression contexts do not carry across messages". A second envelope holding
    only the continuation of the first one's deflate stream cannot be read on its own."""
    c = zlib.compressobj()
    first = c.compress(b"hello ") + c.flush(zlib.Z_SYNC_FLUSH)
    second = c.compress(b"world") + c.flush()
    data = env(bytes([1]) + len(first).to_bytes(4, "big"), first) + env(
        bytes([1]) + len(second).to_bytes(4, "big"), second
    )
    out = feed(EnvelopeDecoder(CONNECT, "deflate"), [data])
    assert kinds(out) == [DECODING, DECODING]  # the first has no end marker, the second no header


def test_empty_message_flagged_compressed_is_empty():
    assert feed(EnvelopeDecoder(CONNECT, "gzip"), [b"\x01\x00\x00\x00\x00"]) == [Envelope(1, b"", 5)]


def test_compression_bomb_is_bounded():
    """32 MiB of zeros in a 32 KB gzip envelope: decompression stops at the ratio budget
    (1 MiB + 100 x the compressed size), without inflating the 32 MiB, and the next envelope is
    decoded."""
    data = fixture("connect_bomb.connect")
    assert len(data) < 40_000
    tracemalloc.start()
    try:
        out = feed(EnvelopeDecoder(CONNECT, "gzip"), [data])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 12 << 20, peak
    assert kinds(out) == [DECODING, "env"]
    compressed = len(gzip.compress(b"\x00" * (32 << 20), mtime=0))
    budget = (1 << 20) + 100 * compressed
    assert out[0].detail == (
        f"envelope at byte 0: decoded gzip output would exceed max_ratio=100 (1048576 + 100 x {compressed}"
        f" encoded bytes = {budget} bytes); message dropped"
    )
    assert out[1] == Envelope(1, WS2, gz_size(WS2))
    # With a smaller max_message_bytes the output bound binds first.
    out = feed(EnvelopeDecoder(CONNECT, "gzip", max_message_bytes=1 << 20), [data])
    assert out[0].detail.startswith("envelope at byte 0: decoded gzip output would exceed max_output_bytes=1048576")


def test_oversize_envelope_is_skipped_without_buffering():
    big = env(b"\x00\x00\x00\x01\x00", b"\x00" * 256)  # length 256
    data = big + env(b"\x00\x00\x00\x00\x02", b"ok")
    out = decoded_each_way(data, CONNECT, max_message_bytes=255)
    assert out == [
        Violation(OVERSIZE, None, "envelope at byte 0: length 256 exceeds 255 bytes; skipped"),
        Envelope(0, b"ok", 7),
    ]
    d = EnvelopeDecoder(CONNECT, max_message_bytes=255)
    for chunk in bytewise(big):
        d.feed(chunk)
        assert d.buffered_bytes <= 4
    # An oversize end envelope still ends the stream.
    data = env(b"\x02\x00\x00\x01\x00", b"{" * 256) + b"late"
    out = decoded_each_way(data, CONNECT, max_message_bytes=255)
    assert kinds(out) == [OVERSIZE, MALFORMED]
    assert out[1].detail == "data after the end envelope (from byte 261) ignored"


@pytest.mark.parametrize("bad", [0, -5, True, 2.0])
def test_bounds_must_be_positive_ints(bad):
    with pytest.raises(ValueError):
        EnvelopeDecoder(CONNECT, max_message_bytes=bad)
    with pytest.raises(ValueError):
        EnvelopeDecoder(CONNECT, max_decode_ratio=bad)


def test_protocol_by_name_and_unknown_protocol():
    assert feed(EnvelopeDecoder("grpc-web"), [b"\x80\x00\x00\x00\x00"]) == [Envelope(0x80, b"", 5, True, {})]
    with pytest.raises(ValueError):
        EnvelopeDecoder("thrift")
    assert EnvelopeProtocol("connect") is CONNECT


# -- gRPC-Web trailers and grpc-web-text --------------------------------------------------------------


def test_grpc_web_trailer_frame():
    data = fixture("grpc_web_trailer.grpcweb")
    lines = b"grpc-status: 8\r\ngrpc-message: quota%20exceeded%3A%20100%25\r\nX-Extra:  a \r\nx-extra: b\r\n"
    trailers = {"grpc-status": "8", "grpc-message": "quota exceeded: 100%", "x-extra": "a,b"}
    out = decoded_each_way(data, GRPC_WEB)
    assert out == [Envelope(0, WS2, 9), Envelope(0x80, lines, 5 + len(lines), end_stream=True, trailers=trailers)]
    assert out[1].grpc_status() == (8, "quota exceeded: 100%")
    assert out[0].grpc_status() == (None, None)


def test_compressed_trailer_frame_and_a_bad_trailer_line():
    lines = b"grpc-status: 0\r\nnot a header\r\n\r\n"
    c = gzip.compress(lines, mtime=0)
    data = bytes([0x81]) + len(c).to_bytes(4, "big") + c
    out = feed(EnvelopeDecoder(GRPC_WEB, "gzip"), [data])
    assert out == [
        Violation(MALFORMED, None, "trailer frame at byte 0: 1 line without a colon ignored"),
        Envelope(0x81, lines, len(data), True, {"grpc-status": "0"}),
    ]
    # Undecodable compressed trailers: the violation, then the end (empty trailers).
    out = feed(EnvelopeDecoder(GRPC_WEB), [data])
    assert kinds(out) == [DECODING, "env"] and out[1] == Envelope(0x81, b"", len(data), True, {})


def test_grpc_web_text_with_padding_mid_stream():
    text = fixture("grpc_web_text.txt")
    assert text.index(b"=") < len(text) - 4  # padded in the middle, not only at the end
    assert text == b"AAAAAAwKBW1zZ18xGgNIZWw=" + b"AAAAAAQaAmxv" + b"gAAAABBncnBjLXN0YXR1czogMA0K"
    want = [
        Envelope(0, WS1, 17),
        Envelope(0, WS2, 9),
        Envelope(0x80, b"grpc-status: 0\r\n", 21, end_stream=True, trailers={"grpc-status": "0"}),
    ]
    assert decoded_each_way(text, text=True) == want
    spaced = b" \r\n".join(text[i : i + 7] for i in range(0, len(text), 7))  # whitespace is ignored
    assert decoded_each_way(spaced, text=True, seeds=range(2)) == want


def test_grpc_web_text_errors():
    good = base64.b64encode(b"\x00\x00\x00\x00\x02hi")  # 7 bytes -> "AAAAAAJoaQ=="
    out = decoded_each_way(good + b"AB*D" + good, text=True)
    assert out == [
        Envelope(0, b"hi", 7),
        Violation(DECODING, None, "grpc-web-text: invalid base64 group b'AB*D' at character 12; decoding stopped"),
    ]
    out = decoded_each_way(good + b"A=BC", text=True)
    assert kinds(out) == ["env", DECODING]
    # An unpadded end: 2 or 3 characters decode as if padded; a lone one is an error.
    assert decoded_each_way(good.rstrip(b"="), text=True) == [Envelope(0, b"hi", 7)]
    out = decoded_each_way(good + b"Q", text=True)
    assert out == [
        Envelope(0, b"hi", 7),
        Violation(DECODING, None, "grpc-web-text ends with a lone base64 character at character 12"),
    ]
    d = GrpcWebTextDecoder()
    assert d.feed(b"") == [] and d.buffered_bytes == 0
    d.close()
    with pytest.raises(ValueError):
        d.feed(good)


# -- helpers ------------------------------------------------------------------------------------------


def test_grpc_status_from_headers_and_trailers():
    assert grpc_status({"grpc-status": "0"}) == (0, None)
    assert grpc_status({"Grpc-Status": " 14 ", "Grpc-Message": "unavailable%3A%20try%20later"}) == (
        14,
        "unavailable: try later",
    )
    assert grpc_status([(b"grpc-status", b"3"), (b"grpc-message", b"caf%C3%A9")]) == (3, "caf\u00e9")
    assert grpc_status([("grpc-status", "5"), ("grpc-status", "7")]) == (5, None)  # the first counts
    assert grpc_status({"grpc-status": "abc", "grpc-message": "100%zz"}) == (None, "100%zz")  # broken % kept
    assert grpc_status({"grpc-message": "bad%FFutf8"}) == (None, "bad\ufffdutf8")
    assert grpc_status({}) == (None, None)
    assert grpc_status({"grpc-message": "a%2541"}, percent_encoded=False) == (None, "a%2541")


def test_parse_trailers():
    assert parse_trailers(b"A: 1\nb:2\r\n\r\n  \nc\n") == ({"a": "1", "b": "2"}, 1)
    assert parse_trailers(b"grpc-message: %E2%9C%93 ok") == ({"grpc-message": "\u2713 ok"}, 0)
    assert parse_trailers(b"") == ({}, 0)


@pytest.mark.parametrize(
    ("payload", "want"),
    [
        (b"{}", None),
        (b'{"metadata": {"k": ["v"]}}', None),
        (b'{"error": null}', None),
        (b'{"error": {"code": "unavailable"}}', ("unavailable", None)),
        (b'{"error": {"code": ""}}', ("unknown", None)),
        (b'{"error": {"message": "m"}}', ("unknown", "m")),
        (b'{"error": {"code": 14, "message": 3}}', ("unknown", None)),
        (b'{"error": "boom"}', ("unknown", None)),
        (b"[]", ("unknown", "end-stream message is not a JSON object")),
        (b"", ("unknown", "end-stream message is not a JSON object")),
        (b"\xff{", ("unknown", "end-stream message is not a JSON object")),
    ],
)
def test_end_stream_error(payload, want):
    assert end_stream_error(payload) == want


@pytest.mark.parametrize(
    ("content_type", "want"),
    [
        ("application/connect+proto", (CONNECT, False)),
        ("Application/Connect+JSON; charset=utf-8", (CONNECT, False)),
        ("application/grpc", (GRPC, False)),
        ("application/grpc+proto", (GRPC, False)),
        ("application/grpc-web+proto", (GRPC_WEB, False)),
        ("application/grpc-web-text+proto", (GRPC_WEB, True)),
        ("application/proto", None),
        ("application/grpcx", None),
        (None, None),
    ],
)
def test_protocol_for(content_type, want):
    assert protocol_for(content_type) == want


# -- properties ---------------------------------------------------------------------------------------

CASES = [
    ("connect_windsurf.connect", CONNECT, "gzip"),
    ("connect_error_end.connect", CONNECT, "gzip"),
    ("connect_cursor.connect", CONNECT, None),
    ("connect_truncated.connect", CONNECT, "gzip"),
    ("connect_reserved_flag.connect", CONNECT, None),
    ("grpc_web_trailer.grpcweb", GRPC_WEB, None),
]


@settings(max_examples=150, deadline=None)
@given(
    case=st.sampled_from(CASES),
    points=CUT_POINTS,
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), max_size=3),
    limit=st.sampled_from([8, 40, 1 << 20]),
)
def test_corrupted_fixtures_never_raise_and_do_not_depend_on_chunking(case, points, flips, limit):
    name, protocol, encoding = case
    data = bytearray(fixture(name))
    for at, mask in flips:
        data[at % len(data)] ^= mask
    data = bytes(data)
    feed_each_way(lambda: EnvelopeDecoder(protocol, encoding, max_message_bytes=limit), data, points)
    d = EnvelopeDecoder(protocol, encoding, max_message_bytes=limit)
    for chunk in bytewise(data):
        d.feed(chunk)
        assert d.buffered_bytes < 5 + limit
    d.close()


@settings(max_examples=150, deadline=None)
@given(
    data=st.binary(max_size=300),
    points=CUT_POINTS,
    protocol=st.sampled_from([CONNECT, GRPC, GRPC_WEB]),
    encoding=st.sampled_from([None, "gzip", "br", "zstd", "deflate"]),
)
def test_arbitrary_bytes_never_raise(data, points, protocol, encoding):
    feed_each_way(lambda: EnvelopeDecoder(protocol, encoding), data, points)


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=200).map(base64.b64encode) | st.binary(max_size=200), points=CUT_POINTS)
def test_grpc_web_text_never_raises(data, points):
    feed_each_way(GrpcWebTextDecoder, data, points)
