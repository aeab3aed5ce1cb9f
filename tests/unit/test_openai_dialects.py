"""The OpenAI dialects ``openai.chat`` and ``openai.responses``: detection, request reading and
the adapters' handling of vendor quirks the wire fixtures do not cover one by one.

Fixture provenance (``tests/fixtures/wire/openai.chat/`` and ``openai.responses/``; bodies as on
the wire, expected records written by hand):

- ``openai.chat/text_include_usage``: openai/openai-python ``.inline-snapshot/external/
  038a5c69c34c9513021b52aa61661f4f5bea321c0aac9e164f2ed3e409aebc48.bin`` (gpt-4o stream with
  ``include_usage``), trimmed after ``" updates"`` + ``"."``; ``truncated_no_done`` is its first
  four events.
- ``openai.chat/tool_call_fragments``: openai/openai-python ``.inline-snapshot/external/
  04fbc4717b37193b9eddf2a3e27adb63fb6a8643672a1274b2890148e9090174.bin``, verbatim (the
  reference's recorded gpt-4o ``get_weather`` stream).
- ``openai.chat/error_no_done``: coder/aibridge ``fixtures/openai/error.txtar`` streaming part,
  verbatim; ``error_then_done`` is the same stream shortened by one chunk, with the ``[DONE]``
  that OpenRouter/vLLM/SGLang send after an in-band error.
- ``openai.chat/azure_content_filter``: the Azure OpenAI capture in quarkiverse/
  quarkus-langchain4j ``AzureOpenAiStreamingChatModelTest.java`` ("generated from a true API
  call to Azure OpenAI"), with the final blank line that the test's text block lost;
  ``unterminated_final_event`` reuses its chunk shape.
- ``openai.chat/usage_null_until_last``: a gpt-3.5-turbo-0125 stream with ``usage: null`` and
  ``obfuscation`` on every chunk, as quoted in a public tracing project's API tests.
- ``openai.chat/reused_tool_index``: the shape reported in ollama/ollama#15457 (Ollama ``/v1``,
  every parallel call at ``index: 0`` with its own id, arguments complete in one fragment).
- ``openai.chat/nonstream_tool_call``: a recorded gpt-4o ``chat.completion`` with a tool call
  (CtwoC/agent_kit ``client/output_style/openai_output.md``).
- ``openai.chat/parallel_tool_calls``, ``openrouter_keepalive``, ``crlf_no_space``,
  ``reasoning_content``, ``refusal``: written from the documented chunk shapes (OpenAI chunk
  object; OpenRouter streaming docs: ``: OPENROUTER PROCESSING`` comments, usage in the final
  chunk; sse-starlette CRLF and ``: ping`` comments; DeepSeek ``reasoning_content``; the
  ``refusal`` delta of structured outputs).
- ``openai.responses/text_stream``, ``failed``, ``error_event``: coder/aibridge
  ``fixtures/openai/responses/streaming/simple.txtar``, ``stream_failure.txtar``,
  ``stream_error.txtar``, verbatim (final blank line added where the txtar ends the section).
- ``openai.responses/text_function_call``: the function-call events of coder/aibridge
  ``…/streaming/builtin_tool.txtar`` after a short message item, renumbered, in the order of
  vendor-wire-formats §3.
- ``openai.responses/reasoning_summary``, ``incomplete_max_output_tokens``,
  ``unknown_event_families``: written from the OpenAI "Streaming events" reference shapes;
  ``nonstream_response``: the response object of the OpenAI "Create a model response" example.
"""

from __future__ import annotations

import base64

import orjson
import pytest

from observer.dialects.base import RequestView
from observer.dialects.openai_chat import OpenAIChatAdapter, OpenAIChatDialect
from observer.dialects.openai_responses import OpenAIResponsesAdapter, OpenAIResponsesDialect
from observer.dialects.registry import default_registry
from observer.events import (
    ChoiceOpen,
    ContentDelta,
    ErrorEvent,
    ModelEvent,
    ResponseIdentity,
    StopEvent,
    StreamEnd,
    StreamStart,
    ToolCallDelta,
    ToolCallEvent,
    UsageEvent,
)
from observer.limits import Limits
from observer.records import RequestFacts, Violation
from observer.wire.frames import JSONFrame, SSEEvent
from tests.wirefeed import observe

CHAT = OpenAIChatDialect()
RESPONSES = OpenAIResponsesDialect()
PNG_B64 = base64.b64encode(b"\x89PNG" + bytes(96)).decode()  # 100 bytes decoded


def view(path: str, method: str = "POST") -> RequestView:
    return RequestView(method, "example.test", path, {"content-type": "application/json"})


def sse(data: object, event: str = "") -> SSEEvent:
    text = data if isinstance(data, str) else orjson.dumps(data).decode()
    return SSEEvent(event, text, None, None, len(text))


def feed(adapter, *messages) -> list:
    out: list = []
    for m in messages:
        out.extend(adapter.on_message(m))
    return out


def kinds(items: list) -> list[str]:
    return [str(v.kind) for v in items if isinstance(v, Violation)]


# -- detection -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/v1/chat/completions",
        "/api/v1/chat/completions",
        "/openai/deployments/gpt-4o-prod/chat/completions?api-version=2024-10-21",
        "/openai/v1/chat/completions?api-version=preview",
        "/chat/completions",
        "/v1/chat/completions/",
    ],
)
def test_chat_matches_chat_completion_paths(path):
    assert CHAT.matches(view(path))
    assert not RESPONSES.matches(view(path))
    assert default_registry().classify(view(path)) is not None
    assert default_registry().classify(view(path)).name == "openai.chat"


@pytest.mark.parametrize("path", ["/v1/responses", "/openai/v1/responses?api-version=preview", "/responses"])
def test_responses_matches_responses_paths(path):
    assert RESPONSES.matches(view(path))
    assert not CHAT.matches(view(path))
    assert default_registry().classify(view(path)).name == "openai.responses"


@pytest.mark.parametrize(
    ("dialect", "path", "method"),
    [
        (CHAT, "/v1/chat/completions", "GET"),
        (CHAT, "/v1/chat/completions/chatcmpl-1/messages", "POST"),
        (CHAT, "/v1/completions", "POST"),
        (RESPONSES, "/v1/responses", "GET"),
        (RESPONSES, "/v1/responses/resp_1/cancel", "POST"),
        (RESPONSES, "/v1/responses/input_tokens", "POST"),
        (RESPONSES, "/v1/chat/completions?next=/responses", "POST"),
    ],
)
def test_other_endpoints_are_not_matched(dialect, path, method):
    assert not dialect.matches(view(path, method))


# -- chat request ---------------------------------------------------------------------------------


def test_chat_request_reduces_inline_binary_parts_and_keeps_urls():
    body = orjson.dumps(
        {
            "model": "gpt-4o",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image_url",
                            "image_url": {"url": f"data:image/png;base64,{PNG_B64}", "detail": "high"},
                        },
                        {"type": "image_url", "image_url": {"url": "https://example.test/cat.png"}},
                        {"type": "input_audio", "input_audio": {"data": PNG_B64, "format": "wav"}},
                        {
                            "type": "file",
                            "file": {"file_data": f"data:application/pdf;base64,{PNG_B64}", "filename": "a.pdf"},
                        },
                        {"type": "image_url", "image_url": {"url": "data:text/plain,hi%20there"}},
                    ],
                }
            ],
        }
    )
    facts, violations = CHAT.parse_request(body, view("/v1/chat/completions"))
    assert violations == []
    assert facts.messages[0]["content"] == [
        {"type": "image_url", "image_url": {"media_type": "image/png", "data_bytes": 100, "detail": "high"}},
        {"type": "image_url", "image_url": {"url": "https://example.test/cat.png"}},
        {"type": "input_audio", "input_audio": {"format": "wav", "data_bytes": 100}},
        {"type": "file", "file": {"media_type": "application/pdf", "data_bytes": 100, "filename": "a.pdf"}},
        {"type": "image_url", "image_url": {"media_type": "text/plain", "data_bytes": 8}},
    ]
    assert PNG_B64 not in orjson.dumps(facts.to_dict()).decode()


def test_chat_request_fields():
    body = orjson.dumps(
        {
            "model": "gpt-4.1",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "a"}}, {"type": "custom", "custom": {"name": "b"}}],
            "functions": [{"name": "legacy"}],
            "temperature": 0,
            "max_tokens": 5,
            "n": 2,
            "stop": ["\n"],
            "seed": 7,
            "reasoning_effort": "low",
            "metadata": {"k": "v"},
            "user": "old-id",
            "safety_identifier": "new-id",
        }
    )
    facts, violations = CHAT.parse_request(body, view("/v1/chat/completions"))
    assert violations == []
    assert facts.stream is False  # absent: a single JSON answer
    assert facts.tool_names == ["a", "b", "legacy"]
    assert len(facts.tools) == 3
    assert facts.parameters == {
        "temperature": 0,
        "max_tokens": 5,
        "n": 2,
        "stop": ["\n"],
        "seed": 7,
        "reasoning_effort": "low",
    }
    assert facts.metadata == {"k": "v"}
    assert facts.end_user == "new-id"


def test_chat_request_model_from_azure_deployment_path_only_when_body_has_none():
    body = b'{"messages":[{"role":"user","content":"x"}]}'
    facts, violations = CHAT.parse_request(body, view("/openai/deployments/my%20gpt/chat/completions?api-version=1"))
    assert (facts.model, violations) == ("my gpt", [])
    facts, _ = CHAT.parse_request(body, view("/openai/deployments/dep1/extensions/chat/completions?api-version=1"))
    assert facts.model == "dep1"
    facts, _ = CHAT.parse_request(b'{"model":"m","messages":[]}', view("/openai/deployments/d/chat/completions"))
    assert facts.model == "m"
    facts, violations = CHAT.parse_request(body, view("/v1/chat/completions"))
    assert facts.model is None
    assert [(v.kind, v.detail) for v in violations] == [
        ("not_llm_request", "no model string; recorded as metadata only")
    ]


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (b'{"model":"m","messages":["x"]}', "1 message(s) without an object and role"),
        (b'{"model":"m","messages":[],"stream":"yes"}', "stream is not a boolean"),
        (b'{"model":"m","messages":[],"tools":{}}', "tools is not an array"),
        (b'{"model":"m","messages":[],"metadata":[]}', "metadata is not an object"),
    ],
)
def test_chat_request_problems_are_violations(body, detail):
    facts, violations = CHAT.parse_request(body, view("/v1/chat/completions"))
    assert facts.body_bytes == len(body)
    assert [v.kind for v in violations] == ["invalid_request"]
    assert violations[0].detail.startswith(detail)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"{not json", "the request body is not JSON"),
        (b"[1]", "the request body is not a JSON object"),
        (b'{"model":"m","messages":{}}', "no messages array"),
        (b'{"model":"m"}', "no messages array"),
        (b'{"model":5,"messages":[]}', "no model string"),
        (b'{"survey_id":"q3","answers":[{"q":1,"a":"yes"}]}', "no messages array"),
    ],
)
def test_a_chat_path_body_without_the_request_shape_is_not_llm_traffic(body, reason):
    """Issue 14 item 8: only the body's size, and why: the record keeps metadata only."""
    facts, violations = CHAT.parse_request(body, view("/v1/chat/completions"))
    assert facts == RequestFacts(body_bytes=len(body))
    assert [(v.kind, v.detail) for v in violations] == [("not_llm_request", f"{reason}; recorded as metadata only")]


# -- responses request ----------------------------------------------------------------------------


def test_responses_request_items_tools_and_instructions():
    body = orjson.dumps(
        {
            "model": "gpt-5",
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": [{"type": "input_file", "file_data": PNG_B64, "filename": "x.bin"}]},
                {"type": "image_generation_call", "id": "ig_1", "result": PNG_B64},
                {"type": "function_call_output", "call_id": "call_1", "output": "42"},
            ],
            "tools": [
                {"type": "function", "name": "add", "parameters": {}},
                {"type": "custom", "name": "apply_patch"},
                {"type": "web_search"},
                {"type": "mcp", "server_label": "deepwiki", "server_url": "https://mcp.example/"},
            ],
            "previous_response_id": "resp_0",
            "prompt": {
                "id": "pmpt_1",
                "variables": {"img": {"type": "input_image", "image_url": f"data:image/png;base64,{PNG_B64}"}},
            },
            "stream": True,
        }
    )
    facts, violations = RESPONSES.parse_request(body, view("/v1/responses"))
    assert violations == []
    assert facts.tool_names == ["add", "apply_patch"]
    assert facts.messages == [
        {"role": "user", "content": [{"type": "input_file", "data_bytes": 100, "filename": "x.bin"}]},
        {"type": "image_generation_call", "id": "ig_1", "data_bytes": 100},
        {"type": "function_call_output", "call_id": "call_1", "output": "42"},
    ]
    assert facts.parameters == {
        "instructions": "Be brief.",
        "previous_response_id": "resp_0",
        "prompt": {
            "id": "pmpt_1",
            "variables": {"img": {"type": "input_image", "media_type": "image/png", "data_bytes": 100}},
        },
    }


@pytest.mark.parametrize(
    ("body", "details"),
    [
        (b'{"model":"m","input":5}', ["input is neither a string nor an array; recorded as metadata only"]),
        (b'{"input":"x"}', ["no model string; recorded as metadata only"]),
        (b'{"survey":"hr-2026","responses":[{"q":"pay","a":"fair"}]}', ["no model string; recorded as metadata only"]),
        (b'{"prompt":{"id":"pmpt_1"}}', []),
        (b'{"model":"m","input":"x","tools":"t"}', ["tools is not an array"]),
    ],
)
def test_responses_request_problems(body, details):
    _, violations = RESPONSES.parse_request(body, view("/v1/responses"))
    assert [v.detail for v in violations] == details


# -- chat adapter ---------------------------------------------------------------------------------


def chunk(delta=None, *, index=0, finish=None, **top):
    choice = {"index": index, "delta": delta or {}, "finish_reason": finish}
    return sse({"id": "c1", "model": "m", "choices": [choice], **top})


def test_chat_repeated_id_and_name_on_every_fragment_is_one_call():
    """Fireworks (GLM) repeats id, type and name on every fragment: same id = same call."""
    frag = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a"'}}
    frag2 = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ":1}"}}
    out = feed(OpenAIChatAdapter(), chunk({"tool_calls": [frag]}), chunk({"tool_calls": [frag2]}))
    calls = [e for e in out if isinstance(e, ToolCallDelta)]
    assert {c.key for c in calls} == {"0:0"}
    assert kinds(out) == []


def test_chat_null_and_empty_continuation_ids_are_absent():
    """Mistral-style continuation fragments with ``"id": "null"`` and ``"name": ""``."""
    first = {"index": 0, "id": "abc", "function": {"name": "f", "arguments": "{"}}
    more = {"index": 0, "id": "null", "function": {"name": "", "arguments": "}"}}
    nulls = {"index": 0, "id": None, "function": {"name": None, "arguments": ""}}
    out = feed(OpenAIChatAdapter(), chunk({"tool_calls": [first]}), chunk({"tool_calls": [more, nulls]}))
    assert [(e.key, e.id, e.name) for e in out if isinstance(e, ToolCallDelta)] == [
        ("0:0", "abc", "f"),
        ("0:0", None, None),
        ("0:0", None, None),
    ]
    assert kinds(out) == []


def test_chat_reused_index_within_one_chunk_starts_a_new_call():
    a = {"index": 0, "id": "call_a", "function": {"name": "f", "arguments": "{}"}}
    b = {"index": 0, "id": "call_b", "function": {"name": "g", "arguments": "{}"}}
    c = {"index": 0, "id": "call_c", "function": {"name": "h", "arguments": "{}"}}
    out = feed(OpenAIChatAdapter(), chunk({"tool_calls": [a, b, c]}))
    assert [e.key for e in out if isinstance(e, ToolCallDelta)] == ["0:0", "0:0:1", "0:0:2"]
    assert kinds(out) == ["reused_tool_index", "reused_tool_index"]


def test_chat_fragments_without_index_use_their_position_flagged_once():
    """Ollama before 0.4.7 (#7881) sent no ``index``."""
    a = {"id": "call_a", "function": {"name": "f", "arguments": "{}"}}
    b = {"id": "call_b", "function": {"name": "g", "arguments": "{}"}}
    out = feed(
        OpenAIChatAdapter(),
        chunk({"tool_calls": [a, b]}),
        chunk({"tool_calls": [{"id": "call_c", "function": {"name": "h"}}]}),
    )
    assert [(e.key, e.index) for e in out if isinstance(e, ToolCallDelta)] == [("0:0", 0), ("0:1", 1), ("0:0:1", 0)]
    assert kinds(out) == ["invalid_event"]


def test_chat_legacy_function_call_custom_calls_and_object_arguments():
    out = feed(
        OpenAIChatAdapter(),
        chunk({"function_call": {"name": "old", "arguments": ""}}),
        chunk({"function_call": {"arguments": "{}"}}),
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "c", "type": "custom", "custom": {"name": "patch", "input": "*** Begin"}}
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 1, "id": "d", "function": {"name": "obj", "arguments": {"b": 1, "a": [2]}}}]}),
        chunk(finish="function_call"),
    )
    deltas = [(e.key, e.index, e.name, e.arguments) for e in out if isinstance(e, ToolCallDelta)]
    assert deltas == [
        ("0:function_call", None, "old", ""),
        ("0:function_call", None, None, "{}"),
        ("0:0", 0, "patch", "*** Begin"),
        ("0:1", 1, "obj", '{"b":1,"a":[2]}'),
    ]
    assert out[-1] == StopEvent(None, "tool_use", "function_call", choice=0)


def test_chat_choices_get_their_own_blocks():
    out = feed(
        OpenAIChatAdapter(),
        chunk({"content": "a"}, index=0),
        chunk({"content": "b", "reasoning_content": "r"}, index=1),
        chunk({"reasoning": "s", "refusal": "no"}, index=2),
        chunk({"reasoning_content": "", "reasoning": "t"}, index=0),
    )
    blocks = [(e.index, e.block_type, e.text) for e in out if isinstance(e, ContentDelta)]
    assert blocks == [
        (0, "text", "a"),
        (1001, "reasoning", "r"),
        (1, "text", "b"),
        (1002, "reasoning", "s"),
        (2002, "refusal", "no"),
        (1000, "reasoning", "t"),
    ]


@pytest.mark.parametrize(
    ("reason", "canonical"),
    [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("tool_calls", "tool_use"),
        ("function_call", "tool_use"),
        ("content_filter", "content_filter"),
        ("error", "error"),
        ("eos", "eos"),
    ],
)
def test_chat_finish_reason_mapping(reason, canonical):
    out = feed(OpenAIChatAdapter(), chunk(finish=reason))
    assert out[-1] == StopEvent(None, canonical, reason, choice=0)


def test_chat_identity_model_changes_and_empty_values():
    out = feed(
        OpenAIChatAdapter(),
        sse({"id": "", "model": "", "choices": [], "prompt_filter_results": []}),
        sse({"id": "c1", "model": "", "choices": []}),
        sse({"id": "c1", "model": "m1", "choices": []}),
        sse({"id": "c1", "model": "m1", "choices": []}),
        sse({"id": "c1", "model": "m2", "choices": []}),
    )
    # the id is also the response's identity, given once (chunks repeat it)
    assert out == [
        StreamStart(None, None, "c1"),
        ResponseIdentity(None, "c1"),
        ModelEvent(None, "m1"),
        ModelEvent(None, "m2"),
    ]


def test_chat_usage_reports():
    out = feed(
        OpenAIChatAdapter(),
        chunk(usage=None),
        chunk(usage={}),
        chunk(usage={"prompt_tokens": 3}),
        chunk(usage={"prompt_tokens": 3, "completion_tokens": -1}),
        chunk(usage={"prompt_tokens": 3, "completion_tokens": 9}),
    )
    assert [e for e in out if isinstance(e, UsageEvent)] == [
        UsageEvent(None, 3, None),
        UsageEvent(None, 3, None),
        UsageEvent(None, 3, 9),
    ]


def test_chat_groq_usage_in_x_groq():
    """Groq's final chunk carries the totals in ``x_groq.usage`` (vercel/ai groq fixtures)."""
    groq = {
        "id": "req_01jadadp0femyae9kav1gpkhe8",
        "usage": {"queue_time": 0.06, "prompt_tokens": 18, "completion_tokens": 439},
    }
    out = feed(OpenAIChatAdapter(), chunk(finish="tool_calls", x_groq=groq))
    assert out[-1] == UsageEvent(None, 18, 439)


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (
            {"object": "error", "message": "bad", "type": "BadRequestError", "param": None, "code": 400},
            ErrorEvent(None, "400", "bad"),
        ),
        ({"error": {"message": "x", "type": "server_error", "code": None}}, ErrorEvent(None, "server_error", "x")),
        (
            {"error": {"message": "x", "code": "rate_limit_exceeded", "type": "requests"}},
            ErrorEvent(None, "rate_limit_exceeded", "x"),
        ),
        ({"error": "plain text"}, ErrorEvent(None, None, "plain text")),
    ],
)
def test_chat_in_band_errors(payload, expected):
    assert feed(OpenAIChatAdapter(), sse(payload)) == [expected]


def test_chat_openrouter_error_chunk_has_error_and_finish_reason():
    """OpenRouter: a chunk with top-level ``error`` and ``finish_reason: "error"`` (HTTP 200)."""
    payload = {
        "id": "gen-1",
        "object": "chat.completion.chunk",
        "model": "openai/gpt-4o",
        "provider": "OpenAI",
        "error": {"code": 502, "message": "Provider disconnected"},
        "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}],
    }
    assert feed(OpenAIChatAdapter(), sse(payload)) == [
        StreamStart(None, "openai/gpt-4o", "gen-1"),
        ResponseIdentity(None, "gen-1"),
        ErrorEvent(None, "502", "Provider disconnected"),
        ChoiceOpen(None, 0, 0),
        StopEvent(None, "error", "error", choice=0),
    ]


def test_chat_bad_payloads_are_violations_and_done_ends():
    out = feed(
        OpenAIChatAdapter(),
        sse("{oops"),
        sse("[1]"),
        sse({"choices": {}}),
        sse({"choices": [1, {"index": 0, "delta": {"tool_calls": [5]}}]}),
        sse(""),
        sse(" [DONE] "),
    )
    assert kinds(out) == ["invalid_json", "invalid_event", "invalid_event", "invalid_event", "invalid_event"]
    assert out[-1] == StreamEnd(None)


def test_chat_whole_body_completion():
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "deepseek-reasoner",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {
                    "role": "assistant",
                    "reasoning_content": "think",
                    "content": [{"type": "text", "text": "hi"}, {"type": "image"}],
                    "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                    "function_call": {"name": "g", "arguments": "{}"},
                },
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 2},
    }
    data = orjson.dumps(body).decode()
    out = OpenAIChatAdapter().on_message(JSONFrame(data, len(data)))
    assert out == [
        StreamStart(None, "deepseek-reasoner", "chatcmpl-1"),
        ResponseIdentity(None, "chatcmpl-1"),
        ChoiceOpen(None, 0, 0),  # the choice is announced first (its text: block 0)
        ContentDelta(None, 1000, "think", "reasoning"),
        ContentDelta(None, 0, "hi", "text"),
        ToolCallEvent(None, 0, "call_1", "f", "{}"),  # function_call beside tool_calls is a mirror, not a call
        StopEvent(None, "end_turn", "stop", choice=0),
        UsageEvent(None, 1, 2),
        StreamEnd(None),
    ]


def test_chat_whole_body_error_at_200_is_an_error_record():
    record = observe(
        "openai.chat",
        b'{"model":"m","messages":[]}',
        [b'{"error":{"message":"quota","type":"insufficient_quota"}}'],
        content_type="application/json",
        path="/v1/chat/completions",
    )
    assert record["error"] == {"code": "insufficient_quota", "message": "quota"}
    assert (record["outcome"], record["violations"]) == ("error", [])


def test_chat_llama_cpp_error_field_is_an_error_with_a_nonstandard_field_violation():
    """llama.cpp before Sept. 2025 sent ``error: {…}`` (a non-standard SSE field) then
    ``data: [DONE]``: WHATWG drops unknown fields, which made such a stream look completed;
    since issue 16 the observer surfaces the field (``nonstandard_field``) and the chat dialect
    reads it as the error it is."""
    wire = (
        b'data: {"id":"c","model":"m","choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
        b'error: {"code":500,"message":"boom"}\n\ndata: [DONE]\n\n'
    )
    record = observe("openai.chat", b'{"model":"m","messages":[],"stream":true}', [wire], path="/v1/chat/completions")
    assert (record["outcome"], record["error"], record["text"]) == ("error", {"code": "500", "message": "boom"}, "x")
    assert [v["kind"] for v in record["violations"]] == ["nonstandard_field"]


# -- responses adapter ----------------------------------------------------------------------------


def ev(etype: str, seq: int | None = None, **fields) -> SSEEvent:
    body = {"type": etype, **fields}
    if seq is not None:
        body["sequence_number"] = seq
    return sse(body, etype)


def test_responses_sequence_gaps_repeats_and_lost_messages():
    adapter = OpenAIResponsesAdapter()
    out = feed(adapter, ev("response.queued", 0), ev("x.unknown", 1), ev("x.unknown", 1), ev("x.unknown", 3))
    assert kinds(out) == ["seq_repeat", "seq_gap"]
    adapter.on_lost()  # an oversize event was dropped below the dialect
    assert feed(adapter, ev("x.unknown", 5)) == []
    assert kinds(feed(adapter, sse("{broken", "x.unknown"), ev("x.unknown", 7))) == ["invalid_json"]
    assert kinds(feed(adapter, ev("x.unknown", 9))) == ["seq_gap"]
    assert kinds(feed(adapter, ev("x.unknown", "ten"), ev("x.unknown"))) == ["invalid_event"]


def test_responses_oversize_event_is_not_a_sequence_gap():
    big = "x" * 2000
    wire = (
        b'event: response.created\ndata: {"type":"response.created","sequence_number":0,"response":{"id":"r","model":"m"}}\n\n'
        + b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","sequence_number":1,'
        + f'"output_index":0,"content_index":0,"delta":"{big}"}}\n\n'.encode()
        + b'event: response.completed\ndata: {"type":"response.completed","sequence_number":2,"response":{"id":"r","model":"m"}}\n\n'
    )
    record = observe(
        "openai.responses",
        b'{"model":"m","input":"x","stream":true}',
        [wire],
        path="/v1/responses",
        limits=Limits(max_event_bytes=1000),
    )
    assert [v["kind"] for v in record["violations"]] == ["oversize_event"]
    assert record["outcome"] == "completed"


def test_responses_type_mismatch_missing_type_and_done_sentinel():
    adapter = OpenAIResponsesAdapter()
    out = feed(
        adapter,
        sse({"type": "response.created", "response": {}}, "response.in_progress"),
        sse({"sequence_number": 1}),
        sse("[DONE]"),
        sse(""),
    )
    assert kinds(out) == ["type_mismatch", "invalid_event"]


def test_responses_done_events_fill_only_what_no_delta_carried():
    out = feed(
        OpenAIResponsesAdapter(),
        ev("response.output_text.delta", output_index=0, content_index=0, delta="Hel"),
        ev("response.output_text.done", output_index=0, content_index=0, text="Hello"),
        ev("response.refusal.done", output_index=1, content_index=0, refusal="No."),
        ev("response.reasoning_text.delta", output_index=2, content_index=0, delta="hmm"),
        ev("response.reasoning_summary_text.done", output_index=2, summary_index=0, text="Sum"),
        ev(
            "response.output_item.done",
            output_index=1,
            item={
                "type": "message",
                "content": [{"type": "refusal", "refusal": "No."}, {"type": "output_text", "text": "late"}],
            },
        ),
        ev("response.output_text.delta", output_index=3, content_index=0, delta=5),
    )
    assert [(e.index, e.block_type, e.text) for e in out if isinstance(e, ContentDelta)] == [
        (0, "text", "Hel"),
        (1, "refusal", "No."),
        (2, "reasoning", "hmm"),
        (3, "reasoning", "Sum"),
        (4, "text", "late"),
    ]
    assert kinds(out) == ["invalid_event"]


def test_responses_call_fallbacks_and_custom_tool_calls():
    out = feed(
        OpenAIResponsesAdapter(),
        # arguments only in .done (no deltas), call opened by its added event
        ev(
            "response.output_item.added",
            output_index=0,
            item={"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": ""},
        ),
        ev("response.function_call_arguments.done", output_index=0, item_id="fc_1", arguments='{"x":1}'),
        # deltas for a call whose added event never came
        ev("response.function_call_arguments.delta", output_index=1, item_id="fc_2", delta="{}"),
        ev(
            "response.output_item.done",
            output_index=1,
            item={"type": "function_call", "id": "fc_2", "call_id": "call_2", "name": "g", "arguments": "{}"},
        ),
        # a custom tool call with free-text input
        ev(
            "response.output_item.added",
            output_index=2,
            item={"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_3", "name": "patch", "input": ""},
        ),
        ev("response.custom_tool_call_input.delta", output_index=2, item_id="ctc_1", delta="*** Begin"),
        ev("response.custom_tool_call_input.done", output_index=2, item_id="ctc_1", input="*** Begin"),
        ev("response.function_call_arguments.delta", output_index=2, item_id="ctc_1", delta=None),
    )
    assert [(e.key, e.index, e.id, e.name, e.arguments) for e in out if isinstance(e, ToolCallDelta)] == [
        ("fc_1", 0, "call_1", "f", ""),
        ("fc_1", 0, None, None, '{"x":1}'),
        ("fc_2", 1, None, None, ""),
        ("fc_2", 1, None, None, "{}"),
        ("ctc_1", 2, "call_3", "patch", ""),
        ("ctc_1", 2, None, None, "*** Begin"),
    ]
    assert kinds(out) == ["invalid_event"]


def test_responses_terminal_output_fills_a_stream_without_deltas():
    """A compatible server that sends only the terminal event."""
    response = {
        "id": "r1",
        "model": "m",
        "status": "completed",
        "output": [
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": "S"}],
                "content": [{"type": "reasoning_text", "text": "R"}],
            },
            {"type": "message", "content": [{"type": "output_text", "text": "T"}]},
            {"type": "function_call", "id": "fc", "call_id": "call_9", "name": "f", "arguments": "{}"},
            {"type": "web_search_call", "id": "ws"},
        ],
        "usage": {"input_tokens": 4, "output_tokens": 2},
    }
    out = feed(OpenAIResponsesAdapter(), ev("response.completed", 0, response=response))
    assert out == [
        StreamStart(0, "m", "r1"),
        ResponseIdentity(0, "r1"),
        ContentDelta(0, 0, "S", "reasoning"),
        ContentDelta(0, 1, "R", "reasoning"),
        ContentDelta(0, 2, "T", "text"),
        ToolCallDelta(0, "fc", 2, "call_9", "f", ""),
        ToolCallDelta(0, "fc", 2, None, None, "{}"),
        StopEvent(0, "tool_use", "completed"),
        UsageEvent(0, 4, 2),
        StreamEnd(0),
    ]


@pytest.mark.parametrize(
    ("details", "stop"),
    [
        ({"reason": "max_output_tokens"}, StopEvent(None, "max_tokens", "incomplete:max_output_tokens")),
        ({"reason": "content_filter"}, StopEvent(None, "content_filter", "incomplete:content_filter")),
        ({"reason": "other"}, StopEvent(None, "other", "incomplete:other")),
        (None, StopEvent(None, None, "incomplete")),
    ],
)
def test_responses_incomplete_reasons(details, stop):
    out = feed(OpenAIResponsesAdapter(), ev("response.incomplete", response={"incomplete_details": details}))
    assert out == [stop, StreamEnd(None)]


def test_responses_error_event_shapes():
    out = feed(
        OpenAIResponsesAdapter(),
        ev("error", 3, code="rate_limit_exceeded", message="bad", param=None),
        ev("error", 4, error={"type": "server_error", "code": "server_error", "message": "boom"}),
    )
    assert out == [ErrorEvent(3, "rate_limit_exceeded", "bad"), ErrorEvent(4, "server_error", "boom")]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            {"object": "response", "status": "failed", "error": {"code": "server_error", "message": "m"}, "output": []},
            [ErrorEvent(None, "server_error", "m"), StreamEnd(None)],
        ),
        (
            {"object": "response", "status": "cancelled", "output": []},
            [StopEvent(None, "cancelled", "cancelled"), StreamEnd(None)],
        ),
        (
            {"object": "response", "id": "r", "status": "queued", "background": True, "output": []},
            [StreamStart(None, None, "r"), ResponseIdentity(None, "r"), StreamEnd(None)],
        ),
        (
            {"error": {"message": "no", "type": "invalid_request_error"}},
            [ErrorEvent(None, "invalid_request_error", "no"), StreamEnd(None)],
        ),
    ],
)
def test_responses_whole_body_objects(body, expected):
    data = orjson.dumps(body).decode()
    assert OpenAIResponsesAdapter().on_message(JSONFrame(data, len(data))) == expected


def test_responses_whole_body_of_another_shape_is_invalid():
    out = OpenAIResponsesAdapter().on_message(JSONFrame('{"hello":1}', 11))
    assert kinds(out) == ["invalid_event"]
    assert out[-1] == StreamEnd(None)


def test_function_call_mirror_of_tool_calls_is_not_a_second_call():
    """Found with the real llama-cpp-python server: each tool-call fragment is sent twice in one
    chunk, in ``delta.tool_calls`` and again in the legacy ``delta.function_call``; the record
    must hold one call."""
    from tests.wirefeed import observe

    chunks = [
        b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant",'
        b'"tool_calls":[{"index":0,"id":"call_0","type":"function","function":{"name":"get_weather","arguments":""}}],'
        b'"function_call":{"name":"get_weather","arguments":""}},"finish_reason":null}]}\n\n',
        b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{'
        b'"tool_calls":[{"index":0,"function":{"arguments":"{\\"city\\": \\"Paris\\"}"}}],'
        b'"function_call":{"arguments":"{\\"city\\": \\"Paris\\"}"}},"finish_reason":null}]}\n\n',
        b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},'
        b'"finish_reason":"tool_calls"}]}\n\n',
        b"data: [DONE]\n\n",
    ]
    req = b'{"model":"m","stream":true,"messages":[],"tools":[{"type":"function","function":{"name":"get_weather"}}]}'
    rec = observe("openai.chat", req, chunks, path="/v1/chat/completions")
    assert rec["tool_calls"] == [
        {"index": 0, "id": "call_0", "name": "get_weather", "arguments": '{"city": "Paris"}', "declared": True}
    ]
    assert rec["stop_reason"] == "tool_use"


def test_invalid_tool_call_indexes_are_each_flagged():
    """Trial finding: indexes 1e18 (float), 10**40 and -1 collapsed silently under one
    "without index" violation."""
    from tests.wirefeed import observe

    def frag(index: str, cid: str) -> bytes:
        return (
            b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{'
            b'"tool_calls":[{"index":'
            + index.encode()
            + b',"id":"'
            + cid.encode()
            + b'","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":null}]}\n\n'
        )

    chunks = [frag("1e18", "call_b"), frag(str(10**40), "call_c"), frag("-1", "call_d"), b"data: [DONE]\n\n"]
    rec = observe("openai.chat", b'{"model":"m","stream":true,"messages":[]}', chunks, path="/v1/chat/completions")
    details = [v["detail"] for v in rec["violations"] if v["kind"] == "invalid_event"]
    assert details == [
        "tool_calls[] fragment index 1e+18 invalid: position used",
        "tool_calls[] fragment index 1e+40 invalid: position used",  # orjson reads integers beyond 64 bits as floats
        "tool_calls[] fragment index -1 invalid: position used",
    ]
    assert [t["id"] for t in rec["tool_calls"]] == ["call_b", "call_c", "call_d"]


@pytest.mark.parametrize(
    ("message", "detail"),
    [
        (chunk({"content": 5}), "content is not text: 5 dropped"),
        (chunk({"content": {}}), "content is not text: {} dropped"),
        (chunk({"content": "x"}, index="a"), "choices[].index 'a' invalid: choice 0 used"),
        (chunk({"content": "x"}, index=-1), "choices[].index -1 invalid: choice 0 used"),
        (chunk({}, finish=7), "finish_reason is not a string: 7"),
        (sse({"id": "c1", "model": 7, "choices": []}), "model is not a string: 7"),
        (
            sse({"id": "c1", "model": "m", "choices": [], "usage": {"prompt_tokens": "x", "completion_tokens": 3}}),
            "usage.prompt_tokens is not a token count: 'x'",
        ),
        (
            sse({"id": "c1", "model": "m", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": -1}}),
            "usage.completion_tokens is not a token count: -1",
        ),
        (
            sse({"id": "c1", "model": "m", "choices": [], "usage": {"prompt_tokens": 1.5}}),
            "usage.prompt_tokens is not a token count: 1.5",
        ),
    ],
)
def test_chat_fields_of_the_wrong_type_are_violations(message, detail):
    """Regression (trial): a chunk field of the wrong JSON type (a number as the content, a
    bad choice index, a non-string finish reason or model, a token count that is not a
    non-negative integer) was dropped or coerced without a trace; each is now an
    ``invalid_event`` violation with the value, and the rest of the chunk is still mapped."""
    out = feed(OpenAIChatAdapter(), chunk({"role": "assistant", "content": ""}), message)
    assert [(v.kind, v.detail) for v in out if isinstance(v, Violation)] == [("invalid_event", detail)]


def test_chat_absent_or_null_fields_are_not_violations():
    """The lenient cases stay silent: no choice index (the only choice), ``content: null``,
    ``finish_reason: null``, ``usage: null`` and null token counts."""
    out = feed(
        OpenAIChatAdapter(),
        sse(
            {"id": "c1", "model": "m", "choices": [{"delta": {"content": None}, "finish_reason": None}], "usage": None}
        ),
        sse({"id": "c1", "model": "m", "choices": [], "usage": {"prompt_tokens": None, "completion_tokens": 2}}),
    )
    assert kinds(out) == []


def test_responses_token_counts_of_the_wrong_type_are_violations():
    """Regression (trial audit): a ``response.usage`` count present but not a non-negative
    integer was ignored without a trace; the valid count is still reported."""
    response = {"id": "r1", "model": "m", "status": "completed", "usage": {"input_tokens": "4", "output_tokens": 2}}
    out = feed(OpenAIResponsesAdapter(), ev("response.completed", 0, response=response))
    assert [(v.kind, v.seq, v.detail) for v in out if isinstance(v, Violation)] == [
        ("invalid_event", 0, "usage.input_tokens is not a token count: '4'")
    ]
    assert [e for e in out if isinstance(e, UsageEvent)] == [UsageEvent(0, None, 2)]


def test_a_request_nested_near_orjson_limit_keeps_its_facts():
    """Trial finding: a chat request nested ~970 levels (orjson accepts 1024) raised
    ``RecursionError`` in ``reduce_binary``; the record lost the whole request."""
    import json

    from observer.dialects.openai_chat import OpenAIChatDialect

    deep: list = []
    for _ in range(1000):
        deep = [deep]
    body = json.dumps(
        {
            "model": "gpt-4o",
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
            "temperature": 0.5,
            "extra": deep,
        }
    ).encode()
    facts, violations = OpenAIChatDialect().parse_request(body, None)
    assert facts.model == "gpt-4o"
    assert facts.messages == [{"role": "user", "content": "hi"}]
    assert facts.parameters["temperature"] == 0.5
    assert facts.parameters["extra"] == deep
    assert violations == []
