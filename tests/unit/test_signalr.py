"""Tests for observer.wire.signalr (SignalR hub protocol: handshake, JSON records, MessagePack frames).

Fixtures: ``tests/fixtures/wire/signalr/*.ws.json`` (``generate.py`` there) and ``js_frames.json``
(frames written by the official ``@microsoft/signalr-protocol-msgpack``). The expected messages
below are written by hand from HubProtocol.md and the reference (§2-§3), not derived from the
generator. Every conversation is fed three ways -- one WebSocket message per feed, one byte per
feed, and cut at seeded random offsets across message boundaries -- and must decode the same.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from observer.records import Violation
from observer.wire.signalr import (
    Handshake,
    HubMessage,
    HubProtocol,
    JsonRecordDecoder,
    MessagePackDecoder,
    decoder_for,
    parse_handshake,
)
from tests.wirefeed import CUT_POINTS, bytewise, feed, split_at

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "wire" / "signalr"
RS = b"\x1e"
SEEDS = range(8)


def malformed(detail: str) -> Violation:
    return Violation(kind="malformed_frame", seq=None, detail=detail)


def invalid(detail: str) -> Violation:
    return Violation(kind="invalid_json", seq=None, detail=detail)


def oversize(detail: str) -> Violation:
    return Violation(kind="oversize_event", seq=None, detail=detail)


def unterminated(detail: str) -> Violation:
    return Violation(kind="unterminated_final_event", seq=None, detail=detail)


def frame(body: bytes) -> bytes:
    """A MessagePack hub frame around ``body``, the VarInt written out by hand (HubProtocol.md)."""
    n = len(body)
    prefix = bytearray()
    while n > 0x7F:
        prefix.append((n & 0x7F) | 0x80)
        n >>= 7
    prefix.append(n)
    return bytes(prefix) + body


def pack(obj: object) -> bytes:
    return frame(msgpack.packb(obj, use_bin_type=True))


def load(case: str) -> dict:
    return json.loads((FIXTURES / f"{case}.ws.json").read_text(encoding="utf-8"))


def contents(case: str, from_client: bool) -> list[bytes]:
    """The contents of one direction's WebSocket messages, in order."""
    return [
        m["text"].encode() if m["type"] == "text" else bytes.fromhex(m["hex"])
        for m in load(case)["messages"]
        if m["from_client"] is from_client
    ]


def random_cuts(data: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return split_at(data, [rng.randrange(len(data) + 1) for _ in range(rng.randrange(1, 12))])


def each_way(new_decoder, messages: list[bytes]) -> list:
    """What fresh decoders give for ``messages`` fed one per call, one byte per call and cut at
    seeded random offsets of their concatenation; asserts the three agree and returns it."""
    whole = feed(new_decoder(), messages)
    stream = b"".join(messages)
    assert feed(new_decoder(), bytewise(stream)) == whole, "one byte at a time differs"
    for seed in SEEDS:
        chunks = random_cuts(stream, seed)
        assert feed(new_decoder(), chunks) == whole, f"seed {seed}: cut into {[len(c) for c in chunks]} differs"
    return whole


def conversation(case: str, from_client: bool, protocol: HubProtocol) -> tuple[Handshake, list]:
    """One direction of a fixture: its handshake, then everything after it decoded each way."""
    first, *later = contents(case, from_client)
    handshake = parse_handshake(first)
    assert isinstance(handshake, Handshake), handshake
    return handshake, each_way(lambda: decoder_for(protocol), [handshake.rest, *later])


# -- the fixtures: expected messages by hand ----------------------------------------------------

REQUEST = Handshake(True, HubProtocol.JSON, "json", 1, None, 32)
MSGPACK_REQUEST = Handshake(True, HubProtocol.MESSAGEPACK, "messagepack", 1, None, 39)
ACCEPTED = Handshake(False, size_bytes=3)
PING = HubMessage(6, size_bytes=11)  # {"type":6} + RS
PROMPT = "Wie ist das Wetter in Wien?"
A1 = "Hello, this is"
A2 = "Hello, this is Bing. The weather"
A3 = "Hello, this is Bing. The weather in Vienna is sunny, 24 °C."

SYDNEY_CHAT = HubMessage(
    4,
    "0",
    "chat",
    [
        {
            "source": "cib",
            "optionsSets": ["nlu_direct_response_filter", "deepleo", "h3imaginative"],
            "isStartOfSession": True,
            "message": {"author": "user", "inputMethod": "Keyboard", "text": PROMPT, "messageType": "Chat"},
            "conversationSignature": "sig-1",
            "participant": {"id": "p-1"},
            "conversationId": "conv-1",
        }
    ],
    size_bytes=368,
)
SYDNEY_CLIENT = [PING, SYDNEY_CHAT]


def sydney_update(text: str, size: int, **message: object) -> HubMessage:
    """A server ``update`` invocation: no invocationId, one bot message (reference §3.1)."""
    args = [{"messages": [{"text": text, "author": "bot", **message}], "requestId": "req-1"}]
    return HubMessage(1, None, "update", args, size_bytes=size)


def sydney_final(answer: str, size: int, result: dict, origin: str = "DeepLeo") -> HubMessage:
    item = {
        "messages": [
            {"author": "user", "text": PROMPT},
            {"author": "bot", "text": answer, "contentOrigin": origin, "turnState": "Completed"},
        ],
        "firstNewMessageIndex": 1,
        "requestId": "req-1",
        "throttling": {"maxNumUserMessagesInConversation": 30, "numUserMessagesInConversation": 1},
        "result": result,
    }
    return HubMessage(2, "0", item=item, size_bytes=size)


COMPLETED = HubMessage(3, "0", size_bytes=30)  # {"type":3,"invocationId":"0"} + RS

EXPECTED: dict[str, dict[bool, tuple[Handshake, list]]] = {
    "sydney_turn": {
        True: (REQUEST, SYDNEY_CLIENT),
        False: (
            ACCEPTED,
            [
                sydney_update("Generating answers for you…", 177, messageType="Progress", messageId="m-0"),
                sydney_update(
                    "Searching the web for: `Wetter Wien`", 195, messageType="InternalSearchQuery", messageId="m-1"
                ),
                sydney_update(A1, 137, messageId="m-2"),
                sydney_update(A2, 155, messageId="m-2"),
                PING,
                sydney_update(A3, 183, messageId="m-2"),
                sydney_final(A3, 478, {"value": "Success", "message": A3}),
                COMPLETED,
            ],
        ),
    },
    "sydney_apology": {
        True: (REQUEST, SYDNEY_CLIENT),
        False: (
            ACCEPTED,
            [
                sydney_update("I'm sorry, I", 135, messageId="m-2"),
                sydney_update("I'm sorry, I cannot help with that.", 184, messageId="m-3", contentOrigin="Apology"),
                sydney_final(
                    "I'm sorry, I cannot help with that.",
                    428,
                    {"value": "Success", "message": "I'm sorry, I cannot help with that."},
                    origin="Apology",
                ),
                COMPLETED,
            ],
        ),
    },
    "sydney_throttled": {
        True: (REQUEST, SYDNEY_CLIENT),
        False: (
            ACCEPTED,
            [sydney_final("", 381, {"value": "Throttled", "message": "Request is throttled."}), COMPLETED],
        ),
    },
    "sydney_completion_error": {
        True: (REQUEST, SYDNEY_CLIENT),
        False: (
            ACCEPTED,
            [
                sydney_update(A1, 137, messageId="m-2"),
                HubMessage(3, "0", error="An unexpected error occurred.", size_bytes=70),
            ],
        ),
    },
    "sydney_dropped": {
        True: (REQUEST, SYDNEY_CLIENT),
        False: (ACCEPTED, [sydney_update(A1, 137, messageId="m-2"), sydney_update(A2, 155, messageId="m-2")]),
    },
    "sydney_close_error": {
        True: (REQUEST, SYDNEY_CLIENT),
        False: (
            ACCEPTED,
            [
                sydney_update(A1, 137, messageId="m-2"),
                HubMessage(7, error="Connection closed with an error.", allow_reconnect=True, size_bytes=76),
            ],
        ),
    },
    "m365_turn": {
        True: (
            REQUEST,
            [
                HubMessage(
                    4,
                    "0",
                    "chat",
                    [
                        {
                            "source": "cib",
                            "optionsSets": ["nlu_direct_response_filter", "deepleo", "h3imaginative"],
                            "isStartOfSession": True,
                            "message": {
                                "author": "user",
                                "inputMethod": "Keyboard",
                                "text": "Summarise my last meeting",
                                "messageType": "Chat",
                            },
                            "conversationSignature": "sig-1",
                            "participant": {"id": "p-1"},
                            "conversationId": "conv-1",
                            "tone": "Reasoning",
                            "plugins": [{"Id": "BingWebSearch", "Source": "BuiltIn"}],
                            "streamingMode": "ConciseWithPadding",
                        }
                    ],
                    size_bytes=476,
                ),
                HubMessage(1, None, "Metrics", [{"name": "TurnEnd"}], size_bytes=63),
            ],
        ),
        False: (
            ACCEPTED,
            [
                HubMessage(
                    1,
                    None,
                    "update",
                    [
                        {
                            "messages": [
                                {
                                    "text": "Reading",
                                    "author": "bot",
                                    "messageType": "Progress",
                                    "contentType": "EarlyProgress",
                                }
                            ],
                            "requestId": "req-9",
                        }
                    ],
                    size_bytes=167,
                ),
                *(
                    HubMessage(
                        1,
                        None,
                        "update",
                        [
                            {
                                "writeAtCursor": delta,
                                "messages": [{"text": text, "author": "bot", "messageId": "b-1"}],
                                "requestId": "req-9",
                            }
                        ],
                        size_bytes=size,
                    )
                    for delta, text, size in [
                        ("The meeting", "The meeting", 164),
                        (" agreed on", "The meeting agreed on", 173),
                        (" Q3 goals.", "The meeting agreed on Q3 goals.", 183),
                    ]
                ),
                HubMessage(
                    2,
                    "0",
                    item={
                        "messages": [
                            {"author": "user", "text": "Summarise my last meeting"},
                            {"author": "bot", "text": "The meeting agreed on Q3 goals.", "turnState": "Completed"},
                        ],
                        "throttling": {"maxNumUserMessagesInConversation": 600, "numUserMessagesInConversation": 2},
                        "conversationExpiryTime": "2026-07-11T10:00:00Z",
                        "result": {"value": "Success"},
                    },
                    size_bytes=352,
                ),
                COMPLETED,
            ],
        ),
    },
    "msgpack_pysignalr": {
        True: (
            MSGPACK_REQUEST,
            [HubMessage(4, "0", "chat", [{"message": {"author": "user", "text": PROMPT}}], size_bytes=68)],
        ),
        False: (
            ACCEPTED,
            [
                HubMessage(1, None, "update", [{"text": "Hello, this"}], size_bytes=31),  # prefix 0x1E + 30
                HubMessage(1, None, "update", [{"text": A2}], size_bytes=53),
                HubMessage(6, size_bytes=3),  # 0x02 0x91 0x06
                HubMessage(
                    2,
                    "0",
                    item={
                        "messages": [{"author": "bot", "text": A3, "turnState": "Completed"}],
                        "throttling": {"maxNumUserMessagesInConversation": 30, "numUserMessagesInConversation": 1},
                        "result": {"value": "Success"},
                    },
                    size_bytes=217,  # 2-byte VarInt + 215
                ),
                HubMessage(3, "0", size_bytes=7),  # void: [3, {}, "0", 2]
            ],
        ),
    },
    "msgpack_js": {
        True: (
            Handshake(True, HubProtocol.MESSAGEPACK, "messagepack", 1, None, 39),
            [
                HubMessage(4, "0", "chat", [{"message": {"author": "user", "text": "Hi"}}], size_bytes=43),
                HubMessage(7, size_bytes=4),  # [7, nil]: 0x03 0x92 0x07 0xc0
            ],
        ),
        False: (
            ACCEPTED,
            [
                HubMessage(6, size_bytes=3),
                HubMessage(1, None, "update", [{"text": "Hi there"}], headers={"x-trace": "t-1"}, size_bytes=40),
                HubMessage(3, "0", error="Stream failed: quota exceeded.", size_bytes=38),
            ],
        ),
    },
}


@pytest.mark.parametrize("case", sorted(EXPECTED))
@pytest.mark.parametrize("from_client", [True, False], ids=["client", "server"])
def test_fixture_conversations(case, from_client):
    """Each direction of each conversation decodes to the hand-written messages, fed whole
    messages, one byte at a time and in random cuts across message boundaries."""
    protocol = HubProtocol.MESSAGEPACK if case.startswith("msgpack") else HubProtocol.JSON
    handshake, got = conversation(case, from_client, protocol)
    want_handshake, want = EXPECTED[case][from_client]
    assert handshake == want_handshake
    assert got == want
    # The sizes account for every byte of the direction (no violations in these fixtures).
    assert handshake.size_bytes + sum(m.size_bytes for m in got) == sum(map(len, contents(case, from_client)))


def test_fixture_cases_all_checked():
    """Every SignalR fixture has its expectation here (the Copilot consumer ones: test_jsonseq)."""
    names = {p.name.removesuffix(".ws.json") for p in FIXTURES.glob("*.ws.json")}
    assert {n for n in names if not n.startswith("copilot_consumer")} == set(EXPECTED)


def test_fixtures_match_their_generator(tmp_path):
    """The checked-in fixtures are what generate.py writes (byte for byte)."""
    gen = FIXTURES / "generate.py"
    shutil.copy(gen, tmp_path / "generate.py")
    subprocess.run([sys.executable, str(tmp_path / "generate.py")], check=True, cwd=tmp_path)
    for written in tmp_path.glob("*.ws.json"):
        assert written.read_bytes() == (FIXTURES / written.name).read_bytes(), written.name


def test_msgpack_payload_holds_0x1e_and_is_not_split_there():
    """The final StreamItem's body contains 0x1E and the 30-byte update's prefix is 0x1E: a
    decoder that split on 0x1E would break both."""
    server = contents("msgpack_pysignalr", False)
    assert server[1][0] == 0x1E  # the length prefix of a 30-byte body
    assert RS in server[3][2:]  # inside the final item's body (after its 2-byte prefix)
    assert server[3][:2] == bytes([0xD7, 0x01])  # 215 = 0x57 | 0x80, then 1


# -- the handshake ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "want"),
    [
        (b'{"protocol":"json","version":1}\x1e', REQUEST),
        (b'{"protocol":"messagepack","version":1}\x1e', MSGPACK_REQUEST),
        (b'{ "protocol" : "json", "version" : 1 }\x1e', Handshake(True, HubProtocol.JSON, "json", 1, None, 39)),
        # @microsoft/signalr 10 with stateful reconnect asks for version 2.
        (b'{"protocol":"json","version":2}\x1e', Handshake(True, HubProtocol.JSON, "json", 2, None, 32)),
        # A protocol this module does not decode (Blazor Server): named, not decoded.
        (b'{"protocol":"blazorpack","version":1}\x1e', Handshake(True, None, "blazorpack", 1, None, 38)),
        (b"{}\x1e", ACCEPTED),
        (b'{"minorVersion":1}\x1e', Handshake(False, size_bytes=19)),
        (b'{"error":null}\x1e', Handshake(False, size_bytes=15)),
        (
            b'{"error":"Requested protocol \'messagepack\' is not available."}\x1e',
            Handshake(False, error="Requested protocol 'messagepack' is not available.", size_bytes=63),
        ),
        # Records after the handshake in the same message are handed back.
        (b'{}\x1e{"type":6}\x1e', Handshake(False, size_bytes=3, rest=b'{"type":6}\x1e')),
        (
            b'{"protocol":"messagepack","version":1}\x1e\x02\x91\x06',
            Handshake(True, HubProtocol.MESSAGEPACK, "messagepack", 1, None, 39, b"\x02\x91\x06"),
        ),
    ],
)
def test_handshake(content, want):
    assert parse_handshake(content) == want
    assert parse_handshake(bytearray(content)) == want


@pytest.mark.parametrize(
    ("content", "want"),
    [
        (
            b'{"protocol":"json","version":1}',
            malformed("no 0x1E in the message (31 bytes): not a whole SignalR handshake"),
        ),
        (b"", malformed("no 0x1E in the message (0 bytes): not a whole SignalR handshake")),
        (b"x" * 5000 + RS, oversize("handshake exceeded 4096 bytes without its 0x1E")),
        (
            b"{protocol}\x1e",
            invalid(
                "handshake is not valid JSON: unexpected character, expected a string key: line 1 column 2 (char 1)"
            ),
        ),
        (b"[1]\x1e", malformed("handshake is not a JSON object")),
        (b'{"type":6}\x1e', malformed("a hub message (it has 'type'), not a handshake")),
        (b'{"protocol":1,"version":1}\x1e', malformed("handshake request: 'protocol' must be a string")),
        (b'{"protocol":"json"}\x1e', malformed("handshake request: 'version' must be an integer")),
        (b'{"protocol":"json","version":true}\x1e', malformed("handshake request: 'version' must be an integer")),
        (b'{"protocol":"json","version":"1"}\x1e', malformed("handshake request: 'version' must be an integer")),
        (b'{"error":42}\x1e', malformed("handshake response: 'error' must be a string")),
    ],
)
def test_handshake_violations(content, want):
    assert parse_handshake(content) == want


def test_handshake_bound():
    assert parse_handshake(b"{}" + b" " * 20 + RS, max_bytes=10) == oversize(
        "handshake exceeded 10 bytes without its 0x1E"
    )
    assert parse_handshake(b"{}" + b" " * 8 + RS, max_bytes=10) == Handshake(False, size_bytes=11)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_handshake_never_raises(data):
    assert isinstance(parse_handshake(data), Handshake | Violation)


# -- JSON records ------------------------------------------------------------------------------------


def json_decode(messages: list[bytes], max_record_bytes: int = 1 << 20) -> list:
    return each_way(lambda: JsonRecordDecoder(max_record_bytes), messages)


def test_json_spec_examples():
    """HubProtocol.md "JSON Encoding" examples, several records per message, headers and all."""
    records = [
        b'{"type":1,"invocationId":"123","target":"Send","arguments":[42,"Test Message"]}',
        b'{"type":1,"target":"Send","arguments":[42,"Test Message"]}',
        b'{"type":1,"invocationId":"123","target":"Send","arguments":[42],"streamIds":["1"]}',
        b'{"type":4,"invocationId":"123","target":"Send","arguments":[42,"Test Message"]}',
        b'{"type":2,"invocationId":"123","item":42}',
        b'{"type":3,"invocationId":"123"}',
        b'{"type":3,"invocationId":"123","result":42}',
        b'{"type":3,"invocationId":"123","error":"It didn\'t work!"}',
        b'{"type":3,"invocationId":"123","result":42,"error":"It didn\'t work!"}',
        b'{"type":5,"invocationId":"123"}',
        b'{"type":6}',
        b'{"type":7}',
        b'{"type":7,"error":"Connection closed because of an error!"}',
        b'{"type":7,"error":"Connection closed because of an error!","allowReconnect":true}',
        b'{"type":8,"sequenceId":1394}',
        b'{"type":9,"sequenceId":1234}',
        b'{"type":1,"headers":{"Foo":"Bar"},"invocationId":"123","target":"Send","arguments":[42,"Test Message"]}',
    ]
    sizes = [len(r) + 1 for r in records]
    got = json_decode([RS.join(records[:5]) + RS, RS.join(records[5:]) + RS])
    assert got == [
        HubMessage(1, "123", "Send", [42, "Test Message"], size_bytes=sizes[0]),
        HubMessage(1, None, "Send", [42, "Test Message"], size_bytes=sizes[1]),
        HubMessage(1, "123", "Send", [42], stream_ids=["1"], size_bytes=sizes[2]),
        HubMessage(4, "123", "Send", [42, "Test Message"], size_bytes=sizes[3]),
        HubMessage(2, "123", item=42, size_bytes=sizes[4]),
        HubMessage(3, "123", size_bytes=sizes[5]),
        HubMessage(3, "123", result=42, has_result=True, size_bytes=sizes[6]),
        HubMessage(3, "123", error="It didn't work!", size_bytes=sizes[7]),
        malformed("JSON hub message type 3 (Completion): both result and error (a protocol error)"),
        HubMessage(5, "123", size_bytes=sizes[9]),
        HubMessage(6, size_bytes=sizes[10]),
        HubMessage(7, size_bytes=sizes[11]),
        HubMessage(7, error="Connection closed because of an error!", size_bytes=sizes[12]),
        HubMessage(7, error="Connection closed because of an error!", allow_reconnect=True, size_bytes=sizes[13]),
        HubMessage(8, sequence_id=1394, size_bytes=sizes[14]),
        HubMessage(9, sequence_id=1234, size_bytes=sizes[15]),
        HubMessage(1, "123", "Send", [42, "Test Message"], headers={"Foo": "Bar"}, size_bytes=sizes[16]),
    ]


def test_json_null_and_empty_fields():
    """A null result is a result; null item is an item; empty headers/streamIds read as absent;
    unknown properties are ignored (ASP.NET skips them)."""
    got = json_decode(
        [
            b'{"type":3,"invocationId":"1","result":null}\x1e'
            b'{"type":2,"invocationId":"1","item":null,"headers":{}}\x1e'
            b'{"type":1,"target":"t","arguments":[],"streamIds":[],"extra":{"x":[1]}}\x1e'
            b'{"type":7,"error":null,"allowReconnect":null}\x1e'
        ]
    )
    assert got == [
        HubMessage(3, "1", has_result=True, size_bytes=44),
        HubMessage(2, "1", item=None, size_bytes=55),
        HubMessage(1, None, "t", [], size_bytes=72),
        HubMessage(7, size_bytes=46),
    ]


@pytest.mark.parametrize(
    ("record", "detail"),
    [
        (b"[1,2]", "JSON hub record is not an object"),
        (b'"x"', "JSON hub record is not an object"),
        (b"{}", "JSON hub record has no integer 'type'"),
        (b'{"type":"1"}', "JSON hub record has no integer 'type'"),
        (b'{"type":true}', "JSON hub record has no integer 'type'"),
        (b'{"type":1.0}', "JSON hub record has no integer 'type'"),
        (b'{"type":1,"arguments":[]}', "JSON hub message type 1 (Invocation): target must be a string"),
        (b'{"type":1,"target":"t"}', "JSON hub message type 1 (Invocation): arguments must be an array"),
        (b'{"type":1,"target":"t","arguments":{}}', "JSON hub message type 1 (Invocation): arguments must be an array"),
        (
            b'{"type":1,"invocationId":7,"target":"t","arguments":[]}',
            "JSON hub message type 1 (Invocation): invocationId must be a string",
        ),
        (
            b'{"type":1,"target":"t","arguments":[],"streamIds":[1]}',
            "JSON hub message type 1 (Invocation): streamIds must be an array of strings",
        ),
        (
            b'{"type":1,"target":"t","arguments":[],"headers":{"a":1}}',
            "JSON hub message type 1 (Invocation): headers must map strings to strings",
        ),
        (
            b'{"type":1,"target":"t","arguments":[],"headers":[]}',
            "JSON hub message type 1 (Invocation): headers must map strings to strings",
        ),
        (
            b'{"type":4,"target":"t","arguments":[]}',
            "JSON hub message type 4 (StreamInvocation): invocationId is required",
        ),
        (b'{"type":2,"item":1}', "JSON hub message type 2 (StreamItem): invocationId must be a string"),
        (b'{"type":2,"invocationId":"1"}', "JSON hub message type 2 (StreamItem): item is required"),
        (
            b'{"type":2,"invocationId":"1","item":1,"headers":{"a":null}}',
            "JSON hub message type 2 (StreamItem): headers must map strings to strings",
        ),
        (b'{"type":3,"invocationId":"1","error":5}', "JSON hub message type 3 (Completion): error must be a string"),
        (b'{"type":5}', "JSON hub message type 5 (CancelInvocation): invocationId must be a string"),
        (b'{"type":7,"error":["x"]}', "JSON hub message type 7 (Close): error must be a string"),
        (b'{"type":7,"allowReconnect":"yes"}', "JSON hub message type 7 (Close): allowReconnect must be a boolean"),
        (b'{"type":8}', "JSON hub message type 8 (Ack): sequenceId must be a non-negative integer"),
        (
            b'{"type":9,"sequenceId":-1}',
            "JSON hub message type 9 (Sequence): sequenceId must be a non-negative integer",
        ),
        (
            b'{"type":9,"sequenceId":false}',
            "JSON hub message type 9 (Sequence): sequenceId must be a non-negative integer",
        ),
    ],
)
def test_json_not_a_hub_message(record, detail):
    """A record of the wrong shape is reported and dropped; the next record still decodes."""
    assert json_decode([record + RS + b'{"type":6}\x1e']) == [malformed(detail), PING]


def test_json_unknown_type_kept():
    """Unknown types are ignored by the reference clients ("Future protocol changes can add
    message types"); here kept, raw, with a violation."""
    assert json_decode([b'{"type":42,"x":[1]}\x1e{"type":0}\x1e{"type":6}\x1e']) == [
        HubMessage(42, size_bytes=20, raw={"type": 42, "x": [1]}),
        malformed("unknown hub message type 42: kept uninterpreted"),
        HubMessage(0, size_bytes=11, raw={"type": 0}),
        malformed("unknown hub message type 0: kept uninterpreted"),
        PING,
    ]


@pytest.mark.parametrize(
    ("record", "detail"),
    [
        (b"{", "unexpected end of data: line 1 column 2 (char 1)"),
        (b"", "Input is a zero-length, empty document: line 1 column 1 (char 0)"),
        (b'{"type":6,}', "trailing comma is not allowed: line 1 column 11 (char 10)"),
        (b'{"type":1,"target":"\xff"}', "str is not valid UTF-8: surrogates not allowed: line 1 column 1 (char 0)"),
    ],
)
def test_json_invalid_record_then_resync(record, detail):
    """Invalid JSON is reported with orjson's message; decoding resumes after the record's 0x1E."""
    got = json_decode([record + RS + b'{"type":6}\x1e'])
    assert got[1:] == [PING]
    assert got[0].kind == "invalid_json" and got[0].detail.startswith("JSON hub record is not valid JSON: ")


def test_json_record_spanning_messages():
    """A record cut across messages is joined; it is accepted only with its 0x1E."""
    record = b'{"type":2,"invocationId":"0","item":"caf\xc3\xa9"}'
    dec = JsonRecordDecoder()
    assert dec.feed(record[:20]) == []
    assert dec.buffered_bytes == 20
    assert dec.feed(record[20:29]) == []
    assert dec.feed(record[29:] + RS + b'{"type":6}') == [HubMessage(2, "0", item="café", size_bytes=len(record) + 1)]
    assert dec.close() == [
        unterminated("stream ended inside a JSON hub record (10 bytes pending without 0x1E, not parsed)")
    ]
    assert dec.close() == []


def test_json_close():
    """Whitespace left at the end is nothing; a record's bytes without 0x1E are reported."""
    assert json_decode([b'{"type":6}\x1e', b"\r\n "]) == [PING]
    assert json_decode([b'{"type":6}']) == [
        unterminated("stream ended inside a JSON hub record (10 bytes pending without 0x1E, not parsed)")
    ]
    dec = JsonRecordDecoder()
    dec.close()
    with pytest.raises(ValueError, match="after close"):
        dec.feed(b"{}")


def test_json_oversize():
    """A record over the bound is reported once, dropped (nothing held) and the next one read;
    the same wherever the input is cut."""
    big = b'{"type":2,"invocationId":"0","item":"' + b"x" * 100 + b'"}'
    just = b'{"type":2,"invocationId":"0","item":"' + b"x" * 33 + b'"}'
    assert len(just) == 72
    limit = 72
    stream = [big + RS + just + RS + b'{"type":6', b"}" + RS + big, big + RS]
    got = json_decode(stream, limit)
    assert got == [
        oversize("JSON hub record exceeded 72 bytes"),
        HubMessage(2, "0", item="x" * 33, size_bytes=73),
        PING,
        oversize("JSON hub record exceeded 72 bytes"),
    ]
    dec = JsonRecordDecoder(limit)
    for piece in bytewise(b"".join(stream)):
        dec.feed(piece)
        assert dec.buffered_bytes <= limit
    # Ended while dropping an oversize record: already reported, nothing more.
    assert json_decode([big], limit) == [oversize("JSON hub record exceeded 72 bytes")]


def test_json_long_record_in_pieces_is_linear():
    """An 8 MB record fed in 1 KiB pieces is appended, never rescanned (quadratic would take
    minutes)."""
    record = b'{"type":2,"invocationId":"0","item":"' + b"y" * (8 << 20) + b'"}' + RS
    dec = JsonRecordDecoder(16 << 20)
    start = time.perf_counter()
    out = [m for i in range(0, len(record), 1024) for m in dec.feed(record[i : i + 1024])]
    assert time.perf_counter() - start < 2.0
    assert out == [HubMessage(2, "0", item="y" * (8 << 20), size_bytes=len(record))]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64) | st.binary(min_size=65, max_size=400), CUT_POINTS)
def test_json_any_bytes(data, points):
    """Any bytes: no exception, the same output however they are cut, bounded holding."""
    dec = JsonRecordDecoder(64)
    whole = feed(JsonRecordDecoder(64), [data])
    assert feed(JsonRecordDecoder(64), split_at(data, points)) == whole
    for piece in split_at(data, points):
        dec.feed(piece)
        assert dec.buffered_bytes <= 64


# -- MessagePack frames ------------------------------------------------------------------------------


def mp_decode(messages: list[bytes], max_record_bytes: int = 1 << 20) -> list:
    return each_way(lambda: MessagePackDecoder(max_record_bytes), messages)


# HubProtocol.md "MessagePack (MsgPack) encoding": each example payload, byte for byte.
SPEC_PAYLOADS = [
    ("96 01 80 a3 78 79 7a a6 6d 65 74 68 6f 64 91 2a 90", HubMessage(1, "xyz", "method", [42])),
    ("96 01 80 c0 a6 6d 65 74 68 6f 64 91 2a 90", HubMessage(1, None, "method", [42])),
    ("96 04 80 a3 78 79 7a a6 6d 65 74 68 6f 64 91 2a 90", HubMessage(4, "xyz", "method", [42])),
    ("94 02 80 a3 78 79 7a 2a", HubMessage(2, "xyz", item=42)),
    ("95 03 80 a3 78 79 7a 01 a5 45 72 72 6f 72", HubMessage(3, "xyz", error="Error")),
    ("94 03 80 a3 78 79 7a 02", HubMessage(3, "xyz")),
    ("95 03 80 a3 78 79 7a 03 2a", HubMessage(3, "xyz", result=42, has_result=True)),
    ("93 05 80 a3 78 79 7a", HubMessage(5, "xyz")),
    ("91 06", HubMessage(6)),
    ("92 07 a3 78 79 7a", HubMessage(7, error="xyz")),
    ("93 07 a3 78 79 7a c3", HubMessage(7, error="xyz", allow_reconnect=True)),
    ("92 08 cc 24", HubMessage(8, sequence_id=36)),
    ("92 09 cc 13", HubMessage(9, sequence_id=19)),
    (
        "96 01 82 a1 78 a1 79 a1 7a a1 7a a3 78 79 7a a6 6d 65 74 68 6f 64 91 2a 90",
        HubMessage(1, "xyz", "method", [42], headers={"x": "y", "z": "z"}),
    ),
]


def test_msgpack_spec_payloads():
    """Every example of the spec, framed with its one-byte VarInt, all in one message and fed
    each way."""
    bodies = [bytes.fromhex(h) for h, _ in SPEC_PAYLOADS]
    got = mp_decode([b"".join(frame(b) for b in bodies)])
    assert got == [
        dataclasses.replace(m, size_bytes=len(b) + 1) for (_, m), b in zip(SPEC_PAYLOADS, bodies, strict=True)
    ]


def test_msgpack_varint_examples():
    """HubProtocol.md "VarInt": 0x35 is 53; 0x80 0x29 is 5248; 0xFF 0xFF 0xFF 0xFF 0x07 is the
    largest (2 GB - 1), more than any bound: oversize, skipped by count."""

    def item_of(body_len: int) -> bytes:
        # [2, {}, "0", <str>]: 0x94 0x02 0x80 0xa1 0x30, then a str8/str16 of the rest.
        head = b"\x94\x02\x80\xa1\x30"
        n = body_len - len(head) - 3
        body = head + b"\xda" + n.to_bytes(2, "big") + b"z" * n
        assert len(body) == body_len
        return body

    b53 = b"\x94\x02\x80\xa1\x30\xd9\x2e" + b"z" * 46
    assert len(b53) == 53
    assert mp_decode([b"\x35" + b53]) == [HubMessage(2, "0", item="z" * 46, size_bytes=54)]
    b5248 = item_of(5248)
    assert mp_decode([b"\x80\x29" + b5248]) == [HubMessage(2, "0", item="z" * 5240, size_bytes=5250)]
    assert mp_decode([b"\xff\xff\xff\xff\x07" + b"\x00" * 10]) == [
        oversize("MessagePack hub body exceeded 1048576 bytes")
    ]


def test_msgpack_never_splits_on_0x1e():
    """0x1E as a length prefix, inside a body, as a positive fixint: all plain bytes here."""
    body = msgpack.packb([2, {}, "0", {"n": 30, "s": "a\x1eb"}])
    assert body.count(RS) == 2
    short = msgpack.packb([1, {}, None, "u", ["x" * 22]])  # 0x95 01 80 c0 a1 75 91 b6 + 22
    assert len(short) == 30
    assert mp_decode([frame(body) + frame(short)]) == [
        HubMessage(2, "0", item={"n": 30, "s": "a\x1eb"}, size_bytes=len(body) + 1),
        HubMessage(1, None, "u", ["x" * 22], size_bytes=31),
    ]


def test_msgpack_frame_spanning_messages():
    """A frame cut across messages is held (bounded) until its last byte."""
    f = pack([1, {}, None, "update", ["é" * 100]])  # 2-byte prefix
    dec = MessagePackDecoder()
    assert dec.feed(f[:1]) == []  # half the prefix
    assert dec.feed(f[1:50]) == []
    assert dec.buffered_bytes == 48
    assert dec.feed(f[50:] + b"\x02\x91") == [HubMessage(1, None, "update", ["é" * 100], size_bytes=len(f))]
    assert dec.close() == [
        unterminated(
            f"stream ended inside a MessagePack frame at byte {len(f)} (1 of 2 bytes of its body, not decoded)"
        )
    ]


def test_msgpack_optional_and_extra_elements():
    """Missing trailing optional elements are absent; extra trailing elements are ignored (the JS
    client checks only minimum lengths "to allow protocol to add items to the end")."""
    got = mp_decode(
        [
            pack([1, {}, "1", "t", [1]])  # no StreamIds (the JS client omits it)
            + pack([4, {}, "2", "t", [], ["s1", "s2"]])
            + pack([7, None, False])
            + pack([2, {}, "3", None, "future"])
            + pack([6, "future"])
            + pack([3, {}, "4", 3, None])  # a nil result is a result
        ]
    )
    assert got == [
        HubMessage(1, "1", "t", [1], size_bytes=10),
        HubMessage(4, "2", "t", [], stream_ids=["s1", "s2"], size_bytes=16),
        HubMessage(7, allow_reconnect=False, size_bytes=5),
        HubMessage(2, "3", item=None, size_bytes=14),
        HubMessage(6, size_bytes=10),
        HubMessage(3, "4", has_result=True, size_bytes=8),
    ]


@pytest.mark.parametrize(
    ("obj", "detail"),
    [
        ({"type": 1}, "MessagePack hub body is not a non-empty array"),
        ([], "MessagePack hub body is not a non-empty array"),
        (["1"], "MessagePack hub body: element 0 (the type) is not an integer"),
        ([True, {}], "MessagePack hub body: element 0 (the type) is not an integer"),
        ([1, {}, None, "t"], "MessagePack hub message type 1 (Invocation): 4 array elements, too few"),
        ([7], "MessagePack hub message type 7 (Close): 1 array element, too few"),
        ([3, {}, "0"], "MessagePack hub message type 3 (Completion): 3 array elements, too few"),
        ([1, {}, 5, "t", []], "MessagePack hub message type 1 (Invocation): invocationId must be a string"),
        ([1, {}, None, b"t", []], "MessagePack hub message type 1 (Invocation): target must be a string"),
        ([1, {}, None, "t", {}], "MessagePack hub message type 1 (Invocation): arguments must be an array"),
        (
            [1, {}, None, "t", [], [1]],
            "MessagePack hub message type 1 (Invocation): streamIds must be an array of strings",
        ),
        ([1, [], None, "t", []], "MessagePack hub message type 1 (Invocation): headers must map strings to strings"),
        (
            [1, {1: "a"}, None, "t", []],
            "MessagePack hub message type 1 (Invocation): headers must map strings to strings",
        ),
        ([4, {}, None, "t", []], "MessagePack hub message type 4 (StreamInvocation): invocationId is required"),
        ([2, {}, None, 1], "MessagePack hub message type 2 (StreamItem): invocationId must be a string"),
        ([2, "h", "0", 1], "MessagePack hub message type 2 (StreamItem): headers must map strings to strings"),
        ([2, {"a": b"b"}, "0", 1], "MessagePack hub message type 2 (StreamItem): headers must map strings to strings"),
        ([3, {}, "0", 4, 1], "MessagePack hub message type 3 (Completion): ResultKind must be 1, 2 or 3"),
        ([3, {}, "0", True], "MessagePack hub message type 3 (Completion): ResultKind must be 1, 2 or 3"),
        ([3, {}, "0", 3], "MessagePack hub message type 3 (Completion): ResultKind 3 without its Result"),
        ([3, {}, "0", 1], "MessagePack hub message type 3 (Completion): ResultKind 1 without its Result"),
        ([3, {}, "0", 1, 7], "MessagePack hub message type 3 (Completion): the error (ResultKind 1) must be a string"),
        ([5, {}, 1], "MessagePack hub message type 5 (CancelInvocation): invocationId must be a string"),
        ([7, 1], "MessagePack hub message type 7 (Close): error must be a string or nil"),
        ([7, None, 1], "MessagePack hub message type 7 (Close): allowReconnect must be a boolean"),
        ([8, "1"], "MessagePack hub message type 8 (Ack): sequenceId must be a non-negative integer"),
        ([9, -1], "MessagePack hub message type 9 (Sequence): sequenceId must be a non-negative integer"),
    ],
)
def test_msgpack_not_a_hub_message(obj, detail):
    """A body of the wrong shape is reported and passed over: the frame length keeps the framing."""
    assert mp_decode([pack(obj) + b"\x02\x91\x06"]) == [malformed(detail), HubMessage(6, size_bytes=3)]


def test_msgpack_unknown_type_kept():
    assert mp_decode([pack([42, "x"]) + b"\x02\x91\x06"]) == [
        HubMessage(42, size_bytes=5, raw=[42, "x"]),
        malformed("unknown hub message type 42: kept uninterpreted"),
        HubMessage(6, size_bytes=3),
    ]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"\x91\x06\x00", "unpack(b) received extra data."),
        (b"\x92\x06", "Unpack failed: incomplete input"),
        (b"\x92\x01\xa3\xff\xfe\xfd", "'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"),
        (b"\xc1", "FormatError"),
        (b"\x91" * 2000 + b"\x06", "StackError"),
        (b"\xdd\xff\xff\xff\xff", "4294967295 exceeds max_array_len(5)"),
        (b"\x81\x91\x01\x02", "unhashable type: 'list'"),
    ],
)
def test_msgpack_body_does_not_decode(body, reason):
    """A body msgpack rejects (strict: one object exactly, bounded lengths) is reported; the next
    frame decodes."""
    assert mp_decode([frame(body) + b"\x02\x91\x06"]) == [
        malformed(f"MessagePack frame at byte 0: body does not decode ({reason})"),
        HubMessage(6, size_bytes=3),
    ]


def test_msgpack_spec_binary_example_frames():
    """HubProtocol.md "Binary encoding" example: frames "Hello\\nWorld" and 0x01 0x02 -- framed
    right, but neither body is one MessagePack array: two violations, framing intact."""
    stream = bytes.fromhex("0B 68 65 6C 6C 6F 0A 77 6F 72 6C 64 02 01 02") + b"\x02\x91\x06"
    assert mp_decode([stream]) == [
        malformed("MessagePack frame at byte 0: body does not decode (unpack(b) received extra data.)"),
        malformed("MessagePack frame at byte 12: body does not decode (unpack(b) received extra data.)"),
        HubMessage(6, size_bytes=3),
    ]


def test_msgpack_empty_frame():
    assert mp_decode([b"\x00\x02\x91\x06"]) == [
        malformed("MessagePack frame at byte 0: empty body"),
        HubMessage(6, size_bytes=3),
    ]


@pytest.mark.parametrize(
    ("prefix", "what"),
    [(b"\x80\x80\x80\x80\x80\x01", "a 6-byte VarInt"), (b"\xff\xff\xff\xff\x08", "a length of 2 GB or more")],
)
def test_msgpack_bad_prefix_stops(prefix, what):
    """A bad prefix loses the framing: one violation, then nothing more is decoded (not even
    valid-looking frames after it), at close nothing more either."""
    stream = b"\x02\x91\x06" + prefix + b"\x02\x91\x06" * 3
    assert mp_decode([stream]) == [
        HubMessage(6, size_bytes=3),
        malformed(
            f"MessagePack frame at byte 3: bad length prefix ({what}); the framing is lost, the rest of the stream is not decoded"
        ),
    ]
    dec = MessagePackDecoder()
    dec.feed(stream[:6])
    dec.feed(stream[6:])
    assert dec.ignored_bytes == len(stream) - 3 - 5
    assert dec.close() == []


def test_msgpack_oversize_skipped_by_count():
    """A body over the bound is reported, dropped as it arrives (nothing held) and the next frame
    read, wherever the input is cut."""
    big = pack([2, {}, "0", "q" * 300])
    ok = pack([2, {}, "0", "q" * 40])
    assert len(ok) == 48
    limit = 47
    stream = [big + ok, big[:100], big[100:] + b"\x02\x91\x06"]
    assert mp_decode(stream, limit) == [
        oversize("MessagePack hub body exceeded 47 bytes"),
        HubMessage(2, "0", item="q" * 40, size_bytes=48),
        oversize("MessagePack hub body exceeded 47 bytes"),
        HubMessage(6, size_bytes=3),
    ]
    dec = MessagePackDecoder(limit)
    for piece in bytewise(b"".join(stream)):
        dec.feed(piece)
        assert dec.buffered_bytes <= limit
    assert mp_decode([big[:50]], limit) == [oversize("MessagePack hub body exceeded 47 bytes")]


def test_msgpack_close_inside_prefix_and_twice():
    assert mp_decode([b"\x02\x91\x06\x80"]) == [
        HubMessage(6, size_bytes=3),
        unterminated("stream ended inside the length prefix of a MessagePack frame at byte 3"),
    ]
    dec = MessagePackDecoder()
    assert dec.close() == [] and dec.close() == []
    with pytest.raises(ValueError, match="after close"):
        dec.feed(b"\x02\x91\x06")


def test_msgpack_long_frame_in_pieces_is_linear():
    f = pack([2, {}, "0", b"\x1e" * (8 << 20)])
    dec = MessagePackDecoder(16 << 20)
    start = time.perf_counter()
    out = [m for i in range(0, len(f), 1024) for m in dec.feed(f[i : i + 1024])]
    assert time.perf_counter() - start < 2.0
    assert out == [HubMessage(2, "0", item=b"\x1e" * (8 << 20), size_bytes=len(f))]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64) | st.binary(min_size=65, max_size=400), CUT_POINTS)
def test_msgpack_any_bytes(data, points):
    """Any bytes: no exception, the same output however they are cut, bounded holding."""
    whole = feed(MessagePackDecoder(64), [data])
    assert feed(MessagePackDecoder(64), split_at(data, points)) == whole
    dec = MessagePackDecoder(64)
    for piece in split_at(data, points):
        dec.feed(piece)
        assert dec.buffered_bytes <= 64


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.builds(
                lambda t, a: [1, {}, None, t, a],
                st.text(max_size=20),
                st.lists(st.integers(-(2**63), 2**64 - 1), max_size=5),
            ),
            st.builds(lambda i, s: [2, {}, i, s], st.text(max_size=5), st.binary(max_size=200)),
            st.just([6]),
            st.builds(lambda e: [7, e], st.none() | st.text(max_size=50)),
        ),
        max_size=8,
    ),
    CUT_POINTS,
)
def test_msgpack_valid_frames_any_cut(objs, points):
    """Valid frames, any content (0x1E and all), cut anywhere: each decodes, none is lost."""
    stream = b"".join(pack(o) for o in objs)
    got = feed(MessagePackDecoder(), split_at(stream, points))
    assert [m.type for m in got] == [o[0] for o in objs]
    assert sum(m.size_bytes for m in got) == len(stream)


# -- the official JS encoder ---------------------------------------------------------------------------

JS_EXPECTED = [
    HubMessage(1, "1", "send", [42, "Test Message"], size_bytes=27),
    HubMessage(1, None, "notify", ["no id"], size_bytes=19),
    HubMessage(1, "xyz", "method", [42], stream_ids=["s1"], headers={"x": "y", "z": "z"}, size_bytes=29),
    HubMessage(4, "0", "chat", [{"message": {"author": "user", "text": "Hi €"}}], size_bytes=47),
    HubMessage(2, "0", item={"text": "x" * 200}, size_bytes=215),
    HubMessage(3, "0", size_bytes=7),
    HubMessage(3, "1", result=42, has_result=True, size_bytes=8),
    HubMessage(3, "2", error="It didn't work!", size_bytes=23),
    HubMessage(5, "0", size_bytes=6),
    HubMessage(6, size_bytes=3),
    HubMessage(7, size_bytes=4),
    HubMessage(8, sequence_id=36, size_bytes=4),
    HubMessage(9, sequence_id=19, size_bytes=4),
]


def test_official_js_encoder_frames():
    """Frames written by @microsoft/signalr-protocol-msgpack (js_frames.json) decode to the
    messages it was given; one message per WebSocket message and all in one."""
    doc = json.loads((FIXTURES / "js_frames.json").read_text())
    frames = [bytes.fromhex(f["hex"]) for f in doc["frames"]]
    assert mp_decode(frames) == JS_EXPECTED
    assert feed(MessagePackDecoder(), [b"".join(frames)]) == JS_EXPECTED
    assert frames[9] == b"\x02\x91\x06" and frames[10] == b"\x03\x92\x07\xc0"


def _node_modules() -> Path | None:
    """A node_modules holding @microsoft/signalr-protocol-msgpack (SIGNALR_JS_NODE_MODULES), or None."""
    path = os.environ.get("SIGNALR_JS_NODE_MODULES")
    if not path or shutil.which("node") is None:
        return None
    path_ = Path(path)
    return path_ if (path_ / "@microsoft" / "signalr-protocol-msgpack").is_dir() else None


@pytest.mark.skipif(
    _node_modules() is None,
    reason="node with @microsoft/signalr-protocol-msgpack (SIGNALR_JS_NODE_MODULES) not available",
)
def test_official_js_package_live():
    """With the npm package at hand: it still writes js_frames.json's frames, and it reads the
    MessagePack fixtures' server frames as this decoder does."""
    env = {**os.environ, "NODE_PATH": str(_node_modules())}
    script = str(FIXTURES / "js_encode.cjs")
    written = json.loads(subprocess.run(["node", script], check=True, capture_output=True, env=env).stdout)
    assert [f["hex"] for f in written["frames"]] == [
        f["hex"] for f in json.loads((FIXTURES / "js_frames.json").read_text())["frames"]
    ]
    for case in ("msgpack_pysignalr", "msgpack_js"):
        messages = contents(case, False)[1:]
        theirs = json.loads(
            subprocess.run(
                ["node", script, *(m.hex() for m in messages)], check=True, capture_output=True, env=env
            ).stdout
        )
        ours = [feed(MessagePackDecoder(), [m]) for m in messages]
        assert [[m["type"] for m in msgs] for msgs in theirs] == [[m.type for m in msgs] for msgs in ours]
        for t_msgs, o_msgs in zip(theirs, ours, strict=True):
            for t, o in zip(t_msgs, o_msgs, strict=True):
                assert t.get("invocationId") == o.invocation_id
                assert t.get("target") == o.target
                assert t.get("arguments") == o.arguments
                assert t.get("item") == o.item
                assert t.get("error") == o.error
                assert (t.get("headers") or None) == o.headers


def test_decoder_for():
    assert isinstance(decoder_for(HubProtocol.JSON), JsonRecordDecoder)
    assert isinstance(decoder_for(HubProtocol.MESSAGEPACK, 10), MessagePackDecoder)
    with pytest.raises(ValueError, match="max_record_bytes"):
        JsonRecordDecoder(0)
    with pytest.raises(ValueError, match="max_record_bytes"):
        MessagePackDecoder(True)


def test_bytes_like_input():
    """A bytearray or memoryview is taken as its bytes."""
    assert JsonRecordDecoder().feed(memoryview(b'{"type":6}\x1e{"type":7}\x1e')) == [PING, HubMessage(7, size_bytes=11)]
    assert JsonRecordDecoder().feed(bytearray(b'{"type":6}\x1e')) == [PING]
    assert MessagePackDecoder().feed(memoryview(b"\x02\x91\x06")) == [HubMessage(6, size_bytes=3)]
