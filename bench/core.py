"""Core throughput: the sans-IO per-flow pipeline against httpx-sse + ``json.loads``.

What is measured, per dialect (``llm-stream-1.0``, ``openai.chat``, ``openai.responses``,
``anthropic.messages``, ``gemini`` (SSE, CRLF line ends as Google sends them), ``ollama``
(NDJSON), ``vercel.ui`` (AI SDK v5 UI stream)) and stream shape:

- ``tokens``: ~2000 text deltas of 1-6 tokens each, in the vendor's real event shape
  (modelled on ``tests/fixtures/wire/<dialect>/``), between the vendor's opening and closing events;
- ``tool``: one tool call whose JSON arguments (~40 KB) stream in ~2000 fragments (not for
  ``llm-stream-1.0`` and ``ollama``: both send a tool call whole);
- ``line``: one event carrying a 300 KB text delta.

Each stream is fed in two chunkings: ``event`` (one wire event per chunk, as mitmproxy calls the
stream callable per HTTP chunk) and ``64k`` (bulk); the 300 KB line also in ``1k`` chunks (an
unterminated event arriving in pieces must not be rescanned: that would be quadratic).

Observer side: ``observer.tap.StreamObserver`` built as the capture path builds it
(a ``ResponseSpec``, ``feed(chunk, now)`` per chunk, ``finish``, the record assembled); the request body is parsed
once outside the timing (it is not stream work). Baseline, on the same chunks: what
``httpx_sse.EventSource.iter_sse`` does (``httpx``'s incremental UTF-8 text decoding,
``SSELineDecoder``, ``line.rstrip("\\n")``, ``SSEDecoder.decode``) plus stdlib ``json.loads`` of
every event's data (``[DONE]`` skipped); for NDJSON: line splitting + ``json.loads``.

Figures: observer MB/s (wire bytes) with the baseline's MB/s; target ``>= 2x``. Events/s are
printed in a second table and kept in the JSON details. Timing: ``time.perf_counter``, observer
and baseline alternated, best of N. Every observer run's record is checked once against the
generated text / arguments (a fast but wrong parser fails the suite: exit 1).

``--profile`` runs pyinstrument over the observer on the token streams (one event per chunk)
and prints the top entries.
"""

from __future__ import annotations

import argparse
import codecs
import json
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from httpx_sse._decoders import SSEDecoder as HxSSEDecoder  # noqa: E402
from httpx_sse._decoders import SSELineDecoder  # noqa: E402

from bench._common import Report  # noqa: E402
from observer.dialects.base import RequestView  # noqa: E402
from observer.dialects.registry import default_registry  # noqa: E402
from observer.limits import Limits  # noqa: E402
from observer.reassembly import EndCause  # noqa: E402
from observer.records import Exchange  # noqa: E402
from observer.response import ResponseSpec, StreamEnd, assemble  # noqa: E402
from observer.tap import StreamObserver  # noqa: E402

T0 = 1_749_292_800.0
TARGET = 2.0

# ---------------------------------------------------------------------------------------------
# Deterministic stream generation
# ---------------------------------------------------------------------------------------------

_VOCAB = (
    " the",
    " weather",
    " in",
    " Vienna",
    " is",
    " sunny",
    ",",
    ".",
    " and",
    " we",
    " expect",
    " 24",
    "°C",
    " today",
    "\n",
    "\n\n",
    " a",
    " light",
    " breeze",
    " from",
    " the",
    " west",
    " —",
    " café",
    " naïve",
    " 日本",
    "語",
    ' "quoted"',
    " back\\slash",
    " tab\t",
    " 🙂",
    " function",
    "(",
    ")",
    " {",
    "}",
    " return",
    " x",
    " +",
    " 1",
    ";",
    " if",
    " else",
)


def token_deltas(rng: random.Random, n: int) -> list[str]:
    """``n`` text deltas of 1-6 vocabulary tokens each."""
    vocab = _VOCAB
    return ["".join(rng.choice(vocab) for _ in range(rng.randint(1, 6))) for _ in range(n)]


def split_text(rng: random.Random, text: str, n: int) -> list[str]:
    """``text`` cut into about ``n`` pieces of random length (characters, never empty)."""
    avg = max(1, len(text) // n)
    out, i = [], 0
    while i < len(text):
        k = rng.randint(1, 2 * avg)
        out.append(text[i : i + k])
        i += k
    return out


def long_text(rng: random.Random, nbytes: int) -> str:
    parts, size = [], 0
    while size < nbytes:
        t = "".join(rng.choice(_VOCAB) for _ in range(64))
        parts.append(t)
        size += len(t.encode())
    return "".join(parts)


def _j(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _sse(data: str, event: str | None = None, nl: str = "\n") -> bytes:
    head = f"event: {event}{nl}" if event else ""
    return f"{head}data: {data}{nl}{nl}".encode()


@dataclass
class Stream:
    """One generated response: its wire events (each a complete event with terminator), the
    request, and what the record must say."""

    dialect: str
    shape: str
    events: list[bytes]
    request: bytes
    path: str
    content_type: str = "text/event-stream"
    request_headers: dict[str, str] = field(default_factory=dict)
    framing: str = "sse"
    text: str | None = None  # expected record text
    args: Any = None  # expected parsed tool arguments

    @property
    def body(self) -> bytes:
        return b"".join(self.events)


TOOL = "write_file"


def _tool_args(rng: random.Random, nbytes: int) -> tuple[dict[str, Any], str]:
    obj = {"path": "src/main.py", "content": long_text(rng, nbytes)}
    return obj, _j(obj)


# -- llm-stream-1.0 -------------------------------------------------------------------------


def gen_standard(shape: str, deltas: list[str], args_pieces: list[str] | None) -> Stream | None:
    if shape == "tool":
        return None  # the standard sends tool.call whole (draft §4.8)
    rid = "550e8400-e29b-41d4-a716-446655440000"
    ev = [
        _sse(
            _j(
                {
                    "v": "1.0",
                    "seq": 0,
                    "type": "stream.start",
                    "request_id": rid,
                    "model": "example-model",
                    "created": 1749292800,
                }
            ),
            "stream.start",
        )
    ]
    seq = 1
    for t in deltas:
        ev.append(
            _sse(
                _j(
                    {
                        "v": "1.0",
                        "seq": seq,
                        "type": "content.delta",
                        "index": 0,
                        "role": "assistant",
                        "delta": {"text": t},
                    }
                ),
                "content.delta",
            )
        )
        seq += 1
    ev.append(
        _sse(
            _j({"v": "1.0", "seq": seq, "type": "content.stop", "index": 0, "stop_reason": "end_turn"}), "content.stop"
        )
    )
    ev.append(
        _sse(
            _j({"v": "1.0", "seq": seq + 1, "type": "usage", "input_tokens": 42, "output_tokens": len(deltas)}), "usage"
        )
    )
    ev.append(_sse(_j({"v": "1.0", "seq": seq + 2, "type": "stream.end", "request_id": rid}), "stream.end"))
    req = _j(
        {
            "version": "1.0",
            "stream": True,
            "model": "example-model",
            "messages": [{"role": "user", "content": "Weather?"}],
        }
    ).encode()
    return Stream(
        "llm-stream-1.0",
        shape,
        ev,
        req,
        "/v1/stream",
        request_headers={"content-type": "application/llm-request+json; version=1.0"},
        text="".join(deltas),
    )


# -- openai.chat ------------------------------------------------------------------------------

_CHAT_HEAD = '{"id":"chatcmpl-9tXjg9DdaOfymTPDrSLfxslQEH0C2","object":"chat.completion.chunk","created":1723024748,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_845eaabc1f","choices":'


def gen_chat(shape: str, deltas: list[str], args_pieces: list[str] | None) -> Stream:
    ev = [
        _sse(
            _CHAT_HEAD
            + '[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}'
        )
    ]
    if shape == "tool":
        ev[0] = _sse(
            _CHAT_HEAD
            + '[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_nZUB8dEnPSMykLtTKRRS3sT8","type":"function","function":{"name":"write_file","arguments":""}}],"refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}'
        )
        for p in args_pieces or ():
            ev.append(
                _sse(
                    _CHAT_HEAD
                    + '[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":'
                    + _j(p)
                    + '}}]},"logprobs":null,"finish_reason":null}],"usage":null}'
                )
            )
        finish = "tool_calls"
    else:
        for t in deltas:
            ev.append(
                _sse(
                    _CHAT_HEAD
                    + '[{"index":0,"delta":{"content":'
                    + _j(t)
                    + '},"logprobs":null,"finish_reason":null}],"usage":null}'
                )
            )
        finish = "stop"
    ev.append(
        _sse(_CHAT_HEAD + '[{"index":0,"delta":{},"logprobs":null,"finish_reason":"' + finish + '"}],"usage":null}')
    )
    ev.append(_sse(_CHAT_HEAD + '[],"usage":{"prompt_tokens":19,"completion_tokens":2000,"total_tokens":2019}}'))
    ev.append(b"data: [DONE]\n\n")
    req = _j(
        {
            "model": "gpt-4o",
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "Write it."}],
            "tools": [{"type": "function", "function": {"name": TOOL, "parameters": {"type": "object"}}}],
        }
    ).encode()
    return Stream(
        "openai.chat", shape, ev, req, "/v1/chat/completions", text="".join(deltas) if shape != "tool" else ""
    )


# -- openai.responses -------------------------------------------------------------------------

_RESP_ID = "resp_0f9c4b2f224d858000695fa062bf048197a680f357bbb09000"
_MSG_ID = "msg_0f9c4b2f224d858000695fa063d4708197af73c2f37cb0b9d3"
_FC_ID = "fc_0c3fb28cfcf463a500695fa2f0b0a881a0890103ba88b0628e"


def _resp_obj(status: str, output: list[Any]) -> dict[str, Any]:
    return {
        "id": _RESP_ID,
        "object": "response",
        "created_at": 1767874658,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "max_output_tokens": None,
        "model": "gpt-4o-mini-2024-07-18",
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": True,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": None if status != "completed" else {"input_tokens": 11, "output_tokens": 2000, "total_tokens": 2011},
        "user": None,
        "metadata": {},
    }


def gen_responses(shape: str, deltas: list[str], args_pieces: list[str] | None) -> Stream:
    seq = 0

    def e(obj: dict[str, Any]) -> bytes:
        nonlocal seq
        obj["sequence_number"] = seq
        seq += 1
        return _sse(_j(obj), obj["type"])

    ev = [
        e({"type": "response.created", "response": _resp_obj("in_progress", [])}),
        e({"type": "response.in_progress", "response": _resp_obj("in_progress", [])}),
    ]
    if shape == "tool":
        args = "".join(args_pieces or ())
        ev.append(
            e(
                {
                    "type": "response.output_item.added",
                    "item": {
                        "id": _FC_ID,
                        "type": "function_call",
                        "status": "in_progress",
                        "arguments": "",
                        "call_id": "call_7VaiUXZYuuuwWwviCrckxq6t",
                        "name": TOOL,
                    },
                    "output_index": 0,
                }
            )
        )
        for p in args_pieces or ():
            ev.append(
                e(
                    {
                        "type": "response.function_call_arguments.delta",
                        "delta": p,
                        "item_id": _FC_ID,
                        "obfuscation": "gWZHP8i4lSgQYT",
                        "output_index": 0,
                    }
                )
            )
        ev.append(
            e(
                {
                    "type": "response.function_call_arguments.done",
                    "arguments": args,
                    "item_id": _FC_ID,
                    "output_index": 0,
                }
            )
        )
        item = {
            "id": _FC_ID,
            "type": "function_call",
            "status": "completed",
            "arguments": args,
            "call_id": "call_7VaiUXZYuuuwWwviCrckxq6t",
            "name": TOOL,
        }
        ev.append(e({"type": "response.output_item.done", "item": item, "output_index": 0}))
    else:
        text = "".join(deltas)
        ev.append(
            e(
                {
                    "type": "response.output_item.added",
                    "item": {
                        "id": _MSG_ID,
                        "type": "message",
                        "status": "in_progress",
                        "content": [],
                        "role": "assistant",
                    },
                    "output_index": 0,
                }
            )
        )
        ev.append(
            e(
                {
                    "type": "response.content_part.added",
                    "content_index": 0,
                    "item_id": _MSG_ID,
                    "output_index": 0,
                    "part": {"type": "output_text", "annotations": [], "logprobs": [], "text": ""},
                }
            )
        )
        for t in deltas:
            ev.append(
                e(
                    {
                        "type": "response.output_text.delta",
                        "content_index": 0,
                        "delta": t,
                        "item_id": _MSG_ID,
                        "logprobs": [],
                        "obfuscation": "N16SG5UiLncOU",
                        "output_index": 0,
                    }
                )
            )
        ev.append(
            e(
                {
                    "type": "response.output_text.done",
                    "content_index": 0,
                    "item_id": _MSG_ID,
                    "logprobs": [],
                    "output_index": 0,
                    "text": text,
                }
            )
        )
        part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
        ev.append(
            e(
                {
                    "type": "response.content_part.done",
                    "content_index": 0,
                    "item_id": _MSG_ID,
                    "output_index": 0,
                    "part": part,
                }
            )
        )
        item = {"id": _MSG_ID, "type": "message", "status": "completed", "content": [part], "role": "assistant"}
        ev.append(e({"type": "response.output_item.done", "item": item, "output_index": 0}))
    ev.append(e({"type": "response.completed", "response": _resp_obj("completed", [item])}))
    req = _j(
        {
            "model": "gpt-4o-mini",
            "stream": True,
            "input": "Write it.",
            "tools": [{"type": "function", "name": TOOL, "parameters": {"type": "object"}}],
        }
    ).encode()
    return Stream("openai.responses", shape, ev, req, "/v1/responses", text="".join(deltas) if shape != "tool" else "")


# -- anthropic.messages -----------------------------------------------------------------------


def gen_anthropic(shape: str, deltas: list[str], args_pieces: list[str] | None) -> Stream:
    ev = [
        _sse(
            '{"type":"message_start","message":{"id":"msg_019Q1hrJbZG26Fb9BQhrkHEr","type":"message","role":"assistant","model":"claude-sonnet-4-20250514","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":377,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1,"service_tier":"standard"}}}',
            "message_start",
        )
    ]
    if shape == "tool":
        ev.append(
            _sse(
                '{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_01NRLabsLyVHZPKxbKvkfSMn","name":"write_file","input":{}}}',
                "content_block_start",
            )
        )
        ev.append(_sse('{"type": "ping"}', "ping"))
        for p in args_pieces or ():
            ev.append(
                _sse(
                    '{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":'
                    + _j(p)
                    + "}}",
                    "content_block_delta",
                )
            )
        stop = "tool_use"
    else:
        ev.append(
            _sse(
                '{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}',
                "content_block_start",
            )
        )
        ev.append(_sse('{"type": "ping"}', "ping"))
        for t in deltas:
            ev.append(
                _sse(
                    '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":' + _j(t) + "}}",
                    "content_block_delta",
                )
            )
        stop = "end_turn"
    ev.append(_sse('{"type":"content_block_stop","index":0}', "content_block_stop"))
    ev.append(
        _sse(
            '{"type":"message_delta","delta":{"stop_reason":"'
            + stop
            + '","stop_sequence":null},"usage":{"output_tokens":2000}}',
            "message_delta",
        )
    )
    ev.append(_sse('{"type":"message_stop"}', "message_stop"))
    req = _j(
        {
            "model": "claude-sonnet-4-0",
            "max_tokens": 4096,
            "stream": True,
            "tools": [{"name": TOOL, "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": "Write it."}],
        }
    ).encode()
    return Stream("anthropic.messages", shape, ev, req, "/v1/messages", text="".join(deltas) if shape != "tool" else "")


# -- gemini (SSE, CRLF) -----------------------------------------------------------------------

_GEM_TAIL = ',"usageMetadata":{"trafficType":"ON_DEMAND"},"modelVersion":"gemini-3.1-pro-preview","createTime":"2026-04-02T17:03:50.399550Z","responseId":"dqHOab6xGLzWodAPkPuViA4"}'


def gen_gemini(shape: str, deltas: list[str], args_pieces: list[str] | None) -> Stream:
    crlf = "\r\n"
    ev = []
    if shape == "tool":
        ev.append(
            _sse(
                '{"candidates":[{"content":{"role":"model","parts":[{"functionCall":{"name":"write_file","willContinue":true},"thoughtSignature":"CiMBjz1rX25KieIB4d4AwFn8"}]}}]'
                + _GEM_TAIL,
                nl=crlf,
            )
        )
        ev.append(
            _sse(
                '{"candidates":[{"content":{"role":"model","parts":[{"functionCall":{"partialArgs":[{"jsonPath":"$.path","stringValue":"src/main.py"}],"willContinue":true}}]}}]'
                + _GEM_TAIL,
                nl=crlf,
            )
        )
        for p in args_pieces or ():
            ev.append(
                _sse(
                    '{"candidates":[{"content":{"role":"model","parts":[{"functionCall":{"partialArgs":[{"jsonPath":"$.content","stringValue":'
                    + _j(p)
                    + ',"willContinue":true}],"willContinue":true}}]}}]'
                    + _GEM_TAIL,
                    nl=crlf,
                )
            )
        ev.append(
            _sse(
                '{"candidates":[{"content":{"role":"model","parts":[{"functionCall":{"partialArgs":[{"jsonPath":"$.content","stringValue":""}],"willContinue":true}}]}}]'
                + _GEM_TAIL,
                nl=crlf,
            )
        )
        ev.append(
            _sse(
                '{"candidates":[{"content":{"role":"model","parts":[{"functionCall":{}}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":26,"candidatesTokenCount":2000,"totalTokenCount":2026,"trafficType":"ON_DEMAND"},"modelVersion":"gemini-3.1-pro-preview","createTime":"2026-04-02T17:03:50.399550Z","responseId":"dqHOab6xGLzWodAPkPuViA4"}',
                nl=crlf,
            )
        )
    else:
        for t in deltas:
            ev.append(
                _sse(
                    '{"candidates":[{"content":{"role":"model","parts":[{"text":' + _j(t) + "}]}}]" + _GEM_TAIL, nl=crlf
                )
            )
        ev.append(
            _sse(
                '{"candidates":[{"content":{"role":"model","parts":[{"text":""}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":5,"candidatesTokenCount":2000,"totalTokenCount":2005,"trafficType":"ON_DEMAND"},"modelVersion":"gemini-3.1-pro-preview","createTime":"2026-04-02T17:03:50.399550Z","responseId":"dqHOab6xGLzWodAPkPuViA4"}',
                nl=crlf,
            )
        )
    req = _j(
        {
            "contents": [{"role": "user", "parts": [{"text": "Write it."}]}],
            "tools": [{"functionDeclarations": [{"name": TOOL, "parameters": {"type": "object"}}]}],
            "toolConfig": {"functionCallingConfig": {"mode": "AUTO", "streamFunctionCallArguments": True}},
        }
    ).encode()
    return Stream(
        "gemini",
        shape,
        ev,
        req,
        "/v1/projects/p/locations/global/publishers/google/models/gemini-3.1-pro-preview:streamGenerateContent?alt=sse",
        text="".join(deltas) if shape != "tool" else "",
    )


# -- ollama (NDJSON) --------------------------------------------------------------------------


def gen_ollama(shape: str, deltas: list[str], args_pieces: list[str] | None) -> Stream | None:
    if shape == "tool":
        return None  # Ollama sends each tool call whole, in one line
    ev = []
    for i, t in enumerate(deltas):
        ev.append(
            (
                _j(
                    {
                        "model": "llama3.2",
                        "created_at": f"2023-08-04T08:52:19.{i:09d}-07:00",
                        "message": {"role": "assistant", "content": t},
                        "done": False,
                    }
                )
                + "\n"
            ).encode()
        )
    ev.append(
        (
            _j(
                {
                    "model": "llama3.2",
                    "created_at": "2023-08-04T19:22:45.499127Z",
                    "message": {"role": "assistant", "content": ""},
                    "done": True,
                    "done_reason": "stop",
                    "total_duration": 4883583458,
                    "load_duration": 1334875,
                    "prompt_eval_count": 26,
                    "prompt_eval_duration": 342546000,
                    "eval_count": 282,
                    "eval_duration": 4535599000,
                }
            )
            + "\n"
        ).encode()
    )
    req = _j({"model": "llama3.2", "messages": [{"role": "user", "content": "Why is the sky blue?"}]}).encode()
    return Stream(
        "ollama",
        shape,
        ev,
        req,
        "/api/chat",
        content_type="application/x-ndjson",
        framing="ndjson",
        text="".join(deltas),
    )


# -- vercel.ui (AI SDK v5 UI message stream) --------------------------------------------------


def gen_vercel(shape: str, deltas: list[str], args_pieces: list[str] | None) -> Stream:
    ev = [_sse('{"type":"start","messageId":"msg-2f1c9e"}'), _sse('{"type":"start-step"}')]
    if shape == "tool":
        ev.append(
            _sse('{"type":"tool-input-start","toolCallId":"call_fJdQDqnXeGxTmr4E3YPSR7Ar","toolName":"write_file"}')
        )
        for p in args_pieces or ():
            ev.append(
                _sse(
                    '{"type":"tool-input-delta","toolCallId":"call_fJdQDqnXeGxTmr4E3YPSR7Ar","inputTextDelta":'
                    + _j(p)
                    + "}"
                )
            )
        ev.append(
            _sse(
                '{"type":"tool-input-available","toolCallId":"call_fJdQDqnXeGxTmr4E3YPSR7Ar","toolName":"write_file","input":'
                + "".join(args_pieces or ())
                + "}"
            )
        )
    else:
        tid = "msg_68679a454370819ca74c8eb3d04379630dd1afb72306ca5d"
        ev.append(_sse('{"type":"text-start","id":"' + tid + '"}'))
        for t in deltas:
            ev.append(_sse('{"type":"text-delta","id":"' + tid + '","delta":' + _j(t) + "}"))
        ev.append(_sse('{"type":"text-end","id":"' + tid + '"}'))
    ev += [_sse('{"type":"finish-step"}'), _sse('{"type":"finish"}'), b"data: [DONE]\n\n"]
    req = _j(
        {
            "id": "chat-77",
            "messages": [{"id": "u-1", "role": "user", "parts": [{"type": "text", "text": "Write it."}]}],
            "trigger": "submit-message",
            "messageId": "a-9",
        }
    ).encode()
    return Stream("vercel.ui", shape, ev, req, "/api/chat", text="".join(deltas) if shape != "tool" else "")


GENERATORS: dict[str, Callable[..., Stream | None]] = {
    "llm-stream-1.0": gen_standard,
    "openai.chat": gen_chat,
    "openai.responses": gen_responses,
    "anthropic.messages": gen_anthropic,
    "gemini": gen_gemini,
    "ollama": gen_ollama,
    "vercel.ui": gen_vercel,
}
RESPONSE_HEADERS = {"vercel.ui": {"x-vercel-ai-ui-message-stream": "v1"}}


def make_stream(dialect: str, shape: str, *, events: int, line_bytes: int, tool_bytes: int) -> Stream | None:
    rng = random.Random(f"{dialect}/{shape}")
    args_obj = args_pieces = None
    if shape == "tokens":
        deltas = token_deltas(rng, events)
    elif shape == "line":
        deltas = [long_text(rng, line_bytes)]
    else:
        deltas = []
        args_obj, args = _tool_args(rng, tool_bytes)
        if dialect == "gemini":
            args_obj = {"path": "src/main.py", "content": args_obj["content"]}
            args_pieces = split_text(rng, args_obj["content"], events)
        else:
            args_pieces = split_text(rng, args, events)
    s = GENERATORS[dialect](shape, deltas, args_pieces)
    if s is not None:
        s.args = args_obj
    return s


# ---------------------------------------------------------------------------------------------
# The two sides
# ---------------------------------------------------------------------------------------------


def chunkings(s: Stream) -> dict[str, list[bytes]]:
    body = s.body
    out = {"event": list(s.events), "64k": [body[i : i + 65536] for i in range(0, len(body), 65536)]}
    if s.shape == "line":
        out["1k"] = [body[i : i + 1024] for i in range(0, len(body), 1024)]
    return out


class ObserverSide:
    """Builds a fresh ``StreamObserver`` per run and assembles the record, as ``observer.capture`` does."""

    def __init__(self, s: Stream) -> None:
        reg = default_registry()
        self.view = RequestView("POST", "127.0.0.1", s.path, {"content-type": "application/json", **s.request_headers})
        dialect = reg.classify(self.view)
        dialect = reg.classify_response(self.view, RESPONSE_HEADERS.get(s.dialect, {}), dialect)
        if dialect is None or dialect.name != s.dialect:
            raise RuntimeError(f"{s.dialect}: classified as {dialect and dialect.name}")
        self.dialect = dialect
        self.facts, self.req_violations = dialect.parse_request(s.request, self.view)
        self.content_type = s.content_type
        self.limits = Limits()
        self.started = datetime.fromtimestamp(T0, tz=timezone.utc)

    def run(self, chunks: list[bytes]) -> Exchange:
        ex = Exchange(
            id="bench",
            dialect=self.dialect.name,
            host="127.0.0.1",
            path="/",
            method="POST",
            http_version="HTTP/1.1",
            started_at=self.started,
            status_code=200,
            request=self.facts,
        )
        spec = ResponseSpec(
            self.dialect.name,
            200,
            self.content_type,
            None,
            T0,
            self.view.path,
            tuple(self.facts.tool_names),
            self.facts.request_id,
            self.facts.stream,
            self.limits,
        )
        obs = StreamObserver(self.dialect, spec)
        feed = obs.feed
        t = T0
        for c in chunks:
            t += 0.001
            feed(c, t)
        return assemble(ex, list(self.req_violations), obs.finish(StreamEnd(EndCause.EOF, t)))


def baseline_sse(chunks: list[bytes]) -> int:
    """httpx_sse ``iter_sse`` over ``httpx``'s ``iter_text`` (incremental UTF-8 decode), then
    ``json.loads`` of each event's data. Returns the number of events."""
    text_decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    lines_decoder = SSELineDecoder()
    decoder = HxSSEDecoder()
    loads = json.loads
    n = 0
    for chunk in chunks:
        for line in lines_decoder.decode(text_decoder.decode(chunk)):
            sse = decoder.decode(line.rstrip("\n"))
            if sse is not None:
                n += 1
                if sse.data != "[DONE]":
                    loads(sse.data)
    tail = text_decoder.decode(b"", True)
    for line in (lines_decoder.decode(tail) if tail else []) + lines_decoder.flush():
        sse = decoder.decode(line.rstrip("\n"))
        if sse is not None:
            n += 1
            if sse.data != "[DONE]":
                loads(sse.data)
    return n


def baseline_ndjson(chunks: list[bytes]) -> int:
    """Line splitting (held pieces joined once per line) + ``json.loads`` of each non-blank line."""
    loads = json.loads
    held: list[bytes] = []
    n = 0
    for chunk in chunks:
        if b"\n" not in chunk:
            held.append(chunk)
            continue
        lines = chunk.split(b"\n")
        if held:
            held.append(lines[0])
            lines[0] = b"".join(held)
            held = []
        tail = lines.pop()
        if tail:
            held.append(tail)
        for line in lines:
            if line.strip():
                loads(line)
                n += 1
    if held:
        line = b"".join(held)
        if line.strip():
            loads(line)
            n += 1
    return n


def check(s: Stream, ex: Exchange) -> str | None:
    """Why the record is wrong, or ``None``."""
    # The AI SDK UI request carries no tool declarations: its calls are undeclared by construction.
    allowed = {"undeclared_tool"} if s.dialect == "vercel.ui" else set()
    bad = [v for v in ex.violations if v.kind not in allowed]
    if bad:
        return f"violations: {[(v.kind, v.detail) for v in bad][:3]}"
    if ex.outcome != "completed":
        return f"outcome {ex.outcome}"
    if s.text is not None and ex.text != s.text:
        return f"text differs (len {len(ex.text)} vs {len(s.text)})"
    if s.args is not None:
        if len(ex.tool_calls) != 1:
            return f"{len(ex.tool_calls)} tool calls"
        try:
            got = json.loads(ex.tool_calls[0].arguments)
        except ValueError as exc:
            return f"tool arguments not JSON: {exc}"
        if got != s.args:
            return "tool arguments differ"
    return None


# ---------------------------------------------------------------------------------------------


def measure(s: Stream, chunks: list[bytes], repeats: int) -> tuple[float, float, int]:
    """(best observer seconds, best baseline seconds, events counted by the baseline)."""
    obs = ObserverSide(s)
    base = baseline_ndjson if s.framing == "ndjson" else baseline_sse
    best_o = best_b = float("inf")
    n = 0
    pc = time.perf_counter
    for _ in range(repeats):
        t = pc()
        obs.run(chunks)
        best_o = min(best_o, pc() - t)
        t = pc()
        n = base(chunks)
        best_b = min(best_b, pc() - t)
    return best_o, best_b, n


def parse_floor(s: Stream, repeats: int) -> float:
    """Best seconds of ``orjson.loads`` alone over every message's data (``[DONE]`` skipped),
    pre-extracted: the least any observer that parses each message once with orjson spends, so
    ``baseline / floor`` is the highest ratio such an observer could reach on this stream."""
    import orjson

    datas = []
    for e in s.events:
        if s.framing == "ndjson":
            datas.append(e.rstrip(b"\r\n"))
            continue
        lines = e.replace(b"\r\n", b"\n").split(b"\n")
        data = b"\n".join(ln[6:] if ln[5:6] == b" " else ln[5:] for ln in lines if ln.startswith(b"data:"))
        if data != b"[DONE]":
            datas.append(data)
    loads = orjson.loads
    best = float("inf")
    pc = time.perf_counter
    for _ in range(repeats):
        t = pc()
        for d in datas:
            loads(d)
        best = min(best, pc() - t)
    return best


def profile(streams: list[Stream], top: int) -> None:
    from pyinstrument import Profiler

    for s in streams:
        obs = ObserverSide(s)
        chunks = list(s.events)
        prof = Profiler(interval=0.0002)
        prof.start()
        for _ in range(20):
            obs.run(chunks)
        prof.stop()
        print(f"\n=== profile: {s.dialect} {s.shape}, one event per chunk, 20 runs ===")
        print(_top_functions(prof, top))


def _top_functions(prof: Any, top: int) -> str:
    """The ``top`` functions by self time (flat) from a pyinstrument session."""
    from collections import defaultdict

    self_time: dict[str, float] = defaultdict(float)
    total = 0.0

    def walk(frame: Any) -> None:
        nonlocal total
        st = frame.total_self_time
        if st and not frame.function.startswith("["):  # skip pyinstrument's synthetic [self]/[await] frames
            key = f"{frame.function} ({Path(frame.file_path or '?').name}:{frame.line_no})"
            self_time[key] += st
            total += st
        for child in frame.children:
            walk(child)

    root = prof.last_session.root_frame()
    walk(root)
    rows = sorted(self_time.items(), key=lambda kv: -kv[1])[:top]
    return "\n".join(f"{100 * t / total:5.1f}%  {t * 1000:8.1f} ms  {k}" for k, t in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="seconds-long run that only shows it works")
    ap.add_argument("--json", metavar="PATH", help="write the report as JSON")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats per figure (best is kept)")
    ap.add_argument("--profile", action="store_true", help="pyinstrument the observer on the token streams")
    ap.add_argument("--top", type=int, default=15, help="entries printed per profile")
    ap.add_argument("--dialect", action="append", help="only these dialects (repeatable)")
    args = ap.parse_args(argv)

    started = time.perf_counter()
    report = Report("core", smoke=args.smoke)
    if args.smoke:
        sizes = {"events": 200, "line_bytes": 30_000, "tool_bytes": 4_000}
        repeats = args.repeats or 1
    else:
        sizes = {"events": 2000, "line_bytes": 300_000, "tool_bytes": 40_000}
        repeats = args.repeats or 5
    dialects = args.dialect or list(GENERATORS)

    if args.profile:
        streams = [make_stream(d, "tokens", **sizes) for d in dialects]
        profile([s for s in streams if s is not None], args.top)
        return 0

    rows = []
    failures = []
    details: dict[str, Any] = {"cases": []}
    for d in dialects:
        for shape in ("tokens", "tool", "line"):
            s = make_stream(d, shape, **sizes)
            if s is None:
                continue
            body = s.body
            for cname, chunks in chunkings(s).items():
                name = f"{d} {shape}/{cname}"
                try:
                    ex = ObserverSide(s).run(chunks)
                except Exception as exc:  # a crash is a failure to measure
                    failures.append(f"{name}: observer raised {type(exc).__name__}: {exc}")
                    continue
                why = check(s, ex)
                if why:
                    failures.append(f"{name}: wrong record: {why}")
                    continue
                t_obs, t_base, n_base = measure(s, chunks, repeats)
                if n_base != len(s.events):
                    failures.append(f"{name}: baseline saw {n_base} events, generated {len(s.events)}")
                    continue
                mb = len(body) / 1e6
                n = len(s.events)
                fig = report.add(name, mb / t_obs, "MB/s", baseline=mb / t_base, target=f">= {TARGET:g}x")
                fig.met = (fig.ratio or 0) >= TARGET
                t_floor = parse_floor(s, repeats)
                rows.append((name, n / t_obs, n / t_base, 1e6 * t_obs / n, 1e6 * t_base / n, t_base / t_floor))
                details["cases"].append(
                    {
                        "name": name,
                        "events": n,
                        "bytes": len(body),
                        "chunks": len(chunks),
                        "observer_s": t_obs,
                        "baseline_s": t_base,
                        "parse_floor_s": t_floor,
                        "observer_events_s": n / t_obs,
                        "baseline_events_s": n / t_base,
                    }
                )

    report.seconds = time.perf_counter() - started
    report.details = details
    report.print_table()
    print()
    print(_events_table(rows))
    for f in failures:
        print(f"FAILED: {f}")
    report.details["failures"] = failures
    report.write_json(args.json)
    return 1 if failures or not report.figures else 0


def _events_table(rows: list[tuple[str, float, float, float, float, float]]) -> str:
    """Events/s and µs/event per figure, and ``ceiling``: baseline time / parse floor
    (:func:`parse_floor`), the best ratio an observer parsing each message with orjson could show."""
    head = ("figure", "obs ev/s", "base ev/s", "obs us/ev", "base us/ev", "ceiling")
    body = [(n, f"{a:,.0f}", f"{b:,.0f}", f"{c:.2f}", f"{d:.2f}", f"{e:.2f}x") for n, a, b, c, d, e in rows]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(6)]
    lines = ["== core: events/s (ceiling: baseline / orjson.loads alone on the same messages) =="]
    for i, r in enumerate([head, *body]):
        lines.append("  ".join(c.ljust(widths[j]) if j == 0 else c.rjust(widths[j]) for j, c in enumerate(r)))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
