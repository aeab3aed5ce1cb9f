"""The reassembler on hand-written canonical events: tool-call fragments, message-level stop
reasons, model updates, usage assignment (values worked out by hand)."""

from __future__ import annotations

from datetime import datetime, timezone

from observer.events import (
    ContentDelta,
    ModelEvent,
    StopEvent,
    StreamEnd,
    ToolCallDelta,
    UsageEvent,
)
from observer.reassembly import EndCause, Reassembler
from observer.records import Exchange, Usage


def run(events, tools=("get_weather",)):
    r = Reassembler(tools)
    for i, ev in enumerate(events):
        r.apply(ev, 100.0 + i)
    ex = Exchange("x", "d", "h", "/p", "POST", "HTTP/1.1", datetime.fromtimestamp(99.0, tz=timezone.utc))
    return r.finish(ex, EndCause.EOF, request_start_s=99.0)


def test_tool_call_fragments_join_by_key_first_id_and_name_win():
    rec = run(
        [
            ToolCallDelta(None, "a", 0, "call_1", "get_weather", ""),
            ToolCallDelta(None, "b", 1, "call_2", "delete_all", '{"x"'),
            ToolCallDelta(None, "a", 0, None, None, '{"city":'),
            ToolCallDelta(None, "a", 0, "call_OTHER", "other_name", '"Paris"}'),
            ToolCallDelta(None, "b", 1, None, None, ":1}"),
            StreamEnd(None),
        ]
    )
    assert [t.to_dict() for t in rec.tool_calls] == [
        {"index": 0, "id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}', "declared": True},
        {"index": 1, "id": "call_2", "name": "delete_all", "arguments": '{"x":1}', "declared": False},
    ]
    assert [(v.kind, v.detail) for v in rec.violations] == [
        ("undeclared_tool", "tool 'delete_all' was not declared in the request")
    ]


def test_usage_is_assigned_never_added():
    rec = run([UsageEvent(None, 377, 1), UsageEvent(None, None, 65), UsageEvent(None, None, 70), StreamEnd(None)])
    assert (rec.usage.input_tokens, rec.usage.output_tokens, rec.usage.reported) == (377, 70, True)
    assert rec.usage.to_dict() == Usage(377, 70, reported=True).to_dict()


def test_stop_event_and_model_updates():
    rec = run(
        [
            ModelEvent(None, ""),
            ContentDelta(None, 0, "Hi", "text"),
            ContentDelta(None, 1, "think", "reasoning"),
            ModelEvent(None, "gpt-4o-2024-08-06"),
            StopEvent(None, "end_turn", "stop"),
            StreamEnd(None),
        ]
    )
    assert rec.model == "gpt-4o-2024-08-06"
    assert (rec.stop_reason, rec.stop_reason_raw) == ("end_turn", "stop")
    assert rec.text == "Hi"  # reasoning is kept in its block, not in text
    assert [(b.index, b.type, b.text) for b in rec.blocks] == [(0, "text", "Hi"), (1, "reasoning", "think")]
    assert rec.ttft_s == 2.0  # first text at 100.0 + 1 = 101.0 (event 1), request at 99.0
