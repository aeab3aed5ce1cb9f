"""The fuller record (issue 16, items 1-2): usage details with their own "reported" provenance,
the response's identity, the joined reasoning and per-choice results, through the dialects'
usage maps, the reassembler, the chain, the store (SQLite and PostgreSQL), the API's withheld
view and the OTLP span.

Expected values are written by hand from the vendors' documented usage objects:
OpenAI API reference "The chat completion object" (``usage.prompt_tokens_details.cached_tokens``,
``completion_tokens_details.reasoning_tokens``) and "The response object" (``usage.
input_tokens_details`` / ``output_tokens_details``); Anthropic Messages API "Usage" and "Prompt
caching" (``cache_creation_input_tokens``, ``cache_read_input_tokens``, ``cache_creation.
ephemeral_5m_input_tokens``); Gemini API "UsageMetadata" (``cachedContentTokenCount``,
``thoughtsTokenCount``, ``promptTokensDetails``); Ollama API "Generate a chat completion"
(``prompt_eval_count``, ``eval_count``, ``*_duration`` in nanoseconds); Bedrock "TokenUsage"
(``cacheReadInputTokens``, ``cacheWriteInputTokens``). The wire fixtures with these fields
(``openai.chat/cached_reasoning``, ``openai.chat/two_choices``, ``openai.responses/
cached_reasoning``, ``anthropic.messages/prompt_cache``, ``gemini/cached_thoughts``) run in
``test_wire_fixtures.py`` and through the official SDKs in ``tests/e2e/test_sdk_clients.py``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa

from observer.api.routers.exchanges import withhold_content
from observer.dialects._openai_common import CHAT_USAGE, RESPONSES_USAGE
from observer.dialects.anthropic import ANTHROPIC_USAGE
from observer.dialects.bedrock import CONVERSE_USAGE, METRICS_USAGE
from observer.dialects.gemini import GEMINI_USAGE
from observer.dialects.ollama import OLLAMA_USAGE
from observer.dialects.usage import read_usage
from observer.events import ContentDelta, ResponseIdentity, StopEvent, StreamEnd, StreamStart, UsageEvent
from observer.otlp import span_attributes
from observer.reassembly import EndCause, Reassembler
from observer.records import Block, Exchange, Usage, Violation
from observer.response import ResponseFacts
from observer.shape import keys
from observer.store.chain import ADDED_KEYS, canonical_record
from observer.store.store import AuditStore

T0 = datetime(2026, 12, 1, 9, 0, 0, tzinfo=timezone.utc)


def _read(usage: Any, spec: Any) -> tuple[UsageEvent | None, list[Any]]:
    out: list[Any] = []
    event = read_usage(usage, spec, 3, out)
    return event, out


# ----- the vendors' usage objects -----


def test_openai_chat_usage_with_cached_and_reasoning_tokens() -> None:
    """OpenAI's documented example usage of a reasoning model with a cache hit."""
    event, out = _read(
        {
            "prompt_tokens": 2006,
            "completion_tokens": 300,
            "total_tokens": 2306,
            "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 256,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        },
        CHAT_USAGE,
    )
    assert out == [event]
    assert event == UsageEvent(
        3,
        2006,
        300,
        cache_read_input_tokens=1920,
        reasoning_output_tokens=256,
        total_tokens=2306,
        details=(
            ("input", "audio", 0),
            ("output", "audio", 0),
            ("output", "accepted_prediction", 0),
            ("output", "rejected_prediction", 0),
        ),
    )


def test_openai_chat_usage_of_an_older_server_reports_no_details() -> None:
    """A compatible server that sends only the three counts: cached and reasoning are null
    (not reported), never 0; DeepSeek's ``prompt_cache_hit_tokens`` stands in for cached."""
    event, _ = _read({"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}, CHAT_USAGE)
    assert event == UsageEvent(3, 9, 3, total_tokens=12)
    event, _ = _read({"prompt_tokens": 9, "completion_tokens": 3, "prompt_cache_hit_tokens": 8}, CHAT_USAGE)
    assert event == UsageEvent(3, 9, 3, cache_read_input_tokens=8)


def test_responses_usage() -> None:
    event, _ = _read(
        {
            "input_tokens": 1410,
            "input_tokens_details": {"cached_tokens": 1024},
            "output_tokens": 520,
            "output_tokens_details": {"reasoning_tokens": 448},
            "total_tokens": 1930,
        },
        RESPONSES_USAGE,
    )
    assert event == UsageEvent(
        3, 1410, 520, cache_read_input_tokens=1024, reasoning_output_tokens=448, total_tokens=1930
    )


def test_anthropic_usage_with_cache_write_split_by_lifetime() -> None:
    event, _ = _read(
        {
            "input_tokens": 21,
            "cache_creation_input_tokens": 188,
            "cache_read_input_tokens": 2048,
            "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 188},
            "output_tokens": 2,
            "service_tier": "priority",
            "server_tool_use": {"web_search_requests": 2},
        },
        ANTHROPIC_USAGE,
    )
    assert event == UsageEvent(
        3,
        21,
        2,
        cache_read_input_tokens=2048,
        cache_creation_input_tokens=188,
        details=(
            ("cache_creation", "ephemeral_5m", 0),
            ("cache_creation", "ephemeral_1h", 188),
            ("server_tool_use", "web_search_requests", 2),
        ),
    )


def test_gemini_usage_metadata_with_modalities() -> None:
    event, _ = _read(
        {
            "promptTokenCount": 4126,
            "candidatesTokenCount": 9,
            "totalTokenCount": 4335,
            "cachedContentTokenCount": 4096,
            "thoughtsTokenCount": 200,
            "toolUsePromptTokenCount": 12,
            "promptTokensDetails": [
                {"modality": "TEXT", "tokenCount": 30},
                {"modality": "DOCUMENT", "tokenCount": 4096},
            ],
            "cacheTokensDetails": [{"modality": "DOCUMENT", "tokenCount": 4096}],
            "candidatesTokensDetails": [{"modality": "TEXT", "tokenCount": 9}],
        },
        GEMINI_USAGE,
    )
    # read_usage gives the counts as sent; the dialect adds thoughts to output (test_wire_fixtures:
    # gemini/cached_thoughts has output 209).
    assert event == UsageEvent(
        3,
        4126,
        9,
        cache_read_input_tokens=4096,
        reasoning_output_tokens=200,
        total_tokens=4335,
        details=(
            ("input", "text", 30),
            ("input", "document", 4096),
            ("cache_read", "document", 4096),
            ("output", "text", 9),
            ("input", "tool_use_prompt", 12),
        ),
    )


def test_ollama_counts_and_durations() -> None:
    event, _ = _read(
        {"done": True, "prompt_eval_count": 26, "eval_count": 282, "total_duration": 4883583458, "eval_duration": 7},
        OLLAMA_USAGE,
    )
    assert event == UsageEvent(3, 26, 282, details=(("duration_ns", "total", 4883583458), ("duration_ns", "eval", 7)))


def test_bedrock_converse_and_invocation_metrics() -> None:
    event, _ = _read(
        {
            "inputTokens": 5,
            "outputTokens": 7,
            "totalTokens": 2060,
            "cacheReadInputTokens": 2048,
            "cacheWriteInputTokens": 0,
        },
        CONVERSE_USAGE,
    )
    assert event == UsageEvent(3, 5, 7, cache_read_input_tokens=2048, cache_creation_input_tokens=0, total_tokens=2060)
    event, _ = _read({"inputTokenCount": 5, "outputTokenCount": 7, "invocationLatency": 900}, METRICS_USAGE)
    assert event == UsageEvent(3, 5, 7)


def test_bad_counts_are_violations_and_left_out() -> None:
    event, out = _read(
        {
            "prompt_tokens": 10,
            "completion_tokens": -1,
            "prompt_tokens_details": {"cached_tokens": "many", "audio_tokens": 2.5},
            "completion_tokens_details": {"reasoning_tokens": None},
        },
        CHAT_USAGE,
    )
    assert event == UsageEvent(3, 10, None)
    assert [(v.kind, v.seq, v.detail) for v in out if isinstance(v, Violation)] == [
        ("invalid_event", 3, "usage.completion_tokens is not a token count: -1"),
        ("invalid_event", 3, "usage.prompt_tokens_details.cached_tokens is not a token count: 'many'"),
        ("invalid_event", 3, "usage.prompt_tokens_details.audio_tokens is not a token count: 2.5"),
    ]


def test_no_count_no_event() -> None:
    assert _read({"prompt_tokens": None, "completion_tokens_details": {}}, CHAT_USAGE) == (None, [])
    assert _read("not an object", CHAT_USAGE) == (None, [])


# ----- the reassembler -----


def _run(events: list[Any]) -> ResponseFacts:
    r = Reassembler()
    for ev in events:
        r.apply(ev, 1.0)
    return r.finish(ResponseFacts(), EndCause.EOF, request_start_s=0.0)


def test_each_count_is_assigned_on_its_own() -> None:
    """Anthropic: ``message_start`` has input and cache counts, ``message_delta`` only output;
    the cache counts stay, output is replaced; details merge by (group, name)."""
    facts = _run(
        [
            UsageEvent(None, 21, 2, cache_read_input_tokens=2048, details=(("cache_creation", "ephemeral_1h", 188),)),
            UsageEvent(None, None, 14, details=(("cache_creation", "ephemeral_1h", 190), ("output", "thinking", 3))),
            StreamEnd(None),
        ]
    )
    assert facts.usage == Usage(
        input_tokens=21,
        output_tokens=14,
        cache_read_input_tokens=2048,
        details={"cache_creation": {"ephemeral_1h": 190}, "output": {"thinking": 3}},
        reported=True,
    )


def test_identity_later_values_replace_and_are_not_counted_as_events() -> None:
    facts = _run(
        [
            StreamStart(None, "o3", None),
            ResponseIdentity(None, "resp_1", None, "auto"),
            ResponseIdentity(None, None, "fp_1", "flex"),
            ResponseIdentity(None, "", None, None),
            StreamEnd(None),
        ]
    )
    assert (facts.response_id, facts.system_fingerprint, facts.service_tier) == ("resp_1", "fp_1", "flex")
    assert facts.events == 2
    after = _run([StreamEnd(None), ResponseIdentity(None, "resp_2")])
    assert after.response_id is None
    assert [v.kind for v in after.violations] == ["event_after_end"]


def test_choices_when_there_are_several_and_none_for_one() -> None:
    two = _run(
        [
            ContentDelta(None, 0, "Blue", "text"),
            ContentDelta(None, 1, "Teal", "text"),
            ContentDelta(None, 1001, "hmm", "reasoning"),
            StopEvent(None, "max_tokens", "length", 1),
            StopEvent(None, "end_turn", "stop", 0),
            StreamEnd(None),
        ]
    )
    assert two.choices == [
        {"index": 0, "text": "Blue", "stop_reason": "end_turn", "stop_reason_raw": "stop"},
        {"index": 1, "text": "Teal", "stop_reason": "max_tokens", "stop_reason_raw": "length"},
    ]
    one = _run([ContentDelta(None, 0, "Blue", "text"), StopEvent(None, "end_turn", "stop", 0), StreamEnd(None)])
    assert one.choices is None
    message = _run([ContentDelta(None, 0, "Blue", "text"), StopEvent(None, "end_turn", "stop"), StreamEnd(None)])
    assert message.choices is None


def test_reasoning_joins_the_reasoning_blocks() -> None:
    record = Exchange(
        id="r",
        dialect="anthropic.messages",
        host="h",
        path="/v1/messages",
        method="POST",
        http_version="HTTP/1.1",
        started_at=T0,
        blocks=[Block(2, "text", "answer"), Block(1, "reasoning", "second "), Block(0, "reasoning", "first ")],
    )
    assert record.reasoning == "first second "
    assert record.to_dict()["reasoning"] == "first second "
    assert list(record.to_dict()).index("reasoning") == list(record.to_dict()).index("blocks") + 1


# ----- the chain -----


def test_added_keys_are_every_field_marked_added() -> None:
    added = {k.name for k in keys(Exchange) if k.missing is not None and k.name not in ("request",)}
    added |= {f"usage.{k.name}" for k in keys(Usage) if k.missing is not None}
    assert set(ADDED_KEYS) == added


def test_a_record_from_before_the_new_fields_hashes_as_it_did(make_exchange: Callable[..., Exchange]) -> None:
    """The dict of a record stored before issue 16 (no new keys) and the same record read back
    now (the new keys null) have the same canonical bytes."""
    now = make_exchange("r1", T0).to_dict()
    before = {
        k: v
        for k, v in now.items()
        if k not in ("response_id", "system_fingerprint", "service_tier", "choices", "reasoning")
    }
    before["usage"] = {"input_tokens": None, "output_tokens": None, "reported": False}
    assert canonical_record(now, "w", 1) == canonical_record(before, "w", 1)


def test_the_new_fields_are_committed_and_choice_text_by_digest(make_exchange: Callable[..., Exchange]) -> None:
    record = make_exchange(
        "r1",
        T0,
        response_id="chatcmpl-1",
        choices=[{"index": 0, "text": "secret", "stop_reason": "end_turn", "stop_reason_raw": "stop"}],
        usage=Usage(1, 2, cache_read_input_tokens=0, details={"input": {"audio": 4}}, reported=True),
    )
    got = canonical_record(record.to_dict(), "w", 1).decode()
    digest = hashlib.sha256(b"secret").hexdigest()
    assert '"response_id":"chatcmpl-1"' in got
    assert '"choices":[{"index":0,"stop_reason":"end_turn","stop_reason_raw":"stop","text":{"sha256":"' + digest in got
    assert '"usage":{"cache_read_input_tokens":0,"details":{"input":{"audio":4}},"input_tokens":1,' in got
    assert "secret" not in got
    assert "reasoning" not in got  # derived, not committed twice


# ----- the store -----


def _full(make_exchange: Callable[..., Exchange], id_: str) -> Exchange:
    return make_exchange(
        id_,
        T0,
        response_id="msg_01",
        system_fingerprint="fp_1",
        service_tier="priority",
        blocks=[Block(0, "reasoning", "think"), Block(1, "text", "say")],
        choices=[
            {"index": 0, "text": "say", "stop_reason": "end_turn", "stop_reason_raw": "stop"},
            {"index": 1, "text": "", "stop_reason": "max_tokens", "stop_reason_raw": "length"},
        ],
        usage=Usage(
            21,
            14,
            cache_read_input_tokens=2048,
            cache_creation_input_tokens=188,
            reasoning_output_tokens=7,
            total_tokens=2271,
            details={"cache_creation": {"ephemeral_1h": 188}},
            reported=True,
        ),
    )


def test_the_store_keeps_every_new_field(store: AuditStore, make_exchange: Callable[..., Exchange]) -> None:
    record = _full(make_exchange, "00000000-0000-5000-8000-000000000001")
    plain = make_exchange("00000000-0000-5000-8000-000000000002", T0)
    store.write_many([record, plain])
    got = store.get(record.id)
    assert got is not None
    assert got == record.to_dict()
    assert got["reasoning"] == "think"
    assert got["usage"]["details"] == {"cache_creation": {"ephemeral_1h": 188}}
    other = store.get(plain.id)
    assert other is not None
    assert other["usage"] == {
        "input_tokens": None,
        "output_tokens": None,
        "cache_read_input_tokens": None,
        "cache_creation_input_tokens": None,
        "reasoning_output_tokens": None,
        "total_tokens": None,
        "details": None,
        "reported": False,
    }
    assert (other["response_id"], other["choices"]) == (None, None)
    with store.engine.connect() as conn:
        row = conn.execute(
            sa.text("SELECT cache_read_input_tokens, total_tokens, response_id FROM exchanges WHERE id = :i"),
            {"i": record.id},
        ).one()
    assert tuple(row) == (2048, 2271, "msg_01")


def test_a_viewer_sees_no_reasoning_and_no_choice_text(make_exchange: Callable[..., Exchange]) -> None:
    out = withhold_content(_full(make_exchange, "r").to_dict())
    assert out["reasoning"] is None
    assert [c["text"] for c in out["choices"]] == [None, None]
    assert [c["stop_reason"] for c in out["choices"]] == ["end_turn", "max_tokens"]
    assert out["usage"]["cache_read_input_tokens"] == 2048  # usage is metadata


def test_otlp_span_carries_the_cache_and_reasoning_counts(make_exchange: Callable[..., Exchange]) -> None:
    attrs = span_attributes(_full(make_exchange, "r"), content=False)
    assert {k: v for k, v in attrs.items() if k.startswith(("gen_ai.usage", "gen_ai.response.id", "openai."))} == {
        "gen_ai.usage.input_tokens": 21,
        "gen_ai.usage.output_tokens": 14,
        "gen_ai.usage.cache_read.input_tokens": 2048,
        "gen_ai.usage.cache_creation.input_tokens": 188,
        "gen_ai.usage.reasoning.output_tokens": 7,
        "gen_ai.response.id": "msg_01",
        "openai.response.system_fingerprint": "fp_1",
        "openai.response.service_tier": "priority",
    }
    plain = span_attributes(
        dataclasses.replace(make_exchange("r", T0), usage=Usage(1, 2, reported=True)), content=False
    )
    assert "gen_ai.usage.cache_read.input_tokens" not in plain


# -- the response id from a header the dialect names (Bedrock's x-amzn-requestid) -----------------


def test_response_id_of_reads_the_dialects_header() -> None:
    """Only a dialect with ``response_id_header`` has one; an absent or empty header gives none."""
    from observer.capture.request import response_id_of
    from observer.dialects.registry import default_registry

    registry = default_registry()
    converse, chat = registry.get("bedrock.converse"), registry.get("openai.chat")
    assert response_id_of(converse, {"x-amzn-requestid": "4c2f-1"}) == "4c2f-1"
    assert response_id_of(converse, {"x-amzn-requestid": ""}) is None
    assert response_id_of(converse, {}) is None
    assert response_id_of(chat, {"x-amzn-requestid": "4c2f-1", "x-request-id": "req_1"}) is None


def test_the_headers_id_is_kept_unless_the_body_names_one() -> None:
    """The header's id is the record's before any event; a body's id (an Anthropic model inside
    Bedrock's InvokeModel) replaces it; an old journal's spec, without the field, reads as none."""
    from observer.dialects.registry import default_registry
    from observer.response import ResponseSpec
    from observer.response import StreamEnd as End
    from observer.tap import StreamObserver

    dialect = default_registry().get("bedrock.converse")
    spec = ResponseSpec("bedrock.converse", 200, "application/json", response_id="aws-req-1")
    body = b'{"output":{"message":{"role":"assistant","content":[{"text":"Hi"}]}},"stopReason":"end_turn"}'

    def observed(spec: ResponseSpec) -> Any:
        obs = StreamObserver(dialect, spec)
        obs.feed(body, 1.0)
        return obs.finish(End(EndCause.EOF, 2.0))

    assert observed(spec).response_id == "aws-req-1"
    assert observed(dataclasses.replace(spec, response_id=None)).response_id is None
    old = spec.to_dict()
    del old["response_id"]
    assert ResponseSpec.from_dict(old).response_id is None
    r = Reassembler((), None)
    r.apply(ResponseIdentity(None, response_id="aws-req-1"), 0.0)
    r.apply(ResponseIdentity(None, response_id="msg_bdrk_01"), 0.0)
    assert r.finish(ResponseFacts(), EndCause.EOF, request_start_s=0.0).response_id == "msg_bdrk_01"
