"""Conversation linking (``observer.conversation``): canonical messages per dialect, the chain
hash, continuation hashes and link candidates.

Requests are parsed by each dialect's own ``parse_request`` (so ``RequestFacts.messages`` are as
the dialect records them); their bodies are written the way the official SDKs resend history
(the OpenAI and Anthropic shapes were captured from openai 3.51 / anthropic 2.10 with a mock
transport: ``model_dump`` of the returned message, ``None`` fields kept). Answers are records as
the reassembler leaves them: text blocks and tool calls with arguments as streamed.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from typing import Any

import pytest

from observer.conversation import (
    GENESIS,
    CanonicalAttachment,
    CanonicalCall,
    CanonicalMessage,
    CanonicalResult,
    canonical_answer,
    canonical_request,
    continuation_hash,
    link_candidates,
    normalise_json,
    prefix_hashes,
)
from observer.dialects.base import RequestView
from observer.dialects.registry import DialectRegistry, default_registry
from observer.dialects.standard import StandardDialect
from observer.records import Block, Exchange, ToolCall

REGISTRY = default_registry()
PATHS = {
    "openai.chat": "/v1/chat/completions",
    "openai.responses": "/v1/responses",
    "anthropic.messages": "/v1/messages",
    "gemini": "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
    "ollama": "/api/chat",
    "llm-stream-1.0": "/v1/stream",
    "vercel.ui": "/api/chat",
}
Q1, A1, Q2 = "What is the capital of Austria?", "Vienna.", "And of Hungary?"


def record(
    dialect: str,
    body: dict[str, Any],
    *,
    text: str = "",
    calls: tuple[tuple[str | None, str, str], ...] = (),
    outcome: str = "completed",
    path: str | None = None,
) -> Exchange:
    """The record of one exchange: ``body`` parsed by the dialect, ``text`` as one text block,
    ``calls`` as (id, name, arguments as streamed)."""
    path = path or PATHS[dialect]
    facts, _ = REGISTRY.get(dialect).parse_request(
        json.dumps(body).encode(), RequestView("POST", "llm.example", path, {"content-type": "application/json"})
    )
    return Exchange(
        id="r",
        dialect=dialect,
        host="llm.example",
        path=path,
        method="POST",
        http_version="HTTP/1.1",
        started_at=datetime(2026, 1, 1, tzinfo=timezone.utc),
        request=facts,
        blocks=[Block(0, "text", text)] if text else [],
        tool_calls=[ToolCall(i, cid, name, args) for i, (cid, name, args) in enumerate(calls)],
        outcome=outcome,
    )


def links(earlier: Exchange, later: Exchange) -> bool:
    """True when ``later`` continues ``earlier``: its candidates hold ``earlier``'s continuation."""
    wanted = continuation_hash(earlier)
    return wanted is not None and wanted in link_candidates(later)


# ----- the chain hash and the canonical bytes -----


def test_genesis_is_the_sha256_of_the_version_tag():
    """``printf %s llm-stream-observer/conversation/1 | sha256sum``."""
    assert GENESIS.hex() == "ed91a3e3921b8e951733eafa47704bcb50b875619dbe26716d109b8306fcad69"


def test_prefix_hashes_chain_the_canonical_bytes():
    """H_i = sha256(H_{i-1} || bytes_i) over raw digests; the bytes are compact ASCII JSON."""
    messages = [
        CanonicalMessage("user", "Grüß dich"),
        CanonicalMessage("assistant", "", (CanonicalCall("c1", "f", '{"a":1}'),)),
        CanonicalMessage("tool", tool_results=(CanonicalResult("c1", "ok"),)),
        CanonicalMessage("user", "look", attachments=(CanonicalAttachment("image_url", 8, None),)),
    ]
    raw = [
        b'["user","Gr\\u00fc\\u00df dich",[],[],[]]',
        b'["assistant","",[["c1","f","{\\"a\\":1}"]],[],[]]',
        b'["tool","",[],[["c1","ok"]],[]]',
        b'["user","look",[],[],[["image_url",8,null]]]',
    ]
    assert [m.to_bytes() for m in messages] == raw
    digest = hashlib.sha256(b"llm-stream-observer/conversation/1").digest()
    expected = []
    for data in raw:
        digest = hashlib.sha256(digest + data).digest()
        expected.append(digest.hex())
    assert prefix_hashes(messages) == expected
    assert prefix_hashes([]) == []


@pytest.mark.parametrize(
    ("value", "normal"),
    [
        ('{"city": "Vienna", "unit": "c"}', '{"city":"Vienna","unit":"c"}'),
        ({"unit": "c", "city": "Vienna"}, '{"city":"Vienna","unit":"c"}'),
        ('{"n": 1.50, "s": "Wien \\u00f6"}', '{"n":1.5,"s":"Wien ö"}'),
        ("", "{}"),
        ("  ", "{}"),
        (None, "{}"),
        ({}, "{}"),
        ('{"a": ', '{"a":'),  # does not parse: kept, stripped
        ("plain text input", "plain text input"),
        ([1, {"b": 2, "a": 1}], '[1,{"a":1,"b":2}]'),
        ("[" * 5000, "[" * 5000),  # too deep for json: kept as a string
        ({"a": {1, 2}}, "<unserialisable>"),  # not JSON (never parsed from a body)
    ],
)
def test_arguments_are_json_normalised(value, normal):
    """The streamed argument string and the object a client resends compare equal."""
    assert normalise_json(value) == normal


# ----- two-turn text flows, one per dialect -----

TEXT_FLOWS = {
    "openai.chat": (
        {"model": "gpt-4o", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": Q1}]},
        {
            "model": "gpt-4o",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": Q1},
                {"content": A1, "refusal": None, "role": "assistant", "annotations": []},
                {"role": "user", "content": [{"type": "text", "text": Q2}]},
            ],
        },
    ),
    "openai.responses": (
        {"model": "gpt-4o", "instructions": "Be brief.", "input": Q1},
        {
            "model": "gpt-4o",
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": Q1},
                {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA"},
                {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": A1, "annotations": [], "logprobs": []}],
                },
                {"role": "user", "content": [{"type": "input_text", "text": Q2}]},
            ],
        },
    ),
    "anthropic.messages": (
        {
            "model": "claude-sonnet-4-5",
            "max_tokens": 256,
            "system": "Be brief.",
            "messages": [{"role": "user", "content": Q1}],
        },
        {
            "model": "claude-sonnet-4-5",
            "max_tokens": 256,
            "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": Q1},
                {"role": "assistant", "content": [{"citations": None, "text": A1, "type": "text"}]},
                {"role": "user", "content": [{"type": "text", "text": Q2, "cache_control": {"type": "ephemeral"}}]},
            ],
        },
    ),
    "gemini": (
        {
            "systemInstruction": {"parts": [{"text": "Be brief."}]},
            "contents": [{"role": "user", "parts": [{"text": Q1}]}],
        },
        {
            "systemInstruction": {"parts": [{"text": "Be brief."}]},
            "contents": [
                {"role": "user", "parts": [{"text": Q1}]},
                # google-genai's streamed chat history: one model content per chunk
                {"role": "model", "parts": [{"text": "Vien"}]},
                {"role": "model", "parts": [{"text": "na."}, {"text": "", "thoughtSignature": "c2ln"}]},
                {"role": "user", "parts": [{"text": Q2}]},
            ],
        },
    ),
    "ollama": (
        {
            "model": "llama3.2",
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": Q1}],
        },
        {
            "model": "llama3.2",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": Q1},
                {"role": "assistant", "content": A1, "thinking": "The capital is Vienna."},
                {"role": "user", "content": Q2},
            ],
        },
    ),
    "llm-stream-1.0": (
        {"version": "1.0", "stream": True, "model": "m", "messages": [{"role": "user", "content": Q1}]},
        {
            "version": "1.0",
            "stream": True,
            "model": "m",
            "messages": [
                {"role": "user", "content": Q1},
                {"role": "assistant", "content": A1},
                {"role": "user", "content": [{"type": "text", "text": Q2}]},
            ],
        },
    ),
    "vercel.ui": (
        {"id": "chat-1", "messages": [{"id": "u-1", "role": "user", "parts": [{"type": "text", "text": Q1}]}]},
        {
            "id": "chat-1",
            "trigger": "submit-message",
            "messages": [
                {"id": "u-1", "role": "user", "parts": [{"type": "text", "text": Q1}]},
                {
                    "id": "a-1",
                    "role": "assistant",
                    "parts": [
                        {"type": "step-start"},
                        {"type": "reasoning", "text": "Easy.", "state": "done"},
                        {"type": "text", "text": A1, "state": "done"},
                    ],
                },
                {"id": "u-2", "role": "user", "parts": [{"type": "text", "text": Q2}]},
            ],
        },
    ),
}


@pytest.mark.parametrize("dialect", sorted(TEXT_FLOWS))
def test_second_turn_continues_the_first(dialect):
    """Turn 2 = turn 1's messages + turn 1's answer + a new user message: linked, and the
    candidate is the prefix just before the new message."""
    body1, body2 = TEXT_FLOWS[dialect]
    turn1 = record(dialect, body1, text=A1)
    turn2 = record(dialect, body2, text="Budapest.")
    assert links(turn1, turn2)
    assert link_candidates(turn2)[0] == continuation_hash(turn1)
    assert not links(turn2, turn1)


@pytest.mark.parametrize("dialect", sorted(TEXT_FLOWS))
def test_an_edited_first_question_does_not_link(dialect):
    """The client changed the earlier user message: no link."""
    body1, body2 = TEXT_FLOWS[dialect]
    edited = json.loads(json.dumps(body2).replace(Q1, "What is the capital of Austria??"))
    assert not links(record(dialect, body1, text=A1), record(dialect, edited))


@pytest.mark.parametrize("dialect", sorted(TEXT_FLOWS))
def test_an_edited_answer_does_not_link(dialect):
    """The client resent a different answer than the record's: no link."""
    body1, body2 = TEXT_FLOWS[dialect]
    assert not links(record(dialect, body1, text="Vienna!"), record(dialect, body2))


@pytest.mark.parametrize("dialect", ["openai.chat", "ollama"])
def test_a_changed_role_does_not_link(dialect):
    """Roles are compared as sent: the system prompt resent as a ``developer`` message (as
    clients do for OpenAI reasoning models), the answer resent as a user message."""
    body1, body2 = TEXT_FLOWS[dialect]
    turn1 = record(dialect, body1, text=A1)
    assert links(turn1, record(dialect, body2))
    for old, new in (('"role": "system"', '"role": "developer"'), ('"role": "assistant"', '"role": "user"')):
        assert not links(turn1, record(dialect, json.loads(json.dumps(body2).replace(old, new))))


def test_canonical_forms_of_the_gemini_flow():
    """Written out: role ``model`` is ``assistant``; the streamed history's two model contents
    are one message; the signature-only part adds nothing."""
    body1, body2 = TEXT_FLOWS["gemini"]
    assert canonical_request(record("gemini", body2)) == [
        CanonicalMessage("system", "Be brief."),
        CanonicalMessage("user", Q1),
        CanonicalMessage("assistant", A1),
        CanonicalMessage("user", Q2),
    ]
    assert canonical_answer(record("gemini", body1, text=A1)) == CanonicalMessage("assistant", A1)


# ----- agent tool loops -----


def test_openai_chat_tool_loop_links():
    """The SDK resends the assistant message with ``tool_calls`` (``type: function``) and a
    ``tool`` message answering it by ``tool_call_id``."""
    user = {"role": "user", "content": "Weather in Vienna?"}
    turn1 = record(
        "openai.chat",
        {"model": "gpt-4o", "messages": [user], "tools": [{"type": "function", "function": {"name": "get_weather"}}]},
        calls=(("call_1", "get_weather", '{"city": "Vienna"}'),),
    )
    assistant = {
        "content": None,
        "role": "assistant",
        "tool_calls": [
            {"id": "call_1", "function": {"arguments": '{"city": "Vienna"}', "name": "get_weather"}, "type": "function"}
        ],
    }
    tool = {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 12}'}
    turn2 = record("openai.chat", {"model": "gpt-4o", "messages": [user, assistant, tool]}, text="12 °C.")
    assert links(turn1, turn2)
    assert canonical_request(turn2) == [
        CanonicalMessage("user", "Weather in Vienna?"),
        CanonicalMessage("assistant", "", (CanonicalCall("call_1", "get_weather", '{"city":"Vienna"}'),)),
        CanonicalMessage("tool", tool_results=(CanonicalResult("call_1", '{"temp_c": 12}'),)),
    ]
    turn3 = record(
        "openai.chat",
        {
            "model": "gpt-4o",
            "messages": [user, assistant, tool, {"role": "assistant", "content": "12 °C."}, user],
        },
    )
    assert links(turn2, turn3)
    assert link_candidates(turn3) == [continuation_hash(turn2), continuation_hash(turn1)]


def test_openai_chat_rewritten_tool_call_id_does_not_link():
    """Call ids are in: a client that invents its own ids breaks the link (the API makes clients
    echo them, so a real client does not)."""
    user = {"role": "user", "content": "Weather in Vienna?"}
    turn1 = record("openai.chat", {"model": "gpt-4o", "messages": [user]}, calls=(("call_1", "get_weather", "{}"),))
    assistant = {
        "role": "assistant",
        "tool_calls": [{"id": "call_X", "function": {"name": "get_weather", "arguments": "{}"}}],
    }
    tool = {"role": "tool", "tool_call_id": "call_X", "content": "12"}
    assert not links(turn1, record("openai.chat", {"model": "gpt-4o", "messages": [user, assistant, tool]}))


def test_openai_chat_legacy_function_call_links():
    """The legacy ``function_call`` answer (a call without id) and its ``function`` message."""
    user = {"role": "user", "content": "Weather?"}
    turn1 = record("openai.chat", {"model": "gpt-3.5-turbo", "messages": [user]}, calls=((None, "get_weather", "{}"),))
    assistant = {"role": "assistant", "content": None, "function_call": {"name": "get_weather", "arguments": "{}"}}
    result = {"role": "function", "name": "get_weather", "content": "12"}
    assert links(turn1, record("openai.chat", {"model": "gpt-3.5-turbo", "messages": [user, assistant, result]}))


ANTHROPIC_USER = {"role": "user", "content": "Weather in Vienna?"}
ANTHROPIC_TOOL_RESULT = {
    "role": "user",
    "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "12 °C"}]}],
}


def anthropic_turn(*messages: dict[str, Any], system: str = "Be brief.", **kw: Any) -> Exchange:
    body = {"model": "claude-sonnet-4-5", "max_tokens": 256, "system": system, "messages": list(messages)}
    return record("anthropic.messages", body, **kw)


def test_anthropic_tool_loop_links_streamed_json_to_resent_input_object():
    """The record's arguments are the streamed ``input_json_delta`` text (spaces, key order);
    the SDK resends ``input`` as an object: equal in canonical form. Thinking is left out."""
    turn1 = anthropic_turn(
        ANTHROPIC_USER,
        text="Let me check.",
        calls=(("toolu_1", "get_weather", '{"city": "Vienna", "unit": "celsius"}'),),
    )
    assistant = {
        "role": "assistant",
        "content": [
            {"signature": "EqQBCgIYAh", "thinking": "I should call the tool.", "type": "thinking"},
            {"citations": None, "text": "Let me check.", "type": "text"},
            {
                "id": "toolu_1",
                "input": {"unit": "celsius", "city": "Vienna"},
                "name": "get_weather",
                "type": "tool_use",
            },
        ],
    }
    turn2 = anthropic_turn(ANTHROPIC_USER, assistant, ANTHROPIC_TOOL_RESULT)
    assert links(turn1, turn2)
    assert canonical_request(turn2) == [
        CanonicalMessage("system", "Be brief."),
        CanonicalMessage("user", "Weather in Vienna?"),
        CanonicalMessage(
            "assistant",
            "Let me check.",
            (CanonicalCall("toolu_1", "get_weather", '{"city":"Vienna","unit":"celsius"}'),),
        ),
        CanonicalMessage("user", tool_results=(CanonicalResult("toolu_1", "12 °C"),)),
    ]


def test_anthropic_dropped_thinking_and_empty_input_still_link():
    """A client that drops the thinking block links too; a call without arguments is streamed
    as nothing (``""``) and resent as ``input: {}``."""
    turn1 = anthropic_turn(ANTHROPIC_USER, calls=(("toolu_1", "get_time", ""),))
    assistant = {
        "role": "assistant",
        "content": [{"id": "toolu_1", "input": {}, "name": "get_time", "type": "tool_use"}],
    }
    assert links(turn1, anthropic_turn(ANTHROPIC_USER, assistant, ANTHROPIC_TOOL_RESULT))


def test_anthropic_changed_system_prompt_breaks_the_link():
    """The system prompt is the first message: a new one changes every prefix."""
    turn1 = anthropic_turn(ANTHROPIC_USER, text="Sunny.")
    again = [ANTHROPIC_USER, {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Tomorrow?"}]
    assert links(turn1, anthropic_turn(*again))
    assert not links(turn1, anthropic_turn(*again, system="Be verbose."))


RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "parameters": {}}]


def test_openai_responses_tool_loop_links():
    """The SDK's ``input += response.output``: a reasoning item (left out) and the
    ``function_call`` item (``call_id`` kept, item id ``fc_`` not), then the
    ``function_call_output``."""
    user = {"role": "user", "content": "Weather in Vienna?"}
    turn1 = record(
        "openai.responses",
        {"model": "o4-mini", "input": [user], "tools": RESPONSES_TOOLS},
        calls=(("call_1", "get_weather", '{"city":"Vienna"}'),),
    )
    items = [
        user,
        {"id": "rs_1", "summary": [], "type": "reasoning"},
        {
            "arguments": '{"city":"Vienna"}',
            "call_id": "call_1",
            "name": "get_weather",
            "type": "function_call",
            "id": "fc_1",
            "status": "completed",
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "12 °C"},
    ]
    turn2 = record("openai.responses", {"model": "o4-mini", "input": items, "tools": RESPONSES_TOOLS})
    assert links(turn1, turn2)
    assert canonical_request(turn2) == [
        CanonicalMessage("user", "Weather in Vienna?"),
        CanonicalMessage("assistant", "", (CanonicalCall("call_1", "get_weather", '{"city":"Vienna"}'),)),
        CanonicalMessage("tool", tool_results=(CanonicalResult("call_1", "12 °C"),)),
    ]


def test_openai_responses_text_and_parallel_calls_are_one_assistant_message():
    """A message item and two function_call items of one answer (order of the calls as the
    client resends them, not as recorded) merge into the one answer message."""
    user = {"role": "user", "content": "Weather in Vienna and Graz?"}
    turn1 = record(
        "openai.responses",
        {"model": "gpt-4o", "input": [user]},
        text="Checking both.",
        calls=(("call_1", "get_weather", '{"city":"Vienna"}'), ("call_2", "get_weather", '{"city":"Graz"}')),
    )
    message = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking both."}]}
    graz = {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city": "Graz"}'}
    vienna = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Vienna"}'}
    outputs = [{"type": "function_call_output", "call_id": c, "output": "12"} for c in ("call_1", "call_2")]
    turn2 = record("openai.responses", {"model": "gpt-4o", "input": [user, message, graz, vienna, *outputs]})
    assert links(turn1, turn2)


def test_openai_responses_changed_instructions_break_the_link():
    """``instructions`` (kept in ``parameters``) is the leading system message."""
    body1, body2 = TEXT_FLOWS["openai.responses"]
    turn1 = record("openai.responses", body1, text=A1)
    assert not links(turn1, record("openai.responses", {**body2, "instructions": "Be verbose."}))
    assert not links(turn1, record("openai.responses", {k: v for k, v in body2.items() if k != "instructions"}))


def test_openai_chat_changed_system_message_breaks_the_link():
    body1, body2 = TEXT_FLOWS["openai.chat"]
    changed = json.loads(json.dumps(body2).replace("Be brief.", "Be brief!"))
    assert not links(record("openai.chat", body1, text=A1), record("openai.chat", changed))


def test_gemini_tool_loop_links():
    """A ``functionCall`` answer (args object serialised by the record) resent with its
    ``thoughtSignature``, then a ``functionResponse``; a thought summary part is left out."""
    user = {"role": "user", "parts": [{"text": "Weather in Vienna?"}]}
    turn1 = record(
        "gemini",
        {"contents": [user], "tools": [{"functionDeclarations": [{"name": "get_weather"}]}]},
        calls=((None, "get_weather", '{"city":"Vienna"}'),),
    )
    model = {
        "role": "model",
        "parts": [
            {"text": "Considering the weather tool.", "thought": True},
            {"functionCall": {"name": "get_weather", "args": {"city": "Vienna"}}, "thoughtSignature": "c2ln"},
        ],
    }
    response = {"role": "user", "parts": [{"functionResponse": {"name": "get_weather", "response": {"temp_c": 12}}}]}
    turn2 = record("gemini", {"contents": [user, model, response]})
    assert links(turn1, turn2)
    assert canonical_request(turn2)[2] == CanonicalMessage(
        "user", tool_results=(CanonicalResult(None, '{"temp_c":12}'),)
    )


def test_gemini_changed_system_instruction_breaks_the_link():
    body1, body2 = TEXT_FLOWS["gemini"]
    changed = {**body2, "systemInstruction": {"parts": [{"text": "Be verbose."}]}}
    assert not links(record("gemini", body1, text=A1), record("gemini", changed))


def test_ollama_tool_loop_links_without_ids():
    """Ollama's call ids are optional and its clients drop them: ids are not compared."""
    user = {"role": "user", "content": "Weather in Vienna?"}
    turn1 = record(
        "ollama", {"model": "qwen3", "messages": [user]}, calls=(("call_abc", "get_weather", '{"city":"Vienna"}'),)
    )
    assistant = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Vienna"}}}],
    }
    tool = {"role": "tool", "content": "12 °C", "tool_name": "get_weather"}
    turn2 = record("ollama", {"model": "qwen3", "messages": [user, assistant, tool]})
    assert links(turn1, turn2)
    assert canonical_request(turn2)[1:] == [
        CanonicalMessage("assistant", "", (CanonicalCall(None, "get_weather", '{"city":"Vienna"}'),)),
        CanonicalMessage("tool", tool_results=(CanonicalResult(None, "12 °C"),)),
    ]


def test_vercel_client_side_tool_loop_links():
    """AI SDK 5: the tool's output is added to the assistant UI message, which is resent (as
    the last message): its call, then a tool message with its output."""
    user = {"id": "u-1", "role": "user", "parts": [{"type": "text", "text": "Weather in Vienna?"}]}
    turn1 = record(
        "vercel.ui", {"id": "c", "messages": [user]}, calls=(("call_1", "get_weather", '{"city":"Vienna"}'),)
    )
    assistant = {
        "id": "a-1",
        "role": "assistant",
        "parts": [
            {"type": "step-start"},
            {
                "type": "tool-get_weather",
                "toolCallId": "call_1",
                "state": "output-available",
                "input": {"city": "Vienna"},
                "output": {"temp_c": 12},
            },
        ],
    }
    turn2 = record("vercel.ui", {"id": "c", "messages": [user, assistant], "trigger": "submit-message"})
    assert links(turn1, turn2)
    assert canonical_request(turn2) == [
        CanonicalMessage("user", "Weather in Vienna?"),
        CanonicalMessage("assistant", "", (CanonicalCall("call_1", "get_weather", '{"city":"Vienna"}'),)),
        CanonicalMessage("tool", tool_results=(CanonicalResult("call_1", '{"temp_c":12}'),)),
    ]


def test_vercel_server_side_multi_step_answer_links():
    """One response ran a server tool between two text steps: the record holds both texts and
    the call; the resent UI message holds them in one message with the output."""
    user = {"id": "u-1", "role": "user", "parts": [{"type": "text", "text": "Weather in Vienna?"}]}
    turn1 = record(
        "vercel.ui",
        {"id": "c", "messages": [user]},
        text="Let me check. It is 12 °C.",
        calls=(("call_1", "get_weather", '{"city":"Vienna"}'),),
    )
    assistant = {
        "id": "a-1",
        "role": "assistant",
        "parts": [
            {"type": "step-start"},
            {"type": "text", "text": "Let me check."},
            {"type": "dynamic-tool", "toolName": "get_weather", "toolCallId": "call_1", "state": "output-available",
             "input": {"city": "Vienna"}, "output": "12 °C"},
            {"type": "step-start"},
            {"type": "text", "text": " It is 12 °C."},
        ],
    }  # fmt: skip
    question = {"id": "u-2", "role": "user", "parts": [{"type": "text", "text": "Thanks!"}]}
    assert links(turn1, record("vercel.ui", {"id": "c", "messages": [user, assistant, question]}))


def test_vercel_v4_tool_invocations_link():
    """AI SDK 4 messages: ``content`` and ``toolInvocations`` without ``parts``."""
    user = {"role": "user", "content": "Weather?"}
    turn1 = record("vercel.ui", {"messages": [user]}, calls=(("call_1", "get_weather", "{}"),))
    invocation = {"state": "result", "toolCallId": "call_1", "toolName": "get_weather", "args": {}, "result": 12}
    assistant = {"role": "assistant", "content": "", "toolInvocations": [invocation]}
    assert links(turn1, record("vercel.ui", {"messages": [user, assistant]}))


# ----- whitespace, attachments, candidates -----


def test_anthropic_and_vercel_attachments_and_tool_errors():
    """Anthropic ``image``/``document`` sources (base64 size, URL, file id); AI SDK ``file``
    parts, v4 ``experimental_attachments`` and a tool's ``output-error``."""
    anthropic = anthropic_turn(
        {
            "role": "user",
            "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
                {"type": "document", "source": {"type": "file", "file_id": "file_01"}},
                {"type": "text", "text": "Compare."},
            ],
        }
    )
    assert canonical_request(anthropic)[1] == CanonicalMessage(
        "user",
        "Compare.",
        attachments=(
            CanonicalAttachment("image", 8, None),
            CanonicalAttachment("image", None, "https://example.com/a.png"),
            CanonicalAttachment("document", None, "file_01"),
        ),
    )
    ui = record(
        "vercel.ui",
        {
            "messages": [
                {"role": "user", "parts": [{"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,iVBORw0KGgo="}]},
                {"role": "user", "content": "See", "experimental_attachments": [{"contentType": "text/plain", "url": "https://example.com/a.txt"}]},
                {"role": "assistant", "parts": [{"type": "tool-lookup", "toolCallId": "c1", "state": "output-error", "input": {}, "errorText": "404 "}]},
            ]
        },
    )  # fmt: skip
    assert canonical_request(ui) == [
        CanonicalMessage("user", attachments=(CanonicalAttachment("image/png", 8, None),)),
        CanonicalMessage(
            "user", "See", attachments=(CanonicalAttachment("text/plain", None, "https://example.com/a.txt"),)
        ),
        CanonicalMessage("assistant", tool_calls=(CanonicalCall("c1", "lookup", "{}"),)),
        CanonicalMessage("tool", tool_results=(CanonicalResult("c1", "404"),)),
    ]


def test_edge_whitespace_does_not_break_the_link_but_inner_whitespace_does():
    """Texts are stripped at both ends (UIs trim answers); whitespace inside counts."""
    body1, body2 = TEXT_FLOWS["openai.chat"]
    turn1 = record("openai.chat", body1, text=" Vienna.\n")
    assert links(turn1, record("openai.chat", body2))
    padded = json.loads(
        json.dumps(body2).replace('"What is the capital of Austria?"', '"What is the capital of Austria?\\n"')
    )
    assert links(turn1, record("openai.chat", padded))
    inner = json.loads(json.dumps(body2).replace('"Vienna."', '"Vienna ."'))
    assert not links(turn1, record("openai.chat", inner))


def test_attachments_compare_by_type_and_decoded_size():
    """A base64 image is recorded as its size: the same image links, another size does not;
    ``detail`` is left out."""

    def image(b64: str, detail: str) -> dict[str, Any]:
        url = f"data:image/png;base64,{b64}"
        return {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": url, "detail": detail}},
            ],
        }

    turn1 = record("openai.chat", {"model": "gpt-4o", "messages": [image("iVBORw0KGgo=", "auto")]}, text="A PNG.")
    follow = [{"role": "assistant", "content": "A PNG."}, {"role": "user", "content": "Sure?"}]
    assert links(
        turn1, record("openai.chat", {"model": "gpt-4o", "messages": [image("iVBORw0KGgo=", "high"), *follow]})
    )
    assert not links(
        turn1, record("openai.chat", {"model": "gpt-4o", "messages": [image("iVBORw0KGgoAAAA", "auto"), *follow]})
    )
    assert canonical_request(turn1)[0].attachments == (CanonicalAttachment("image_url", 8, None),)


def test_candidates_are_assistant_ended_proper_prefixes_longest_first():
    """Only a prefix ending with an assistant message can be a continuation; the whole request
    is never one (a continuing request has a message after the earlier answer)."""
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "1"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "2"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "3"},
    ]
    turn = record("openai.chat", {"model": "m", "messages": messages})
    hashes = prefix_hashes(canonical_request(turn))
    assert link_candidates(turn) == [hashes[4], hashes[2]]
    assert link_candidates(record("openai.chat", {"model": "m", "messages": messages[:2]})) == []


def test_a_retry_is_not_a_continuation():
    """The same request sent again (a retry, a regenerate) is a sibling, not a continuation."""
    body1, _ = TEXT_FLOWS["anthropic.messages"]
    assert not links(record("anthropic.messages", body1, text=A1), record("anthropic.messages", body1, text=A1))


# ----- what cannot be continued -----


@pytest.mark.parametrize("outcome", ["error", "client_aborted", "truncated", "http_error", "unreadable", "interrupted"])
def test_only_completed_exchanges_can_be_continued(outcome):
    body1, _ = TEXT_FLOWS["openai.chat"]
    assert continuation_hash(record("openai.chat", body1, text="Vien", outcome=outcome)) is None


def test_an_empty_answer_cannot_be_continued():
    """Nothing to resend: no text (or only whitespace) and no tool call."""
    body1, _ = TEXT_FLOWS["openai.chat"]
    assert continuation_hash(record("openai.chat", body1)) is None
    assert continuation_hash(record("openai.chat", body1, text=" \n")) is None


def test_several_choices_cannot_be_continued():
    """``n > 1`` (OpenAI chat) or ``candidateCount > 1`` (Gemini): which one the client keeps is
    unknown."""
    body1, _ = TEXT_FLOWS["openai.chat"]
    assert continuation_hash(record("openai.chat", {**body1, "n": 2}, text=A1)) is None
    assert continuation_hash(record("openai.chat", {**body1, "n": 1}, text=A1)) is not None
    gemini1, _ = TEXT_FLOWS["gemini"]
    assert continuation_hash(record("gemini", {**gemini1, "generationConfig": {"candidateCount": 2}}, text=A1)) is None


def test_a_prefill_or_an_empty_request_cannot_be_continued():
    """A request ending with an assistant message (prefill) or without messages."""
    prefill = anthropic_turn(ANTHROPIC_USER, {"role": "assistant", "content": "The weather is"}, text=" sunny.")
    assert continuation_hash(prefill) is None
    empty = record("openai.chat", {"model": "m", "messages": []}, text="Hi")
    assert continuation_hash(empty) is None
    assert link_candidates(empty) == []


def test_ollama_generate_cannot_be_continued():
    """``/api/generate`` continues by ``context``, not by resent messages."""
    turn = record("ollama", {"model": "llama3.2", "prompt": "Hi"}, text="Hello!", path="/api/generate")
    assert continuation_hash(turn) is None


# ----- registry and robustness -----


def test_unknown_dialect_and_custom_registry_use_the_defaults():
    """A record whose dialect the registry does not have is mapped by the defaults; a custom
    registry is used when given."""
    body1, body2 = TEXT_FLOWS["llm-stream-1.0"]
    turn1, turn2 = record("llm-stream-1.0", body1, text=A1), record("llm-stream-1.0", body2)
    turn1.dialect = turn2.dialect = "vendor.unknown"
    assert links(turn1, turn2)
    only_standard = DialectRegistry([StandardDialect()])
    assert continuation_hash(turn1, only_standard) in link_candidates(turn2, only_standard)


HOSTILE = [
    None,
    "text",
    7,
    [1, 2],
    {"role": 5, "content": {"x": 1}},
    {"role": "assistant", "content": [None, 3, {"type": None}], "tool_calls": "x"},
    {"role": "assistant", "tool_calls": [None, {"function": "f"}, {"id": 3, "function": {"name": 4, "arguments": 5}}]},
    {"role": "tool", "content": None},
    {"role": "user", "content": [{"type": "tool_result", "content": None}, {"type": "image", "source": None}]},
    {
        "role": "user",
        "parts": [None, {"type": 3}, {"type": "tool-x"}, {"type": "tool-invocation", "toolInvocation": 1}],
    },
    {"role": "model", "parts": [{"functionCall": "x"}, {"inlineData": {"data_bytes": True}}, {"text": 3}]},
    {"type": "function_call", "name": None, "arguments": {"deep": [[[]]]}},
    {"type": "function_call_output", "output": [{"type": "input_text", "text": "ok"}, 5]},
    {"role": "user", "images": [None, {"data_bytes": "x"}], "experimental_attachments": [None, {"url": 5}]},
    {"role": "user", "content": "x" * 10, "tool_calls": [{"function": {"arguments": "[" * 5000}}]},
]


@pytest.mark.parametrize("dialect", sorted(PATHS))
def test_hostile_messages_never_raise(dialect):
    """Whatever a request holds, canonical forms and hashes are computed (no exception)."""
    turn = record(dialect, {"model": "m", "messages": HOSTILE, "input": HOSTILE, "contents": HOSTILE}, text="x")
    turn.request.messages = HOSTILE
    turn.request.parameters = {"instructions": 5, "n": "2", "candidateCount": None}
    assert len(link_candidates(turn)) <= len(HOSTILE)
    continuation_hash(turn)
