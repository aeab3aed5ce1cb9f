"""The tap's fast lanes (``StreamAdapter.fast``/``on_object`` of each message parsed once)
give exactly the record of the general path (every message built, decoded and mapped by
``on_message``), whatever the chunking, the limits and the noise mixed into the stream.

The general path is forced through the dialect contract, not the tap's internals: the dialect
is wrapped (``tests.wirefeed.general_only``) so that its adapters offer only ``on_message``,
``on_lost`` and ``on_close``, and the tap has no lane to take. The mutation tests at the end
break each fast lane on purpose and check that these comparisons see it."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from observer.dialects.registry import default_registry
from observer.limits import Limits
from observer.reassembly import EndCause
from observer.response import ResponseSpec
from tests.wirefeed import bytewise, cases, dialect_dirs, feed, feed_each_way, load, observe, split_at


def _observe(case_like: dict[str, Any], chunks: list[bytes], *, general: bool, limits: Limits) -> dict[str, Any]:
    """The record of ``chunks`` as the response of ``case_like``; ``general``: through
    ``general_only`` (no fast lane offered to the tap)."""
    return observe(
        case_like["dialect"],
        case_like["request"],
        chunks,
        status=case_like.get("status", 200),
        content_type=case_like["content_type"],
        content_encoding=case_like.get("content_encoding"),
        end=case_like.get("end", EndCause.EOF),
        limits=limits,
        path=case_like["path"],
        request_headers=case_like["headers"],
        general=general,
    )


def _case_like(dialect: str, name: str) -> dict[str, Any]:
    c = load(dialect, name)
    return {
        "dialect": dialect,
        "path": c.path,
        "headers": c.request_headers,
        "request": c.request,
        "content_type": c.content_type,
        "content_encoding": c.content_encoding,
        "status": c.status,
        "end": c.end,
    }


FIXTURE_CASES = [(d, c) for d in dialect_dirs() for c in cases(d)]


@pytest.mark.parametrize(("dialect", "case"), FIXTURE_CASES, ids=[f"{d}/{c}" for d, c in FIXTURE_CASES])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(points=st.lists(st.integers(min_value=0, max_value=6000), max_size=30))
def test_fixture_fast_equals_general(dialect, case, points):
    """Every wire fixture, in any chunking: the record with the fast lanes equals the record of
    the general path, byte for byte (timings, events count, violations in order)."""
    c = load(dialect, case)
    like = _case_like(dialect, case)
    chunks = split_at(c.body, points)
    limits = Limits()
    assert _observe(like, chunks, general=False, limits=limits) == _observe(like, chunks, general=True, limits=limits)


# -- generated token streams -------------------------------------------------------------------


def _streaming_case(dialect: str, content_type: str) -> dict[str, Any]:
    """Request, path and headers of a fixture of ``dialect`` streamed as ``content_type``."""
    for name in cases(dialect):
        c = load(dialect, name)
        if c.content_type == content_type and c.status == 200 and c.content_encoding is None and c.request:
            like = _case_like(dialect, name)
            like["content_encoding"] = None
            like["end"] = EndCause.EOF
            return like
    raise AssertionError(f"no streaming fixture for {dialect}")


def _sse(obj: Any, event: str | None = None, nl: str = "\n") -> bytes:
    data = obj if isinstance(obj, bytes) else orjson.dumps(obj)
    head = f"event: {event}{nl}".encode() if event else b""
    return head + b"data: " + data + (nl + nl).encode()


def _std(ops: list[tuple[str, Any]]) -> bytes:
    out = [_sse({"v": "1.0", "seq": 0, "type": "stream.start", "model": "m", "request_id": "r"}, "stream.start")]
    seq = 1
    for kind, val in ops:
        if kind in ("delta", "frag"):
            out.append(
                _sse(
                    {"v": "1.0", "seq": seq, "type": "content.delta", "index": 0, "delta": {"text": val}},
                    "content.delta",
                )
            )
        elif val == 0:
            seq += 1  # a gap
        elif val == 1:
            out.append(
                _sse({"v": "1.0", "seq": seq, "type": "content.delta", "index": 2, "delta": {"text": "x"}}, "message")
            )
        elif val == 2:
            out.append(
                _sse(
                    {"v": "2.0", "seq": seq, "type": "content.delta", "index": 1, "delta": {"text": "y"}},
                    "content.delta",
                )
            )
        elif val == 3:
            out.append(b'event: content.delta\ndata: {"v":"1.0","seq":' + str(seq).encode() + b',"x":"\xff"}\n\n')
        elif val == 4:
            out.append(
                _sse(
                    {"v": "1.0", "seq": seq - 1, "type": "content.delta", "index": 0, "delta": {"text": "r"}},
                    "content.delta",
                )
            )
        else:
            out.append(b"event: content.delta\ndata: {not json\n\n")
        seq += 1
    out.append(_sse({"v": "1.0", "seq": seq, "type": "stream.end"}, "stream.end"))
    return b"".join(out)


def _chat(ops: list[tuple[str, Any]]) -> bytes:
    head = {"id": "c1", "object": "chat.completion.chunk", "model": "gpt"}

    def chunk(delta: dict[str, Any], **kw: Any) -> bytes:
        return _sse({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}], **kw})

    out = [chunk({"role": "assistant", "content": ""})]
    for kind, val in ops:
        if kind == "delta":
            out.append(chunk({"content": val}))
        elif kind == "frag":
            out.append(chunk({"tool_calls": [{"index": len(val) % 2, "function": {"arguments": val}}]}))
        elif val == 6:
            out.append(
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_a",
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": ""},
                            }
                        ]
                    }
                )
            )
        elif val == 7:
            out.append(
                chunk({"tool_calls": [{"index": 1, "id": "call_b", "function": {"name": "x", "arguments": "{"}}]})
            )
        elif val == 0:
            out.append(chunk({"reasoning_content": "think"}))
        elif val == 1:
            out.append(_sse({**head, "model": "gpt-2", "choices": [{"index": 0, "delta": {"content": "m"}}]}))
        elif val == 2:
            out.append(chunk({"content": None}))
        elif val == 3:
            out.append(b'data: {"choices":[{"index":0,"delta":{"content":"\xff"}}]}\n\n')
        elif val == 4:
            out.append(_sse({**head, "choices": [{"index": 1, "delta": {"content": "b"}}, {"index": 0, "delta": {}}]}))
        else:
            out.append(b"data: [1, 2]\n\n")
    out.append(_sse({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    out.append(_sse({**head, "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}}))
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def _anthropic(ops: list[tuple[str, Any]]) -> bytes:
    out = [
        _sse(
            {"type": "message_start", "message": {"id": "msg", "model": "claude", "usage": {"input_tokens": 1}}},
            "message_start",
        ),
        _sse(
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            "content_block_start",
        ),
    ]
    for kind, val in ops:
        if kind == "delta":
            out.append(
                _sse(
                    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": val}},
                    "content_block_delta",
                )
            )
        elif kind == "frag":
            out.append(
                _sse(
                    {
                        "type": "content_block_delta",
                        "index": 1 + len(val) % 2,
                        "delta": {"type": "input_json_delta", "partial_json": val},
                    },
                    "content_block_delta",
                )
            )
        elif val == 6:
            out.append(
                _sse(
                    {
                        "type": "content_block_start",
                        "index": 1,
                        "content_block": {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}},
                    },
                    "content_block_start",
                )
            )
        elif val == 7:
            out.append(
                _sse(
                    {"type": "content_block_start", "index": 2, "content_block": {"type": "text", "text": ""}},
                    "content_block_start",
                )
            )
        elif val == 0:
            out.append(_sse({"type": "ping"}, "ping"))
        elif val == 1:
            out.append(
                _sse(
                    {"type": "content_block_delta", "index": 3, "delta": {"type": "text_delta", "text": "u"}},
                    "content_block_delta",
                )
            )
        elif val == 2:
            out.append(
                _sse(
                    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "n"}},
                    "content_block_stop",
                )
            )
        elif val == 3:
            out.append(
                _sse({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "t"}})
            )
        elif val == 4:
            out.append(_sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": 5}}))
        else:
            out.append(
                b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":'
                b'{"type":"text_delta","text":"\xc3"}}\n\n'
            )
    out.append(_sse({"type": "content_block_stop", "index": 0}, "content_block_stop"))
    out.append(
        _sse(
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}},
            "message_delta",
        )
    )
    out.append(_sse({"type": "message_stop"}, "message_stop"))
    return b"".join(out)


def _gemini(ops: list[tuple[str, Any]]) -> bytes:
    def chunk(parts: list[Any], **kw: Any) -> bytes:
        return _sse(
            {
                "candidates": [{"content": {"role": "model", "parts": parts}, **kw}],
                "usageMetadata": {"trafficType": "ON_DEMAND"},
                "modelVersion": "g1",
            },
            nl="\r\n",
        )

    out = []
    for kind, val in ops:
        if kind in ("delta", "frag"):
            out.append(chunk([{"text": val}]))
        elif val == 0:
            out.append(chunk([{"text": "th", "thought": True}]))
        elif val == 1:
            out.append(
                _sse(
                    {"candidates": [{"content": {"parts": [{"text": "u"}]}}], "usageMetadata": {"promptTokenCount": 4}},
                    nl="\r\n",
                )
            )
        elif val == 2:
            out.append(_sse({"candidates": [{"content": {"parts": [{"text": "v"}]}}], "modelVersion": "g2"}, nl="\r\n"))
        elif val == 3:
            out.append(chunk([{"text": "a"}, {"text": "b"}]))
        elif val == 4:
            out.append(_sse({"candidates": [{"index": 1, "content": {"parts": [{"text": "c1"}]}}]}, nl="\r\n"))
        else:
            out.append(b"data: [DONE]\r\n\r\n")
    out.append(chunk([{"text": ""}], finishReason="STOP"))
    return b"".join(out)


def _responses(ops: list[tuple[str, Any]]) -> bytes:
    seq = 0

    def ev(obj: dict[str, Any], *, seq_on: bool = True) -> bytes:
        nonlocal seq
        if seq_on:
            obj = {**obj, "sequence_number": seq}
        seq += 1
        return _sse(obj, obj["type"])

    resp = {"id": "resp_1", "object": "response", "model": "gpt-5", "status": "in_progress", "output": []}
    out = [ev({"type": "response.created", "response": resp})]
    base = {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0}
    for kind, val in ops:
        if kind == "delta":
            out.append(ev({**base, "delta": val}))
        elif kind == "frag":
            out.append(
                ev(
                    {
                        "type": "response.function_call_arguments.delta",
                        "item_id": "fc_1",
                        "output_index": 1,
                        "delta": val,
                    }
                )
            )
        elif val == 6:
            out.append(
                ev(
                    {
                        "type": "response.output_item.added",
                        "output_index": 1,
                        "item": {
                            "type": "function_call",
                            "id": "fc_1",
                            "call_id": "call_1",
                            "name": "get_weather",
                            "arguments": "",
                        },
                    }
                )
            )
        elif val == 7:
            out.append(ev({"type": "response.function_call_arguments.delta", "item_id": "fc_9", "delta": "z"}))
        elif val == 0:
            seq += 1  # a gap
        elif val == 1:
            out.append(ev({**base, "delta": "n"}, seq_on=False))
        elif val == 2:
            out.append(ev({**base, "output_index": 1, "delta": "o"}))
        elif val == 3:
            out.append(_sse({**base, "delta": "x", "sequence_number": seq}, "response.refusal.delta"))
            seq += 1
        elif val == 4:
            out.append(ev({**base, "content_index": 1, "delta": "p", "sequence_number": max(seq - 2, 0)}, seq_on=False))
        else:
            out.append(
                ev(
                    {
                        "type": "response.output_text.done",
                        "item_id": "msg_1",
                        "output_index": 0,
                        "content_index": 0,
                        "text": "whole",
                    }
                )
            )
    out.append(
        ev(
            {
                "type": "response.completed",
                "response": {**resp, "status": "completed", "usage": {"input_tokens": 1, "output_tokens": 2}},
            }
        )
    )
    return b"".join(out)


def _vercel(ops: list[tuple[str, Any]]) -> bytes:
    out = [_sse({"type": "start", "messageId": "m1"}), _sse({"type": "text-start", "id": "t0"})]
    for kind, val in ops:
        if kind == "delta":
            out.append(_sse({"type": "text-delta", "id": "t0", "delta": val}))
        elif kind == "frag":
            out.append(_sse({"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": val}))
        elif val == 6:
            out.append(_sse({"type": "tool-input-start", "toolCallId": "c1", "toolName": "get_weather"}))
        elif val == 7:
            out.append(_sse({"type": "tool-input-delta", "toolCallId": 5, "inputTextDelta": "q"}))
        elif val == 0:
            out.append(_sse({"type": "reasoning-delta", "id": "r0", "delta": "why"}))
        elif val == 1:
            out.append(_sse({"type": "text-delta", "id": "t1", "delta": "new"}))
        elif val == 2:
            out.append(_sse({"type": "text-delta", "id": 3, "delta": "bad"}))
        elif val == 3:
            out.append(_sse({"type": "text-start", "id": "t0"}))
        elif val == 4:
            out.append(_sse({"type": "text-delta", "id": "t0", "delta": "d"}, "custom"))
        else:
            out.append(b'data: {"type":"text-delta","id":"t0","delta":"\xe2\x82"}\n\n')
    out.append(_sse({"type": "finish"}))
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def _ollama(ops: list[tuple[str, Any]]) -> bytes:
    def line(obj: Any) -> bytes:
        return orjson.dumps(obj) + b"\n"

    out = []
    for kind, val in ops:
        if kind in ("delta", "frag"):
            out.append(line({"model": "llama", "message": {"role": "assistant", "content": val}, "done": False}))
        elif val == 0:
            out.append(line({"model": "llama", "message": {"role": "assistant", "content": "", "thinking": "h"}}))
        elif val == 1:
            out.append(line({"model": "llama2", "message": {"role": "assistant", "content": "m"}, "done": False}))
        elif val == 2:
            out.append(line({"model": "llama", "message": {"content": 7}, "done": False}))
        elif val == 3:
            out.append(b'{"model":"llama","message":{"content":"\xf0\x9f"},"done":false}\n')
        elif val == 4:
            out.append(line({"model": "llama", "message": {"content": "d"}, "done": "no"}))
        else:
            out.append(b"\r\n  \n{broken\n")
    out.append(
        line(
            {
                "model": "llama",
                "message": {"role": "assistant", "content": ""},
                "done": True,
                "done_reason": "stop",
                "prompt_eval_count": 3,
                "eval_count": 4,
            }
        )
    )
    return b"".join(out)


GENERATED = {
    "llm-stream-1.0": (_std, "text/event-stream"),
    "openai.chat": (_chat, "text/event-stream"),
    "anthropic.messages": (_anthropic, "text/event-stream"),
    "gemini": (_gemini, "text/event-stream"),
    "openai.responses": (_responses, "text/event-stream"),
    "vercel.ui": (_vercel, "text/event-stream"),
    "ollama": (_ollama, "application/x-ndjson"),
}

_texts = st.text(alphabet=st.sampled_from(list('ab \n\t"\\é日🙂\x00')), max_size=6)
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("delta"), _texts),
        st.tuples(st.just("frag"), _texts),
        st.tuples(st.just("noise"), st.integers(min_value=0, max_value=7)),
    ),
    max_size=40,
)
_limits = st.sampled_from(
    [
        Limits(),
        Limits(max_stream_text_chars=20),
        Limits(max_stream_events=7),
        Limits(max_blocks=1, max_violations=2),
        Limits(max_event_bytes=120),
    ]
)


@pytest.mark.parametrize("dialect", sorted(GENERATED))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=_ops,
    points=st.lists(st.integers(min_value=0, max_value=4000), max_size=25),
    limits=_limits,
    whole=st.booleans(),
)
def test_generated_fast_equals_general(dialect, ops, points, limits, whole):
    """Token streams with noise (events the fast lane must decline: gaps, mismatched event
    names, invalid UTF-8 or JSON, other blocks, model changes, ...), in any chunking and under
    tight limits: the fast lanes give exactly the general path's record."""
    build, content_type = GENERATED[dialect]
    like = _streaming_case(dialect, content_type)
    body = build(ops)
    chunks = [body] if whole else split_at(body, points)
    fast = _observe(like, chunks, general=False, limits=limits)
    assert fast == _observe(like, chunks, general=True, limits=limits)


def _adapter_class(dialect: str) -> type:
    """The class of ``dialect``'s stream adapters (where its ``fast`` lives)."""
    return type(default_registry().get(dialect).new_adapter(ResponseSpec(dialect, 200, "text/event-stream")))


FRAGMENT_DIALECTS = ("openai.chat", "anthropic.messages", "openai.responses", "vercel.ui")


@pytest.mark.parametrize("dialect", sorted(GENERATED))
def test_fast_lane_is_taken(dialect, monkeypatch):
    """The generated token streams do go through each dialect's fast lane (else the equality
    tests above would prove nothing)."""
    build, content_type = GENERATED[dialect]
    like = _streaming_case(dialect, content_type)
    adapter_cls = _adapter_class(dialect)
    calls = {"hit": 0}
    original = adapter_cls.fast

    def counting(self, event, obj, sink, now_s):
        hit = original(self, event, obj, sink, now_s)
        if hit:
            calls["hit"] += 1
        return hit

    monkeypatch.setattr(adapter_cls, "fast", counting)
    _observe(like, [build([("delta", "hello")] * 5)], general=False, limits=Limits())
    assert calls["hit"] >= 4
    if dialect in FRAGMENT_DIALECTS:
        calls["hit"] = 0
        _observe(like, [build([("noise", 6)] + [("frag", "ab")] * 5)], general=False, limits=Limits())
        assert calls["hit"] >= 5


# -- the SSE decoder's shortcuts -----------------------------------------------------------------

_sse_lines = st.lists(
    st.one_of(
        st.sampled_from([b"", b"", b"", b":comment", b"id: 7", b"retry: 15", b"data", b"event", b"x: y"]),
        st.builds(lambda v: b"data: " + v, st.sampled_from([b"a", b"", b" b", b"\xc3\xa9", b"\xff", b"{}"])),
        st.builds(lambda v: b"data:" + v, st.sampled_from([b"a", b"long" * 20])),
        st.builds(lambda v: b"event: " + v, st.sampled_from([b"e", b"", b"\xfe"])),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(
    lines=_sse_lines,
    eols=st.lists(st.sampled_from([b"\n", b"\n", b"\n", b"\r\n", b"\r"]), min_size=30, max_size=30),
    points=st.lists(st.integers(min_value=0, max_value=800), max_size=12),
    limit=st.sampled_from([1 << 20, 40, 90]),
    bom=st.booleans(),
)
def test_sse_shortcuts_are_chunking_independent(lines, eols, points, limit, bom):
    """Whatever mix of lines and line ends, the decoder's shortcuts (whole blocks split on LF
    LF, single-line events, CRLF events, a pending block finished before whole blocks) give
    the same events and violations as one byte at a time (which never takes them)."""
    from observer.wire.sse import SSEDecoder

    body = (b"\xef\xbb\xbf" if bom else b"") + b"".join(line + eol for line, eol in zip(lines, eols, strict=False))

    expected = feed_each_way(lambda: SSEDecoder(max_event_bytes=limit), body, points)
    for cut in range(1, len(body)):  # every two-chunk split: each shortcut meets every boundary
        assert feed(SSEDecoder(max_event_bytes=limit), [body[:cut], body[cut:]]) == expected, cut


# -- Gemini streamed function-call arguments (GeminiAdapter._fast_call) --------------------------

_GEM_CALL_PARTS = [
    {
        "functionCall": {
            "partialArgs": [{"jsonPath": "$.content", "stringValue": "ab", "willContinue": True}],
            "willContinue": True,
        }
    },
    {
        "functionCall": {
            "partialArgs": [{"jsonPath": "$['content']", "stringValue": "x", "willContinue": True}],
            "willContinue": True,
        }
    },
    {
        "functionCall": {
            "partialArgs": [{"jsonPath": "$.content", "stringValue": "é\n", "willContinue": True}],
            "willContinue": True,
        },
        "text": "t",
    },
    {"functionCall": {"partialArgs": [{"jsonPath": "$.content", "stringValue": "c"}], "willContinue": True}},
    {
        "functionCall": {
            "partialArgs": [{"jsonPath": "$.path", "stringValue": "p", "willContinue": True}],
            "willContinue": True,
        }
    },
    {
        "functionCall": {
            "partialArgs": [{"jsonPath": "$.content", "numberValue": 3, "willContinue": True}],
            "willContinue": True,
        }
    },
    {
        "functionCall": {
            "partialArgs": [
                {"jsonPath": "$.content", "stringValue": "d", "willContinue": True},
                {"jsonPath": "$.content", "stringValue": "e", "willContinue": True},
            ],
            "willContinue": True,
        }
    },
    {"functionCall": {"name": "write_file", "willContinue": True}},
    {"functionCall": {"partialArgs": [{"jsonPath": "$.content", "stringValue": "", "willContinue": True}]}},
    {"text": "plain"},
]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    picks=st.lists(st.integers(min_value=0, max_value=len(_GEM_CALL_PARTS) - 1), max_size=30),
    points=st.lists(st.integers(min_value=0, max_value=6000), max_size=20),
    limits=_limits,
    whole=st.booleans(),
)
def test_gemini_call_fast_equals_general(picks, points, limits, whole):
    """Streamed function-call argument pieces (continuations the fast lane takes, and the
    look-alikes it must decline: another spelling of the path, a non-string value, several
    entries, a closing piece, a new call, text in the part) in any chunking and under tight
    limits: the same record as the general path."""
    like = _streaming_case("gemini", "text/event-stream")

    def chunk(part: dict[str, Any], **kw: Any) -> bytes:
        return _sse(
            {"candidates": [{"content": {"role": "model", "parts": [part]}, **kw}], "modelVersion": "g1"}, nl="\r\n"
        )

    body = b"".join(
        [
            chunk({"functionCall": {"name": "write_file", "willContinue": True}}),
            chunk(
                {
                    "functionCall": {
                        "partialArgs": [{"jsonPath": "$.content", "stringValue": "s", "willContinue": True}],
                        "willContinue": True,
                    }
                }
            ),
        ]
        + [chunk(_GEM_CALL_PARTS[i]) for i in picks]
        + [chunk({"text": ""}, finishReason="STOP")]
    )
    chunks = [body] if whole else split_at(body, points)
    fast = _observe(like, chunks, general=False, limits=limits)
    assert fast == _observe(like, chunks, general=True, limits=limits)


def _gemini_call_body() -> list[bytes]:
    """A Gemini stream (one chunk per event) opening a streamed call, then six continuations."""

    def chunk(part: dict[str, Any]) -> bytes:
        return _sse({"candidates": [{"content": {"parts": [part]}}]}, nl="\r\n")

    return [chunk({"functionCall": {"name": "write_file", "willContinue": True}})] + [chunk(_GEM_CALL_PARTS[0])] * 6


def test_gemini_call_fast_lane_is_taken(monkeypatch):
    """Continuation pieces of a streamed call do take the Gemini fast lane."""
    from observer.dialects import gemini

    like = _streaming_case("gemini", "text/event-stream")
    calls = {"hit": 0}
    original = gemini.GeminiAdapter._fast_call

    def counting(self, index, part, call):
        hit = original(self, index, part, call)
        if hit:
            calls["hit"] += 1
        return hit

    monkeypatch.setattr(gemini.GeminiAdapter, "_fast_call", counting)
    ex = _observe(like, _gemini_call_body(), general=False, limits=Limits())
    assert calls["hit"] >= 5
    assert orjson.loads(ex["tool_calls"][0]["arguments"]) == {"content": "ab" * 6}


# -- the framers' shortcuts and the reassembler's runs -----------------------------------------------

_CHAT_HEAD = b'{"id":"c1","object":"chat.completion.chunk","model":"gpt","choices":[{"index":0,"delta":'


def _chat_delta(text: str) -> bytes:
    return _CHAT_HEAD + b'{"content":' + orjson.dumps(text) + b'},"finish_reason":null}]}'


# One SSE block each: (lines, payload kind). Payloads are chat chunks the fast lane takes, so
# every shape below reaches the reassembler through one of the SSE framer's shortcuts or its
# line-by-line path.
_BLOCKS = st.sampled_from(
    [
        [b"data: %D"],
        [b"data: %D"],
        [b"data:%D"],  # no space after the colon
        [b"event: message", b"data: %D"],
        [b"event:x", b"data:%D"],
        [b"event: \xfe", b"data: %D"],  # an event type that is not UTF-8
        [b"data: %D", b"id: 7"],
        [b"id: 8", b"data: %D"],
        [b": comment", b"data: %D"],
        [b"retry: 10", b"data: %D"],
        [b'data: {"id":"c1",', b'data: "choices":[]}'],  # two data lines, joined by LF: valid JSON
        [b"data: {not json"],
        [b"data: [DONE]"],
        [b"data: %D", b"data: x"],
        [b"event: e"],  # a block without data
        [],  # an extra blank line
    ]
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    blocks=st.lists(st.tuples(_BLOCKS, _texts), max_size=40),
    eols=st.lists(st.sampled_from([b"\n", b"\n", b"\r\n", b"\r\n", b"\r"]), min_size=1, max_size=8),
    points=st.lists(st.integers(min_value=0, max_value=3000), max_size=20),
    limits=_limits,
    whole=st.booleans(),
)
def test_bulk_lane_equals_general(blocks, eols, points, limits, whole):
    """Chunks of many messages in every SSE shape the framer's shortcuts take (one data line,
    after an event line, with or without the space, LF or CRLF line ends) and every shape they
    leave to its line-by-line path (id/retry/comment lines, several data lines, blank lines, bare
    CR), data that is not JSON and an event type that is not UTF-8, in any chunking and under
    tight limits: exactly the record of the general path."""
    like = _streaming_case("openai.chat", "text/event-stream")
    out = [b"data: " + _CHAT_HEAD + b'{"role":"assistant","content":""},"finish_reason":null}]}\n\n']
    for i, (lines, text) in enumerate(blocks):
        eol = eols[i % len(eols)]
        for line in lines:
            out.append(line.replace(b"%D", _chat_delta(text)) + eol)
        out.append(eol)
    out.append(b"data: [DONE]\n\n")
    body = b"".join(out)
    chunks = [body] if whole else split_at(body, points)
    fast = _observe(like, chunks, general=False, limits=limits)
    assert fast == _observe(like, chunks, general=True, limits=limits)


@pytest.mark.parametrize("chunking", ["event", "whole", "pieces"])
@pytest.mark.parametrize("limits", [Limits(), Limits(max_stream_text_chars=700)])
def test_long_runs_equal_general(chunking, limits):
    """A run longer than the reassembler's coalescing period (600 deltas on one block, then
    a second block, then tool-argument fragments of two calls), and a text cap crossed inside
    a run: the same record as the general path."""
    like = _streaming_case("openai.chat", "text/event-stream")
    head = b'{"id":"c1","object":"chat.completion.chunk","model":"gpt","choices":[{"index":%d,"delta":'
    events = [b"data: " + _CHAT_HEAD + b'{"role":"assistant","content":""},"finish_reason":null}]}\n\n']
    events += [b"data: " + _chat_delta(f"t{i} ") + b"\n\n" for i in range(600)]
    events += [b"data: " + (head % 1) + b'{"content":"other"},"finish_reason":null}]}\n\n' for _ in range(3)]
    for call in (0, 1):
        opening = (
            b'{"tool_calls":[{"index":%d,"id":"call_%d","type":"function","function":{"name":"f","arguments":""}}]}'
        )
        events.append(b"data: " + _CHAT_HEAD + opening % (call, call) + b',"finish_reason":null}]}\n\n')
        events += [
            b"data: " + _CHAT_HEAD + b'{"tool_calls":[{"index":%d,"function":{"arguments":"a%d"}}]},'
            b'"finish_reason":null}]}\n\n' % (call, i)
            for i in range(300)
        ]
    events.append(b"data: [DONE]\n\n")
    body = b"".join(events)
    chunks = {"event": events, "whole": [body], "pieces": split_at(body, range(0, len(body), 4099))}[chunking]
    fast = _observe(like, chunks, general=False, limits=limits)
    assert fast == _observe(like, chunks, general=True, limits=limits)
    if limits.max_stream_text_chars > 10_000:
        assert fast["text"].startswith("t0 t1 t2 ") and "t599 " in fast["text"]
        assert [len(c["arguments"]) for c in fast["tool_calls"]] == [len("".join(f"a{i}" for i in range(300)))] * 2


def test_runs_are_taken():
    """Consecutive text deltas of one block are applied as one run (one ``Reassembler._extend``
    of the pieces after the first), whole or one message per chunk, else the equality tests
    above would prove nothing about runs."""
    from observer.reassembly import Reassembler

    like = _streaming_case("openai.chat", "text/event-stream")
    events = (
        [b"data: " + _CHAT_HEAD + b'{"role":"assistant","content":""},"finish_reason":null}]}\n\n']
        + [b"data: " + _chat_delta(t) + b"\n\n" for t in ("a", "b", "c", "d", "e")]
        + [b"data: [DONE]\n\n"]
    )
    extend = Reassembler._extend
    for chunks in ([b"".join(events)], events):
        seen: list[list[str]] = []

        def counting_extend(self, parts, pieces, seen=seen):
            seen.append(list(pieces))
            return extend(self, parts, pieces)

        Reassembler._extend = counting_extend
        try:
            rec = _observe(like, chunks, general=False, limits=Limits())
        finally:
            Reassembler._extend = extend
        assert rec["text"] == "abcde"
        assert seen == [["b", "c", "d", "e"]]  # "a" opened the run; [DONE] (stream.end) applied it


@pytest.mark.parametrize("split", [False, True])
def test_event_type_not_utf8_is_reported_by_fast_lanes(split):
    """Regression: a chat chunk the fast lane takes (empty content: no event) under an event
    type that is not UTF-8 was taken without the check that reports it; the record must carry
    ``invalid_utf8`` (WHATWG decodes the field with replacement) whichever lane sees it."""
    like = _streaming_case("openai.chat", "text/event-stream")
    opening = b"data: " + _CHAT_HEAD + b'{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
    odd = b"event: \xfe\ndata: " + _chat_delta("") + b"\n\n"
    tail = b"data: " + _chat_delta("ok") + b"\n\ndata: [DONE]\n\n"
    chunks = [opening, odd, tail] if split else [opening + odd + tail]
    rec = _observe(like, chunks, general=False, limits=Limits())
    assert rec["violations"] == [{"kind": "invalid_utf8", "seq": None, "detail": "invalid UTF-8 replaced by U+FFFD"}]
    assert rec["text"] == "ok"


# -- mutations: a fast lane broken on purpose must make the comparisons above fail ---------------


def _chunkings(body: bytes, content_type: str) -> dict[str, list[bytes]]:
    """``body`` whole (the framers' many-message shortcuts), one message per chunk (their
    one-message shortcuts) and one byte per chunk (their general path): each way a message
    reaches a fast lane."""
    end = rb"\n" if content_type == "application/x-ndjson" else rb"\r?\n\r?\n"
    messages = re.findall(rb".*?" + end + rb"|.+", body, re.S)
    assert b"".join(messages) == body
    return {"whole": [body], "per message": messages, "bytewise": bytewise(body)}


class _Mutant:
    """A ``DeltaSink`` in front of the real one that changes what a fast lane reports."""

    def __init__(self, sink: Any, text: Any = None, fragment: Any = None) -> None:
        self._sink, self._text, self._fragment = sink, text, fragment

    def text(self, index, block_type, text, now_s):
        if self._text is not None:
            index, block_type, text = self._text(index, block_type, text)
        self._sink.text(index, block_type, text, now_s)

    def fragment(self, seq, key, index, id, name, arguments):
        if self._fragment is not None:
            arguments = self._fragment(arguments)
        self._sink.fragment(seq, key, index, id, name, arguments)


def _through(**changes: Any):
    """A mutation of ``fast``: its hits go through a ``_Mutant`` making ``changes``."""
    return lambda original: (
        lambda self, event, obj, sink, now_s: original(self, event, obj, _Mutant(sink, **changes), now_s)
    )


def _takes_everything(original):
    """A message it should have declined, taken as "no event"."""
    return lambda self, event, obj, sink, now_s: original(self, event, obj, sink, now_s) or True


# mutation -> (how it changes ``fast``, the generated stream's operations)
MUTATIONS = {
    "wrong text": (_through(text=lambda i, t, x: (i, t, x + "\u2020")), [("delta", "hello")] * 5),
    "wrong block": (_through(text=lambda i, t, x: (i + 1, t, x)), [("delta", "hello")] * 5),
    "wrong fragment": (_through(fragment=lambda a: a + "\u2020"), [("noise", 6)] + [("frag", "ab")] * 5),
    "takes what it must decline": (_takes_everything, [("delta", "a"), ("noise", 0), ("delta", "b")]),
}


@pytest.mark.mutation
@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
@pytest.mark.parametrize("dialect", sorted(GENERATED))
def test_broken_fast_lane_is_detected(dialect, mutation, monkeypatch):
    """A dialect's ``fast`` broken on purpose (a wrong text, block or argument fragment, or a
    message taken that it must decline) gives a record that differs from the general path's,
    in every chunking: the equality tests above can fail."""
    mutate, ops = MUTATIONS[mutation]
    if mutation == "wrong fragment" and dialect not in FRAGMENT_DIALECTS:
        pytest.skip("no tool-argument fragments in this dialect's fast lane")
    build, content_type = GENERATED[dialect]
    like = _streaming_case(dialect, content_type)
    adapter_cls = _adapter_class(dialect)
    original = adapter_cls.fast
    monkeypatch.setattr(adapter_cls, "fast", mutate(original))
    for how, chunks in _chunkings(build(ops), content_type).items():
        fast = _observe(like, chunks, general=False, limits=Limits())
        assert fast != _observe(like, chunks, general=True, limits=Limits()), f"{mutation} not detected ({how})"


@pytest.mark.mutation
def test_broken_gemini_call_lane_is_detected(monkeypatch):
    """Gemini's streamed-call lane broken on purpose (each continuation piece it takes gets a
    wrong character) gives a record that differs from the general path's, in every chunking."""
    from observer.dialects import gemini

    original = gemini.GeminiAdapter._fast_call

    def wrong_piece(self, index, part, call):
        args = call.get("partialArgs") if call.__class__ is dict else None
        if args.__class__ is list and len(args) == 1 and args[0].__class__ is dict and "stringValue" in args[0]:
            call = {**call, "partialArgs": [{**args[0], "stringValue": f"{args[0]['stringValue']}\u2020"}]}
        return original(self, index, part, call)

    monkeypatch.setattr(gemini.GeminiAdapter, "_fast_call", wrong_piece)
    like = _streaming_case("gemini", "text/event-stream")
    for how, chunks in _chunkings(b"".join(_gemini_call_body()), "text/event-stream").items():
        fast = _observe(like, chunks, general=False, limits=Limits())
        assert fast != _observe(like, chunks, general=True, limits=Limits()), how


@pytest.mark.parametrize("dialect", sorted(GENERATED))
def test_general_path_never_takes_a_fast_lane(dialect, monkeypatch):
    """Through ``general_only`` no adapter's ``fast`` runs, on any fixture or generated stream
    (regression: ``openai.chat``'s ``on_object`` called its own fast lane, so a broken lane
    broke both sides of the comparison alike)."""
    build, content_type = GENERATED[dialect]

    def refuse(self, event, obj, sink, now_s):
        raise AssertionError("fast lane called on the general path")

    monkeypatch.setattr(_adapter_class(dialect), "fast", refuse)
    bodies = [(_streaming_case(dialect, content_type), build([("delta", "a"), ("noise", 6), ("frag", "b")] * 3))]
    bodies += [(_case_like(dialect, name), load(dialect, name).body) for name in cases(dialect)]
    for like, body in bodies:
        for chunks in ([body], bytewise(body)):
            rec = _observe(like, chunks, general=True, limits=Limits())
            assert not any(v["kind"] == "observer_error" for v in rec["violations"])


@pytest.mark.parametrize(
    ("dialect", "content_type", "body", "expected"),
    [
        (
            "openai.chat",
            "text/event-stream",
            'event: x\nid: 7\ndata: {"choices":[],"x":"\u00e9"}\n\n'.encode(),
            [("SSE", "x", '{"choices":[],"x":"\u00e9"}', "7", 46)],
        ),
        (
            "ollama",
            "application/x-ndjson",
            '{"model":"m\u00e9","done":false}\r\n'.encode(),
            [("frame", "", '{"model":"m\u00e9","done":false}', None, 30)],
        ),
    ],
)
def test_parsed_message_reads_like_its_text_form(dialect, content_type, body, expected, monkeypatch):
    """The message ``on_object`` gets (data parsed from the bytes, its text decoded only when
    read, UTF-8: the data holds an e-acute) has the text form's ``event``, ``data``, ``id`` and
    ``size_bytes``."""
    from observer.wire.frames import JSONFrame

    cls = _adapter_class(dialect)
    original = cls.on_object
    seen = []

    def reading(self, message, obj):
        kind = "frame" if isinstance(message, JSONFrame) else "SSE"
        seen.append((kind, message.event, message.data, getattr(message, "id", None), message.size_bytes))
        return original(self, message, obj)

    monkeypatch.setattr(cls, "on_object", reading)
    like = _streaming_case(dialect, content_type)
    _observe(like, [body], general=False, limits=Limits())
    assert seen == expected
