"""Amazon Bedrock dialects (``bedrock.converse``, ``bedrock.invoke``): detection, request facts
and the adapters' mapping of event-stream messages. Expected values are written by hand from
the AWS Bedrock API reference (ConverseStream, Converse, InvokeModelWithResponseStream; the
event shapes of shared reference vendor-wire-formats §8) and Anthropic's "Streaming messages"
(the events Bedrock wraps in ``chunk.bytes``). Whole responses, framed from event-stream bytes,
are the wire fixtures of ``tests/fixtures/wire/bedrock.*`` (``test_wire_fixtures.py``)."""

from __future__ import annotations

import base64
import json

import pytest

from observer.dialects.base import RequestView
from observer.dialects.bedrock import (
    BedrockConverseDialect,
    BedrockInvokeDialect,
    ConverseAdapter,
    InvokeAdapter,
    bedrock_path,
    strip_bytes,
)
from observer.dialects.registry import default_registry
from observer.events import (
    ContentDelta,
    ErrorEvent,
    ResponseIdentity,
    StopEvent,
    StreamEnd,
    StreamStart,
    ToolCallDelta,
    ToolCallEvent,
    UsageEvent,
)
from observer.records import Violation
from observer.response import ResponseSpec
from observer.wire.frames import Framing, JSONFrame, SSEEvent

HOST = "bedrock-runtime.eu-central-1.amazonaws.com"
CLAUDE = "anthropic.claude-3-5-sonnet-20240620-v1:0"


def view(path: str, method: str = "POST") -> RequestView:
    return RequestView(method, HOST, path, {"content-type": "application/json"})


def event(name: str, data: object) -> SSEEvent:
    text = data if isinstance(data, str) else json.dumps(data)
    return SSEEvent(event=name, data=text, id=None, retry=None, size_bytes=len(text))


def chunk(inner: dict) -> SSEEvent:
    return event("chunk", {"bytes": base64.b64encode(json.dumps(inner).encode()).decode(), "p": "abcdefgh"})


def run(adapter, messages) -> list:
    out = []
    for m in messages:
        out += adapter.on_message(m)
    return out + adapter.on_close()


# ----- detection -----


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (f"/model/{CLAUDE}/converse-stream", "bedrock.converse"),
        ("/model/us.anthropic.claude-3-7-sonnet-20250219-v1%3A0/converse", "bedrock.converse"),
        (f"/model/{CLAUDE}/invoke-with-response-stream", "bedrock.invoke"),
        ("/model/meta.llama3-8b-instruct-v1:0/invoke", "bedrock.invoke"),
        (f"/model/{CLAUDE}/converse-stream?x=1", "bedrock.converse"),  # the query is not the path
        (f"/model/{CLAUDE}/invoke-with-bidirectional-stream", None),
        (f"/model/{CLAUDE}/count-tokens", None),
        ("/v1/model/x/converse", None),
    ],
)
def test_detection_by_path(path, expected):
    dialect = default_registry().classify(view(path))
    assert (dialect.name if dialect else None) == expected


def test_get_is_not_an_invocation():
    assert default_registry().classify(view(f"/model/{CLAUDE}/converse", method="GET")) is None


def test_the_model_is_the_paths_url_decoded():
    arn = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-3-haiku-20240307-v1:0"
    assert bedrock_path(f"/model/{arn.replace(':', '%3A').replace('/', '%2F')}/converse-stream") == (
        arn,
        "converse-stream",
    )
    assert bedrock_path("/model//converse") is None


def test_framing_by_media_type():
    spec = ResponseSpec(dialect="bedrock.converse", status_code=200, content_type="application/vnd.amazon.eventstream")
    assert BedrockConverseDialect().framing(spec) is Framing.EVENT_STREAM
    assert BedrockInvokeDialect().framing(spec) is Framing.EVENT_STREAM
    json_spec = ResponseSpec(dialect="bedrock.converse", status_code=200, content_type="application/json")
    assert BedrockConverseDialect().framing(json_spec) is Framing.JSON


# ----- Converse requests -----

CONVERSE_REQUEST = {
    "messages": [
        {
            "role": "user",
            "content": [
                {"text": "What is in this picture, and the weather in Paris?"},
                {"image": {"format": "png", "source": {"bytes": "iVBORw0KGgo="}}},
            ],
        }
    ],
    "system": [{"text": "You are terse."}],
    "inferenceConfig": {"maxTokens": 512, "temperature": 0.2},
    "toolConfig": {
        "tools": [
            {"toolSpec": {"name": "get_weather", "description": "Weather", "inputSchema": {"json": {"type": "object"}}}}
        ],
        "toolChoice": {"auto": {}},
    },
    "requestMetadata": {"team": "finance"},
}


def test_a_converse_request():
    facts, violations = BedrockConverseDialect().parse_request(
        json.dumps(CONVERSE_REQUEST).encode(), view(f"/model/{CLAUDE}/converse-stream")
    )
    assert violations == []
    assert (facts.model, facts.stream) == (CLAUDE, True)
    assert facts.messages == [
        {"role": "system", "content": [{"text": "You are terse."}]},
        {
            "role": "user",
            "content": [
                {"text": "What is in this picture, and the weather in Paris?"},
                {"image": {"format": "png", "source": {"data_bytes": 8}}},  # 12 base64 chars, one pad
            ],
        },
    ]
    assert facts.tool_names == ["get_weather"]
    assert facts.parameters == {
        "inferenceConfig": {"maxTokens": 512, "temperature": 0.2},
        "toolChoice": {"auto": {}},
    }
    assert facts.metadata == {"team": "finance"}


def test_a_non_streaming_converse_request_and_near_misses():
    dialect = BedrockConverseDialect()
    facts, _ = dialect.parse_request(b'{"messages": []}', view(f"/model/{CLAUDE}/converse"))
    assert facts.stream is False
    for body, why in ((b'{"prompt": "hi"}', "no messages array"), (b"[1]", "not a JSON object")):
        facts, violations = dialect.parse_request(body, view(f"/model/{CLAUDE}/converse"))
        assert [v.kind for v in violations] == ["not_llm_request"] and why in violations[0].detail
        assert facts.messages == [] and facts.body_bytes == len(body)


def test_bytes_inside_tool_results_are_stripped_too():
    value = {"toolResult": {"content": [{"document": {"name": "a", "source": {"bytes": "QUJD"}}}]}}
    assert strip_bytes(value) == {"toolResult": {"content": [{"document": {"name": "a", "source": {"data_bytes": 3}}}]}}


# ----- Converse stream -----


def test_a_converse_stream_with_text_reasoning_and_a_tool_call():
    got = run(
        ConverseAdapter(),
        [
            event("messageStart", {"role": "assistant", "p": "abc"}),
            event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"reasoningContent": {"text": "Think"}}}),
            event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"reasoningContent": {"signature": "s"}}}),
            event("contentBlockStop", {"contentBlockIndex": 0}),
            event("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"text": "Let me check"}}),
            event("contentBlockStop", {"contentBlockIndex": 1}),
            event(
                "contentBlockStart",
                {"contentBlockIndex": 2, "start": {"toolUse": {"toolUseId": "tooluse_1", "name": "get_weather"}}},
            ),
            event("contentBlockDelta", {"contentBlockIndex": 2, "delta": {"toolUse": {"input": '{"city":'}}}),
            event("contentBlockDelta", {"contentBlockIndex": 2, "delta": {"toolUse": {"input": '"Paris"}'}}}),
            event("contentBlockStop", {"contentBlockIndex": 2}),
            event("messageStop", {"stopReason": "tool_use"}),
            event(
                "metadata",
                {
                    "usage": {"inputTokens": 25, "outputTokens": 17, "totalTokens": 42},
                    "metrics": {"latencyMs": 300},
                },
            ),
        ],
    )
    assert got == [
        StreamStart(None, None, None),
        ContentDelta(None, 0, "Think", "reasoning"),
        ContentDelta(None, 1, "Let me check", "text"),
        ToolCallDelta(None, "2", 2, "tooluse_1", "get_weather", ""),
        ToolCallDelta(None, "2", 2, None, None, '{"city":'),
        ToolCallDelta(None, "2", 2, None, None, '"Paris"}'),
        StopEvent(None, "tool_use", "tool_use"),
        UsageEvent(None, 25, 17, total_tokens=42),
        StreamEnd(None),
    ]


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("end_turn", "end_turn"),
        ("max_tokens", "max_tokens"),
        ("stop_sequence", "stop_sequence"),
        ("guardrail_intervened", "content_filter"),
        ("content_filtered", "content_filter"),
        ("model_context_window_exceeded", "model_context_window_exceeded"),
    ],
)
def test_stop_reasons(raw, canonical):
    assert ConverseAdapter().on_message(event("messageStop", {"stopReason": raw})) == [StopEvent(None, canonical, raw)]


def test_a_stream_that_stopped_without_metadata_still_ends_and_one_that_did_not_stop_does_not():
    assert run(ConverseAdapter(), [event("messageStop", {"stopReason": "end_turn"})])[-1] == StreamEnd(None)
    assert StreamEnd(None) not in run(
        ConverseAdapter(), [event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "cut"}})]
    )


def test_an_exception_mid_stream_is_an_error():
    got = run(
        ConverseAdapter(),
        [
            event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Hel"}}),
            event("exception:throttlingException", {"message": "Too many requests, please wait."}),
        ],
    )
    assert got == [
        ContentDelta(None, 0, "Hel", "text"),
        ErrorEvent(None, "throttlingException", "Too many requests, please wait."),
    ]
    assert ConverseAdapter().on_message(event("error:InternalFailure", {"message": "boom"})) == [
        ErrorEvent(None, "InternalFailure", "boom")
    ]


def test_bad_converse_events_are_violations():
    adapter = ConverseAdapter()
    assert [v.kind for v in adapter.on_message(event("contentBlockDelta", "[1]")) if isinstance(v, Violation)] == [
        "invalid_event"
    ]
    assert [v.kind for v in adapter.on_message(event("contentBlockDelta", "{bad")) if isinstance(v, Violation)] == [
        "invalid_json"
    ]
    assert [
        v.kind
        for v in adapter.on_message(event("contentBlockDelta", {"contentBlockIndex": -1, "delta": {"text": "x"}}))
    ] == ["invalid_event"]
    assert [v.kind for v in adapter.on_message(event("metadata", {"usage": {"inputTokens": "many"}}))] == [
        "invalid_event"
    ]
    assert adapter.on_message(event("someNewMember", {"x": 1})) == []  # the API may add members


def test_a_converse_body():
    body = {
        "output": {
            "message": {
                "role": "assistant",
                "content": [
                    {"reasoningContent": {"reasoningText": {"text": "Hmm", "signature": "s"}}},
                    {"text": "It is sunny."},
                    {"toolUse": {"toolUseId": "t1", "name": "get_weather", "input": {"city": "Paris"}}},
                ],
            }
        },
        "stopReason": "end_turn",
        "usage": {"inputTokens": 9, "outputTokens": 4, "totalTokens": 13},
        "metrics": {"latencyMs": 120},
    }
    assert ConverseAdapter().on_message(JSONFrame(json.dumps(body), 1)) == [
        StreamStart(None, None, None),
        ContentDelta(None, 0, "Hmm", "reasoning"),
        ContentDelta(None, 1, "It is sunny.", "text"),
        ToolCallEvent(None, 2, "t1", "get_weather", '{"city":"Paris"}'),
        StopEvent(None, "end_turn", "end_turn"),
        UsageEvent(None, 9, 4, total_tokens=13),
        StreamEnd(None),
    ]


# ----- InvokeModel -----

ANTHROPIC_REQUEST = {
    "anthropic_version": "bedrock-2023-05-31",
    "max_tokens": 256,
    "system": "Be brief.",
    "messages": [{"role": "user", "content": "Hello"}],
    "tools": [{"name": "lookup", "description": "d", "input_schema": {"type": "object"}}],
}


def test_an_anthropic_invoke_request_is_read_as_anthropic_reads_it():
    facts, violations = BedrockInvokeDialect().parse_request(
        json.dumps(ANTHROPIC_REQUEST).encode(), view(f"/model/{CLAUDE}/invoke-with-response-stream")
    )
    assert violations == []
    assert (facts.model, facts.stream) == (CLAUDE, True)
    assert facts.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    assert facts.tool_names == ["lookup"]
    assert facts.parameters == {"max_tokens": 256}


def test_other_providers_invoke_requests():
    dialect = BedrockInvokeDialect()
    facts, violations = dialect.parse_request(
        b'{"prompt": "Tell me a joke", "max_gen_len": 64}', view("/model/meta.llama3-8b-instruct-v1:0/invoke")
    )
    assert violations == [] and (facts.model, facts.stream) == ("meta.llama3-8b-instruct-v1:0", False)
    assert facts.messages == [{"role": "user", "content": "Tell me a joke"}]
    assert facts.parameters == {"max_gen_len": 64}
    facts, _ = dialect.parse_request(
        b'{"inputText": "Hi", "textGenerationConfig": {"maxTokenCount": 9}}',
        view("/model/amazon.titan-text-express-v1/invoke-with-response-stream"),
    )
    assert facts.messages == [{"role": "user", "content": "Hi"}] and facts.stream is True
    facts, violations = dialect.parse_request(b'{"texts": ["embed me"]}', view("/model/cohere.embed-v3/invoke"))
    assert [v.kind for v in violations] == ["not_llm_request"]


def test_an_anthropic_invoke_stream():
    got = run(
        InvokeAdapter(),
        [
            chunk(
                {
                    "type": "message_start",
                    "message": {
                        "id": "msg_bdrk_01",
                        "type": "message",
                        "role": "assistant",
                        "model": "claude-3-5-sonnet-20240620",
                        "content": [],
                        "usage": {"input_tokens": 12, "output_tokens": 1},
                    },
                }
            ),
            chunk({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            chunk({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi there"}}),
            chunk({"type": "content_block_stop", "index": 0}),
            chunk({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}}),
            chunk(
                {
                    "type": "message_stop",
                    "amazon-bedrock-invocationMetrics": {"inputTokenCount": 12, "outputTokenCount": 3},
                }
            ),
        ],
    )
    assert got == [
        StreamStart(None, "claude-3-5-sonnet-20240620", None),
        ResponseIdentity(None, response_id="msg_bdrk_01"),
        UsageEvent(None, 12, 1),
        ContentDelta(None, 0, "", "text"),
        ContentDelta(None, 0, "Hi there", "text"),
        StopEvent(None, "end_turn", "end_turn"),
        UsageEvent(None, None, 3),
        StreamEnd(None),  # the metrics repeat what usage said: not added again
    ]


def test_invocation_metrics_give_usage_when_the_model_gave_none():
    got = run(
        InvokeAdapter(),
        [
            chunk({"outputText": "Hello", "index": 0, "completionReason": None}),
            chunk(
                {
                    "outputText": " world",
                    "index": 0,
                    "completionReason": "FINISH",
                    "amazon-bedrock-invocationMetrics": {"inputTokenCount": 4, "outputTokenCount": 2},
                }
            ),
        ],
    )
    assert got == [
        StreamStart(None, None, None),
        ContentDelta(None, 0, "Hello", "text"),
        ContentDelta(None, 0, " world", "text"),
        StopEvent(None, "end_turn", "FINISH"),
        UsageEvent(None, 4, 2),
        StreamEnd(None),
    ]


def test_llama_and_mistral_bodies():
    llama = {"generation": "Why did", "prompt_token_count": 8, "generation_token_count": 2, "stop_reason": "length"}
    assert InvokeAdapter().on_message(JSONFrame(json.dumps(llama), 1)) == [
        StreamStart(None, None, None),
        ContentDelta(None, 0, "Why did", "text"),
        StopEvent(None, "max_tokens", "length"),
        UsageEvent(None, 8, 2),
        StreamEnd(None),
    ]
    mistral = {"outputs": [{"text": "Bonjour", "stop_reason": "stop"}]}
    assert InvokeAdapter().on_message(JSONFrame(json.dumps(mistral), 1)) == [
        StreamStart(None, None, None),
        ContentDelta(None, 0, "Bonjour", "text"),
        StopEvent(None, "end_turn", "stop"),
        StreamEnd(None),
    ]


def test_bad_chunks_are_violations_and_exceptions_errors():
    adapter = InvokeAdapter()
    assert [v.kind for v in adapter.on_message(event("chunk", {"p": "x"}))] == ["invalid_event"]
    assert [v.kind for v in adapter.on_message(event("chunk", {"bytes": "%%%"}))] == ["invalid_event"]
    assert [v.kind for v in adapter.on_message(event("chunk", {"bytes": base64.b64encode(b"[1]").decode()}))] == [
        "invalid_event"
    ]
    assert adapter.on_message(event("exception:modelTimeoutException", {"message": "timed out"})) == [
        ErrorEvent(None, "modelTimeoutException", "timed out")
    ]


def test_bytes_that_are_not_event_stream_framing_are_unreadable_not_truncated():
    """SSE ``data:`` lines under ``application/vnd.amazon.eventstream`` (llm-katan's Bedrock
    answer; tests/e2e/test_real_servers.py): read as AWS frames, the first 8 bytes
    ``data: {"`` are a 0x64617461-byte total length whose prelude CRC (bytes 8-11, ``mess``)
    is not ``zlib.crc32(b'data: {"')``, and no later offset holds a valid prelude. The stream
    ended cleanly and nothing of it could be read: ``unreadable`` with the one
    ``checksum_mismatch``, no ``missing_stream_end`` blaming the upstream (trial finding)."""
    from tests.wirefeed import observe

    body = b'data: {"messageStart": {"role": "assistant"}}\n\ndata: {"messageStop": {"stopReason": "end_turn"}}\n\n'
    record = observe(
        "bedrock.converse",
        b'{"messages": [{"role": "user", "content": [{"text": "hi"}]}]}',
        [body[:20], body[20:]],
        content_type="application/vnd.amazon.eventstream",
        path="/model/m/converse-stream",
    )
    assert (record["outcome"], record["text"], record["events"]) == ("unreadable", "", 0)
    assert [v["kind"] for v in record["violations"]] == ["checksum_mismatch"]
    assert record["response_bytes"] == len(body)
