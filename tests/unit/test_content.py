"""Tests for observer.wire.content (RFC 9110 §8.4 content codings, decoded incrementally)."""

from __future__ import annotations

import gzip
import sys
import zlib

import brotli
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from observer.errors import ContentDecodingError, ObserverError, UnsupportedEncoding
from observer.wire.content import make_decoder

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

EVENTS = [
    b'data: {"v":"1.0","seq":%d,"type":"content.delta","index":0,"delta":{"text":"tok \xc3\xa9 %d"}}\n\n' % (i, i)
    for i in range(40)
]
PLAIN = b"".join(EVENTS)


def _zlib(data: bytes, wbits: int) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, wbits)
    return c.compress(data) + c.flush()


COMPRESSORS = {
    "gzip": gzip.compress,
    "x-gzip": gzip.compress,
    "deflate": lambda d: _zlib(d, zlib.MAX_WBITS),  # zlib wrapper, RFC 9110 §8.4.1.2
    "br": brotli.compress,
    "zstd": zstd.compress,
}
CODINGS = sorted(COMPRESSORS)


def decode_all(coding: str | None, chunks) -> tuple[bytes, bool]:
    d = make_decoder(coding)
    out = b"".join(d.feed(c) for c in chunks) + d.close()
    return out, d.complete


def split_at(data: bytes, points: list[int]) -> list[bytes]:
    cuts = sorted({p % (len(data) + 1) for p in points})
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


def bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


# -- identity ---------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, "", "identity", " Identity ", "identity, identity", " , "])
def test_identity_passes_through_same_object(value):
    d = make_decoder(value)
    chunk = b"data: x\n\n"
    assert d.complete is True
    assert d.feed(chunk) is chunk
    assert d.close() == b""
    assert d.complete is True


# -- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize("coding", CODINGS)
def test_round_trip_whole(coding):
    out, complete = decode_all(coding, [COMPRESSORS[coding](PLAIN)])
    assert out == PLAIN
    assert complete is True


@pytest.mark.parametrize("coding", CODINGS)
def test_round_trip_one_byte_at_a_time(coding):
    out, complete = decode_all(coding, bytewise(COMPRESSORS[coding](PLAIN)))
    assert out == PLAIN
    assert complete is True


@pytest.mark.parametrize("spelling", ["GZIP", " gzip ", "Gzip", "X-GZip"])
def test_coding_names_case_insensitive_and_trimmed(spelling):
    assert decode_all(spelling, [gzip.compress(b"hello")]) == (b"hello", True)


@settings(max_examples=200, deadline=None)
@given(
    coding=st.sampled_from(CODINGS + ["gzip, br", "deflate-raw"]),
    points=st.lists(st.integers(0, 100_000), max_size=30),
)
def test_random_splits_give_same_plaintext(coding, points):
    if coding == "gzip, br":
        body = brotli.compress(gzip.compress(PLAIN))
    elif coding == "deflate-raw":
        coding, body = "deflate", _zlib(PLAIN, -zlib.MAX_WBITS)
    else:
        body = COMPRESSORS[coding](PLAIN)
    assert decode_all(coding, split_at(body, points)) == (PLAIN, True)


# -- incremental output -----------------------------------------------------------------------


def _flushed_pieces(coding: str) -> list[bytes]:
    """The body as a streaming server sends it: the compressor flushed after each event."""
    if coding in ("gzip", "deflate", "deflate-raw"):
        wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS, "deflate-raw": -zlib.MAX_WBITS}[coding]
        c = zlib.compressobj(6, zlib.DEFLATED, wbits)
        return [c.compress(e) + c.flush(zlib.Z_SYNC_FLUSH) for e in EVENTS] + [c.flush()]
    if coding == "br":
        c = brotli.Compressor()
        return [c.process(e) + c.flush() for e in EVENTS] + [c.finish()]
    if coding == "zstd":
        c = zstd.ZstdCompressor()
        return [c.compress(e, zstd.ZstdCompressor.FLUSH_BLOCK) for e in EVENTS] + [
            c.flush(zstd.ZstdCompressor.FLUSH_FRAME)
        ]
    raise AssertionError(coding)


@pytest.mark.parametrize("coding", ["gzip", "deflate", "deflate-raw", "br", "zstd"])
def test_each_flushed_event_decodes_on_arrival(coding):
    pieces = _flushed_pieces(coding)
    d = make_decoder("deflate" if coding == "deflate-raw" else coding)
    for event, piece in zip(EVENTS, pieces):
        assert d.feed(piece) == event
        assert d.complete is False
    assert d.feed(pieces[-1]) == b""
    assert d.close() == b""
    assert d.complete is True


# -- truncation and corruption ----------------------------------------------------------------


@pytest.mark.parametrize("coding", ["gzip", "deflate", "deflate-raw", "br", "zstd"])
def test_truncated_stream_is_not_an_error(coding):
    pieces = _flushed_pieces(coding)
    # Cut off after 10 events (the end marker never arrives), and also mid-piece.
    for body in (b"".join(pieces[:10]), b"".join(pieces[:10]) + pieces[10][:3]):
        d = make_decoder("deflate" if coding == "deflate-raw" else coding)
        out = d.feed(body)
        out += d.close()
        assert out.startswith(b"".join(EVENTS[:10]))
        assert b"".join(EVENTS).startswith(out)
        assert d.complete is False


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "zstd"])
def test_empty_body_is_incomplete(coding):
    assert decode_all(coding, [b""]) == (b"", False)
    assert decode_all(coding, []) == (b"", False)


@pytest.mark.parametrize(
    ("coding", "body"),
    [
        ("gzip", b"not gzip at all"),
        ("gzip", gzip.compress(b"hello")[:-8] + b"\x00\x00\x00\x00\x05\x00\x00\x00"),  # bad CRC32
        ("deflate", b"\x78\x9c" + b"\xff" * 20),  # zlib header, corrupt deflate data
        ("deflate", b"\xff" * 20),  # raw deflate, reserved block type
        ("br", b"\xff" * 20),
        ("zstd", b"\xff" * 20),
        ("zstd", zstd.compress(b"hello") + b"garbage!"),
    ],
)
def test_corrupt_input_raises_and_stays_failed(coding, body):
    d = make_decoder(coding)
    with pytest.raises(ContentDecodingError) as info:
        d.feed(body)
        d.close()
    assert info.value.code == "content_decoding_error"
    assert isinstance(info.value, ObserverError)
    with pytest.raises(ContentDecodingError):
        d.feed(b"more")
    with pytest.raises(ContentDecodingError):
        d.close()


@pytest.mark.parametrize(("coding", "compress"), [("deflate", zlib.compress), ("br", brotli.compress)])
def test_data_after_end_of_single_stream_is_corrupt(coding, compress):
    d = make_decoder(coding)
    assert d.feed(compress(b"hello")) == b"hello"
    assert d.complete is True
    with pytest.raises(ContentDecodingError):
        d.feed(b"extra")


@pytest.mark.parametrize("value", ["compress", "x-compress", "gzip, foo", "aes128gcm", "br;q=1"])
def test_unknown_coding_rejected_at_construction(value):
    with pytest.raises(UnsupportedEncoding) as info:
        make_decoder(value)
    assert info.value.code == "unsupported_encoding"


# -- chains, deflate variants, multi-member -------------------------------------------------


def test_chain_gzip_then_br_is_decoded_br_first():
    body = brotli.compress(gzip.compress(PLAIN))
    assert decode_all("gzip, br", [body]) == (PLAIN, True)
    assert decode_all(" GZIP ,Br ", bytewise(body)) == (PLAIN, True)
    # The other order is a different body.
    with pytest.raises(ContentDecodingError):
        decode_all("br, gzip", [body])


def test_chain_with_identity_elements_and_three_codings():
    body = zstd.compress(brotli.compress(gzip.compress(PLAIN)))
    assert decode_all("gzip, identity, br, zstd", [body]) == (PLAIN, True)


def test_chain_incremental_and_truncated():
    c = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    inner = b"".join(c.compress(e) + c.flush(zlib.Z_SYNC_FLUSH) for e in EVENTS[:5])  # gzip never finished
    d = make_decoder("gzip, zstd")
    zc = zstd.ZstdCompressor()
    out = d.feed(zc.compress(inner, zstd.ZstdCompressor.FLUSH_BLOCK))
    assert out == b"".join(EVENTS[:5])
    assert d.close() == b""
    assert d.complete is False


def test_raw_deflate_fallback():
    body = _zlib(PLAIN, -zlib.MAX_WBITS)
    assert decode_all("deflate", [body]) == (PLAIN, True)
    assert decode_all("deflate", bytewise(body)) == (PLAIN, True)


@pytest.mark.parametrize("wbits", [zlib.MAX_WBITS, -zlib.MAX_WBITS])
def test_deflate_header_decided_on_two_bytes_split(wbits):
    body = _zlib(PLAIN, wbits)
    d = make_decoder("deflate")
    assert d.feed(body[:1]) == b""
    out = d.feed(body[1:2]) + d.feed(body[2:]) + d.close()
    assert (out, d.complete) == (PLAIN, True)


def test_deflate_single_byte_body():
    assert decode_all("deflate", [b"\x78"]) == (b"", False)


def test_concatenated_gzip_members():
    body = gzip.compress(b"first ") + gzip.compress(b"second ") + gzip.compress(b"third")
    assert decode_all("gzip", [body]) == (b"first second third", True)
    assert decode_all("gzip", bytewise(body)) == (b"first second third", True)
    # A second member cut short: what was decoded is returned, the stream is incomplete.
    d = make_decoder("gzip")
    second = gzip.compress(b"second")
    assert d.feed(gzip.compress(b"first ") + second[:-4]) == b"first second"
    assert d.complete is False
    assert d.close() == b""
    assert d.complete is False


def test_gzip_trailing_garbage_after_member_ignored():
    assert decode_all("gzip", [gzip.compress(b"hello") + b"\x00\x00\x00\x00"]) == (b"hello", True)
    assert decode_all("gzip", [gzip.compress(b"hello"), b"junk", b"more junk"]) == (b"hello", True)


def test_zstd_multiple_frames():
    body = zstd.compress(b"one ") + zstd.compress(b"two ") + zstd.compress(b"three")
    assert decode_all("zstd", [body]) == (b"one two three", True)
    assert decode_all("zstd", bytewise(body)) == (b"one two three", True)
    d = make_decoder("zstd")
    assert d.feed(zstd.compress(b"one ") + zstd.compress(b"two")[:5]) == b"one "
    assert d.complete is False
