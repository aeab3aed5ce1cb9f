"""Recovered framings (issue 16, item 4): what servers in the wild break, recovered where the intent
is unambiguous and always put on record.

- Several JSON documents in one SSE event (``data: {...}\\ndata: {...}``: GLM / Kimi via some hosts,
  vendor-wire-formats §9 and eventsource-parser PR #31; ``data: {...}{...}``): one event each,
  ``nonconformant_framing`` (``observer.wire.recovery``, ``observer.wire.sse``,
  ``observer.wire.frames.split_documents``).
- A field WHATWG §9.2.6 ignores: llama.cpp's ``error: {...}`` (ggml-org/llama.cpp #16104, #16109)
  is dispatched as an ``error`` event; other unknown fields are named once (``nonstandard_field``).
- A lone UTF-16 surrogate in a JSON string (RFC 8259 §8.2): U+FFFD, ``lone_surrogate`` with the
  JSON path (``observer.jsontext.without_lone_surrogates``, ``observer.wire.frames.text_message``).
- A block's stop for an index that never started (Anthropic ``content_block_stop``, Responses
  ``response.output_item.done``, the draft's ``content.stop``, Bedrock ``contentBlockStop``):
  ``block_not_started``, the stop reason kept.

Expected values are written by hand; the wire fixtures of these cases (``error_field``,
``stop_not_started``, ``lone_surrogate`` of ``llm-stream-1.0``; ``joined_data_lines``,
``lone_surrogate`` of ``openai.chat``; ``stop_not_started`` of ``anthropic.messages``;
``item_done_not_added`` of ``openai.responses``) run in ``test_wire_fixtures.py``.
"""

from __future__ import annotations

import json
from dataclasses import replace

import orjson
import pytest
from hypothesis import given, settings

from observer import jsontext
from observer.dialects.bedrock import ConverseAdapter
from observer.dialects.sse_errors import NOT_JSON, read_error, with_error
from observer.events import ContentDelta, ErrorEvent, StopEvent
from observer.records import Violation
from observer.wire.frames import SSEEvent, split_documents, text_message
from observer.wire.recovery import MAX_NAMED_FIELDS, MAX_SURFACED_PER_BLOCK, documents, json_documents
from observer.wire.sse import SSEDecoder
from tests.wirefeed import (
    CUT_POINTS,
    assert_matches,
    bytewise,
    feed,
    feed_each_way,
    load,
    observe,
    observe_case,
    split_at,
)

FRAMING = "nonconformant_framing"
FIELD = "nonstandard_field"
LONE = "lone_surrogate"
NOT_STARTED = "block_not_started"


def decode(chunks: list[bytes]) -> list:
    return feed(SSEDecoder(), chunks)


def joined(n_docs: int, n_lines: int) -> str:
    return (
        f"{n_docs} JSON documents in one event's data ({n_lines} data lines without a blank line "
        "between them): each read as an event of its own"
    )


def surfaced(name: str, n: int) -> Violation:
    return Violation(
        FIELD,
        None,
        f"field {name!r} ({n} bytes) is not an SSE field (WHATWG §9.2.6 ignores it): "
        f"its value dispatched as an event of type {name!r}",
    )


# -- several JSON documents in one event ------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([b'{"a":1}', b'{"b":2}'], [b'{"a":1}', b'{"b":2}']),
        ([b"[1]", b' {"b":2} ', b"[3,4]"], [b"[1]", b'{"b":2}', b"[3,4]"]),
        ([b'{"a":1}{"b":2}', b'{"c":3}'], [b'{"a":1}', b'{"b":2}', b'{"c":3}']),
        ([b'{"a":', b"1}"], None),  # one value split over lines (WHATWG joins it: valid JSON)
        ([b'{"a":[', b"1]}", b"{"], None),  # no line ends a value where the next starts one
        ([b"YHOO", b"+2", b"10"], None),  # text data (WHATWG's stock example)
        ([b'{"a":1}', b"[DONE]"], None),  # "[DONE]" frames as a value but is not JSON
        ([b'{"a":1}', b"42"], None),  # a scalar is junk to the scanner: not unambiguous
        ([b'{"a":1}', b'{"b":'], None),  # the last value is cut short
        ([b'{"a":1}', b'{"b":2} x'], None),  # junk after the values
        ([b'{"a":"\\ud83d"}', b'{"b":2}'], [b'{"a":"\\ud83d"}', b'{"b":2}']),  # valid but for a lone surrogate
    ],
)
def test_json_documents(values, expected):
    """Split only when the joined data is not one JSON value but a sequence of valid ones."""
    assert json_documents(values) == expected


def test_documents_of_one_line():
    assert documents(b'{"a":1}{"b":[2]}') == [b'{"a":1}', b'{"b":[2]}']
    assert documents(b'{"a":1}') is None  # one document: nothing to split
    assert documents(b"") is None
    assert documents(b'{"a":1}}') is None  # a stray closer is junk


def test_data_lines_without_blank_line_are_events_of_their_own():
    """Whole, byte by byte and cut anywhere: one violation, then one message per document; the
    block's event type and id on each, its retry on the first only, and sizes that add up to
    the block's 54 bytes (6 + 10 + 9 + 14 + 14 + 1: the later message its document's 7 bytes,
    the first the rest)."""
    body = b'id: 7\nretry: 10\nevent: x\ndata: {"a":1}\ndata: {"b":2}\n\n'
    assert len(body) == 54
    expected = [
        Violation(FRAMING, None, joined(2, 2)),
        (b"x", b'{"a":1}', "7", 10, 47),
        (b"x", b'{"b":2}', "7", None, 7),
    ]
    assert feed_each_way(SSEDecoder, body, [5, 20, 40]) == expected


def test_joined_blocks_in_one_chunk_take_the_same_way():
    """Several whole blocks in one chunk (the decoder's block shortcut) give what the line path
    gives: the second block is split, the first and third are not."""
    body = b'data: {"a":1}\n\ndata: {"b":2}\ndata: {"c":3}\n\ndata: {"d":4}\n\n'
    expected = [
        (b"", b'{"a":1}', None, None, 15),
        Violation(FRAMING, None, joined(2, 2)),
        (b"", b'{"b":2}', None, None, 22),
        (b"", b'{"c":3}', None, None, 7),
        (b"", b'{"d":4}', None, None, 15),
    ]
    assert decode([body]) == expected
    assert decode(bytewise(body)) == expected


def test_pretty_printed_json_over_data_lines_is_not_split():
    body = b'data: {\ndata:   "a": 1\ndata: }\n\n'
    assert decode([body]) == [(b"", b'{\n  "a": 1\n}', None, None, 32)]


def test_split_documents_of_one_line():
    """``data: {...}{...}`` (the consumer's failure path): the same violation kind and messages."""
    violation, parts = split_documents((b"", b'{"a":1}{"b":[2]}', "1", 5, 24))
    assert violation == Violation(
        FRAMING, None, "2 JSON documents in one event's data, one after another: each read as an event of its own"
    )
    assert parts == [(b"", b'{"a":1}', "1", 5, 15), (b"", b'{"b":[2]}', "1", None, 9)]
    assert split_documents((None, b'{"a":1}', None, None, 8)) is None
    assert split_documents((None, b"not json", None, None, 8)) is None


def test_joined_chat_chunks_through_the_pipeline():
    """Two chat-completion chunks joined by one LF: both texts in the record (hand-counted)."""
    chunk = '{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"%s"}}]}'
    body = f"data: {chunk % 'Hi'}\ndata: {chunk % ' there'}\n\ndata: [DONE]\n\n".encode()
    request = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'
    for chunks in ([body], bytewise(body)):
        record = observe("openai.chat", request, chunks, path="/v1/chat/completions")
        assert record["text"] == "Hi there"
        assert [(v["kind"], v["detail"]) for v in record["violations"]] == [(FRAMING, joined(2, 2))]


# -- fields WHATWG ignores ----------------------------------------------------------------------


def test_llama_cpp_error_field_is_an_error_event():
    """llama.cpp before #16109: ``error: {...}`` then ``data: [DONE]``; the error's value (102
    bytes) becomes the data of an ``error`` event, the whole block (7 + 102 + 2 bytes) its size."""
    value = b'{"code":400,"message":"the request exceeds the available context size","type":"invalid_request_error"}'
    assert len(value) == 102
    body = b"error: " + value + b"\n\ndata: [DONE]\n\n"
    expected = [surfaced("error", 102), (b"error", value, None, None, 111), (b"", b"[DONE]", None, None, 14)]
    assert feed_each_way(SSEDecoder, body, [3, 60, 110]) == expected


def test_surfaced_field_beside_data_comes_after_it():
    """A block with data and a surfaced field: the data's message first (the block's size less
    the field value's 7 bytes, retry on it), then the field's."""
    body = b'retry: 5\ndata: {"a":1}\nevent_data: {"m":1}\n\n'
    assert decode([body]) == [
        (b"", b'{"a":1}', None, 5, len(body) - 7),
        surfaced("event_data", 7),
        (b"event_data", b'{"m":1}', None, None, 7),
    ]


def test_surfaced_fields_bounded_per_block():
    lines = b"".join(b"f%d: [%d]\n" % (i, i) for i in range(MAX_SURFACED_PER_BLOCK + 1))
    out = decode([lines + b"\n"])
    assert [o[0] for o in out if isinstance(o, tuple)] == [b"f%d" % i for i in range(MAX_SURFACED_PER_BLOCK)]
    # The one beyond the bound is named (ignored), before the block's messages.
    assert out[0] == Violation(
        FIELD,
        None,
        f"field 'f{MAX_SURFACED_PER_BLOCK}' (3 bytes) is not an SSE field: ignored, as WHATWG §9.2.6 says "
        f"(more than {MAX_SURFACED_PER_BLOCK} JSON-valued fields in one event)",
    )


def test_ignored_fields_named_once_per_name_and_bounded():
    """A field that is not surfaced (its value is not JSON-like, or its name is not a token) is
    ignored as WHATWG says, and named the first time only; at most MAX_NAMED_FIELDS names."""
    names = [b"x%d" % i for i in range(MAX_NAMED_FIELDS + 2)]
    body = b"".join(n + b": text\n" for n in names) + b"x0: again\ndata: y\n\n"
    out = decode([body])
    assert [o.detail.split("'")[1] for o in out if isinstance(o, Violation)] == [
        n.decode() for n in names[:MAX_NAMED_FIELDS]
    ]
    assert out[-1] == (b"", b"y", None, None, len(body))
    assert decode([b"a: 1\nb: 2\na: 3\ndata: y\n\n"]) == [
        Violation(FIELD, None, "field 'a' (1 byte) is not an SSE field: ignored, as WHATWG §9.2.6 says"),
        Violation(FIELD, None, "field 'b' (1 byte) is not an SSE field: ignored, as WHATWG §9.2.6 says"),
        (b"", b"y", None, None, 24),  # 5 + 5 + 5 + 8 + 1
    ]
    assert decode([b"my field: {1}\n\n"])[0].detail.startswith(
        "field 'my field' (3 bytes) is not an SSE field: ignored"
    )


@pytest.mark.parametrize(
    "body",
    [
        b'error: {"m":"' + b"x" * 64 + b'"}\n\ndata: {"a":1}\n\n',  # the field's own line is too long
        b"error: [1]\ndata: " + b"x" * 64 + b'\n\ndata: {"a":1}\n\n',  # a later line of its block is
    ],
)
def test_oversize_block_surfaces_nothing(body):
    """An oversize block is discarded whole, its surfaced field too (never carried into the next)."""
    for chunks in ([body], bytewise(body)):
        assert [o.kind if isinstance(o, Violation) else o[1] for o in feed(SSEDecoder(40), chunks)] == [
            "oversize_event",
            b'{"a":1}',
        ]


def test_unterminated_block_of_a_field_is_dispatched_at_close():
    assert decode([b"error: [1]"]) == [
        surfaced("error", 3),
        (b"error", b"[1]", None, None, 10),
        Violation(
            "unterminated_final_event",
            None,
            "stream ended before the blank line that dispatches the final event (10 bytes)",
        ),
    ]


def test_plain_text_error_field_is_surfaced():
    """``error`` is surfaced whatever its value (``observer.wire.recovery.ALWAYS_SURFACED``): a
    plain-text error (16 bytes) is an ``error`` event, the block (7 + 16 + 1 + 1 bytes) its size;
    an empty one too (its data empty)."""
    assert decode([b"error: model overloaded\n\n"]) == [
        surfaced("error", 16),
        (b"error", b"model overloaded", None, None, 25),
    ]
    assert decode([b"error\n\n"]) == [surfaced("error", 0), (b"error", b"", None, None, 7)]


def test_other_text_fields_stay_ignored():
    """Field names are case-sensitive (WHATWG §9.2.6): ``Error: text`` and ``err: text`` are not
    ``error``, so they are named and ignored, not surfaced."""
    assert decode([b"Error: model overloaded\nerr: x\ndata: y\n\n"]) == [
        Violation(FIELD, None, "field 'Error' (16 bytes) is not an SSE field: ignored, as WHATWG §9.2.6 says"),
        Violation(FIELD, None, "field 'err' (1 byte) is not an SSE field: ignored, as WHATWG §9.2.6 says"),
        (b"", b"y", None, None, 40),  # 24 + 7 + 8 + 1
    ]


@settings(max_examples=60, deadline=None)
@given(points=CUT_POINTS)
def test_error_field_fixture_any_chunking(points):
    """The draft's error sent under ``error:`` (fixture ``llm-stream-1.0/error_field``): the
    outcome is ``error`` with the error recorded however the body is cut."""
    case = load("llm-stream-1.0", "error_field")
    assert_matches(observe_case(case, split_at(case.body, points)), case.expected)


# -- lone surrogates -----------------------------------------------------------------------------


def test_lone_surrogate_replaced_with_its_path():
    text, bad = text_message((b"", b'{"seq":3,"delta":{"text":"hi \\ud83d"}}', None, None, 40))
    assert isinstance(text, SSEEvent)
    assert json.loads(text.data) == {"seq": 3, "delta": {"text": "hi \ufffd"}}
    assert bad == Violation(LONE, 3, "a lone UTF-16 surrogate replaced by U+FFFD at $.delta.text (character 3)")


def test_lone_surrogates_in_keys_arrays_and_odd_keys():
    text, bad = text_message((None, b'{"a b":["\\udc00x\\ud83d\\ude00"],"\\ud800k":1}', None, None, 40))
    assert json.loads(text.data) == {"a b": ["\ufffdx\U0001f600"], "\ufffdk": 1}
    assert bad == Violation(
        LONE,
        None,
        '2 lone UTF-16 surrogates replaced by U+FFFD at $["a b"][0] (character 0), $["\\ud800k"] (key, character 0)',
    )


def test_places_bounded():
    value, n, places = jsontext.without_lone_surrogates('["\\ud800","\\ud801","\\ud802","\\ud803","\\ud804"]')
    assert (value, n) == (["\ufffd"] * 5, 5)
    assert places == ["$[0] (character 0)", "$[1] (character 0)", "$[2] (character 0)"]
    _, bad = text_message((None, b'["\\ud800","\\ud801","\\ud802","\\ud803","\\ud804"]', None, None, 1))
    assert bad.detail.endswith("$[2] (character 0) and 2 more")


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a":"\\\\ud83d"} x',  # an escaped backslash, then "ud83d": no surrogate (and not JSON)
        b'{"a":"\\ud83d\\ude00"',  # a valid pair, but the text is cut: not JSON even so
        b'{"a":"\\ud83d\\ude00"} junk',
        b"[DONE]",
    ],
)
def test_nothing_recovered_when_not_only_surrogates(raw):
    text, bad = text_message((b"", raw, None, None, len(raw)))
    assert text.data == raw.decode() and bad is None


def test_lone_surrogate_with_invalid_utf8_is_one_violation():
    _, bad = text_message((b"", b'{"t":"\xff \\ud83d"}', None, None, 14))
    assert bad == Violation(
        LONE,
        None,
        "a lone UTF-16 surrogate replaced by U+FFFD at $.t (character 2); invalid UTF-8 replaced by U+FFFD",
    )


# -- a block's stop for an index that never started ---------------------------------------------


def converse(name: str, data: dict) -> SSEEvent:
    text = json.dumps(data)
    return SSEEvent(event=name, data=text, id=None, retry=None, size_bytes=len(text))


def test_bedrock_block_stop_not_started():
    """ConverseStream: a text block opens with its first delta (no ``contentBlockStart``); a
    ``contentBlockStop`` for index 1, never opened, is flagged; messageStop's reason is kept."""
    adapter = ConverseAdapter()
    out = []
    for m in [
        converse("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Hi"}}),
        converse("contentBlockStop", {"contentBlockIndex": 0}),
        converse("contentBlockStop", {"contentBlockIndex": 1}),
        converse("messageStop", {"stopReason": "end_turn"}),
    ]:
        out += adapter.on_message(m)
    assert out == [
        ContentDelta(None, 0, "Hi", "text"),
        Violation(
            NOT_STARTED,
            None,
            "contentBlockStop for contentBlockIndex 1, which no contentBlockStart or contentBlockDelta opened",
        ),
        StopEvent(None, "end_turn", "end_turn"),
    ]


def test_bedrock_block_stop_after_tool_start_is_fine():
    adapter = ConverseAdapter()
    start = {"contentBlockIndex": 2, "start": {"toolUse": {"toolUseId": "t1", "name": "f"}}}
    adapter.on_message(converse("contentBlockStart", start))
    assert adapter.on_message(converse("contentBlockStop", {"contentBlockIndex": 2})) == []


def test_standard_tool_call_opens_its_block():
    """The draft's tool flow (tool.call, then content.stop "tool_use" at its index) is conformant."""
    case = load("llm-stream-1.0", "tool_flow")
    record = observe_case(case, [case.body])
    assert [v["kind"] for v in record["violations"]] == []


@pytest.mark.parametrize(
    ("dialect", "case"),
    [
        ("llm-stream-1.0", "stop_not_started"),
        ("llm-stream-1.0", "lone_surrogate"),
        ("llm-stream-1.0", "error_field"),
        ("anthropic.messages", "stop_not_started"),
        ("openai.responses", "item_done_not_added"),
        ("openai.chat", "joined_data_lines"),
        ("openai.chat", "lone_surrogate"),
    ],
)
def test_general_mapping_gives_the_same_record(dialect, case):
    """Without the fast lanes (every message through ``on_message``) each new fixture gives the
    hand-written record too: the lanes' state (e.g. the draft's opened blocks) matches."""
    c = load(dialect, case)
    record = observe(
        dialect,
        c.request,
        [c.body],
        status=c.status,
        content_type=c.content_type,
        path=c.path,
        request_headers=c.request_headers,
        general=True,
    )
    assert_matches(record, c.expected)


# -- through the tap and a dialect (the hooks outside the SSE layer) -------------------------------

CHAT_REQUEST = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'
CHAT_CHUNK = '{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"%s"}}]}'


def test_llama_cpp_error_field_makes_the_chat_outcome_error():
    value = '{"code":400,"message":"the request exceeds the available context size","type":"invalid_request_error"}'
    body = f"data: {CHAT_CHUNK % 'Hi'}\n\nerror: {value}\n\ndata: [DONE]\n\n".encode()
    record = observe("openai.chat", CHAT_REQUEST, [body], path="/v1/chat/completions")
    assert record["text"] == "Hi"
    assert (record["outcome"], record["error"]) == (
        "error",
        {"code": "400", "message": "the request exceeds the available context size"},
    )
    assert [v["kind"] for v in record["violations"]] == [FIELD]


#: One fixture per SSE dialect: its request, path and response headers, with the body replaced.
SSE_DIALECT_CASES = [
    ("llm-stream-1.0", "complete_example"),
    ("openai.chat", "text_include_usage"),
    ("openai.responses", "text_stream"),
    ("anthropic.messages", "text_stream"),
    ("gemini", "sse_text_crlf"),
    ("vercel.ui", "v5_reference_example"),
]


@pytest.mark.parametrize(("dialect", "case"), SSE_DIALECT_CASES)
def test_plain_text_error_field_is_the_error_in_every_sse_dialect(dialect, case):
    """Issue 16 item 4: an error sent under the ignored ``error`` field, as plain text, makes the
    outcome ``error`` with the text as its message, whatever the dialect
    (``observer.dialects.sse_errors``); the field is on record first."""
    c = replace(load(dialect, case), body=b"error: the server is overloaded\n\n")
    record = observe_case(c, [c.body])
    assert (record["outcome"], record["error"]) == ("error", {"code": None, "message": "the server is overloaded"})
    assert record["violations"][0] == {"kind": FIELD, "seq": None, "detail": surfaced("error", 24).detail}


@pytest.mark.parametrize(("dialect", "case"), SSE_DIALECT_CASES)
def test_json_error_field_is_the_error_in_every_sse_dialect(dialect, case):
    """The same with a JSON value in Google's shape, which the Gemini and OpenAI chat dialects
    read themselves (chat: the numeric code as text, for OpenRouter), the others by the general
    rule: code ``status`` (a string, over the numeric ``code``), the message as sent; the draft
    dialect's own reading (code and message at the top) found neither, so the rule's is kept."""
    value = b'{"error":{"code":429,"message":"Resource has been exhausted","status":"RESOURCE_EXHAUSTED"}}'
    c = replace(load(dialect, case), body=b"error: " + value + b"\n\n")
    record = observe_case(c, [c.body])
    code = "429" if dialect == "openai.chat" else "RESOURCE_EXHAUSTED"
    assert (record["outcome"], record["error"]) == ("error", {"code": code, "message": "Resource has been exhausted"})


@pytest.mark.parametrize("framing", ["event: error\ndata: ", "error: "])
def test_an_error_event_is_not_the_answer(framing):
    """A chunk sent as ``event: error`` (or under ``error:``) is an error even when its data looks
    like a delta (the fast lane does not take it), its message the data; its text is not the
    answer (trial finding: ``HelloINJECT tail``), and the record says what was left out (the
    choice's announcement and its delta); the text around it is kept."""
    chunk = CHAT_CHUNK % "INJECT"
    body = f"data: {CHAT_CHUNK % 'Hello'}\n\n{framing}{chunk}\n\ndata: {CHAT_CHUNK % ' tail'}\n\n".encode()
    record = observe("openai.chat", CHAT_REQUEST, [body])
    assert record["text"] == "Hello tail"
    assert (record["outcome"], record["error"]) == ("error", {"code": None, "message": chunk})
    assert {
        "kind": "invalid_event",
        "seq": None,
        "detail": "an error event is not the answer: 1 content event in it not recorded",
    } in record["violations"]


@pytest.mark.parametrize(
    ("obj", "data", "expected"),
    [
        # OpenAI's envelope: code, else type (error_event's rule); a null code is no code.
        ({"error": {"message": "m", "type": "server_error", "code": None}}, "", ErrorEvent(None, "server_error", "m")),
        # OpenRouter: a numeric code only, as decimal text.
        (
            {"error": {"code": 502, "message": "Provider returned error"}},
            "",
            ErrorEvent(None, "502", "Provider returned error"),
        ),
        # Google: the status over the number.
        ({"code": 503, "status": "UNAVAILABLE", "message": "m"}, "", ErrorEvent(None, "UNAVAILABLE", "m")),
        # A string error member, with the object's code.
        ({"error": "rate limited", "code": "429"}, "", ErrorEvent(None, "429", "rate limited")),
        # No message: the data's text is (nothing lost).
        ({"code": "busy"}, ' {"code":"busy"} ', ErrorEvent(None, "busy", '{"code":"busy"}')),
        # A JSON string; other JSON; an empty string.
        ("overloaded", '"overloaded"', ErrorEvent(None, None, "overloaded")),
        ([1, 2], "[1, 2]", ErrorEvent(None, None, "[1, 2]")),
        ("", '""', ErrorEvent(None, None, None)),
        # Not JSON: the text, stripped; empty: no message; JSON text given as text is parsed.
        (NOT_JSON, " model overloaded \n", ErrorEvent(None, None, "model overloaded")),
        (NOT_JSON, "", ErrorEvent(None, None, None)),
        (NOT_JSON, b'{"message":"m","type":"t"}', ErrorEvent(None, "t", "m")),
        (NOT_JSON, b"bad \xff", ErrorEvent(None, None, "bad \ufffd")),
        # The event's own type (Anthropic's, the draft's envelope) is not a code.
        ({"type": "error", "error": {"type": "overloaded_error"}}, "", ErrorEvent(None, "overloaded_error", None)),
        ({"type": "error"}, '{"type":"error"}', ErrorEvent(None, None, '{"type":"error"}')),
        # Booleans are not codes (RFC 8259: distinct types).
        ({"code": True, "message": "m"}, "", ErrorEvent(None, None, "m")),
    ],
)
def test_read_error(obj, data, expected):
    assert read_error(obj, data) == expected


def test_with_error_keeps_the_adapters_own_error():
    own = ErrorEvent(None, "api_error", "Overloaded")
    bad = Violation("invalid_json", None, "x")
    assert with_error([own], NOT_JSON, "text") == [own]
    assert with_error([bad], NOT_JSON, "text") == [bad, ErrorEvent(None, None, "text")]
    # An empty one is read by the rule (its seq kept), unless the rule finds nothing either.
    empty = ErrorEvent(7, None, None)
    assert with_error([bad, empty, bad], NOT_JSON, "text") == [bad, ErrorEvent(7, None, "text"), bad]
    assert with_error([empty], NOT_JSON, "") == [empty]
    # Read from data with a code or message member (explicitly null): the dialect's reading stands.
    draft = {"v": "1.0", "seq": 7, "type": "error", "code": None, "message": None}
    assert with_error([empty], draft, orjson.dumps(draft)) == [empty]


def test_one_line_of_joined_documents_through_the_pipeline():
    body = f"data: {CHAT_CHUNK % 'Hi'}{CHAT_CHUNK % ' there'}\n\ndata: [DONE]\n\n".encode()
    record = observe("openai.chat", CHAT_REQUEST, [body], path="/v1/chat/completions")
    assert record["text"] == "Hi there"
    assert [v["kind"] for v in record["violations"]] == [FRAMING]
