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
        Violation("invalid_event", None, "eval_count is not a token count: -1"),
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


# ----- tools the UI request cannot declare (issue 16, item 5) -----


def test_reassembler_without_declarable_tools_leaves_each_call_unknown():
    """``tool_names=None`` (a dialect whose requests never declare tools): a complete call and a
    call built from fragments both get ``declared`` ``None`` and no ``undeclared_tool``; with an
    empty declaration (``()``) the same calls are undeclared, each with its violation."""
    from observer.reassembly import EndCause, Reassembler
    from observer.response import ResponseFacts

    def run(tool_names):
        r = Reassembler(tool_names)
        r.apply(ToolCallEvent(None, 0, "call_1", "getWeather", '{"city":"Vienna"}'), 1.0)
        r.apply(ToolCallDelta(None, "call_2", 1, "call_2", "getTime", '{"tz":'), 1.1)
        r.apply(ToolCallDelta(None, "call_2", 1, "call_2", None, '"UTC"}'), 1.2)
        r.apply(StreamEnd(None), 1.3)
        facts = r.finish(ResponseFacts(), EndCause.EOF, request_start_s=0.0)
        return [(t.id, t.arguments, t.declared) for t in facts.tool_calls], [v.kind for v in facts.violations]

    assert run(None) == ([("call_1", '{"city":"Vienna"}', None), ("call_2", '{"tz":"UTC"}', None)], [])
    assert run(()) == (
        [("call_1", '{"city":"Vienna"}', False), ("call_2", '{"tz":"UTC"}', False)],
        ["undeclared_tool", "undeclared_tool"],
    )
    assert run(("getTime",))[0][1][2] is True


def test_response_spec_keeps_unknown_tool_names_through_its_dict():
    """``ResponseSpec.tool_names`` ``None`` survives ``to_dict``/``from_dict`` (the journal and
    the worker get the spec that way) as ``None``, distinct from no declared tool (``()``)."""
    unknown = ResponseSpec("vercel.ui", 200, "text/event-stream", tool_names=None)
    assert unknown.to_dict()["tool_names"] is None
    assert ResponseSpec.from_dict(unknown.to_dict()).tool_names is None
    assert ResponseSpec.from_dict(ResponseSpec("openai.chat", 200).to_dict()).tool_names == ()


def test_ai_sdk_tool_calls_are_not_undeclared_through_the_pipeline():
    """A v5 stream with a server-side tool, fed as the tap feeds it: ``declared`` ``null``, no
    ``undeclared_tool`` (the app declared the tool on its server)."""
    rec = observe("vercel.ui", UI_REQUEST, [UI_TOOL_STREAM], content_type="text/event-stream", path="/api/assistant")
    assert rec["tool_calls"] == [
        {"index": 0, "id": "call_1", "name": "getWeather", "arguments": '{"city":"Vienna"}', "declared": None}
    ]
    assert (rec["text"], rec["violations"], rec["outcome"]) == ("21°C in Vienna.", [], "completed")


# ----- request bodies held until the response headers decide (issue 16, item 5) -----

UI_TOOL_STREAM = (
    b'data: {"type":"start","messageId":"m-2"}\n\n'
    b'data: {"type":"start-step"}\n\n'
    b'data: {"type":"tool-input-start","toolCallId":"call_1","toolName":"getWeather"}\n\n'
    b'data: {"type":"tool-input-delta","toolCallId":"call_1","inputTextDelta":"{\\"city\\":\\"Vienna\\"}"}\n\n'
    b'data: {"type":"tool-input-available","toolCallId":"call_1","toolName":"getWeather","input":{"city":"Vienna"}}\n\n'
    b'data: {"type":"tool-output-available","toolCallId":"call_1","output":{"tempC":21}}\n\n'
    b'data: {"type":"finish-step"}\n\ndata: {"type":"start-step"}\n\n'
    b'data: {"type":"text-start","id":"t1"}\n\n'
    b'data: {"type":"text-delta","id":"t1","delta":"21\xc2\xb0C in Vienna."}\n\n'
    b'data: {"type":"text-end","id":"t1"}\n\ndata: {"type":"finish-step"}\n\n'
    b'data: {"type":"finish","finishReason":"stop"}\n\ndata: [DONE]\n\n'
)
UI_HEADERS = {"content-type": "text/event-stream", "x-vercel-ai-ui-message-stream": "v1"}
# UI_REQUEST as recorded: 210 bytes; the PDF's base64 "JVBERi0xLjQK" is "%PDF-1.4\n", 9 bytes.
UI_MESSAGES = [
    {
        "id": "m1",
        "role": "user",
        "parts": [{"type": "text", "text": "hi"}, {"type": "file", "mediaType": "application/pdf", "data_bytes": 9}],
    }
]


@pytest.mark.parametrize(
    ("method", "content_type", "held"),
    [
        ("POST", "application/json", True),
        ("POST", "application/json; charset=utf-8", True),
        ("post", "application/vnd.app+json", True),
        ("POST", "text/plain;charset=UTF-8", True),  # fetch with a string body and no Content-Type
        ("POST", None, True),
        ("POST", "multipart/form-data; boundary=x", False),
        ("POST", "application/octet-stream", False),
        ("GET", "application/json", False),
        ("PUT", "application/json", False),
    ],
)
def test_vercel_may_match_response_names_json_posts(method, content_type, held):
    headers = {} if content_type is None else {"content-type": content_type}
    assert VercelUIDialect().may_match_response(RequestView(method, "app.example", "/x", headers)) is held


class _App:
    """The mitmproxy addon around one AI SDK app host (``app.example``, an LLM host by
    ``llm_hosts_extra``), driven hook by hook as mitmproxy drives a streamed upload."""

    def __init__(self, tctx, addon, **options):
        self.addon = addon
        self.records = []
        tctx.configure(addon, observer_llm_hosts_extra="app.example", **options)

    def flow(self, path="/api/assistant", headers=None, http_version="HTTP/1.1", host="app.example", method="POST"):
        from mitmproxy.test import tflow

        f = tflow.tflow()
        f.request.method, f.request.host, f.request.path = method, host, path
        f.request.http_version = http_version
        f.request.headers.clear()
        for k, v in ({"content-type": "application/json"} if headers is None else headers).items():
            f.request.headers[k] = v
        f.request.data.content = None  # streamed: mitmproxy keeps no copy
        f.request.timestamp_end = None  # still uploading
        f.request.stream = False
        return f

    def upload(self, f, *chunks, end=True):
        tap = f.request.stream
        for c in chunks:
            assert tap(c) is c  # every chunk passed on unchanged, the same object
        if end:
            tap(b"")
            f.request.timestamp_end = f.request.timestamp_start + 0.01
            self.addon.request(f)  # mitmproxy's ``request`` hook: at the end of a streamed upload

    def respond(self, f, headers=UI_HEADERS, body=UI_TOOL_STREAM, *, finish=True):
        from mitmproxy import http

        f.response = http.Response.make(200, b"", headers)
        f.response.stream = False
        self.addon.responseheaders(f)
        tap = f.response.stream
        assert tap is True or tap(body) is body
        if finish:
            self.addon.response(f)


@pytest.fixture
def app():
    from mitmproxy.test import taddons

    from observer.capture.hooks import LLMAudit

    records: list = []
    addon = LLMAudit(sink=lambda r: records.append(r.to_dict()) or True, worker=False)
    with taddons.context(addon) as tctx:

        def make(**options):
            a = _App(tctx, addon, **options)
            a.records = records
            return a

        yield make


@pytest.mark.parametrize(
    ("http_version", "headers"),
    [
        ("HTTP/1.1", {"content-type": "application/json", "content-length": "210"}),
        ("HTTP/1.1", {"content-type": "application/json", "transfer-encoding": "chunked"}),
        ("HTTP/2.0", {"content-type": "application/json"}),  # HTTP/2: no Content-Length needed
    ],
)
def test_an_ai_sdk_app_on_its_own_route_keeps_its_request(app, http_version, headers):
    """``POST /api/assistant``: nothing says LLM when the request arrives, so its body streams
    on (a stream callable, never buffered) with a copy kept; the UI stream header claims it, and
    the record has the UI request (messages, size, metadata) and the tool call ``declared``
    ``null`` without ``undeclared_tool``."""
    a = app()
    f = a.flow(headers=headers, http_version=http_version)
    a.addon.requestheaders(f)
    assert callable(f.request.stream)
    a.upload(f, UI_REQUEST[:100], UI_REQUEST[100:])
    a.respond(f)
    (rec,) = a.records
    assert (rec["dialect"], rec["path"], rec["outcome"], rec["text"]) == (
        "vercel.ui",
        "/api/assistant",
        "completed",
        "21°C in Vienna.",
    )
    assert rec["request"]["messages"] == UI_MESSAGES
    assert (rec["request"]["body_bytes"], rec["request"]["metadata"]) == (
        210,
        {"id": "c1", "trigger": "submit-message"},
    )
    assert rec["tool_calls"] == [
        {"index": 0, "id": "call_1", "name": "getWeather", "arguments": '{"city":"Vienna"}', "declared": None}
    ]
    assert rec["violations"] == []
    assert (len(a.addon.held_requests), a.addon.held_requests.budget.used_bytes) == (0, 0)


def test_a_held_body_whose_response_is_not_llm_is_dropped(app):
    """A JSON POST on the LLM host answered with plain JSON: no record, the copy dropped at the
    response headers, and the rest of the upload still passes (uncopied)."""
    a = app()
    f = a.flow(path="/api/settings")
    a.addon.requestheaders(f)
    tap = f.request.stream
    assert tap(b'{"theme":') == b'{"theme":'
    a.respond(f, headers={"content-type": "application/json"}, body=b'{"ok":true}', finish=False)
    assert f.response.stream is True and len(a.addon.held_requests) == 0
    assert tap.body() is None  # nothing kept
    assert tap(b'"dark"}') == b'"dark"}'
    assert tap.body() is None and tap.total_bytes == 16
    a.addon.response(f)
    assert a.records == []


def test_requests_that_are_not_held_stream_on_untouched(app):
    """Not held: a JSON POST to a host that is not an LLM host, a multipart upload to one (both
    ``stream = True``, nothing kept); a request a dialect claims by its path keeps its old
    path (mitmproxy buffers it: ``stream`` stays False)."""
    a = app()
    other = a.flow(host="elsewhere.example")
    a.addon.requestheaders(other)
    upload = a.flow(headers={"content-type": "multipart/form-data; boundary=b"})
    a.addon.requestheaders(upload)
    chat = a.flow(path="/v1/chat/completions", headers={"content-type": "application/json", "content-length": "2"})
    a.addon.requestheaders(chat)
    assert (other.request.stream, upload.request.stream, chat.request.stream) == (True, True, False)
    assert len(a.addon.held_requests) == 0


def test_a_held_body_over_the_cap_is_recorded_as_oversize(app):
    """An upload that outgrows ``max_request_bytes`` (50 bytes here): the copy is dropped at the
    cap, the bytes still pass, and the claimed record has the size seen and ``oversize_request``
    (never a silently empty request)."""
    a = app(observer_max_request_bytes=50)
    f = a.flow(headers={"content-type": "application/json", "transfer-encoding": "chunked"})
    a.addon.requestheaders(f)
    a.upload(f, UI_REQUEST[:40], UI_REQUEST[40:])
    a.respond(f)
    (rec,) = a.records
    assert (rec["request"]["messages"], rec["request"]["body_bytes"]) == ([], 210)
    assert [(v["kind"], v["detail"]) for v in rec["violations"]] == [
        ("oversize_request", "request body over 50 bytes not parsed")
    ]


def test_a_body_declared_over_the_cap_is_not_copied(app):
    """``Content-Length`` over ``max_request_bytes``: no copy is made at all (``stream = True``),
    and the claimed record has the declared size and ``oversize_request``."""
    a = app(observer_max_request_bytes=50)
    f = a.flow(headers={"content-type": "application/json", "content-length": "210"})
    a.addon.requestheaders(f)
    assert f.request.stream is True
    a.respond(f)
    (rec,) = a.records
    assert (rec["request"]["messages"], rec["request"]["body_bytes"]) == ([], 210)
    assert [(v["kind"], v["detail"]) for v in rec["violations"]] == [
        ("oversize_request", "request body of 210 bytes not parsed")
    ]


def test_a_held_body_still_uploading_at_the_response_headers_is_read_when_it_ends(app):
    """The response starts before the upload ended (an early answer; HTTP/2): the body is not
    read half-way (it would not parse) but at the end of the upload, mitmproxy's ``request``
    hook, and the record has the whole request."""
    a = app()
    f = a.flow(headers={"content-type": "application/json"}, http_version="HTTP/2.0")
    a.addon.requestheaders(f)
    a.upload(f, UI_REQUEST[:100], end=False)
    a.respond(f, finish=False)
    a.upload(f, UI_REQUEST[100:])
    a.addon.response(f)
    (rec,) = a.records
    assert (rec["request"]["messages"], rec["request"]["body_bytes"], rec["violations"]) == (UI_MESSAGES, 210, [])


def test_an_exchange_ending_while_its_held_body_uploads_is_an_incomplete_request(app):
    """The exchange ends before the upload did: ``incomplete_request`` with the bytes seen."""
    a = app()
    f = a.flow(headers={"content-type": "application/json"})
    a.addon.requestheaders(f)
    a.upload(f, UI_REQUEST[:100], end=False)
    a.respond(f)
    (rec,) = a.records
    assert (rec["request"]["messages"], rec["request"]["body_bytes"]) == ([], 100)
    assert [(v["kind"], v["detail"]) for v in rec["violations"]] == [
        ("incomplete_request", "exchange ended before the request body was complete (100 bytes received); not parsed")
    ]


@pytest.mark.parametrize(
    ("method", "headers", "violations"),
    [
        ("GET", {}, []),  # resuming a stream: no body, nothing lost
        (
            "POST",
            {"content-type": "multipart/form-data; boundary=b", "content-length": "300"},
            [
                (
                    "invalid_request",
                    "request body of 300 bytes not kept: a POST of multipart/form-data is not held until the"
                    " response headers (only the requests a response-recognised dialect may answer are:"
                    " observer.capture.held)",
                )
            ],
        ),
    ],
)
def test_a_claimed_request_that_was_not_held_says_so(app, method, headers, violations):
    a = app()
    f = a.flow(method=method, headers=headers)
    a.addon.requestheaders(f)
    assert f.request.stream is True
    a.respond(f)
    (rec,) = a.records
    assert rec["request"]["messages"] == []
    assert [(v["kind"], v["detail"]) for v in rec["violations"]] == violations
