"""Ollama native API and Vercel AI SDK stream dialects: detection, request facts, and the edge
cases of their adapters that the wire fixtures do not show, with expected values written by hand.

Provenance of the wire fixtures (``tests/fixtures/wire/ollama/``, ``.../vercel.ui/``):

- ollama ``chat_stream``, ``generate_stream``, ``chat_tool_call``, ``chat_no_stream``: the
  examples of ollama/ollama ``docs/api.md`` ("Chat Request (Streaming)", "Generate request
  (Streaming)", "Chat request (with tools)" sent streamed, "Chat request (Structured outputs)"),
  trimmed, with ``done_reason`` values from the same page (``length`` in ``generate_stream``).
  ``error_mid_stream``: the ``{"error": ...}`` line written by ollama ``server/routes.go``
  ``streamResponse`` once the body has started (message text made up). ``chat_thinking``:
  hand-written in the shape of docs.ollama.com "Thinking" (``message.thinking`` beside
  ``message.content``). ``truncated``, ``crlf``: hand-written in the same shape as the docs
  examples (CRLF line ends to exercise the framer).
- vercel.ui ``v5_reference_example``: the example of vendor-wire-formats §7, which follows
  vercel/ai ``content/docs/04-ai-sdk-ui/50-stream-protocol.mdx`` (ids from that page).
  ``v5_multi_step``: tool input deltas from the seed article on the data stream protocol
  (``{"city":"San`` + `` Francisco"}``), ``finish.finishReason`` per vercel/ai
  ``packages/ai/src/ui-message-stream/ui-message-chunks.ts``, message metadata per
  ``content/docs/04-ai-sdk-ui/25-message-metadata.mdx``. ``v5_error``: an ``error`` part then
  ``[DONE]``, as in vercel/ai ``create-ui-message-stream-response.test.ts``. ``v5_abort``: the
  ``abort`` part of ``50-stream-protocol.mdx`` then ``[DONE]``. ``v4_*``: the line parts of
  vercel/ai ``packages/ui-utils/src/data-stream-parts.ts`` (``3:"An error occurred."`` is the
  SDK's default masked error text).
"""

from __future__ import annotations

import pytest

from observer.dialects.base import RequestView
from observer.dialects.ollama import OllamaAdapter, OllamaDialect
from observer.dialects.registry import default_registry
from observer.dialects.vercel import VercelUIAdapter, VercelUIDialect, parse_ui_request
from observer.events import (
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

UI_REQUEST = (
    b'{"id":"c1","messages":[{"id":"m1","role":"user","parts":[{"type":"text","text":"hi"},'
    b'{"type":"file","mediaType":"application/pdf","url":"data:application/pdf;base64,JVBERi0xLjQK"}]}],'
    b'"trigger":"submit-message"}'
)


def view(path: str, method: str = "POST") -> RequestView:
    return RequestView(method, "127.0.0.1", path, {"content-type": "application/json"})


def line(data: str) -> JSONFrame:
    return JSONFrame(data, len(data) + 1)


def sse(data: str) -> SSEEvent:
    return SSEEvent("", data, None, None, len(data) + 8)


def kinds(items: list) -> list[str]:
    return [i.kind if isinstance(i, Violation) else type(i).__name__ for i in items]


# ----- detection -----


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate", "/api/chat?x=1", "/ollama/api/chat", "/api/generate/"])
def test_ollama_paths_detected(path):
    assert default_registry().classify(view(path)).name == "ollama"


@pytest.mark.parametrize(
    ("path", "method"),
    [
        ("/api/chat", "GET"),
        ("/api/tags", "POST"),
        ("/api/chatty", "POST"),
        ("/api/embed", "POST"),
        ("/x?next=/api/chat", "POST"),
    ],
)
def test_other_requests_not_ollama(path, method):
    found = default_registry().classify(view(path, method))
    assert found is None or found.name != "ollama"


@pytest.mark.parametrize(
    "headers",
    [
        {"x-vercel-ai-ui-message-stream": "v1"},
        {"x-vercel-ai-data-stream": "v1"},
        {"x-vercel-ai-ui-message-stream": " V1 "},
    ],
)
def test_ai_sdk_response_header_reclassifies_api_chat(headers):
    """An app's POST /api/chat first looks like Ollama; the AI SDK response header wins."""
    registry = default_registry()
    v = view("/api/chat")
    assert registry.classify_response(v, headers, registry.classify(v)).name == "vercel.ui"


def test_ai_sdk_header_of_unknown_version_or_absent_keeps_the_request_dialect():
    registry = default_registry()
    v = view("/api/chat")
    current = registry.classify(v)
    assert registry.classify_response(v, {"x-vercel-ai-ui-message-stream": "v2"}, current) is current
    assert registry.classify_response(v, {"content-type": "application/x-ndjson"}, current) is current


def test_vercel_never_matches_a_request():
    assert VercelUIDialect().matches(view("/api/chat")) is False


@pytest.mark.parametrize(
    ("mtype", "framing"),
    [
        ("application/x-ndjson", Framing.NDJSON),
        ("application/ndjson", Framing.NDJSON),
        ("application/json", Framing.JSON),
        ("text/plain", None),
        ("text/event-stream", None),
    ],
)
def test_ollama_framing(mtype, framing):
    assert OllamaDialect().framing(ResponseSpec("ollama", 200, mtype, path="/api/chat")) == framing


@pytest.mark.parametrize(
    ("mtype", "framing"),
    [("text/event-stream", Framing.SSE), ("text/plain", Framing.NDJSON), ("application/json", None)],
)
def test_vercel_framing(mtype, framing):
    assert VercelUIDialect().framing(ResponseSpec("vercel.ui", 200, mtype, path="/api/chat")) == framing


# ----- Ollama requests -----


def test_ollama_reads_an_ai_sdk_body_without_violations():
    """The request of an AI SDK app on /api/chat is read as one (the response later shows the
    dialect): the same facts as the AI SDK dialect records, and nothing flagged."""
    facts, violations = OllamaDialect().parse_request(UI_REQUEST, view("/api/chat"))
    assert violations == []
    assert facts == VercelUIDialect().parse_request(UI_REQUEST, view("/api/chat"))[0]
    assert facts.model is None
    assert facts.metadata == {"id": "c1", "trigger": "submit-message"}
    assert facts.messages[0]["parts"][1] == {"type": "file", "mediaType": "application/pdf", "data_bytes": 9}


def test_ollama_reads_an_ai_sdk_body_with_an_app_model_field_as_one():
    """AI Elements apps add their own fields (``model``, ``webSearch``): still a UI request, so
    its file data URLs are reduced too."""
    body = UI_REQUEST[:-1] + b',"model":"openai/gpt-4o","webSearch":false}'
    facts, violations = OllamaDialect().parse_request(body, view("/api/chat"))
    assert violations == []
    assert facts.messages[0]["parts"][1]["data_bytes"] == 9


def test_ollama_chat_images_reduced_and_tools_named():
    body = (
        b'{"model":"llava","stream":false,"messages":[{"role":"user","content":"what is this?",'
        b'"images":["iVBORw0KGgo=","TWFu"]}],"tools":[{"type":"function","function":{"name":"lookup"}},'
        b'{"type":"function","function":{}}],"options":{"num_ctx":2048},"format":"json","keep_alive":0}'
    )
    facts, violations = OllamaDialect().parse_request(body, view("/api/chat"))
    assert violations == []
    assert facts.stream is False
    assert facts.messages == [
        {"role": "user", "content": "what is this?", "images": [{"data_bytes": 8}, {"data_bytes": 3}]}
    ]
    assert facts.tool_names == ["lookup"]
    assert len(facts.tools) == 2
    assert facts.parameters == {"num_ctx": 2048, "format": "json", "keep_alive": 0}


def test_ollama_generate_prompt_becomes_messages():
    body = b'{"model":"llava","prompt":"describe","images":["TWFu"],"suffix":"END","raw":true,"stream":null}'
    facts, violations = OllamaDialect().parse_request(body, view("/api/generate"))
    assert violations == []
    assert facts.stream is True  # null is the default: streamed
    assert facts.messages == [{"role": "user", "content": "describe", "images": [{"data_bytes": 3}], "suffix": "END"}]
    assert facts.parameters == {"raw": True}


def test_ollama_generate_without_prompt_loads_the_model():
    """``{"model": ...}`` alone loads a model (docs/api.md "Load a model"): no messages, no fault."""
    facts, violations = OllamaDialect().parse_request(b'{"model":"llama3.2"}', view("/api/generate"))
    assert (facts.messages, violations) == ([], [])


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (b'{"model":"m","stream":"yes","messages":[]}', "stream is not a boolean"),
        (b'{"model":"m","messages":["hi",{"content":"x"}]}', "2 message(s) without an object and role"),
        (b'{"model":"m","messages":[],"tools":{}}', "tools is not an array"),
        (b'{"model":"m","messages":[],"options":[]}', "options is not an object"),
    ],
)
def test_ollama_request_type_errors(body, detail):
    facts, violations = OllamaDialect().parse_request(body, view("/api/chat"))
    assert [v.kind for v in violations] == ["invalid_request"]
    assert violations[0].detail == detail or (detail.endswith("*") and violations[0].detail.startswith(detail[:-1]))
    assert facts.body_bytes == len(body)


@pytest.mark.parametrize(
    ("path", "body", "reason"),
    [
        ("/api/chat", b"", "the request body is not JSON"),
        ("/api/chat", b"[1]", "the request body is not a JSON object"),
        ("/api/chat", b'{"model":7,"messages":[]}', "no model string"),
        ("/api/chat", b'{"model":"m","messages":{}}', "no messages array"),
        ("/api/chat", b'{"channel":"team-devs","text":"lunch at 12?","user":"u1"}', "no model string"),
        ("/api/generate", b'{"model":"m","prompt":["x"]}', "prompt is not a string"),
    ],
)
def test_an_ollama_path_body_without_the_request_shape_is_not_llm_traffic(path, body, reason):
    """Issue 14 item 8 (a team chat posted to /api/chat was stored as ollama): metadata only."""
    facts, violations = OllamaDialect().parse_request(body, view(path))
    assert facts == RequestFacts(body_bytes=len(body))
    assert [(v.kind, v.detail) for v in violations] == [("not_llm_request", f"{reason}; recorded as metadata only")]


def test_ollama_bad_stream_type_is_unknown():
    facts, _ = OllamaDialect().parse_request(b'{"model":"m","stream":1,"messages":[]}', view("/api/chat"))
    assert facts.stream is None


# ----- AI SDK requests -----


@pytest.mark.parametrize("body", [b"", b"  ", b"not json", b"[1,2]", b'{"messages":"x"}'])
def test_ui_request_of_unknown_shape_is_recorded_by_size_only(body):
    facts, violations = VercelUIDialect().parse_request(body, view("/api/chat"))
    assert violations == []
    assert facts == RequestFacts(body_bytes=len(body), stream=True)


def test_ui_request_completion_prompt_and_v4_attachments():
    assert parse_ui_request(b'{"prompt":"Once"}').messages == [{"role": "user", "content": "Once"}]
    body = (
        b'{"messages":[{"role":"user","content":"see","experimental_attachments":[{"name":"a.png",'
        b'"contentType":"image/png","url":"data:image/png;base64,TWE="},{"url":"https://x.test/b.png"}]}]}'
    )
    assert parse_ui_request(body).messages == [
        {
            "role": "user",
            "content": "see",
            "experimental_attachments": [
                {"name": "a.png", "contentType": "image/png", "data_bytes": 2},
                {"url": "https://x.test/b.png"},
            ],
        }
    ]


# ----- Ollama adapter -----


def test_ollama_adapter_line_faults():
    a = OllamaAdapter()
    out = []
    for data in [
        "{oops",
        "[1]",
        '{"message":"x","done":false}',
        '{"message":{"content":5},"done":"no"}',
        '{"message":{"tool_calls":{}}}',
        '{"message":{"tool_calls":[{"function":{"arguments":{}}}, 3]}}',
        "   ",
    ]:
        out += a.on_message(line(data))
    assert kinds(out) == [
        "invalid_json",
        "invalid_event",
        "invalid_event",
        "invalid_event",
        "invalid_event",
        "invalid_event",
        "invalid_event",
        "ToolCallEvent",
        "invalid_event",
    ]
    assert out[7] == ToolCallEvent(None, 0, None, None, "{}")


def test_ollama_adapter_generate_thinking_and_raw_done_reason():
    a = OllamaAdapter()
    out = a.on_message(line('{"model":"m","thinking":"hmm","response":"ok","done":false}'))
    out += a.on_message(line('{"model":"m2","response":"","done":true,"done_reason":"unload","eval_count":-1}'))
    assert out == [
        ModelEvent(None, "m"),
        ContentDelta(None, 1, "hmm", "reasoning"),
        ContentDelta(None, 0, "ok", "text"),
        ModelEvent(None, "m2"),
        StopEvent(None, "unload", "unload"),
        Violation("invalid_event", None, "eval_count is not an integer in 0..2^63-1"),
        StreamEnd(None),
    ]


def test_ollama_adapter_tool_call_id_string_arguments_and_plain_done():
    """A done line without done_reason (older servers) gives no stop reason; tool calls keep
    their ``id`` and string ``arguments`` as sent, and ``stop`` after them is ``tool_use``."""
    a = OllamaAdapter()
    call = '{"id":"call_1","function":{"name":"f","arguments":"{\\"a\\": 1}"}}'
    out = a.on_message(line('{"message":{"tool_calls":[' + call + "]}}"))
    out += a.on_message(line('{"done":true}'))
    assert out == [ToolCallEvent(None, 0, "call_1", "f", '{"a": 1}'), StreamEnd(None)]
    b = OllamaAdapter()
    b.on_message(line('{"message":{"tool_calls":[{"function":{"name":"f","arguments":{}}}]}}'))
    assert b.on_message(line('{"done":true,"done_reason":"stop"}'))[0] == StopEvent(None, "tool_use", "stop")


def test_ollama_error_object_is_kept_as_json():
    out = OllamaAdapter().on_message(line('{"error":{"message":"boom"}}'))
    assert out == [ErrorEvent(None, None, '{"message":"boom"}')]


def test_ollama_error_status_is_http_error():
    """Before the stream starts Ollama answers with an error status and a JSON body: not parsed."""
    rec = observe(
        "ollama",
        b'{"model":"nope","messages":[]}',
        [b'{"error":"model \\"nope\\" not found"}'],
        status=404,
        content_type="application/json",
        path="/api/chat",
    )
    assert rec["outcome"] == "http_error"
    assert rec["response_body"] == '{"error":"model \\"nope\\" not found"}'


def test_ollama_stream_false_with_unexpected_media_type_is_unreadable():
    rec = observe("ollama", b'{"model":"m","messages":[]}', [b"hello"], content_type="text/plain", path="/api/chat")
    assert [v["kind"] for v in rec["violations"]] == ["unexpected_content_type"]
    assert rec["outcome"] == "unreadable"


# ----- AI SDK adapter: v5 -----


def test_v5_faults_and_ignored_parts():
    a = VercelUIAdapter()
    out = []
    for data in [
        "{oops",
        '"text"',
        '{"id":"x"}',
        '{"type":"text-delta","delta":"x"}',
        '{"type":"text-delta","id":"t"}',
        '{"type":"finish","finishReason":3}',
        '{"type":"custom","kind":"openai.compaction"}',
        '{"type":"tool-output-error","toolCallId":"c","errorText":"no"}',
        '{"type":"text-end","id":"t"}',
    ]:
        out += a.on_message(sse(data))
    assert kinds(out) == [
        "invalid_json",
        "invalid_event",
        "invalid_event",
        "invalid_event",
        "invalid_event",
        "invalid_event",
    ]
    assert out[3].detail == "text-delta: id is not a string"


def test_v5_tool_input_without_deltas_uses_the_complete_input():
    """Started but not streamed: the complete input is appended to the started call; never
    started: a complete call. A second ``tool-input-available`` adds nothing."""
    a = VercelUIAdapter()
    out = a.on_message(sse('{"type":"tool-input-start","toolCallId":"c1","toolName":"f"}'))
    out += a.on_message(sse('{"type":"tool-input-available","toolCallId":"c1","toolName":"f","input":{"b":[1,2]}}'))
    out += a.on_message(
        sse('{"type":"tool-input-error","toolCallId":"c2","toolName":"g","input":"x(","errorText":"bad"}')
    )
    out += a.on_message(sse('{"type":"tool-input-available","toolCallId":"c2","toolName":"g","input":{}}'))
    assert out == [
        ToolCallDelta(None, "c1", 0, "c1", "f", ""),
        ToolCallDelta(None, "c1", 0, "c1", "f", '{"b":[1,2]}'),
        ToolCallEvent(None, 1, "c2", "g", '"x("'),
    ]


def test_v5_delta_before_start_and_block_ids_per_type():
    a = VercelUIAdapter()
    out = a.on_message(sse('{"type":"tool-input-delta","toolCallId":"c","inputTextDelta":"{}"}'))
    out += a.on_message(sse('{"type":"tool-input-start","toolCallId":"c","toolName":"f"}'))
    out += a.on_message(sse('{"type":"reasoning-delta","id":"0","delta":"r"}'))
    out += a.on_message(sse('{"type":"text-delta","id":"0","delta":"t"}'))
    out += a.on_message(sse('{"type":"text-delta","id":"0","delta":""}'))
    assert out == [
        ToolCallDelta(None, "c", 0, "c", None, "{}"),
        ToolCallDelta(None, "c", 0, "c", "f", ""),
        ContentDelta(None, 0, "r", "reasoning"),
        ContentDelta(None, 1, "t", "text"),
    ]


@pytest.mark.parametrize(
    ("reason", "canonical"),
    [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("tool-calls", "tool_use"),
        ("content-filter", "content_filter"),
        ("error", "error"),
        ("other", "other"),
    ],
)
def test_v5_finish_reasons(reason, canonical):
    out = VercelUIAdapter().on_message(sse('{"type":"finish","finishReason":"' + reason + '"}'))
    assert out == [StopEvent(None, canonical, reason)]


def test_v5_message_metadata_model_and_usage():
    a = VercelUIAdapter()
    out = a.on_message(sse('{"type":"message-metadata","messageMetadata":{"model":"m","promptTokens":3}}'))
    too_big = 2**63
    out += a.on_message(
        sse('{"type":"message-metadata","messageMetadata":{"usage":{"outputTokens":' + str(too_big) + "}}}")
    )
    out += a.on_message(sse('{"type":"message-metadata","messageMetadata":"x"}'))
    out += a.on_message(sse('{"type":"start","messageId":7}'))
    out += a.on_message(sse('{"type":"start","messageId":"again"}'))
    assert out == [ModelEvent(None, "m"), UsageEvent(None, 3, None), StreamStart(None, None, None)]


def test_v5_error_then_done_keeps_error():
    """An error part then ``[DONE]``: outcome error, text kept (vendor-wire-formats §7)."""
    body = (
        b'data: {"type":"text-delta","id":"a","delta":"x"}\n\n'
        b'data: {"type":"error","errorText":"E"}\n\n'
        b"data: [DONE]\n\n"
    )
    rec = observe("vercel.ui", b"", [body], path="/api/chat")
    assert (rec["outcome"], rec["error"], rec["text"], rec["violations"]) == (
        "error",
        {"code": None, "message": "E"},
        "x",
        [],
    )


# ----- AI SDK adapter: v4 lines -----


def test_v4_faults_and_ignored_parts():
    a = VercelUIAdapter()
    out = []
    for data in [
        "hello",
        ":x",
        "0:not json",
        "0:5",
        '3:{"m":1}',
        'd:"x"',
        "9:{}",
        'c:{"toolCallId":"c"}',
        '2:[{"a":1}]',
        "z:whatever",
        'k:{"data":"TWE=","mimeType":"image/png"}',
        "8:[{}]",
        "  ",
    ]:
        out += a.on_message(line(data))
    assert kinds(out) == [
        "invalid_event",
        "invalid_event",
        "invalid_json",
        "invalid_event",
        "ErrorEvent",
        "invalid_event",
        "StreamEnd",
        "invalid_event",
        "invalid_event",
    ]
    assert out[4] == ErrorEvent(None, None, '{"m":1}')
    assert out[7].detail == "data stream part '9': toolCallId is not a string"
    assert out[8].detail == "data stream part 'c': argsTextDelta is not a string"


def test_v4_finish_with_null_usage():
    """v4 encodes a NaN token count as null: no count is recorded, the stream still ends."""
    part = 'd:{"finishReason":"length","usage":{"promptTokens":null,"completionTokens":null}}'
    out = VercelUIAdapter().on_message(line(part))
    assert out == [StopEvent(None, "max_tokens", "length"), StreamEnd(None)]


def test_v4_crlf_lines_whole_pipeline():
    body = (
        b'f:{"messageId":"m1"}\r\n0:"Hi"\r\n'
        b'd:{"finishReason":"stop","usage":{"promptTokens":1,"completionTokens":2}}\r\n'
    )
    rec = observe("vercel.ui", b"", [body], content_type="text/plain; charset=utf-8", path="/api/chat")
    got = (rec["outcome"], rec["text"], rec["request_id"], rec["usage"]["output_tokens"])
    assert got == ("completed", "Hi", "m1", 2)


# ----- through the mitmproxy addon -----


def test_addon_records_an_ai_sdk_app_on_api_chat_as_vercel_ui():
    """``POST /api/chat`` is taken for Ollama when the request arrives; the response header
    turns the record into ``vercel.ui``, with the request facts of the UI request, no violation
    from the request-time guess, and the stream read as a UI message stream."""
    from mitmproxy import http
    from mitmproxy.test import taddons, tflow

    from observer.capture.hooks import LLMAudit

    records = []
    addon = LLMAudit(sink=lambda r: records.append(r) or True)
    body = (
        b'data: {"type":"start","messageId":"m-1"}\n\ndata: {"type":"text-delta","id":"a","delta":"Hi"}\n\n'
        b'data: {"type":"finish","finishReason":"stop"}\n\ndata: [DONE]\n\n'
    )
    with taddons.context(addon) as tctx:
        tctx.configure(addon, observer_llm_hosts_extra="app.example")  # the operator's AI SDK app
        f = tflow.tflow()
        f.request.method, f.request.host, f.request.path = "POST", "app.example", "/api/chat"
        f.request.headers["content-type"] = "application/json"
        f.request.content = UI_REQUEST
        addon.requestheaders(f)
        addon.request(f)
        f.response = http.Response.make(
            200, b"", {"content-type": "text/event-stream", "x-vercel-ai-ui-message-stream": "v1"}
        )
        f.response.stream = False
        addon.responseheaders(f)
        f.response.stream(body)
        f.response.stream(b"")
        addon.response(f)
    (rec,) = [r.to_dict() for r in records]
    assert (rec["dialect"], rec["outcome"], rec["text"], rec["request_id"]) == ("vercel.ui", "completed", "Hi", "m-1")
    assert rec["request"]["metadata"] == {"id": "c1", "trigger": "submit-message"}
    assert (rec["stop_reason"], rec["violations"]) == ("end_turn", [])
