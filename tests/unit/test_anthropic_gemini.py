"""Anthropic Messages and Google Gemini dialects: detection, request facts, framing and the
adapters' edge cases. Expected values are written by hand from the vendors' documentation.

The wire fixtures (``tests/fixtures/wire/anthropic.messages/``, ``tests/fixtures/wire/gemini/``,
run by ``test_wire_fixtures.py``) reuse recorded bytes, trimmed where noted:

- anthropic.messages ``text_stream`` (verbatim, no final newline), ``tool_use`` (plus the final
  blank line), ``usage_cumulative`` (plus a final LF), ``refusal`` (verbatim): anthropics/
  anthropic-sdk-python ``tests/lib/streaming/fixtures/basic_response.txt``,
  ``tool_use_response.txt``, ``message_delta_fields_response.txt``, ``refusal_response.txt``;
  ``truncated``, ``type_mismatch``, ``done_after_stop`` and ``vertex_stream_raw_predict`` are
  ``basic_response.txt`` cut, relabelled or extended.
- anthropic.messages ``error_mid_stream`` (one text delta added) and ``whitespace_padded``
  (verbatim stream): coder/aibridge ``fixtures/anthropic/error.txtar`` and
  ``fixtures/anthropic/multi_thinking_builtin_tool.txtar``.
- gemini ``sse_text_crlf`` (three of its chunks, CRLF separators) and ``function_call``
  (verbatim, with its request): junjihashimoto/louter
  ``test-data/gemini/streaming_long/response.json`` and
  ``test-data/gemini/streaming_function_calling/{request,response}_0.json``.
- gemini ``prompt_blocked``: vercel/ai ``packages/google/src/__fixtures__/issue-19758-prompt-block.chunks.txt``
  (as one SSE event); ``thought_summaries`` and ``parallel_calls_then_stop`` follow the shapes
  of ``google-reasoning.chunks.txt`` and ``google-tool-call-gemini3.chunks.txt`` there.
- The rest (``thinking_then_text``, ``ping_anywhere``, ``non_streaming_tool_use``,
  ``redacted_thinking``; gemini ``max_tokens``, ``json_array_stream``, ``non_streaming_vertex``,
  ``truncated``, ``usage_running_totals``, ``error_chunk``) are written from the vendors'
  documented shapes (Anthropic "Streaming messages", "Tool use", "Extended thinking"; Gemini
  API "Generating content", Vertex AI ``GenerateContentResponse``).
"""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from observer.dialects.anthropic import AnthropicAdapter, AnthropicDialect
from observer.dialects.base import RequestView
from observer.dialects.gemini import GeminiAdapter, GeminiDialect
from observer.dialects.registry import default_registry
from observer.events import (
    ChoiceOpen,
    ContentDelta,
    ErrorEvent,
    ModelEvent,
    StopEvent,
    StreamEnd,
    StreamStart,
    ToolCallDelta,
    ToolCallEvent,
    UsageEvent,
)
from observer.records import RequestFacts, Violation
from observer.response import ResponseSpec
from observer.wire.frames import Framing, JSONFrame, SSEEvent
from tests.wirefeed import observe


def view(path: str, method: str = "POST") -> RequestView:
    return RequestView(method, "api.example", path, {"content-type": "application/json"})


def sse(event: str, data: object) -> SSEEvent:
    text = data if isinstance(data, str) else json.dumps(data)
    return SSEEvent(event=event, data=text, id=None, retry=None, size_bytes=len(text))


def frame(data: object) -> JSONFrame:
    text = data if isinstance(data, str) else json.dumps(data)
    return JSONFrame(text, len(text))


def kinds(items: list) -> list[str]:
    return [v.kind for v in items if isinstance(v, Violation)]


def events(items: list) -> list:
    return [e for e in items if not isinstance(e, Violation)]


# --- detection ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/v1/messages", "anthropic.messages"),
        ("/v1/messages?beta=true", "anthropic.messages"),
        ("/anthropic/v1/messages", "anthropic.messages"),
        ("/api/anthropic/v1/messages", "anthropic.messages"),
        (
            "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4@20250514:streamRawPredict",
            "anthropic.messages",
        ),
        (
            "/v1/projects/p/locations/global/publishers/anthropic/models/claude-opus-4-1%4020250805:rawPredict",
            "anthropic.messages",
        ),
        ("/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", "gemini"),
        ("/v1beta/models/gemini-2.5-flash:streamGenerateContent", "gemini"),
        ("/v1/models/gemini-2.0-flash:generateContent?key=AIza", "gemini"),
        (
            "/v1/projects/p/locations/us-central1/publishers/google/models/gemini-2.0-flash-001"
            ":streamGenerateContent?alt=sse",
            "gemini",
        ),
        ("/v1beta/models/gemini-2.5-flash%3AgenerateContent", "gemini"),
    ],
)
def test_detected(path, name):
    assert default_registry().classify(view(path)).name == name


@pytest.mark.parametrize(
    "path",
    [
        "/v1/messages/count_tokens",
        "/v1/messages/batches",
        "/v1/threads/thread_abc/messages",  # OpenAI Assistants: creates a thread message
        "/model/anthropic.claude-3-5-sonnet-20240620-v1:0/invoke-with-response-stream",  # Bedrock eventstream
        "/v1/projects/p/locations/l/publishers/anthropic/models/claude-3-haiku:countTokens",
        "/v1/projects/p/locations/l/publishers/mistralai/models/mistral-large:streamRawPredict",
        "/v1beta/models/gemini-2.5-flash:countTokens",
        "/v1beta/models/text-embedding-004:embedContent",
        "/v1beta/models:generateContent",
        "/v1beta/models/:generateContent",
    ],
)
def test_not_detected(path):
    found = default_registry().classify(view(path))
    assert found is None or found.name not in {"anthropic.messages", "gemini"}


def test_get_is_not_inference():
    assert not AnthropicDialect().matches(view("/v1/messages", "GET"))
    assert not GeminiDialect().matches(view("/v1beta/models/gemini-2.5-flash:generateContent", "GET"))


# --- framing ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "media_type", "framing"),
    [
        ("/v1beta/models/g:streamGenerateContent?alt=sse", "text/event-stream", Framing.SSE),
        ("/v1beta/models/g:streamGenerateContent", "application/json", Framing.JSON_ARRAY),
        ("/v1beta/models/g:generateContent", "application/json", Framing.JSON),
        ("/v1beta/models/g:generateContent", "text/plain", None),
    ],
)
def test_gemini_framing(path, media_type, framing):
    d = GeminiDialect()
    facts, _ = d.parse_request(b'{"contents": []}', view(path))
    assert d.framing(ResponseSpec(d.name, 200, media_type, request_stream=facts.stream, path=path)) is framing


@pytest.mark.parametrize(
    ("media_type", "framing"),
    [("text/event-stream", Framing.SSE), ("application/json", Framing.JSON), ("application/x-ndjson", None)],
)
def test_anthropic_framing(media_type, framing):
    spec = ResponseSpec("anthropic.messages", 200, media_type, request_stream=True, path="/v1/messages")
    assert AnthropicDialect().framing(spec) is framing


# --- Anthropic requests -------------------------------------------------------------------


def anthropic_request(doc: object, path: str = "/v1/messages"):
    body = doc if isinstance(doc, bytes) else orjson.dumps(doc)
    return AnthropicDialect().parse_request(body, view(path))


def test_anthropic_request_nested_base64_and_text_document():
    png = "iVBORw0KGgo="  # 8 bytes decoded
    doc = {
        "model": "claude-sonnet-4-0",
        "max_tokens": 10,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "plain text"}},
                    {
                        "type": "document",
                        "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0x"},
                    },
                ],
            },
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [
                            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}
                        ],
                    }
                ],
            },
        ],
        "tools": [
            {"name": "shot", "input_schema": {"type": "object"}},
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
        ],
        "mcp_servers": [{"type": "url", "url": "https://mcp.example", "name": "x", "authorization_token": "secret"}],
        "top_k": 5,
    }
    facts, violations = anthropic_request(doc)
    assert violations == []
    assert facts.stream is False  # absent = non-streaming
    assert facts.messages[0]["content"][0]["source"]["data"] == "plain text"  # text source kept
    pdf = facts.messages[0]["content"][1]["source"]
    assert pdf == {"type": "base64", "media_type": "application/pdf", "data_bytes": 6}
    image = facts.messages[2]["content"][0]["content"][0]
    assert image == {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data_bytes": 8}}
    assert facts.tool_names == ["shot", "web_search"]
    assert facts.parameters == {"max_tokens": 10, "top_k": 5}
    assert "secret" not in orjson.dumps(facts.to_dict()).decode()


@pytest.mark.parametrize(
    ("body", "details"),
    [
        (b'{"model": "m", "messages": []}', ["missing required fields: max_tokens"]),
        (
            b'{"model": "m", "messages": [], "max_tokens": 1, "stream": "yes", "tools": {}, "metadata": [], "system": 3}',
            [
                "stream is not a boolean",
                "system is neither a string nor an array",
                "tools is not an array",
                "metadata is not an object",
            ],
        ),
        (
            b'{"model": "m", "max_tokens": 1, "messages": [{"content": "x"}, 3]}',
            ["2 message(s) without an object and role"],
        ),
    ],
)
def test_anthropic_request_violations(body, details):
    facts, violations = anthropic_request(body)
    assert {v.kind for v in violations} == {"invalid_request"}
    assert [v.detail.split(":")[0] if "JSON:" in v.detail else v.detail for v in violations] == details
    assert facts.body_bytes == len(body)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"{nope", "the request body is not JSON"),
        (b"[1]", "the request body is not a JSON object"),
        (b"{}", "no messages array"),
        (b'{"model": 5, "messages": [], "max_tokens": 1}', "no model string"),
        (b'{"model": "m", "messages": {}, "max_tokens": 1}', "no messages array"),
    ],
)
def test_an_anthropic_path_body_without_the_request_shape_is_not_llm_traffic(body, reason):
    """Issue 14 item 8: metadata only (the body's size) and why."""
    facts, violations = anthropic_request(body)
    assert facts == RequestFacts(body_bytes=len(body))
    assert [(v.kind, v.detail) for v in violations] == [("not_llm_request", f"{reason}; recorded as metadata only")]


def test_anthropic_vertex_model_from_path_and_raw_predict_non_streaming():
    path = "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-3-5-haiku%4020241022:rawPredict"
    facts, violations = anthropic_request(
        {"anthropic_version": "vertex-2023-10-16", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
        path,
    )
    assert violations == []  # no model in the body on Vertex
    assert (facts.model, facts.stream) == ("claude-3-5-haiku@20241022", False)


# --- Anthropic adapter --------------------------------------------------------------------


def start(model: str = "claude-x", inp: int = 10, out: int = 1) -> dict:
    return {"type": "message_start", "message": {"model": model, "usage": {"input_tokens": inp, "output_tokens": out}}}


def test_anthropic_usage_assigned_across_several_message_deltas():
    body = "".join(
        f"event: {e['type']}\ndata: {orjson.dumps(e).decode()}\n\n"
        for e in [
            start(inp=377, out=1),
            {"type": "message_delta", "delta": {"stop_reason": None}, "usage": {"output_tokens": 30}},
            {"type": "message_delta", "delta": {"stop_reason": "pause_turn"}, "usage": {"output_tokens": 65}},
            {"type": "message_stop"},
        ]
    ).encode()
    record = observe("anthropic.messages", b'{"model":"m","max_tokens":9,"messages":[]}', [body], path="/v1/messages")
    assert (record["usage"]["input_tokens"], record["usage"]["output_tokens"], record["usage"]["reported"]) == (
        377,
        65,
        True,
    )
    assert record["usage"]["cache_read_input_tokens"] is None  # start() sends no cache counts: not reported
    assert (record["stop_reason"], record["outcome"]) == ("pause_turn", "completed")


def test_anthropic_adapter_checks():
    a = AnthropicAdapter()
    assert kinds(a.on_message(sse("message_start", "{not json"))) == ["invalid_json"]
    assert kinds(a.on_message(sse("message_start", "[1, 2]"))) == ["invalid_event"]
    assert kinds(a.on_message(sse("x", {"no": "type"}))) == ["invalid_event"]
    assert a.on_message(sse("", start())) == [StreamStart(None, "claude-x", None), UsageEvent(None, 10, 1)]
    # a text_delta for a block its content_block_start opened as thinking; then one never opened
    a.on_message(
        sse(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
        )
    )
    out = a.on_message(
        sse(
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "a"}},
        )
    )
    assert kinds(out) == ["invalid_event"] and events(out) == [ContentDelta(None, 0, "a", "text")]
    delta = {"type": "input_json_delta", "partial_json": "{"}
    out = a.on_message(sse("content_block_delta", {"type": "content_block_delta", "index": 4, "delta": delta}))
    assert kinds(out) == ["invalid_event"] and events(out) == [ToolCallDelta(None, "4", 4, None, None, "{")]
    out = a.on_message(sse("content_block_delta", {"type": "content_block_delta", "index": -1, "delta": {}}))
    assert kinds(out) == ["invalid_event"]
    out = a.on_message(sse("message_delta", {"type": "message_delta", "delta": {}, "usage": {"output_tokens": "7"}}))
    assert kinds(out) == ["invalid_event"] and events(out) == []


def test_anthropic_unknown_events_blocks_and_deltas_are_skipped():
    # anthropics/anthropic-sdk-python tests/lib/streaming/fixtures/compaction_multi_delta_response.txt (trimmed)
    a = AnthropicAdapter()
    msgs = [
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "compaction", "content": None, "encrypted_content": None},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "compaction_delta", "content": "Earlier conversation ", "encrypted_content": "Epw"},
        },
        {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "x"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "citations_delta", "citation": {}}},
        {"type": "content_block_stop", "index": 0},
        {"type": "some_future_event", "payload": 1},
    ]
    assert [a.on_message(sse(m["type"], m)) for m in msgs] == [[]] * len(msgs)


def test_anthropic_error_then_done_stays_error():
    body = (
        b"event: message_start\ndata: " + orjson.dumps(start()) + b"\n\n"
        b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n'
        b"event: done\ndata: [DONE]\n\n"
    )
    record = observe("anthropic.messages", b'{"model":"m","max_tokens":9,"messages":[]}', [body], path="/v1/messages")
    assert record["error"] == {"code": "overloaded_error", "message": "Overloaded"}
    assert record["outcome"] == "error"
    assert [v["kind"] for v in record["violations"]] == ["invalid_event", "missing_stream_end"]


def test_anthropic_non_streaming_error_body_and_empty_tool_input():
    a = AnthropicAdapter()
    err = {"type": "error", "error": {"type": "api_error", "message": "Overloaded"}, "request_id": None}
    assert a.on_message(frame(err)) == [ErrorEvent(None, "api_error", "Overloaded")]
    msg = {
        "type": "message",
        "model": "claude-y",
        "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "s"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "tool_use", "id": "t", "name": "now", "input": {}},
        ],
        "stop_reason": "tool_use",
    }
    assert AnthropicAdapter().on_message(frame(msg)) == [
        StreamStart(None, "claude-y", None),
        ContentDelta(None, 0, "hmm", "reasoning"),
        ContentDelta(None, 1, "", "reasoning"),
        ToolCallEvent(None, 2, "t", "now", "{}"),
        StopEvent(None, "tool_use", "tool_use"),
        StreamEnd(None),
    ]


def test_anthropic_tool_without_arguments_streams_empty_string():
    a = AnthropicAdapter()
    block = {"type": "tool_use", "id": "t", "name": "now", "input": {}}
    delta = {"type": "input_json_delta", "partial_json": ""}
    out = a.on_message(sse("content_block_start", {"type": "content_block_start", "index": 1, "content_block": block}))
    out += a.on_message(sse("content_block_delta", {"type": "content_block_delta", "index": 1, "delta": delta}))
    assert out == [ToolCallDelta(None, "1", 1, "t", "now", ""), ToolCallDelta(None, "1", 1, None, None, "")]


def test_anthropic_reused_block_index():
    a = AnthropicAdapter()

    def block_start(index: int, block: dict) -> list:
        return a.on_message(
            sse("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})
        )

    def json_delta(index: int, text: str) -> list:
        delta = {"type": "input_json_delta", "partial_json": text}
        return a.on_message(sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))

    assert block_start(0, {"type": "tool_use", "id": "a", "name": "f", "input": {}}) == [
        ToolCallDelta(None, "0", 0, "a", "f", "")
    ]
    assert json_delta(0, "{}") == [ToolCallDelta(None, "0", 0, None, None, "{}")]
    out = block_start(0, {"type": "tool_use", "id": "b", "name": "g", "input": {}})
    assert kinds(out) == ["reused_tool_index"] and events(out) == [ToolCallDelta(None, "0:2", 0, "b", "g", "")]
    assert json_delta(0, "[") == [ToolCallDelta(None, "0:2", 0, None, None, "[")]
    out = block_start(0, {"type": "text", "text": ""})
    assert kinds(out) == ["invalid_event"] and events(out) == [ContentDelta(None, 0, "", "text")]


# --- Gemini requests ----------------------------------------------------------------------


def gemini_request(doc: object, path: str = "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"):
    body = doc if isinstance(doc, bytes) else orjson.dumps(doc)
    return GeminiDialect().parse_request(body, view(path))


def test_gemini_request_snake_case_and_nested_inline_data():
    doc = {
        "system_instruction": {"parts": [{"text": "Be brief."}]},
        "contents": [
            {"role": "user", "parts": [{"inline_data": {"mime_type": "audio/wav", "data": "UklGRg=="}}]},
            {"role": "model", "parts": [{"functionCall": {"name": "snap", "args": {}}}]},
            {
                "role": "user",
                "parts": [
                    {
                        "functionResponse": {
                            "name": "snap",
                            "response": {"ok": True},
                            "parts": [{"inlineData": {"mimeType": "image/jpeg", "data": "/9j/4AAQ"}}],
                        }
                    }
                ],
            },
        ],
        "tools": [{"function_declarations": [{"name": "snap"}]}, {"codeExecution": {}}],
        "generation_config": {"temperature": 0, "thinkingConfig": {"thinkingBudget": 0}},
        "safety_settings": [],
        "cachedContent": "cachedContents/abc",
    }
    facts, violations = gemini_request(doc)
    assert violations == []
    assert (facts.model, facts.stream) == ("gemini-2.5-flash", True)
    assert facts.messages[0] == {"role": "system", "parts": [{"text": "Be brief."}]}
    assert facts.messages[1]["parts"][0] == {"inline_data": {"mime_type": "audio/wav", "data_bytes": 4}}
    nested = facts.messages[3]["parts"][0]["functionResponse"]["parts"][0]
    assert nested == {"inlineData": {"mimeType": "image/jpeg", "data_bytes": 6}}
    assert facts.tool_names == ["snap"]
    assert facts.parameters == {
        "temperature": 0,
        "thinkingConfig": {"thinkingBudget": 0},
        "safety_settings": [],
        "cachedContent": "cachedContents/abc",
    }
    assert facts.end_user is None and facts.metadata == {}


@pytest.mark.parametrize(
    ("body", "details"),
    [
        (
            b'{"contents": [], "tools": {}, "generationConfig": [], "labels": "x", "systemInstruction": "s"}',
            [
                "systemInstruction is not an object",
                "tools is not an array",
                "generationConfig is not an object",
                "labels is not an object",
            ],
        ),
        (b'{"contents": [{"role": "user"}, "x"]}', ["2 content(s) without an object and parts"]),
    ],
)
def test_gemini_request_violations(body, details):
    facts, violations = gemini_request(body)
    assert [v.kind for v in violations] == ["invalid_request"] * len(details)
    assert [v.detail for v in violations] == details
    assert (facts.model, facts.stream, facts.body_bytes) == ("gemini-2.5-flash", True, len(body))


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"[]", "the request body is not a JSON object"),
        (b"{}", "no contents array"),
        (b'{"contents": {}}', "no contents array"),
    ],
)
def test_a_gemini_path_body_without_the_request_shape_is_not_llm_traffic(body, reason):
    facts, violations = gemini_request(body)
    assert facts == RequestFacts(body_bytes=len(body))
    assert [(v.kind, v.detail) for v in violations] == [("not_llm_request", f"{reason}; recorded as metadata only")]


def test_gemini_request_model_url_decoded_and_unary():
    facts, _ = gemini_request(b'{"contents": []}', "/v1beta/models/tuned%2Dmodel%2D1:generateContent")
    assert (facts.model, facts.stream) == ("tuned-model-1", False)


# --- Gemini adapter -----------------------------------------------------------------------


def test_gemini_two_candidates_blocks_and_stop_per_candidate():
    g = GeminiAdapter()
    chunk = {
        "candidates": [
            {"index": 0, "content": {"parts": [{"text": "A"}, {"functionCall": {"name": "f"}}]}},
            {
                "index": 1,
                "content": {"parts": [{"text": "plan", "thought": True}, {"text": "B"}]},
                "finishReason": "STOP",
            },
        ]
    }
    assert g.on_message(frame(chunk)) == [
        ChoiceOpen(None, 0, 0),  # each candidate announced when first seen, its text at 2c
        ContentDelta(None, 0, "A", "text"),
        ToolCallEvent(None, 0, None, "f", ""),  # args absent: recorded as ""
        ChoiceOpen(None, 1, 2),
        ContentDelta(None, 3, "plan", "reasoning"),
        ContentDelta(None, 2, "B", "text"),
        StopEvent(None, "end_turn", "STOP", 1, 2),  # candidate 1 made no function call; its text: block 2
    ]
    assert g.on_message(frame({"candidates": [{"index": 0, "finishReason": "STOP"}]})) == [
        StopEvent(None, "tool_use", "STOP", 0, 0)
    ]
    assert g.on_close() == [StreamEnd(None)]


@pytest.mark.parametrize("reason", ["SAFETY", "RECITATION", "MALFORMED_FUNCTION_CALL", "OTHER", "BLOCKLIST"])
def test_gemini_other_finish_reasons_kept(reason):
    out = GeminiAdapter().on_message(frame({"candidates": [{"finishReason": reason}]}))
    assert out == [ChoiceOpen(None, 0, 0), StopEvent(None, reason, reason, 0, 0)]  # no index: its position


@pytest.mark.parametrize("bad", [-1, "1", 1.5, True, 2**31])
def test_gemini_candidate_index_of_the_wrong_type_is_a_violation(bad):
    """Trial finding: an index present but not a non-negative 31-bit integer became the
    candidate's position without a trace; now with an ``invalid_event`` naming it."""
    out = GeminiAdapter().on_message(frame({"candidates": [{}, {"index": bad, "finishReason": "STOP"}]}))
    assert out == [
        ChoiceOpen(None, 0, 0),
        Violation("invalid_event", None, f"candidates[].index {bad!r} invalid: its position 1 used"),
        ChoiceOpen(None, 1, 2),
        StopEvent(None, "end_turn", "STOP", 1, 2),
    ]


def test_gemini_adapter_checks_and_tolerances():
    g = GeminiAdapter()
    assert kinds(g.on_message(frame("{oops"))) == ["invalid_json"]
    assert kinds(g.on_message(frame("[1, {}]"))) == ["invalid_event"]
    assert kinds(g.on_message(frame("[DONE]"))) == ["invalid_event"]
    assert g.on_message(frame(" [DONE]\n")) == []  # flagged once per stream
    # streamed-arguments continuation parts carry no name: not recorded
    assert g.on_message(frame({"candidates": [{"content": {"parts": [{"functionCall": {}}]}}]})) == [
        ChoiceOpen(None, 0, 0)  # the candidate is announced, nothing else
    ]
    assert g.on_message(frame({"error": {"code": 429, "message": "quota"}})) == [ErrorEvent(None, "429", "quota")]
    assert g.on_message(frame({"modelVersion": "m1"})) == [ModelEvent(None, "m1")]
    assert g.on_message(frame({"modelVersion": "m1"})) == []  # once per distinct value
    assert g.on_message(frame({"usageMetadata": {"thoughtsTokenCount": 4}})) == [
        UsageEvent(None, None, 4, reasoning_output_tokens=4)  # output = candidates + thoughts; thoughts as sent
    ]
    assert g.on_close() == []  # no finishReason: the record gets missing_stream_end


def test_gemini_prompt_block_is_a_stop_not_an_error():
    g = GeminiAdapter()
    out = g.on_message(frame({"promptFeedback": {"blockReason": "OTHER", "blockReasonMessage": "Blocked by policy."}}))
    assert out == [StopEvent(None, "content_filter", "OTHER")]
    assert g.on_close() == [StreamEnd(None)]


# --- robustness ---------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 2**64) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=12,
)
ANTHROPIC_TYPES = [
    "message_start",
    "content_block_start",
    "content_block_delta",
    "message_delta",
    "message_stop",
    "error",
    "message",
    "ping",
]
ANTHROPIC_KEYS = ["message", "index", "content_block", "delta", "usage", "error", "content", "model", "stop_reason"]
GEMINI_KEYS = ["candidates", "promptFeedback", "usageMetadata", "modelVersion", "error"]


@settings(max_examples=300, deadline=None)
@given(
    etype=st.sampled_from(ANTHROPIC_TYPES) | json_values,
    fields=st.dictionaries(st.sampled_from(ANTHROPIC_KEYS), json_values, max_size=4),
)
def test_anthropic_adapter_never_raises(etype, fields):
    a = AnthropicAdapter()
    for data in ({"type": etype, **fields}, {"type": "content_block_delta", "index": 0, "delta": fields}):
        for item in a.on_message(sse("", data)):
            assert isinstance(item, Violation) or item.seq is None


@settings(max_examples=300, deadline=None)
@given(fields=st.dictionaries(st.sampled_from(GEMINI_KEYS), json_values, max_size=4), cand=json_values)
def test_gemini_adapter_never_raises(fields, cand):
    g = GeminiAdapter()
    g.on_message(frame(fields))
    g.on_message(frame({"candidates": [cand, {"content": {"parts": [cand]}, "finishReason": "STOP"}]}))
    assert g.on_close() == [StreamEnd(None)]


# --- Gemini streamed function-call arguments (streamFunctionCallArguments) -----------------


def fc_chunk(call: dict, finish: str | None = None) -> JSONFrame:
    cand: dict = {"content": {"role": "model", "parts": [{"functionCall": call}]}}
    if finish is not None:
        cand["finishReason"] = finish
    return frame({"candidates": [cand]})


def partial(path: str, more: bool = True, **value) -> dict:
    return {"partialArgs": [{"jsonPath": path, **value}], "willContinue": more}


def test_gemini_streamed_args_nested_paths_numbers_and_bools():
    g = GeminiAdapter()
    assert g.on_message(fc_chunk({"name": "plan", "id": "c1", "willContinue": True})) == [ChoiceOpen(None, 0, 0)]
    for call in (
        partial("$.recipe.name", stringValue="Lasa", willContinue=True),
        partial("$.recipe.name", stringValue="gna"),
        partial("$.recipe.items[0].qty", numberValue=2),
        partial("$.recipe.items[0].unit", stringValue="cup"),
        partial("$.recipe.items[1].qty", numberValue=0.5),
        partial("$.vegan", boolValue=False),
        partial("$['note key']", nullValue="NULL_VALUE"),
        partial("$.skipped"),  # no value: skipped
    ):
        assert g.on_message(fc_chunk(call)) == []
    out = g.on_message(fc_chunk({}, finish="STOP"))
    args = {
        "recipe": {"name": "Lasagna", "items": [{"qty": 2, "unit": "cup"}, {"qty": 0.5}]},
        "vegan": False,
        "note key": None,
    }
    assert out == [
        ToolCallEvent(None, 0, "c1", "plan", orjson.dumps(args).decode()),
        StopEvent(None, "tool_use", "STOP", 0, 0),
    ]
    assert g.on_close() == [StreamEnd(None)]


def test_gemini_streamed_args_two_consecutive_calls_and_classic_call_unchanged():
    g = GeminiAdapter()
    out = []
    for call in (
        {"name": "getWeather", "willContinue": True},
        partial("$.location", stringValue="Bos", willContinue=True),
        partial("$.location", stringValue="ton", willContinue=True),
        partial("$.location", stringValue=""),
        {},
        {"name": "getWeather", "willContinue": True},
        partial("$.location", stringValue="San Francisco", willContinue=True),
        partial("$.days", numberValue=3, more=False),  # a part without willContinue closes the call
        {"name": "time", "args": {"tz": "PST"}},  # classic complete call
        {},  # no call open: not recorded
    ):
        out += g.on_message(fc_chunk(call))
    assert out == [
        ChoiceOpen(None, 0, 0),
        ToolCallEvent(None, 0, None, "getWeather", '{"location":"Boston"}'),
        ToolCallEvent(None, 1, None, "getWeather", '{"location":"San Francisco","days":3}'),
        ToolCallEvent(None, 2, None, "time", '{"tz":"PST"}'),
    ]


def test_gemini_streamed_args_unclosed_call_emitted_on_close():
    g = GeminiAdapter()
    g.on_message(fc_chunk({"name": "getWeather", "willContinue": True}))
    g.on_message(fc_chunk(partial("$.location", stringValue="Bos", willContinue=True)))
    out = g.on_close()
    assert events(out) == [ToolCallEvent(None, 0, None, "getWeather", '{"location":"Bos"}')]
    assert kinds(out) == ["invalid_event"]
    assert "function call not closed" in out[1].detail


def test_gemini_streamed_args_unclosed_then_finish_or_next_call():
    g = GeminiAdapter()
    g.on_message(fc_chunk({"name": "a", "willContinue": True}))
    g.on_message(fc_chunk(partial("$.x", numberValue=1)))
    out = g.on_message(fc_chunk({"name": "b", "willContinue": True}))  # a never closed
    assert events(out) == [ToolCallEvent(None, 0, None, "a", '{"x":1}')] and kinds(out) == ["invalid_event"]
    out = g.on_message(fc_chunk({}, finish="STOP")) + g.on_close()
    assert events(out) == [
        ToolCallEvent(None, 1, None, "b", "{}"),
        StopEvent(None, "tool_use", "STOP", 0, 0),
        StreamEnd(None),
    ]


def test_gemini_streamed_args_bad_paths_and_caps():
    g = GeminiAdapter()
    g.on_message(fc_chunk({"name": "f", "willContinue": True}))
    out = []
    for call in (
        partial("location", stringValue="x"),  # not a $ path
        partial("$." + ".a" * 100, numberValue=1),  # too deep
        partial("$.s", stringValue="text"),
        partial("$.s.inner", numberValue=1),  # through a string
        partial("$.list[0]", numberValue=1),
        partial("$.list[5]", numberValue=1),  # past the end
        {"partialArgs": "nope", "willContinue": True},
    ):
        out += g.on_message(fc_chunk(call))
    assert out and events(out) == [] and kinds(out) == ["invalid_event"] * 5
    many = [{"jsonPath": f"$.k{i}", "numberValue": i} for i in range(1100)]
    out = g.on_message(fc_chunk({"partialArgs": many, "willContinue": False}))
    assert kinds(out) == ["invalid_event"]  # one per call
    (call,) = events(out)
    args = orjson.loads(call.arguments)
    # 1000 values attempted: s, list[0], the two conflicting ones, then k0 .. k995
    assert args["s"] == "text" and args["list"] == [1] and len(args) == 998 and "k995" in args


@pytest.mark.parametrize(("text", "shown"), [(5, "5"), ({}, "{}"), ([1], "[1]"), (True, "True")])
def test_gemini_part_text_of_the_wrong_type_is_a_violation(text, shown):
    """Regression (trial audit): a part whose ``text`` is not a string was dropped without a
    trace; now an ``invalid_event`` violation, the chunk's other parts still mapped."""
    out = GeminiAdapter().on_message(frame({"candidates": [{"content": {"parts": [{"text": text}, {"text": "B"}]}}]}))
    assert out == [
        ChoiceOpen(None, 0, 0),
        Violation("invalid_event", None, f"part text is not a string: {shown} dropped"),
        ContentDelta(None, 0, "B", "text"),
    ]


def test_gemini_token_counts_of_the_wrong_type_are_violations():
    """Regression (trial audit): a ``usageMetadata`` count present but not a non-negative
    integer was ignored without a trace; the valid counts are still reported."""
    meta = {"promptTokenCount": "x", "candidatesTokenCount": 3, "thoughtsTokenCount": -1}
    out = GeminiAdapter().on_message(frame({"candidates": [], "usageMetadata": meta}))
    assert [(v.kind, v.detail) for v in out if isinstance(v, Violation)] == [
        ("invalid_event", "usageMetadata.promptTokenCount is not a token count: 'x'"),
        ("invalid_event", "usageMetadata.thoughtsTokenCount is not a token count: -1"),
    ]
    assert [e for e in out if isinstance(e, UsageEvent)] == [UsageEvent(None, None, 3)]
