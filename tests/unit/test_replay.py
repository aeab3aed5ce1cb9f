"""Replay in the draft standard's format (issue 16 item 7; ``observer.standard_replay`` and
``GET /v1/exchanges/{id}/replay``).

Four replays are written by hand from their fixture files (the request body, the wire body and
the hand-written ``expected.json``; draft §4.2 envelope, §5.2 envelope fields, §5.3 events, the
``created`` being wirefeed's ``T0``): an OpenAI chat tool call, an Anthropic thinking stream
(with and without its reasoning block), a Bedrock ConverseStream text + tool use and a Gemini
stream of two candidates (each choice's stop). Every wire fixture is then recorded
(``tests.wirefeed``), replayed, and the replay recorded again through the standard dialect
(``llm-stream-1.0``): text, text blocks, tool calls (``declared`` too), usage, per-choice
results, stop reason, error and outcome must come back (what cannot, and why, is asserted too).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from observer.api import create_app
from observer.reassembly import EndCause
from observer.records import Block, ErrorInfo, Exchange, RequestFacts, ToolCall, Usage, Violation
from observer.standard_replay import (
    BLOCK_TYPE,
    CHOICE,
    DELTA_MAX_CHARS,
    STOP_REASON_RAW,
    encode_sse,
    standard_replay,
)
from observer.store.checkpoint import CheckpointKey
from observer.store.migrate import upgrade
from observer.store.store import AuditStore
from observer.store.tokens import create_token
from observer.wire.sse import SSEDecoder
from tests.unit.test_limits_and_purity import impurities
from tests.wirefeed import T0, TextForm, bytewise, cases, dialect_dirs, feed, load, observe, observe_case

STANDARD = "llm-stream-1.0"
CREATED = 1_749_292_800  # tests.wirefeed.T0 in whole seconds: every fixture's started_at
DIALECT = "llm-stream-observer:recorded_dialect"
TOOL_NAMES = "llm-stream-observer:tool_names"
# Violations that would mean the replay is not well-formed draft SSE (draft §5.1, §5.2, §5.4).
WIRE_KINDS = {
    "seq_gap",
    "seq_repeat",
    "missing_stream_start",
    "type_mismatch",
    "invalid_json",
    "event_after_end",
    "unsupported_version",
    "seq_exhausted",
    "oversize_event",
    "unterminated_final_event",
    "invalid_utf8",
    "block_not_started",
}
END_CAUSE = {"client_aborted": EndCause.CLIENT_ABORTED, "interrupted": EndCause.SHUTDOWN}


def recorded(dialect: str, case: str) -> list[dict[str, Any]]:
    """The record(s) of a fixture (several for a stream cut into turns), fed whole."""
    c = load(dialect, case)
    got = observe_case(c, [c.body])
    return got if isinstance(got, list) else [got]


def record_of(dialect: str, case: str) -> Exchange:
    (one,) = recorded(dialect, case)
    return Exchange.from_dict(one)


def back(envelope: dict[str, Any], body: bytes, *, status: int = 200, outcome: str = "completed") -> dict[str, Any]:
    """The record the standard dialect makes of a replay: ``envelope`` sent as
    ``application/llm-request+json``, ``body`` as its SSE answer, ended as ``outcome`` ended
    (a client abort or a shutdown is the transport's, not an event)."""
    rec: dict[str, Any] = observe(
        STANDARD,
        orjson.dumps(envelope),
        [body],
        status=status,
        end=END_CAUSE.get(outcome, EndCause.EOF),
        request_headers={"content-type": "application/llm-request+json"},
    )
    return rec


def kinds(record: dict[str, Any]) -> list[str]:
    return [v["kind"] for v in record["violations"]]


# -- hand-written replays ------------------------------------------------------------------------

# openai.chat/tool_call_fragments: the request body's tools and other keys as the dialect records
# them (tools as sent; parameters every top-level key but model, messages, tools, stream), the
# chunks' id as request_id (and, with system_fingerprint, as the stream.start identity
# extensions), one tool call (arguments joined from the fragments), finish_reason "tool_calls"
# (canonical tool_use), usage 48/19 with total 67 and reasoning 0 as usage extensions, [DONE].
OPENAI_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "state": {"type": "string"}},
                "required": ["city", "state"],
                "additionalProperties": False,
            },
            "strict": True,
        },
    }
]
OPENAI_ENVELOPE = {
    "version": "1.0",
    "stream": True,
    "model": "gpt-4o-2024-08-06",
    "messages": [{"role": "user", "content": "What's the weather like in SF?"}],
    "tools": OPENAI_TOOLS,
    "parameters": {"stream_options": {"include_usage": True}},
    "extensions": {DIALECT: "openai.chat", TOOL_NAMES: ["get_weather"]},
}
OPENAI_SSE = r"""event: stream.start
data: {"v":"1.0","seq":0,"type":"stream.start","model":"gpt-4o-2024-08-06","created":1749292800,"request_id":"chatcmpl-ABgJDo0JIRWSH5W2cE0J8vaImv3Dm","extensions":{"llm-stream-observer:response_id":"chatcmpl-ABgJDo0JIRWSH5W2cE0J8vaImv3Dm","llm-stream-observer:system_fingerprint":"fp_5050236cbd"}}

event: tool.call
data: {"v":"1.0","seq":1,"type":"tool.call","index":0,"id":"call_nZUB8dEnPSMykLtTKRRS3sT8","name":"get_weather","arguments":"{\"city\":\"San Francisco\",\"state\":\"CA\"}"}

event: content.stop
data: {"v":"1.0","seq":2,"type":"content.stop","index":0,"stop_reason":"tool_use","extensions":{"llm-stream-observer:stop_reason_raw":"tool_calls"}}

event: usage
data: {"v":"1.0","seq":3,"type":"usage","input_tokens":48,"output_tokens":19,"extensions":{"llm-stream-observer:reasoning_output_tokens":0,"llm-stream-observer:total_tokens":67}}

event: stream.end
data: {"v":"1.0","seq":4,"type":"stream.end","request_id":"chatcmpl-ABgJDo0JIRWSH5W2cE0J8vaImv3Dm"}

"""

# anthropic.messages/thinking_then_text: message id msg_01ThinkingThenText000001 and service_tier
# standard (identity extensions), a thinking block 0, a text block 1, stop end_turn in
# message_delta, usage 48 in and (message_delta's) 71 out, cache read/write 0 (extensions);
# parameters: max_tokens and thinking.
ANTHROPIC_ENVELOPE = {
    "version": "1.0",
    "stream": True,
    "model": "claude-sonnet-4-20250514",
    "messages": [{"role": "user", "content": "What is 27 * 453?"}],
    "parameters": {"max_tokens": 20000, "thinking": {"type": "enabled", "budget_tokens": 16000}},
    "extensions": {DIALECT: "anthropic.messages"},
}
ANTHROPIC_SSE = """event: stream.start
data: {"v":"1.0","seq":0,"type":"stream.start","model":"claude-sonnet-4-20250514","created":1749292800,"extensions":{"llm-stream-observer:response_id":"msg_01ThinkingThenText000001","llm-stream-observer:service_tier":"standard"}}

event: content.delta
data: {"v":"1.0","seq":1,"type":"content.delta","index":1,"role":"assistant","delta":{"text":"27 * 453 = 12,231"}}

event: content.stop
data: {"v":"1.0","seq":2,"type":"content.stop","index":1,"stop_reason":"end_turn"}

event: usage
data: {"v":"1.0","seq":3,"type":"usage","input_tokens":48,"output_tokens":71,"extensions":{"llm-stream-observer:cache_read_input_tokens":0,"llm-stream-observer:cache_creation_input_tokens":0}}

event: stream.end
data: {"v":"1.0","seq":4,"type":"stream.end"}

"""
ANTHROPIC_ALL_SSE = r"""event: stream.start
data: {"v":"1.0","seq":0,"type":"stream.start","model":"claude-sonnet-4-20250514","created":1749292800,"extensions":{"llm-stream-observer:response_id":"msg_01ThinkingThenText000001","llm-stream-observer:service_tier":"standard"}}

event: content.delta
data: {"v":"1.0","seq":1,"type":"content.delta","index":0,"role":"assistant","delta":{"text":"Let me solve this step by step:\n\n1. First break down 27 * 453\n2. 453 = 400 + 50 + 3"},"extensions":{"llm-stream-observer:block_type":"reasoning"}}

event: content.delta
data: {"v":"1.0","seq":2,"type":"content.delta","index":1,"role":"assistant","delta":{"text":"27 * 453 = 12,231"}}

event: content.stop
data: {"v":"1.0","seq":3,"type":"content.stop","index":1,"stop_reason":"end_turn"}

event: usage
data: {"v":"1.0","seq":4,"type":"usage","input_tokens":48,"output_tokens":71,"extensions":{"llm-stream-observer:cache_read_input_tokens":0,"llm-stream-observer:cache_creation_input_tokens":0}}

event: stream.end
data: {"v":"1.0","seq":5,"type":"stream.end"}

"""

# bedrock.converse/text_and_tool: the model only in the URL (the response names none: null), the
# messages and toolConfig.tools as sent, inferenceConfig as the parameter; text "Hello wörld" at 0,
# tool use at 1, stopReason tool_use, usage 12/7 (total 19: an extension) in the metadata event;
# the response id is the x-amzn-requestid header of the fixture's meta (the events name none).
BEDROCK_ENVELOPE = {
    "version": "1.0",
    "stream": True,
    "model": "anthropic.claude-3-5-sonnet-20240620-v1:0",
    "messages": [{"role": "user", "content": [{"text": "What is the weather in Paris?"}]}],
    "tools": [
        {
            "toolSpec": {
                "name": "get_weather",
                "description": "Weather by city",
                "inputSchema": {"json": {"type": "object", "properties": {"city": {"type": "string"}}}},
            }
        }
    ],
    "parameters": {"inferenceConfig": {"maxTokens": 256}},
    "extensions": {DIALECT: "bedrock.converse", TOOL_NAMES: ["get_weather"]},
}
BEDROCK_SSE = r"""event: stream.start
data: {"v":"1.0","seq":0,"type":"stream.start","model":null,"created":1749292800,"extensions":{"llm-stream-observer:response_id":"4c2f0a5e-8b7d-4e1a-9f3c-2d6b1a0e7c55"}}

event: content.delta
data: {"v":"1.0","seq":1,"type":"content.delta","index":0,"role":"assistant","delta":{"text":"Hello wörld"}}

event: tool.call
data: {"v":"1.0","seq":2,"type":"tool.call","index":1,"id":"tooluse_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"}

event: content.stop
data: {"v":"1.0","seq":3,"type":"content.stop","index":1,"stop_reason":"tool_use"}

event: usage
data: {"v":"1.0","seq":4,"type":"usage","input_tokens":12,"output_tokens":7,"extensions":{"llm-stream-observer:total_tokens":19}}

event: stream.end
data: {"v":"1.0","seq":5,"type":"stream.end"}

"""

# gemini/two_candidates: candidateCount 2 (a parameter), responseId as the identity extension,
# candidate 0's text at block 0 and candidate 1's at block 2 (Gemini's 2c), each block's first
# delta announcing its choice, no block stop reasons; then each choice's stop at its block, marked
# with its choice (STOP -> end_turn, MAX_TOKENS ->
# max_tokens, the raw ones as extensions): the last is the message's, so no other content.stop;
# usage 5 in, 11 out, total 16 (an extension); no request id.
GEMINI_ENVELOPE = {
    "version": "1.0",
    "stream": True,
    "model": "gemini-2.0-flash",
    "messages": [{"role": "user", "parts": [{"text": "Name a colour."}]}],
    "parameters": {"candidateCount": 2, "maxOutputTokens": 8},
    "extensions": {DIALECT: "gemini"},
}
GEMINI_SSE = r"""event: stream.start
data: {"v":"1.0","seq":0,"type":"stream.start","model":"gemini-2.0-flash","created":1749292800,"extensions":{"llm-stream-observer:response_id":"c2Y0aPqXBMmQ1MkP8dXo-Q0"}}

event: content.delta
data: {"v":"1.0","seq":1,"type":"content.delta","index":0,"role":"assistant","delta":{"text":"Blue sky."},"extensions":{"llm-stream-observer:choices":[0]}}

event: content.delta
data: {"v":"1.0","seq":2,"type":"content.delta","index":2,"role":"assistant","delta":{"text":"Teal is a colour between"},"extensions":{"llm-stream-observer:choices":[1]}}

event: content.stop
data: {"v":"1.0","seq":3,"type":"content.stop","index":0,"stop_reason":"end_turn","extensions":{"llm-stream-observer:choice":0,"llm-stream-observer:stop_reason_raw":"STOP"}}

event: content.stop
data: {"v":"1.0","seq":4,"type":"content.stop","index":2,"stop_reason":"max_tokens","extensions":{"llm-stream-observer:choice":1,"llm-stream-observer:stop_reason_raw":"MAX_TOKENS"}}

event: usage
data: {"v":"1.0","seq":5,"type":"usage","input_tokens":5,"output_tokens":11,"extensions":{"llm-stream-observer:total_tokens":16}}

event: stream.end
data: {"v":"1.0","seq":6,"type":"stream.end"}

"""

HAND_WRITTEN = [
    ("openai.chat", "tool_call_fragments", False, OPENAI_ENVELOPE, OPENAI_SSE),
    ("anthropic.messages", "thinking_then_text", False, ANTHROPIC_ENVELOPE, ANTHROPIC_SSE),
    ("anthropic.messages", "thinking_then_text", True, ANTHROPIC_ENVELOPE, ANTHROPIC_ALL_SSE),
    ("bedrock.converse", "text_and_tool", False, BEDROCK_ENVELOPE, BEDROCK_SSE),
    ("gemini", "two_candidates", False, GEMINI_ENVELOPE, GEMINI_SSE),
]


@pytest.mark.parametrize(
    ("dialect", "case", "all_blocks", "envelope", "sse"),
    HAND_WRITTEN,
    ids=[f"{d}/{c}{'+all' if a else ''}" for d, c, a, _e, _s in HAND_WRITTEN],
)
def test_hand_written_replay(dialect: str, case: str, all_blocks: bool, envelope: dict[str, Any], sse: str) -> None:
    """The envelope and the SSE bytes are exactly the hand-written ones."""
    assert int(T0) == CREATED  # the hand-written ``created``
    got_envelope, events = standard_replay(record_of(dialect, case), all_blocks=all_blocks)
    assert got_envelope == envelope
    assert encode_sse(events).decode() == sse


# -- the round trip over every wire fixture ---------------------------------------------------

RECORDS = [(d, c, i) for d in dialect_dirs() for c in cases(d) for i in range(len(recorded(d, c)))]
RECORD_IDS = [f"{d}/{c}" + (f"[{i}]" if i else "") for d, c, i in RECORDS]


def test_every_fixture_is_replayed() -> None:
    """The round trip covers every fixture folder of a dialect and all their cases."""
    assert {d for d, _c, _i in RECORDS} == set(dialect_dirs())
    assert len({(d, c) for d, c, _i in RECORDS}) == sum(len(cases(d)) for d in dialect_dirs()) >= 90


def _carriers(original: dict[str, Any], again: dict[str, Any], kept: set[str]) -> list[dict[str, Any]]:
    """The blocks ``again`` has beyond ``original``'s blocks of the ``kept`` types (the
    asserts of the round trip say what they may be)."""
    indexes = {b["index"] for b in original["blocks"] if b["type"] in kept}
    return [b for b in again["blocks"] if b["index"] not in indexes]


def _assert_round_trip(original: dict[str, Any], events: list[dict[str, Any]], again: dict[str, Any]) -> None:
    """What the standard dialect records of the replay equals the original record wherever
    the draft can carry it (the module docstring of ``observer.standard_replay``)."""
    assert again["text"] == original["text"]
    calls = [(t["index"], t["id"], t["name"], t["arguments"], t["declared"]) for t in original["tool_calls"]]
    assert [(t["index"], t["id"], t["name"], t["arguments"], t["declared"]) for t in again["tool_calls"]] == calls
    assert again["usage"] == original["usage"]  # every count, the details, "not reported" as null
    assert again["choices"] == original["choices"]  # each choice's text and stop reasons
    assert kinds(again).count("undeclared_tool") == kinds(original).count("undeclared_tool")
    for key in ("response_id", "system_fingerprint", "service_tier"):
        assert again[key] == original[key], key
    assert again["stop_reason"] == original["stop_reason"]
    assert again["error"] == original["error"]
    assert again["outcome"] == original["outcome"]
    assert again["model"] == original["model"]
    assert again["request_id"] == original["request_id"]
    # The vendor's raw stop reason travels in the observer's extension, read back.
    assert again["stop_reason_raw"] == original["stop_reason_raw"]
    if original["stop_reason_raw"] != original["stop_reason"]:
        last_stop = [e for e in events if e["type"] == "content.stop"][-1]
        assert last_stop["extensions"][STOP_REASON_RAW] == original["stop_reason_raw"]
        assert set(last_stop["extensions"]) <= {STOP_REASON_RAW, CHOICE}
    # The request as recorded.
    for key in ("model", "messages", "tools", "parameters", "end_user", "request_id"):
        assert again["request"][key] == original["request"][key], key
    assert set(original["request"]["extensions"]) <= set(again["request"]["extensions"])
    # A well-formed draft stream; its end as the original's.
    assert not set(kinds(again)) & WIRE_KINDS, kinds(again)
    assert ("missing_stream_end" in kinds(again)) == ("missing_stream_end" in kinds(original))


@pytest.mark.parametrize(("dialect", "case", "turn"), RECORDS, ids=RECORD_IDS)
def test_round_trip(dialect: str, case: str, turn: int) -> None:
    """Replayed and recorded again, the exchange keeps its text, text blocks, tool calls,
    usage (every count), response identity, stop reason (canonical and raw), error, outcome,
    model and request; reasoning and refusal blocks are left out, and the message's stop
    reason may add one empty block (its ``content.stop``)."""
    original = recorded(dialect, case)[turn]
    envelope, events = standard_replay(Exchange.from_dict(original))
    again = back(envelope, encode_sse(events), status=original["status_code"], outcome=original["outcome"])
    _assert_round_trip(original, events, again)
    kept = {"text", "tool_use"}
    want = [(b["index"], b["type"], b["text"], b["stop_reason"]) for b in original["blocks"] if b["type"] in kept]
    carriers = _carriers(original, again, kept)
    got = [(b["index"], b["type"], b["text"], b["stop_reason"]) for b in again["blocks"] if b not in carriers]
    assert [(i, t, x) for i, t, x, _s in got] == [(i, t, x) for i, t, x, _s in want]
    # A block's own stop reason comes back; one without gets the message's, if it carries it.
    for (_i, _t, _x, stop), (_gi, _gt, _gx, got_stop) in zip(want, got, strict=True):
        assert got_stop in (stop, original["stop_reason"])
    assert len(carriers) <= 1
    for block in carriers:
        assert (block["text"], block["stop_reason"]) == ("", original["stop_reason"])
        assert block["type"] == ("tool_use" if original["stop_reason"] == "tool_use" else "text")


@pytest.mark.parametrize(("dialect", "case", "turn"), RECORDS, ids=RECORD_IDS)
def test_round_trip_with_all_blocks(dialect: str, case: str, turn: int) -> None:
    """With ``all_blocks`` every block is in the stream, typed by the extension field: read
    with it, the events give the record's blocks, and through the standard dialect (which reads
    it) everything comes back, the reasoning text and each block's type too."""
    original = recorded(dialect, case)[turn]
    envelope, events = standard_replay(Exchange.from_dict(original), all_blocks=True)
    read: dict[int, tuple[str, str]] = {}
    for e in events:
        if e["type"] == "content.delta":
            kind = e.get("extensions", {}).get(BLOCK_TYPE, "text")
            prior = read.get(e["index"], (kind, ""))
            assert prior[0] == kind
            read[e["index"]] = (kind, prior[1] + e["delta"]["text"])
    want = [(b["index"], b["type"], b["text"]) for b in original["blocks"] if b["type"] != "tool_use"]
    # Beyond them at most the empty delta opening the message stop's block (a record without one).
    extra = [i for i in read if i not in {b["index"] for b in original["blocks"]}]
    assert len(extra) <= 1 and all(read.pop(i) == ("text", "") for i in extra)
    assert [(i, k, t) for i, (k, t) in sorted(read.items())] == want
    again = back(envelope, encode_sse(events), status=original["status_code"], outcome=original["outcome"])
    _assert_round_trip(original, events, again)  # the standard dialect reads the block types back
    assert again["reasoning"] == original["reasoning"]
    got = {b["index"]: (b["type"], b["text"]) for b in again["blocks"]}
    assert all(got.get(i) == (k, t) for i, k, t in want), (got, want)


def test_sse_framing() -> None:
    """Each event is one ``event:`` line naming its type, one ``data:`` line with its JSON and
    a blank line (draft §5.1); a WHATWG decoder gives back every event object, in seq order."""
    _envelope, events = standard_replay(record_of("openai.chat", "tool_call_fragments"))
    body = encode_sse(events)
    messages = feed(TextForm(SSEDecoder()), bytewise(body))
    assert [(m.event, json.loads(m.data)) for m in messages] == [(e["type"], e) for e in events]
    assert [e["seq"] for e in events] == [0, 1, 2, 3, 4]
    assert body.count(b"\n\n") == 5 and body.count(b"\n") == 15


# -- single mappings, on records made here ------------------------------------------------------

STARTED = datetime(2026, 12, 4, 9, 30, 15, 900_000, tzinfo=timezone.utc)  # 1796376615.9 s


def exchange(**fields: Any) -> Exchange:
    """A small completed standard-looking record; ``fields`` override any attribute."""
    values: dict[str, Any] = {
        "id": "r1",
        "dialect": "openai.chat",
        "host": "api.example.com",
        "path": "/v1/chat/completions",
        "method": "POST",
        "http_version": "HTTP/1.1",
        "status_code": 200,
        "started_at": STARTED,
        "model": "m",
        "request": RequestFacts(model="m", messages=[{"role": "user", "content": "hi"}]),
        "blocks": [Block(0, "text", "Hello", None)],
        "stop_reason": "end_turn",
        "stop_reason_raw": "stop",
        "outcome": "completed",
    }
    values.update(fields)
    return Exchange(**values)


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def test_created_is_the_records_start_in_whole_seconds() -> None:
    _envelope, events = standard_replay(exchange())
    assert events[0] == {"v": "1.0", "seq": 0, "type": "stream.start", "model": "m", "created": 1796376615}


def test_usage_absent_counts_are_null_and_come_back_unreported() -> None:
    """A count the vendor did not send is null (never 0); the standard dialect flags the
    draft-required field and records it as not reported again."""
    _envelope, events = standard_replay(exchange(usage=Usage(input_tokens=None, output_tokens=5, reported=True)))
    (usage,) = [e for e in events if e["type"] == "usage"]
    assert usage == {"v": "1.0", "seq": 3, "type": "usage", "input_tokens": None, "output_tokens": 5}
    again = back(*_replayed(exchange(usage=Usage(input_tokens=None, output_tokens=5, reported=True))))
    assert {k: again["usage"][k] for k in ("input_tokens", "output_tokens", "reported")} == {
        "input_tokens": None,
        "output_tokens": 5,
        "reported": True,
    }
    assert [(v["kind"], v["detail"]) for v in again["violations"]] == [
        ("invalid_event", "usage: input_tokens is not a non-negative integer")
    ]


def test_usage_not_reported_gives_no_usage_event() -> None:
    _envelope, events = standard_replay(exchange(usage=Usage()))
    assert types(events) == ["stream.start", "content.delta", "content.stop", "stream.end"]
    assert back(*_replayed(exchange()))["usage"]["reported"] is False


def test_long_text_is_cut_into_deltas() -> None:
    """One block of 2 * 8192 + 1 characters: three deltas of 8192, 8192 and 1 (each far below
    the 1 MiB event cap); the text comes back whole."""
    text = "ä" * (2 * 8192) + "!"
    _envelope, events = standard_replay(exchange(blocks=[Block(0, "text", text, None)]))
    assert DELTA_MAX_CHARS == 8192
    assert [len(e["delta"]["text"]) for e in events if e["type"] == "content.delta"] == [8192, 8192, 1]
    assert back(*_replayed(exchange(blocks=[Block(0, "text", text, None)])))["text"] == text


def test_empty_block_is_one_empty_delta() -> None:
    _envelope, events = standard_replay(exchange(blocks=[Block(0, "text", "", None)]))
    assert [e["delta"] for e in events if e["type"] == "content.delta"] == [{"text": ""}]


def test_http_error_replays_as_no_event() -> None:
    """A non-2xx answer had no stream: no event; with its status it is an http_error again."""
    rec = exchange(status_code=503, blocks=[], stop_reason=None, stop_reason_raw=None, model=None, outcome="http_error")
    envelope, events = standard_replay(rec)
    assert events == [] and encode_sse(events) == b""
    assert back(envelope, b"", status=503, outcome="http_error")["outcome"] == "http_error"


@pytest.mark.parametrize(
    ("outcome", "end_cause", "back_outcome"),
    [
        ("truncated", EndCause.EOF, "truncated"),
        ("client_aborted", EndCause.CLIENT_ABORTED, "client_aborted"),
        ("client_aborted", EndCause.EOF, "truncated"),
        ("interrupted", EndCause.SHUTDOWN, "interrupted"),
    ],
)
def test_streams_that_did_not_end_replay_without_stream_end(outcome: str, end_cause: EndCause, back_outcome: str):
    """No ``stream.end``: the outcome is then the transport's, which the reader supplies."""
    rec = exchange(outcome=outcome, stop_reason=None, stop_reason_raw=None)
    envelope, events = standard_replay(rec)
    assert types(events) == ["stream.start", "content.delta"]
    again = observe(
        STANDARD,
        orjson.dumps(envelope),
        [encode_sse(events)],
        end=end_cause,
        request_headers={"content-type": "application/llm-request+json"},
    )
    assert again["outcome"] == back_outcome


def test_error_keeps_its_stream_end_only_if_it_had_one() -> None:
    err = ErrorInfo("overloaded", "busy")
    ended = exchange(outcome="error", error=err, stop_reason=None, stop_reason_raw=None)
    cut = replace(ended, violations=[Violation("missing_stream_end", None, "upstream closed the stream")])
    assert types(standard_replay(ended)[1])[-2:] == ["error", "stream.end"]
    assert types(standard_replay(cut)[1])[-1] == "error"
    assert back(*_replayed(cut))["error"] == {"code": "overloaded", "message": "busy"}


def test_raw_stop_reason_without_a_canonical_one() -> None:
    """The draft requires ``stop_reason``: null, with the vendor's value in the extension."""
    _envelope, events = standard_replay(exchange(stop_reason=None, stop_reason_raw="WEIRD"))
    assert events[2] == {
        "v": "1.0",
        "seq": 2,
        "type": "content.stop",
        "index": 0,
        "stop_reason": None,
        "extensions": {STOP_REASON_RAW: "WEIRD"},
    }


def test_a_stop_reason_without_any_block_opens_one() -> None:
    """No block and no tool call (a prompt blocked before any output): an empty delta opens
    block 0, whose content.stop carries the stop reason; no ``block_not_started`` on the way back."""
    rec = exchange(blocks=[], stop_reason="content_filter", stop_reason_raw="PROHIBITED_CONTENT")
    _envelope, events = standard_replay(rec)
    assert events[1:3] == [
        {"v": "1.0", "seq": 1, "type": "content.delta", "index": 0, "role": "assistant", "delta": {"text": ""}},
        {
            "v": "1.0",
            "seq": 2,
            "type": "content.stop",
            "index": 0,
            "stop_reason": "content_filter",
            "extensions": {STOP_REASON_RAW: "PROHIBITED_CONTENT"},
        },
    ]
    again = back(*_replayed(rec))
    assert (again["stop_reason"], kinds(again)) == ("content_filter", [])


def test_message_stop_goes_to_the_last_text_block_or_the_tool_call() -> None:
    """end_turn after a reasoning block 0 and text block 1 (all blocks): index 1; tool_use
    after text 0 and a call at 3: index 3 (draft §4.8 shape)."""
    two = [Block(0, "reasoning", "hm", None), Block(1, "text", "ok", None), Block(2, "reasoning", "so", None)]
    events = standard_replay(exchange(blocks=two), all_blocks=True)[1]
    assert [(e["index"], e["stop_reason"]) for e in events if e["type"] == "content.stop"] == [(1, "end_turn")]
    call = ToolCall(3, "c1", "f", "{}")
    events = standard_replay(exchange(tool_calls=[call], stop_reason="tool_use", stop_reason_raw="tool_use"))[1]
    assert [(e["type"], e.get("index")) for e in events][1:4] == [
        ("content.delta", 0),
        ("tool.call", 3),
        ("content.stop", 3),
    ]


def test_each_tool_use_block_comes_back() -> None:
    """Two tool calls with their draft blocks (``tool.call`` then ``content.stop`` tool_use at
    0 and at 1, draft §4.8): both blocks come back, not only the message's last."""
    calls = [ToolCall(0, "c0", "f", "{}", True), ToolCall(1, "c1", "g", "{}", True)]
    tool_blocks = [Block(0, "tool_use", "", "tool_use"), Block(1, "tool_use", "", "tool_use")]
    rec = exchange(tool_calls=calls, blocks=tool_blocks, stop_reason="tool_use", stop_reason_raw="tool_use")
    again = back(*_replayed(rec))
    assert [(b["index"], b["type"], b["text"], b["stop_reason"]) for b in again["blocks"]] == [
        (0, "tool_use", "", "tool_use"),
        (1, "tool_use", "", "tool_use"),
    ]


def test_null_tool_call_fields_come_back_null() -> None:
    call = ToolCall(None, None, None, '{"a":1}')
    rec = exchange(tool_calls=[call], blocks=[], stop_reason=None, stop_reason_raw=None)
    again = back(*_replayed(rec))
    assert [(t["index"], t["id"], t["name"], t["arguments"]) for t in again["tool_calls"]] == [
        (None, None, None, '{"a":1}')
    ]


def test_envelope_keeps_binary_parts_extensions_and_end_user() -> None:
    """Binary parts as recorded (type, media type and decoded size; no data), the recorded
    extension names (values unknown: null), end_user and request_id as draft metadata."""
    image = {"type": "image", "media_type": "image/png", "data_bytes": 1234}
    request = RequestFacts(
        version="1.0",
        stream=True,
        model="m",
        messages=[{"role": "user", "content": [{"type": "text", "text": "what is it"}, image]}],
        metadata={"trace": "t-1"},
        extensions=["acme:cache"],
        end_user="alice",
        request_id="req-7",
    )
    rec = exchange(dialect=STANDARD, request=request, request_id="req-7")
    envelope, _events = standard_replay(rec)
    assert envelope == {
        "version": "1.0",
        "stream": True,
        "model": "m",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "what is it"}, image]}],
        "metadata": {"trace": "t-1", "user_id": "alice", "request_id": "req-7"},
        "extensions": {"acme:cache": None, DIALECT: STANDARD},
    }
    again = back(*_replayed(rec))
    assert again["request"]["messages"] == request.messages
    assert (again["request"]["end_user"], again["request"]["request_id"]) == ("alice", "req-7")
    assert again["request"]["extensions"] == ["acme:cache", DIALECT]
    assert kinds(again) == []


_NAMES = st.one_of(st.none(), st.text(max_size=12))
_REASONS = st.sampled_from([None, "end_turn", "max_tokens", "tool_use", "content_filter", "refusal"])
_COUNTS = st.one_of(st.none(), st.integers(min_value=0, max_value=2**53))


@st.composite
def exchanges(draw: st.DrawFn) -> Exchange:
    """Records of any shape the replay must carry: blocks of the three types at distinct
    indexes, tool calls with or without index, id and name, partial usage, a stop reason with a
    raw one, an error, and every way a stream ends."""
    indexes = draw(st.lists(st.integers(min_value=0, max_value=9), unique=True, max_size=4))
    blocks = [
        Block(i, draw(st.sampled_from(["text", "reasoning", "refusal"])), draw(st.text(max_size=40)), draw(_REASONS))
        for i in indexes
    ]
    elsewhere = draw(st.booleans())  # the request's tools declared on an app's server: declared unknown
    calls = [
        ToolCall(
            draw(st.one_of(st.none(), st.integers(0, 9))),
            draw(_NAMES),
            draw(_NAMES),
            draw(st.text(max_size=30)),
            None if elsewhere else False,
        )
        for _ in range(draw(st.integers(0, 3)))
    ]
    # Choices (n > 1) as reassembly makes them: each one's text is a text block's, or "" for none.
    texts = [b.text for b in blocks if b.type == "text"]
    choice_indexes = draw(st.lists(st.integers(min_value=0, max_value=5), unique=True, max_size=3))
    choices = [
        {"index": c, "text": draw(st.sampled_from([*texts, ""])), "stop_reason": r, "stop_reason_raw": raw_c}
        for c in sorted(choice_indexes)
        for r in [draw(_REASONS)]
        for raw_c in [draw(st.sampled_from([r, "length", None]))]
    ]
    reason = draw(_REASONS)
    raw = draw(st.sampled_from([reason, "STOP", "length", None]))
    error = draw(st.one_of(st.none(), st.builds(ErrorInfo, _NAMES, _NAMES)))
    outcome = "error" if error is not None else draw(st.sampled_from(["completed", "truncated", "client_aborted"]))
    cut = outcome != "completed" and draw(st.booleans())
    usage = Usage(input_tokens=draw(_COUNTS), output_tokens=draw(_COUNTS), reported=draw(st.booleans()))
    if not usage.reported:
        usage = Usage()
    return exchange(
        blocks=blocks,
        tool_calls=calls,
        choices=choices if len(choices) > 1 else None,
        usage=usage,
        stop_reason=reason,
        stop_reason_raw=raw,
        error=error,
        outcome=outcome,
        violations=[Violation("missing_stream_end", None, "cut")]
        if cut or outcome in ("truncated", "client_aborted")
        else [],
    )


@settings(max_examples=150, deadline=None)
@given(rec=exchanges())
def test_any_record_round_trips(rec: Exchange) -> None:
    """Whatever the record holds, the standard dialect gives back its text, tool calls,
    usage, stop reason, error and outcome (with the transport's end for an abort)."""
    original = rec.to_dict()
    envelope, events = standard_replay(rec)
    again = back(envelope, encode_sse(events), outcome=rec.outcome)
    assert again["text"] == original["text"]
    calls = [(t["index"], t["id"], t["name"], t["arguments"], t["declared"]) for t in original["tool_calls"]]
    assert [(t["index"], t["id"], t["name"], t["arguments"], t["declared"]) for t in again["tool_calls"]] == calls
    assert again["choices"] == original["choices"]
    for key in ("input_tokens", "output_tokens", "reported"):
        assert again["usage"][key] == original["usage"][key], key
    assert (again["stop_reason"], again["error"], again["outcome"]) == (rec.stop_reason, original["error"], rec.outcome)
    assert not set(kinds(again)) & WIRE_KINDS, kinds(again)


def test_core_is_pure() -> None:
    """No proxy, database, web, clock or file module in the replay core."""
    source = (Path(__file__).resolve().parents[2] / "observer" / "standard_replay.py").read_text()
    assert impurities(source) == []


def _replayed(rec: Exchange) -> tuple[dict[str, Any], bytes]:
    envelope, events = standard_replay(rec)
    return envelope, encode_sse(events)


# -- the API ---------------------------------------------------------------------------------

BOOTSTRAP = "bootstrap-token-for-replay-tests"
ROUTE = "/v1/exchanges/{}/replay"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, dict[str, str]], str]]:
    """The API over a SQLite store holding the records of openai.chat/tool_call_fragments (id
    ``rec-openai``, given) and anthropic.messages/thinking_then_text (``rec-anthropic``);
    headers per caller."""
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    upgrade(url)
    store = AuditStore(url)
    key = CheckpointKey.load_or_create(tmp_path / "keys" / "checkpoint-key.pem")
    rec = record_of("openai.chat", "tool_call_fragments")
    rec.id = "rec-openai"
    thinking = record_of("anthropic.messages", "thinking_then_text")
    thinking.id = "rec-anthropic"
    store.write_many([rec, thinking])
    headers = {"bootstrap": {"Authorization": f"Bearer {BOOTSTRAP}"}, "none": {}}
    for role in ("viewer", "auditor", "responder", "admin"):
        token, _ = create_token(store.engine, key, store.store_id(), name=role, role=role, actor="test", at=STARTED)
        headers[role] = {"Authorization": f"Bearer {token}"}
    try:
        with TestClient(create_app(store, BOOTSTRAP, key)) as client:
            yield client, headers, "rec-openai"
    finally:
        store.dispose()


def test_api_json_has_both_parts(api: Any) -> None:
    client, headers, rid = api
    response = client.get(ROUTE.format(rid), headers=headers["auditor"])
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "id": rid,
        "dialect": "openai.chat",
        "status_code": 200,
        "request": OPENAI_ENVELOPE,
        "stream": OPENAI_SSE,
    }


def test_api_parts_as_their_own_media_types(api: Any) -> None:
    client, headers, rid = api
    request = client.get(ROUTE.format(rid), params={"part": "request"}, headers=headers["responder"])
    assert (request.status_code, request.headers["content-type"]) == (200, "application/llm-request+json")
    assert request.json() == OPENAI_ENVELOPE
    stream = client.get(ROUTE.format(rid), params={"part": "stream"}, headers=headers["admin"])
    assert (stream.status_code, stream.headers["content-type"]) == (200, "text/event-stream; charset=utf-8")
    assert stream.content == OPENAI_SSE.encode()


@pytest.mark.parametrize(
    ("caller", "status"),
    [("viewer", 403), ("auditor", 200), ("responder", 200), ("admin", 200), ("bootstrap", 200), ("none", 401)],
)
def test_api_roles(api: Any, caller: str, status: int) -> None:
    """The replay is content: a viewer may not read it (403), nor anyone without a token."""
    client, headers, rid = api
    response = client.get(ROUTE.format(rid), headers=headers[caller])
    assert response.status_code == status
    if status != 200:
        assert "San Francisco" not in response.text
        assert response.json()["error"]["code"] == {403: "forbidden", 401: "unauthorized"}[status]


def test_api_errors(api: Any) -> None:
    """404 for an unknown id; 400 for a bad or unknown parameter (never ignored)."""
    client, headers, rid = api
    missing = client.get(ROUTE.format("no-such-id"), headers=headers["auditor"])
    assert missing.status_code == 404
    assert missing.json() == {"error": {"code": "not_found", "message": "no exchange with id 'no-such-id'"}}
    bad = client.get(ROUTE.format(rid), params={"part": "both"}, headers=headers["auditor"])
    assert (bad.status_code, bad.json()["error"]["code"]) == (400, "invalid_parameter")
    unknown = client.get(ROUTE.format(rid), params={"format": "sse"}, headers=headers["auditor"])
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (400, "unknown_parameter")


def test_api_blocks_all(api: Any) -> None:
    """``blocks=all`` adds the reasoning block, typed; the default leaves it out."""
    client, headers, _rid = api
    route = ROUTE.format("rec-anthropic")
    default = client.get(route, params={"part": "stream"}, headers=headers["auditor"])
    assert default.content == ANTHROPIC_SSE.encode()
    every = client.get(route, params={"blocks": "all", "part": "stream"}, headers=headers["auditor"])
    assert every.content == ANTHROPIC_ALL_SSE.encode()


def test_api_call_is_in_the_access_log(api: Any) -> None:
    """The call names the record it returned, as GET /v1/exchanges/{id} does."""
    client, headers, rid = api
    assert client.get(ROUTE.format(rid), headers=headers["auditor"]).status_code == 200
    log = client.get("/v1/access-log", params={"exchange_id": rid}, headers=headers["admin"]).json()
    entries = [e for e in log["items"] if e["endpoint"] == "/v1/exchanges/{exchange_id}/replay"]
    assert [(e["principal"], e["status"], e["rows"], e["ids"]) for e in entries] == [("auditor", 200, 1, [rid])]
