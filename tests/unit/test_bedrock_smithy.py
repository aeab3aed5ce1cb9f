"""Bedrock event streams produced by an independent encoder, smithy-aws-event-stream, checked
against botocore's decoder and ours, then recorded by the Bedrock dialects.

Where the values come from:

- The bytes: ``smithy_aws_event_stream.events.EventMessage(headers=..., payload=...).encode()``
  of smithy-aws-event-stream 0.3.0 (AWS's Smithy runtime for Python, pinned with smithy-core
  0.9.0 in ``requirements-clients.lock``): the prelude (two lengths, CRC-32), string headers
  (type 7, ``u16`` length) in the dict's order, the payload and the message CRC. Nothing here
  encodes a frame by hand (the stdlib encoder of ``tests/fixtures/wire/binary/generate.py`` is
  the project's own; this module replaces it with AWS's).
- The first oracle: botocore's ``botocore.eventstream.EventStreamBuffer`` (botocore 1.44.8, the
  decoder boto3 uses for Bedrock's response streams): the headers and payloads it decodes must
  equal what was encoded, in wire order; on a bad message CRC it raises its ``ChecksumMismatch``
  ("Checksum mismatch: expected 0x..., calculated 0x...").
- The second decoder: ``observer.wire.eventstream.EventStreamDecoder`` must give the same
  headers and payloads, whatever the chunking, and on a bad message CRC a ``checksum_mismatch``
  violation with botocore's two CRC values, then the following message.
- The event names and payload shapes: AWS Bedrock API reference "ConverseStream"
  (``ConverseStreamOutput``: ``messageStart.role``, ``contentBlockDelta.contentBlockIndex`` /
  ``delta.text``, ``contentBlockStop``, ``messageStop.stopReason`` ``end_turn``,
  ``metadata.usage`` ``inputTokens`` / ``outputTokens`` / ``totalTokens`` and
  ``metadata.metrics.latencyMs``; the modelled ``throttlingException`` with its ``message``) and
  "InvokeModelWithResponseStream" (``chunk`` events: ``PayloadPart.bytes``, base64 of the model's
  JSON; for Anthropic models the events of Anthropic's "Streaming messages" plus the final
  ``amazon-bedrock-invocationMetrics``); the headers ``:event-type``, ``:content-type``
  ``application/json``, ``:message-type`` ``event`` / ``exception`` with ``:exception-type``
  from the AWS "Event stream encoding" description (and smithy's ``EventMessage`` docstring).
  The ``p`` padding field is what Bedrock adds to each payload (the reference's verified
  132-byte ``messageStart`` frame of ``test_eventstream.py`` carries ``"p": "abcd"``).
- The expected records are written by hand from those documents and the decisions of
  ``observer/dialects/bedrock.py``'s docstring (the stream never names the model for Converse,
  so ``model`` is ``None`` and ``request_model`` is the URL's; Anthropic's ``message_start``
  names it for InvokeModel), as in ``tests/fixtures/wire/bedrock.*/*.expected.json``; the
  ``events`` counts are the canonical events listed beside each expectation.

Each stream is fed whole, one byte at a time and cut at seeded random points. Without
smithy-aws-event-stream or botocore (a machine without the clients lock) the module is skipped.
"""

from __future__ import annotations

import base64
import json
import random
import re
import struct
import zlib

import pytest

from observer.dialects.bedrock import EVENT_STREAM
from observer.records import Violation
from observer.wire.eventstream import EventStreamDecoder, EventStreamMessage
from tests.wirefeed import assert_matches, bytewise, feed_each_way, observe, split_at

smithy_aws_event_stream = pytest.importorskip("smithy_aws_event_stream", reason="smithy-aws-event-stream not installed")
smithy_events = pytest.importorskip("smithy_aws_event_stream.events")
botocore_eventstream = pytest.importorskip("botocore.eventstream", reason="botocore not installed")

CLAUDE = "anthropic.claude-3-5-sonnet-20240620-v1:0"
CONVERSE_PATH = f"/model/{CLAUDE}/converse-stream"
INVOKE_PATH = f"/model/{CLAUDE}/invoke-with-response-stream"
CONVERSE_REQUEST = json.dumps(
    {"messages": [{"role": "user", "content": [{"text": "Say hello"}]}], "inferenceConfig": {"maxTokens": 64}}
).encode()
INVOKE_REQUEST = json.dumps(
    {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}]}
).encode()
SEEDS = range(5)


# -- producing frames with smithy ------------------------------------------------------------------


def event_headers(event_type: str) -> dict[str, str]:
    """A Bedrock event's three string headers (AWS "Event stream encoding"; ConverseStream)."""
    return {":event-type": event_type, ":content-type": "application/json", ":message-type": "event"}


def exception_headers(exception_type: str) -> dict[str, str]:
    """A modelled exception's headers (smithy ``EventMessage`` docstring: ``:message-type``
    ``exception`` with ``:exception-type``; Bedrock sends ``:content-type`` too)."""
    return {":exception-type": exception_type, ":content-type": "application/json", ":message-type": "exception"}


def smithy_encode(headers: dict[str, str], payload: bytes) -> bytes:
    """One frame as smithy-aws-event-stream 0.3.0 encodes it."""
    return smithy_events.EventMessage(headers=headers, payload=payload).encode()


def compact(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


TEXTS = ["Hello", ", w\u00f6rld", " \u2615", " \U0001f600 bye."]  # 1-, 2-, 3- and 4-byte UTF-8 split too

CONVERSE = [
    (event_headers("messageStart"), compact({"p": "abcd", "role": "assistant"})),
    *(
        (
            event_headers("contentBlockDelta"),
            compact({"contentBlockIndex": 0, "delta": {"text": t}, "p": "ab"[: i % 3]}),
        )
        for i, t in enumerate(TEXTS)
    ),
    (event_headers("contentBlockStop"), compact({"contentBlockIndex": 0, "p": "abcdefg"})),
    (event_headers("messageStop"), compact({"p": "abc", "stopReason": "end_turn"})),
    (
        event_headers("metadata"),
        compact(
            {
                "metrics": {"latencyMs": 412},
                "p": "abcdef",
                "usage": {"inputTokens": 21, "outputTokens": 9, "totalTokens": 30},
            }
        ),
    ),
]

# Anthropic's "Streaming messages" events as Bedrock's InvokeModelWithResponseStream wraps them.
ANTHROPIC_EVENTS = [
    {
        "type": "message_start",
        "message": {
            "id": "msg_bdrk_01Smithy",
            "type": "message",
            "role": "assistant",
            "model": "claude-3-5-sonnet-20240620",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 13, "output_tokens": 1},
        },
    },
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Bon"}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "jour \u00e0 vous"}},
    {"type": "content_block_stop", "index": 0},
    {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": 5},
    },
    {
        "type": "message_stop",
        "amazon-bedrock-invocationMetrics": {
            "inputTokenCount": 13,
            "outputTokenCount": 5,
            "invocationLatency": 530,
            "firstByteLatency": 210,
        },
    },
]

INVOKE = [
    (
        event_headers("chunk"),
        compact({"bytes": base64.b64encode(compact(e)).decode("ascii"), "p": "abcdefghij"[: i + 1]}),
    )
    for i, e in enumerate(ANTHROPIC_EVENTS)
]

THROTTLED = "Too many requests, please wait before trying again."
EXCEPTION = [
    CONVERSE[0],
    CONVERSE[1],
    (exception_headers("throttlingException"), compact({"message": THROTTLED})),
]

STREAMS = {"converse": CONVERSE, "invoke": INVOKE, "exception": EXCEPTION}


def stream_bytes(messages: list[tuple[dict[str, str], bytes]]) -> bytes:
    return b"".join(smithy_encode(h, p) for h, p in messages)


# -- decoding -------------------------------------------------------------------------------------


def seeded_chunks(data: bytes, seed: int) -> list[bytes]:
    """``data`` cut at 40 points drawn from ``random.Random(seed)``."""
    rng = random.Random(seed)
    return split_at(data, [rng.randrange(len(data) + 1) for _ in range(40)])


def botocore_decoded(chunks: list[bytes]) -> list[tuple[list, bytes]]:
    """botocore's ``EventStreamBuffer`` fed ``chunks``: each message's headers (as a list of
    pairs: wire order counts) and payload."""
    buf = botocore_eventstream.EventStreamBuffer()
    out = []
    for chunk in chunks:
        buf.add_data(chunk)
        out += [(list(m.headers.items()), m.payload) for m in buf]
    return out


def ours_decoded(data: bytes, seed: int) -> list:
    """Our decoder's output for ``data`` whole, byte by byte and cut at seeded points (the three
    asserted equal by ``feed_each_way``)."""
    rng = random.Random(seed)
    return feed_each_way(EventStreamDecoder, data, [rng.randrange(len(data) + 1) for _ in range(40)])


def feeds(data: bytes) -> dict[str, list[bytes]]:
    """The chunkings every stream is fed in: whole, one byte at a time, seeded random cuts."""
    return {"whole": [data], "bytewise": bytewise(data), **{f"seed{s}": seeded_chunks(data, s) for s in SEEDS}}


def test_the_encoder_is_the_pinned_smithy_aws_event_stream():
    """The docstrings cite smithy-aws-event-stream 0.3.0 (``requirements-clients.lock``)."""
    assert smithy_aws_event_stream.__version__ == "0.3.0"


@pytest.mark.parametrize("name", list(STREAMS))
def test_smithy_frames_decode_the_same_in_botocore_and_ours(name):
    """Every smithy-produced frame of the stream: botocore decodes exactly the encoded headers
    (names, string values, wire order) and payload, whatever the chunking; ours gives the same
    headers and payloads, and ``size_bytes`` is each frame's length as smithy encoded it."""
    messages = STREAMS[name]
    frames = [smithy_encode(h, p) for h, p in messages]
    data = b"".join(frames)
    encoded = [(list(h.items()), p) for h, p in messages]
    for how, chunks in feeds(data).items():
        assert botocore_decoded(chunks) == encoded, f"botocore, fed {how}"
    for seed in SEEDS:
        ours = ours_decoded(data, seed)
        assert all(isinstance(m, EventStreamMessage) for m in ours), ours
        assert [(list(m.headers.items()), m.payload) for m in ours] == encoded
        assert [m.size_bytes for m in ours] == [len(f) for f in frames]


def test_smithy_frame_layout_is_the_documented_one():
    """One smithy frame read against the format (AWS "Event stream encoding"): total_length
    and headers_length big-endian, the prelude CRC-32 of their 8 bytes, a string header as
    ``name_len | name | 7 | u16 len | value``, the message CRC-32 of everything before it; the
    three headers of ``messageStart`` take 1+11+1+2+12, 1+13+1+2+16 (``application/json``) and
    1+13+1+2+5 (``event``) bytes."""
    headers, payload = CONVERSE[0]
    frame = smithy_encode(headers, payload)
    total, hlen, pcrc = struct.unpack(">III", frame[:12])
    assert hlen == (1 + 11 + 1 + 2 + 12) + (1 + 13 + 1 + 2 + 16) + (1 + 13 + 1 + 2 + 5)
    assert total == len(frame) == 16 + hlen + len(payload)
    assert pcrc == zlib.crc32(frame[:8])
    assert frame[12:27] == b"\x0b:event-type\x07\x00\x0c"
    assert frame[-4:] == struct.pack(">I", zlib.crc32(frame[:-4]))
    assert frame[12 + hlen : -4] == payload


# -- the records ------------------------------------------------------------------------------------

# Converse: messageStart -> stream start; four text deltas at block 0; contentBlockStop gives
# nothing; messageStop end_turn -> stop; metadata -> usage (input/output/total as sent; latencyMs
# is not recorded) and the stream's end. Canonical events: 1 + 4 + 1 + 1 + 1 = 8.
CONVERSE_RECORD = {
    "request_model": CLAUDE,
    "model": None,
    "text": "Hello, w\u00f6rld \u2615 \U0001f600 bye.",
    "blocks": [{"index": 0, "type": "text", "text": "Hello, w\u00f6rld \u2615 \U0001f600 bye.", "stop_reason": None}],
    "tool_calls": [],
    "usage": {
        "input_tokens": 21,
        "output_tokens": 9,
        "cache_read_input_tokens": None,
        "cache_creation_input_tokens": None,
        "reasoning_output_tokens": None,
        "total_tokens": 30,
        "details": None,
        "reported": True,
    },
    "stop_reason": "end_turn",
    "stop_reason_raw": "end_turn",
    "error": None,
    "outcome": "completed",
    "violations": [],
    "events": 8,
}

# InvokeModel (Anthropic): message_start -> stream start (model), its id msg_bdrk_01Smithy (the
# response_id) and usage 13/1;
# content_block_start -> an empty text delta; two text deltas; message_delta -> stop end_turn
# and output usage 5; message_stop -> the end (the invocation metrics repeat the usage: not added).
# Canonical events: start, usage, 3 deltas, stop, usage, end = 8.
INVOKE_RECORD = {
    "request_model": CLAUDE,
    "model": "claude-3-5-sonnet-20240620",
    "text": "Bonjour \u00e0 vous",
    "blocks": [{"index": 0, "type": "text", "text": "Bonjour \u00e0 vous", "stop_reason": None}],
    "tool_calls": [],
    "usage": {
        "input_tokens": 13,
        "output_tokens": 5,
        "cache_read_input_tokens": None,
        "cache_creation_input_tokens": None,
        "reasoning_output_tokens": None,
        "total_tokens": None,
        "details": None,
        "reported": True,
    },
    "response_id": "msg_bdrk_01Smithy",
    "stop_reason": "end_turn",
    "stop_reason_raw": "end_turn",
    "error": None,
    "outcome": "completed",
    "violations": [],
    "events": 8,
}

# A throttlingException after the first delta: the error (code = :exception-type, message =
# the payload's), no stop and no usage, and the stream never ended cleanly (as the hand-written
# fixture bedrock.converse/exception_mid_stream). Canonical events: start, delta, error = 3.
EXCEPTION_RECORD = {
    "request_model": CLAUDE,
    "model": None,
    "text": "Hello",
    "blocks": [{"index": 0, "type": "text", "text": "Hello", "stop_reason": None}],
    "tool_calls": [],
    "usage": {
        "input_tokens": None,
        "output_tokens": None,
        "cache_read_input_tokens": None,
        "cache_creation_input_tokens": None,
        "reasoning_output_tokens": None,
        "total_tokens": None,
        "details": None,
        "reported": False,
    },
    "stop_reason": None,
    "error": {"code": "throttlingException", "message": THROTTLED},
    "outcome": "error",
    "violations": [{"kind": "missing_stream_end", "seq": None, "detail": "*"}],
    "events": 3,
}

EXCHANGES = {
    "converse": ("bedrock.converse", CONVERSE_REQUEST, CONVERSE_PATH, CONVERSE_RECORD),
    "invoke": ("bedrock.invoke", INVOKE_REQUEST, INVOKE_PATH, INVOKE_RECORD),
    "exception": ("bedrock.converse", CONVERSE_REQUEST, CONVERSE_PATH, EXCEPTION_RECORD),
}


def record_of(name: str, chunks: list[bytes], *, general: bool = False) -> dict:
    dialect, request, path, _ = EXCHANGES[name]
    return observe(dialect, request, chunks, content_type=EVENT_STREAM, path=path, general=general)


@pytest.mark.parametrize("general", [False, True], ids=["tap", "general"])
@pytest.mark.parametrize("name", list(EXCHANGES))
def test_smithy_streams_give_the_hand_written_record(name, general):
    """The smithy-produced stream through the dialect (its fast lane, and the general
    ``on_message`` mapping alone) gives the hand-written record in every chunking."""
    data = stream_bytes(STREAMS[name])
    want = EXCHANGES[name][3]
    for how, chunks in feeds(data).items():
        try:
            assert_matches(record_of(name, chunks, general=general), want)
        except AssertionError as exc:
            raise AssertionError(f"fed {how}: {exc}") from exc


# -- a corrupted message CRC ------------------------------------------------------------------------

BAD = 2  # the second contentBlockDelta (", wörld") of CONVERSE


def corrupted_converse() -> tuple[bytes, int, int]:
    """The Converse stream with one payload byte of frame ``BAD`` flipped (its CRCs left as
    smithy computed them): (bytes, the frame's stream offset, its length)."""
    frames = [smithy_encode(h, p) for h, p in CONVERSE]
    at = sum(len(f) for f in frames[:BAD])
    frame = bytearray(frames[BAD])
    hlen = struct.unpack(">I", frame[4:8])[0]
    frame[12 + hlen + 5] ^= 0x20  # inside the JSON payload: '"' -> '\x02'
    return b"".join(frames[:BAD]) + bytes(frame) + b"".join(frames[BAD + 1 :]), at, len(frame)


def test_botocore_rejects_the_corrupted_smithy_frame():
    """botocore (the oracle) yields the frames before and raises ``ChecksumMismatch`` on the
    flipped one, with the CRC smithy sent and the one of the bytes received."""
    data, at, size = corrupted_converse()
    sent = struct.unpack(">I", data[at + size - 4 : at + size])[0]
    calculated = zlib.crc32(data[at : at + size - 4])
    buf = botocore_eventstream.EventStreamBuffer()
    buf.add_data(data)
    assert [next(buf).payload for _ in range(BAD)] == [p for _, p in CONVERSE[:BAD]]
    with pytest.raises(botocore_eventstream.ChecksumMismatch) as caught:
        next(buf)
    assert f"expected 0x{sent:08x}, calculated 0x{calculated:08x}" in str(caught.value)


def test_our_decoder_reports_the_corrupted_smithy_frame_and_recovers():
    """Ours: the frames before, one ``checksum_mismatch`` naming the frame's offset and length
    and botocore's two CRC values, then every following frame (the prelude was good, so the
    frame's extent is known), in every chunking."""
    data, at, size = corrupted_converse()
    buf = botocore_eventstream.EventStreamBuffer()
    buf.add_data(data)
    for _ in range(BAD):
        next(buf)
    with pytest.raises(botocore_eventstream.ChecksumMismatch) as caught:
        next(buf)
    sent, calculated = re.findall(r"0x([0-9a-f]{8})", str(caught.value))
    want_violation = Violation(
        "checksum_mismatch",
        None,
        f"message CRC mismatch in the frame at byte {at} ({size} bytes): expected 0x{sent},"
        f" calculated 0x{calculated}; frame skipped",
    )
    for seed in SEEDS:
        out = ours_decoded(data, seed)
        assert out[BAD] == want_violation
        got = [(list(m.headers.items()), m.payload) for m in out[:BAD] + out[BAD + 1 :]]
        assert got == [(list(h.items()), p) for h, p in CONVERSE[:BAD] + CONVERSE[BAD + 1 :]]


# The record of the corrupted stream: the lost delta's text is missing, the rest as in
# CONVERSE_RECORD, with the decoder's checksum_mismatch; canonical events 8 - 1 = 7.
CORRUPTED_RECORD = {
    **CONVERSE_RECORD,
    "text": "Hello \u2615 \U0001f600 bye.",
    "blocks": [{"index": 0, "type": "text", "text": "Hello \u2615 \U0001f600 bye.", "stop_reason": None}],
    "violations": [{"kind": "checksum_mismatch", "seq": None, "detail": "*"}],
    "events": 7,
}


def test_the_dialect_records_the_corrupted_smithy_stream():
    """Through the Converse dialect the corrupted frame is a violation and the rest of the
    stream is recorded (stop, usage, clean end), in every chunking."""
    data, _, _ = corrupted_converse()
    for how, chunks in feeds(data).items():
        try:
            assert_matches(record_of("converse", chunks), CORRUPTED_RECORD)
        except AssertionError as exc:
            raise AssertionError(f"fed {how}: {exc}") from exc
