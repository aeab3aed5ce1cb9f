"""Tests for observer.wire.content (RFC 9110 §8.4 content codings, decoded incrementally)."""

from __future__ import annotations

import functools
import gzip
import random
import sys
import tracemalloc
import zlib

import brotli
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from observer.errors import ContentDecodingError, ObserverError, UnsupportedEncoding
from observer.wire.content import make_decoder
from tests.wirefeed import CUT_POINTS, bytewise, feed, split_at

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
    """(the plain bytes a fresh decoder gives for ``chunks`` then ``close()``, its ``complete``)."""
    d = make_decoder(coding)
    return feed(d, chunks), d.complete


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
    points=CUT_POINTS,
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
    for event, piece in zip(EVENTS, pieces, strict=False):  # pieces end with the trailer
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


# -- output limits (decompression bombs) ------------------------------------------------------

MiB = 1 << 20
ALLOWANCE = MiB  # make_decoder's default ratio_allowance_bytes
RATIO = 100
CHUNK = 16 * 1024  # what a proxy read typically delivers
LIMIT_CODINGS = ["gzip", "deflate", "deflate-raw", "br", "zstd", "gzip, br"]


def _decoder_name(coding: str) -> str:
    return "deflate" if coding == "deflate-raw" else coding


def _compress(coding: str, data: bytes) -> bytes:
    """Whole-body compression per coding (fast settings: the bombs are 64 MiB)."""
    if coding == "gzip":
        return gzip.compress(data, 6)
    if coding == "deflate":
        return _zlib(data, zlib.MAX_WBITS)
    if coding == "deflate-raw":
        return _zlib(data, -zlib.MAX_WBITS)
    if coding == "br":
        return brotli.compress(data, quality=5)
    if coding == "zstd":
        return zstd.compress(data)
    if coding == "gzip, br":
        return brotli.compress(gzip.compress(data, 6), quality=5)
    raise AssertionError(coding)


BOMB_PREFIX = random.Random(7).randbytes(64 * 1024)  # incompressible: decodes at ratio ~1
BOMB_ZEROS = 64 * MiB


@functools.cache
def _bomb(coding: str) -> bytes:
    """64 KiB of ordinary data, then 64 MiB of zeros (compression ratio ~1000 and more)."""
    return _compress(coding, BOMB_PREFIX + bytes(BOMB_ZEROS))


def _feed_until_limit(d, body: bytes, chunk: int = CHUNK, ratio: int | None = RATIO, max_output: int | None = None):
    """Feeds ``body`` in ``chunk``-sized pieces until the limit error; returns (error, output
    returned before it, budget at the failing feed computed from the bytes fed so far)."""
    returned = bytearray()
    fed = 0
    for i in range(0, len(body), chunk):
        piece = body[i : i + chunk]
        fed += len(piece)
        caps = []
        if ratio is not None:
            caps.append(ALLOWANCE + ratio * fed)
        if max_output is not None:
            caps.append(max_output)
        try:
            returned += d.feed(piece)
        except ContentDecodingError as exc:
            return exc, bytes(returned), min(caps), fed
    raise AssertionError(f"no limit error; {len(returned)} bytes decoded")


@pytest.mark.parametrize("coding", LIMIT_CODINGS)
def test_bomb_stopped_by_ratio_within_budget(coding):
    body = _bomb(coding)
    d = make_decoder(_decoder_name(coding), max_ratio=RATIO)
    exc, returned, budget, fed = _feed_until_limit(d, body)
    assert exc.code == "decompression_limit"
    assert isinstance(exc, ObserverError)
    assert "max_ratio=100" in str(exc)
    # Stopped early: the budget at that point is a fraction of the 64 MiB.
    assert budget < 16 * MiB
    # What came out before the error is within the budget and is the true plaintext.
    assert len(returned) <= budget
    assert returned == (BOMB_PREFIX + bytes(BOMB_ZEROS))[: len(returned)]
    # Failed for good: every later call raises the same error.
    for call in (lambda: d.feed(b"more"), d.close, lambda: d.feed(b"")):
        with pytest.raises(ContentDecodingError) as again:
            call()
        assert again.value is exc


def _stream_compress(coding: str, parts: list[bytes]) -> bytes:
    """Compresses ``parts`` as a streaming server does: the compressor flushed after each."""
    if coding in ("gzip", "deflate", "deflate-raw"):
        wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS, "deflate-raw": -zlib.MAX_WBITS}[coding]
        c = zlib.compressobj(6, zlib.DEFLATED, wbits)
        return b"".join(c.compress(p) + c.flush(zlib.Z_SYNC_FLUSH) for p in parts) + c.flush()
    if coding == "br":
        c = brotli.Compressor(quality=5)
        return b"".join(c.process(p) + c.flush() for p in parts) + c.finish()
    if coding == "zstd":
        c = zstd.ZstdCompressor()
        return b"".join(c.compress(p, zstd.ZstdCompressor.FLUSH_BLOCK) for p in parts) + c.flush(
            zstd.ZstdCompressor.FLUSH_FRAME
        )
    if coding == "gzip, br":
        g = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        gz = [g.compress(p) + g.flush(zlib.Z_SYNC_FLUSH) for p in parts]
        gz[-1] += g.flush()
        return _stream_compress("br", gz)
    raise AssertionError(coding)


@pytest.mark.parametrize("coding", LIMIT_CODINGS)
def test_output_before_limit_error_stays_returned(coding):
    # The ordinary prefix comes out over several small feeds before the zeros trip the limit;
    # those bytes stay returned, the failing feed's output is dropped.
    body = _stream_compress(coding, [BOMB_PREFIX, bytes(BOMB_ZEROS)])
    d = make_decoder(_decoder_name(coding), max_ratio=RATIO, ratio_allowance_bytes=0)
    returned = bytearray()
    fed = 0
    with pytest.raises(ContentDecodingError) as info:
        for i in range(0, len(body), 512):
            fed += len(body[i : i + 512])
            returned += d.feed(body[i : i + 512])
    assert info.value.code == "decompression_limit"
    assert len(BOMB_PREFIX) // 2 < len(returned) <= RATIO * fed
    assert returned == (BOMB_PREFIX + bytes(BOMB_ZEROS))[: len(returned)]


def test_gzip_bomb_memory_stays_near_budget():
    # 4 members of 64 MiB of zeros each: 256 MiB decoded without limits.
    member = gzip.compress(bytes(BOMB_ZEROS), 9)
    body = member * 4
    d = make_decoder("gzip", max_ratio=RATIO)
    tracemalloc.start()
    try:
        exc, returned, budget, _fed = _feed_until_limit(d, body)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert exc.code == "decompression_limit"
    assert len(returned) <= budget == ALLOWANCE + RATIO * CHUNK
    # At most the budget plus one byte is inflated (zlib's output buffer may hold it twice).
    assert peak < 3 * budget + MiB < 16 * MiB


def test_zstd_bomb_memory_stays_near_budget():
    d = make_decoder("zstd", max_ratio=RATIO)
    body = zstd.compress(bytes(256 * MiB))
    tracemalloc.start()
    try:
        exc, returned, budget, _fed = _feed_until_limit(d, body)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert exc.code == "decompression_limit"
    assert len(returned) <= budget
    assert peak < 3 * budget + MiB < 16 * MiB


@pytest.mark.parametrize("coding", LIMIT_CODINGS)
def test_bomb_stopped_by_max_output_bytes(coding):
    d = make_decoder(_decoder_name(coding), max_output_bytes=3 * MiB)
    exc, returned, budget, _fed = _feed_until_limit(d, _bomb(coding), ratio=None, max_output=3 * MiB)
    assert exc.code == "decompression_limit"
    assert "max_output_bytes=3145728" in str(exc)
    assert len(returned) <= budget == 3 * MiB


def test_the_smaller_limit_binds_and_is_named():
    body = gzip.compress(bytes(BOMB_ZEROS), 9)
    d = make_decoder("gzip", max_ratio=RATIO, max_output_bytes=MiB // 2)
    exc, returned, budget, _ = _feed_until_limit(d, body, max_output=MiB // 2)
    assert "max_output_bytes=524288" in str(exc)
    assert len(returned) <= budget == MiB // 2
    d = make_decoder("gzip", max_ratio=RATIO, max_output_bytes=1 << 40)
    exc, returned, budget, _ = _feed_until_limit(d, body, max_output=1 << 40)
    assert "max_ratio=100 (1048576 + 100 x 16384 encoded bytes = 2686976 bytes)" in str(exc)
    assert len(returned) <= budget == 2686976


def test_chain_inner_stage_bomb_is_bounded():
    # The br stage (the inner one for "gzip, br") expands to 64 MiB of stored-block gzip: a
    # valid gzip stream, but the intermediate data alone is a bomb.
    inner = gzip.compress(bytes(BOMB_ZEROS), 0)
    body = brotli.compress(inner, quality=5)
    assert len(body) < CHUNK
    d = make_decoder("gzip, br", max_ratio=RATIO)
    with pytest.raises(ContentDecodingError) as info:
        d.feed(body)
    assert info.value.code == "decompression_limit"
    assert "intermediate br output" in str(info.value)
    with pytest.raises(ContentDecodingError) as again:
        d.close()
    assert again.value is info.value


@pytest.mark.parametrize("coding", [*CODINGS, "deflate-raw", "gzip, br", "identity"])
def test_max_output_bytes_exact(coding):
    if coding == "identity":
        body = PLAIN
    elif coding in COMPRESSORS:
        body = COMPRESSORS[coding](PLAIN)
    else:
        body = _compress(coding, PLAIN)
    name = _decoder_name(coding)
    for chunks in ([body], bytewise(body)):
        d = make_decoder(name, max_output_bytes=len(PLAIN))
        out = b"".join(d.feed(c) for c in chunks) + d.close()
        assert (out, d.complete) == (PLAIN, True)
    for chunks in ([body], bytewise(body)):
        d = make_decoder(name, max_output_bytes=len(PLAIN) - 1)
        out = bytearray()
        with pytest.raises(ContentDecodingError) as info:
            for c in chunks:
                out += d.feed(c)
            out += d.close()
        assert info.value.code == "decompression_limit"
        assert len(out) <= len(PLAIN) - 1
        assert PLAIN.startswith(out)
        with pytest.raises(ContentDecodingError):
            d.feed(b"x")


def test_zero_max_output_bytes():
    d = make_decoder("gzip", max_output_bytes=0)
    assert d.feed(gzip.compress(b"")) == b""
    assert d.close() == b""
    assert d.complete is True
    with pytest.raises(ContentDecodingError) as info:
        make_decoder("gzip", max_output_bytes=0).feed(gzip.compress(b"x"))
    assert info.value.code == "decompression_limit"


def test_identity_with_limits():
    d = make_decoder(None, max_ratio=1, ratio_allowance_bytes=0)
    chunk = b"data: x\n\n"
    assert d.feed(chunk) is chunk  # output == input never exceeds a ratio >= 1
    d = make_decoder("identity", max_output_bytes=10)
    assert d.feed(b"0123456789") == b"0123456789"
    with pytest.raises(ContentDecodingError) as info:
        d.feed(b"!")
    assert info.value.code == "decompression_limit"
    with pytest.raises(ContentDecodingError):
        d.close()


@pytest.mark.parametrize("coding", ["gzip", "deflate", "deflate-raw", "br", "zstd"])
def test_flushed_sse_with_limits_decodes_as_without(coding):
    pieces = _flushed_pieces(coding)
    d = make_decoder(_decoder_name(coding), max_ratio=RATIO)
    for event, piece in zip(EVENTS, pieces, strict=False):  # pieces end with the trailer
        assert d.feed(piece) == event
        assert d.complete is False
    assert d.feed(pieces[-1]) == b""
    assert d.close() == b""
    assert d.complete is True
    body = b"".join(pieces)
    for chunks in ([body], bytewise(body)):
        d = make_decoder(_decoder_name(coding), max_ratio=RATIO, ratio_allowance_bytes=0)
        out = b"".join(d.feed(c) for c in chunks) + d.close()
        assert (out, d.complete) == (PLAIN, True)


@settings(max_examples=200, deadline=None)
@given(
    coding=st.sampled_from(["gzip", "deflate", "deflate-raw", "br", "zstd", "gzip, br"]),
    points=CUT_POINTS,
    allowance=st.sampled_from([0, 1 << 20]),
)
def test_random_splits_with_limits_give_same_plaintext(coding, points, allowance):
    if coding == "gzip, br":
        body = brotli.compress(gzip.compress(PLAIN))
    else:
        body = b"".join(_flushed_pieces(coding))
    name = _decoder_name(coding)
    expected = decode_all(name, split_at(body, points))
    assert expected == (PLAIN, True)
    d = make_decoder(name, max_ratio=RATIO, ratio_allowance_bytes=allowance, max_output_bytes=len(PLAIN))
    assert (feed(d, split_at(body, points)), d.complete) == expected


def _repetitive_stream(events: int) -> bytes:
    """A model repeating itself: compresses 20-35x, far more than prose, far less than a bomb."""
    rnd = random.Random(0)
    words = ["the", "model", "keeps", "repeating", "itself"]
    return b"".join(
        b'data: {"type":"content_block_delta","index":0,"seq":%d,"delta":{"type":"text_delta","text":"%s"}}\n\n'
        % (i, " ".join(rnd.choice(words) for _ in range(2)).encode())
        for i in range(events)
    )


REPETITIVE = _repetitive_stream(30_000)  # ~3.3 MB, beyond the 1 MiB allowance


@pytest.mark.parametrize("coding", LIMIT_CODINGS)
def test_repetitive_stream_below_ratio_passes(coding):
    body = _compress(coding, REPETITIVE)
    assert 10 < len(REPETITIVE) / len(body) < RATIO / 2
    d = make_decoder(_decoder_name(coding), max_ratio=RATIO)
    out = b"".join(d.feed(body[i : i + CHUNK]) for i in range(0, len(body), CHUNK)) + d.close()
    assert (out, d.complete) == (REPETITIVE, True)
    # The same stream against a ratio it does exceed is stopped (the limit is real).
    d = make_decoder(_decoder_name(coding), max_ratio=2, ratio_allowance_bytes=0)
    with pytest.raises(ContentDecodingError) as info:
        for i in range(0, len(body), CHUNK):
            d.feed(body[i : i + CHUNK])
    assert info.value.code == "decompression_limit"


def test_without_limits_output_is_unbounded():
    body = gzip.compress(bytes(8 * MiB), 9)
    assert len(body) * 500 < 8 * MiB
    assert decode_all("gzip", [body]) == (bytes(8 * MiB), True)


@pytest.mark.parametrize(
    "kwargs",
    [{"max_ratio": 0}, {"max_ratio": -1}, {"max_ratio": 10, "ratio_allowance_bytes": -1}, {"max_output_bytes": -1}],
)
def test_invalid_limits_rejected(kwargs):
    with pytest.raises(ValueError):
        make_decoder("gzip", **kwargs)


@pytest.mark.parametrize(
    ("coding", "body"),
    [
        ("gzip", b"not gzip at all"),
        ("deflate", b"\x78\x9c" + b"\xff" * 20),
        ("br", b"\xff" * 20),
        ("br", brotli.compress(b"hello") + b"extra"),
        ("zstd", zstd.compress(b"hello") + b"garbage!"),
        ("gzip, br", brotli.compress(b"not gzip")),
    ],
)
def test_corrupt_input_with_limits_is_still_corrupt(coding, body):
    d = make_decoder(coding, max_ratio=RATIO, max_output_bytes=MiB)
    with pytest.raises(ContentDecodingError) as info:
        d.feed(body)
        d.close()
    assert info.value.code == "content_decoding_error"
    with pytest.raises(ContentDecodingError) as again:
        d.feed(b"more")
    assert again.value is info.value


def test_gzip_trailing_garbage_and_members_with_limits():
    body = gzip.compress(b"first ") + gzip.compress(b"second") + b"\x00junk"
    for chunks in ([body], bytewise(body)):
        d = make_decoder("gzip", max_output_bytes=len(b"first second"))
        assert (b"".join(d.feed(c) for c in chunks) + d.close(), d.complete) == (b"first second", True)
