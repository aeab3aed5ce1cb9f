"""Conversations linked without client help, with the official SDKs through ``observer run``.

Each test drives a real SDK (openai, anthropic) through the proxy to the replay upstream
(``tests/e2e/replay_upstream.py``, which answers each turn with a recorded vendor stream), and
resends the history as that SDK's user would: the accumulated final message of the previous turn
(``get_final_completion()`` / ``get_final_message()``, dumped as the SDK gives it) plus the next
user message, or, in an agent tool loop, the assistant's tool call and the tool's result. The
records of one conversation must share ``conversation_id`` (the first turn's id), and ``GET
/v1/conversations/{id}`` must list them in order; an edited history must not link.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.e2e.replay_upstream import ReplayUpstream
from tests.e2e.servers import NewRecords, ca_context

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

GAP_MS = 5


@pytest.fixture(scope="module")
def replay() -> Any:
    with ReplayUpstream(default_gap_ms=GAP_MS) as up:
        yield up


def _headers(case: str) -> dict[str, str]:
    return {"x-upstream-case": case, "x-upstream-gap-ms": str(GAP_MS), "x-test-id": "conv-" + uuid.uuid4().hex[:10]}


def _openai(replay: ReplayUpstream, proxy: Any) -> Any:
    import openai

    http = openai.DefaultHttpxClient(proxy=proxy.proxy_url, verify=ca_context(proxy.ca_path), trust_env=False)
    return openai.OpenAI(
        base_url=f"https://127.0.0.1:{replay.https_port}/v1", api_key="sk-test", http_client=http, max_retries=0
    )


def _anthropic(replay: ReplayUpstream, proxy: Any) -> Any:
    import anthropic

    http = anthropic.DefaultHttpxClient(proxy=proxy.proxy_url, verify=ca_context(proxy.ca_path), trust_env=False)
    return anthropic.Anthropic(
        base_url=f"https://127.0.0.1:{replay.https_port}", api_key="sk-ant-test", http_client=http, max_retries=0
    )


def _openai_turn(client: Any, messages: list[Any], case: str, records: NewRecords) -> tuple[Any, dict[str, Any]]:
    with client.chat.completions.stream(
        model="gpt-4o-2024-08-06", messages=messages, extra_headers=_headers(case)
    ) as stream:
        final = stream.get_final_completion()
    return final.choices[0].message, records.one()


def _conversation(proxy: Any, conversation_id: str) -> list[str]:
    response = proxy.api.request(f"/v1/conversations/{conversation_id}")
    assert response.status_code == 200, response.text
    return [item["id"] for item in response.json()["exchanges"]]


def test_openai_multi_turn_chat_is_one_conversation(replay: ReplayUpstream, recorded: Any) -> None:
    client = _openai(replay, recorded)
    history: list[Any] = [{"role": "user", "content": "What's the weather like in SF?"}]
    answer, first = _openai_turn(client, history, "openai.chat/text_include_usage", NewRecords(recorded.api))
    assert answer.content  # the SDK accumulated a text answer
    history += [answer.to_dict(), {"role": "user", "content": "And tomorrow?"}]
    answer, second = _openai_turn(client, history, "openai.chat/text_include_usage", NewRecords(recorded.api))
    history += [answer.to_dict(), {"role": "user", "content": "Thanks. And on Sunday?"}]
    _answer, third = _openai_turn(client, history, "openai.chat/text_include_usage", NewRecords(recorded.api))
    assert first["conversation_id"] == first["id"]
    assert second["conversation_id"] == first["id"] and third["conversation_id"] == first["id"]
    assert _conversation(recorded, first["id"]) == [first["id"], second["id"], third["id"]]

    # An edited history (the first answer rewritten) is not a continuation: a new conversation.
    edited = [history[0], {"role": "assistant", "content": "Something else."}, {"role": "user", "content": "?"}]
    _answer, other = _openai_turn(client, edited, "openai.chat/text_include_usage", NewRecords(recorded.api))
    assert other["conversation_id"] == other["id"]


def test_openai_agent_tool_loop_is_one_conversation(replay: ReplayUpstream, recorded: Any) -> None:
    client = _openai(replay, recorded)
    history: list[Any] = [{"role": "user", "content": "What's the weather like in SF?"}]
    answer, first = _openai_turn(client, history, "openai.chat/tool_call_fragments", NewRecords(recorded.api))
    assert answer.tool_calls, "the fixture answers with a tool call"
    history.append(answer.to_dict())
    for call in answer.tool_calls:
        history.append({"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 18, "sky": "fog"}'})
    _answer, second = _openai_turn(client, history, "openai.chat/text_include_usage", NewRecords(recorded.api))
    assert first["tool_calls"] and first["conversation_id"] == first["id"]
    assert second["conversation_id"] == first["id"]


def _anthropic_turn(client: Any, messages: list[Any], case: str, records: NewRecords) -> tuple[Any, dict[str, Any]]:
    with client.messages.stream(
        model="claude-sonnet-4-0", max_tokens=1024, messages=messages, extra_headers=_headers(case)
    ) as stream:
        final = stream.get_final_message()
    return final, records.one()


def test_anthropic_multi_turn_and_tool_loop_is_one_conversation(replay: ReplayUpstream, recorded: Any) -> None:
    client = _anthropic(replay, recorded)
    history: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    message, first = _anthropic_turn(client, history, "anthropic.messages/tool_use", NewRecords(recorded.api))
    uses = [b for b in message.content if b.type == "tool_use"]
    assert uses, "the fixture answers with a tool_use block"
    history.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]})
    history.append(
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": u.id, "content": "14 degrees, light rain"} for u in uses
            ],
        }
    )
    message, second = _anthropic_turn(client, history, "anthropic.messages/text_stream", NewRecords(recorded.api))
    history.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]})
    history.append({"role": "user", "content": "Should I take an umbrella?"})
    _message, third = _anthropic_turn(client, history, "anthropic.messages/text_stream", NewRecords(recorded.api))
    assert first["conversation_id"] == first["id"]
    assert second["conversation_id"] == first["id"] and third["conversation_id"] == first["id"]
    assert _conversation(recorded, first["id"]) == [first["id"], second["id"], third["id"]]
