"""Real official clients through the real proxy: the ``openai``, ``anthropic`` and
``google-genai`` Python SDKs, and curl, stream through ``observer run`` to a local upstream that
replays the wire fixtures (``tests/e2e/replay_upstream.py``: one event per chunk, 100 ms apart).

For every fixture case an SDK can consume (a 200 SSE stream on the SDK's own route, see
``Driver.applies``), the SDK streams it with its own streaming helper and accumulator
(openai ``chat.completions.stream``, anthropic ``messages.stream``; openai
``responses.create(stream=True)`` and google-genai ``models.generate_content_stream`` give typed
chunks that are joined here), sending the fixture's request body. Checked:

- transport: every event reaches the SDK before the upstream sends the next one (the SDK's
  item for wire event i arrives before ``send_times[i + 1]``);
- the record equals what the SDK accumulated: text, tool calls (id, name, arguments), usage
  (input, output and, where the SDK's usage type has them, cached, cache-write, reasoning and
  total tokens: the ``cached_reasoning`` / ``prompt_cache`` / ``cached_thoughts`` fixtures carry
  them), stop reason (raw), outcome (``error`` when the SDK raised a mid-stream error);
- the record equals the fixture's hand-written expectation on every response-side key.

curl replays EVERY case of every dialect folder (its exact request bytes, path, query and
headers): the body must arrive byte for byte, each piece before the next is sent, and the
stored record must equal the whole hand-written ``expected.json`` (request included) — the
same record the sans-IO fixture test gets, now through mitmproxy.

SDK facts on this machine (openai 3.x, anthropic 2.x, google-genai 3.x): they use ``httpx2``;
each gets its own ``DefaultHttpxClient`` / ``httpx2.Client`` with the proxy and a TLS context
that trusts only the proxy's CA; ``SSL_CERT_FILE`` (preset here to the system store) is
overridden to the proxy's CA as well; retries are off so one call is one record.

A dialect that is still a placeholder (``tests/e2e/servers.py`` ``dialect_ready``) skips its
cases with the reason.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import subprocess
import time
import uuid
import warnings
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import pytest

from tests.e2e.replay_upstream import FIXTURES, FixtureResponse, ReplayUpstream, case_names, fixture_response
from tests.e2e.servers import NewRecords, ca_context, proxy_env, require_dialect, sse_fields
from tests.wirefeed import assert_matches

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(90),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]  # the SDKs warn about old model names

GAP_MS = 100.0
# Keys of the record that depend only on the response (and the model asked for), so an SDK
# that re-serialises the fixture's request must still give the fixture's expected values.
RESPONSE_KEYS = (
    "request_model",
    "model",
    "request_id",
    "text",
    "blocks",
    "tool_calls",
    "usage",
    "stop_reason",
    "stop_reason_raw",
    "error",
    "outcome",
    "events",
    "violations",
)
SDK_DIALECTS = ("openai.chat", "openai.responses", "anthropic.messages", "gemini")
# Cases where the official SDK's own accumulation differs from the wire (checked to still
# differ; the record is checked against the hand-written expectation instead).
SDK_DIVERGES = {
    "openai.chat/reused_tool_index": "openai 3.51 merges parallel tool calls that all say index 0 (Ollama /v1, "
    "vendor-wire-formats §9) into one call with concatenated ids, names and arguments; "
    "the record keeps the two calls by id",
    "openai.chat/lone_surrogate": "the SDK keeps each half of an emoji split across two deltas (its text holds "
    "the lone surrogates); the record replaces each lone surrogate by U+FFFD and flags it (issue 16)",
    "openai.responses/item_done_not_added": "the SDK drops the text of an output_item.done whose item was never "
    "added; the record keeps it and flags block_not_started (issue 16)",
    "openai.chat/error_field_text": "the SDK ignores the error sent under an `error:` field (as WHATWG says) and "
    "ends without an error; the record's outcome is error with the text (issue 16)",
}
# Recovered framings the official SDK itself cannot read (issue 16): it raises at the broken
# event and closes the connection, so the rest of the body never reaches it. Checked: the SDK
# fails reading (not an API error). The record of these bytes is checked whole by the curl
# replay below and by tests/unit/test_recovered_framings.py.
SDK_CANNOT_READ = {
    "openai.chat/joined_data_lines": "two JSON documents in one event's data: the SDK's JSON decoding fails",
    "anthropic.messages/stop_not_started": "a content_block_stop for a block never started: the SDK's "
    "accumulator fails on the missing block",
    "gemini/error_field_json": "an error sent under an `error:` field: google-genai 3 takes the line for JSON "
    "and fails (UnknownApiResponseError 'Failed to parse response as JSON'); the record's outcome is error "
    "with the code and message",
}


# --------------------------------------------------------------------------------------------
# what an SDK saw


@dataclass
class SdkRun:
    """What one SDK call produced: arrival time of each raw stream item (``time.monotonic()``),
    and the SDK's own accumulation."""

    times: list[float] = field(default_factory=list)
    chunks: list[tuple[float, bytes]] = field(default_factory=list)  # raw body chunks as the SDK's transport got them
    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # {id, name, arguments: str | dict}
    input_tokens: int | None = None
    output_tokens: int | None = None
    # the SDK's other usage counts, by the record's name (only those the SDK's usage type has)
    usage_extra: dict[str, int | None] = field(default_factory=dict)
    choices: list[tuple[int, str, str | None]] | None = None  # (index, text, finish reason) when n > 1
    stop_raw: str | None = None
    error: BaseException | None = None  # what the SDK raised
    error_event: bool = False  # the SDK surfaced an error the API reported in-band, without raising


@dataclass
class Target:
    """Where the SDK sends its request: the replay upstream's TLS origin, through the proxy."""

    origin: str  # https://127.0.0.1:<port>
    proxy_url: str
    ca_path: str
    headers: dict[str, str]  # x-upstream-case, x-upstream-gap-ms, x-test-id

    def transport(self, run: SdkRun) -> Any:
        """The SDK's HTTP transport: through the proxy, trusting only its CA, timestamping every
        raw body chunk into ``run.chunks``."""
        return TimedTransport(self.proxy_url, ca_context(self.ca_path), run.chunks)


def _timed_transport_class() -> type:
    import httpx2

    class _Timed(httpx2.BaseTransport):
        def __init__(self, proxy_url: str, verify: Any, chunks: list[tuple[float, bytes]]):
            self.inner = httpx2.HTTPTransport(proxy=proxy_url, verify=verify, trust_env=False)
            self.chunks = chunks

        def handle_request(self, request: Any) -> Any:
            resp = self.inner.handle_request(request)
            inner, chunks = resp.stream, self.chunks

            class _Stream(httpx2.SyncByteStream):
                def __iter__(self) -> Any:
                    for chunk in inner:
                        chunks.append((time.monotonic(), chunk))
                        yield chunk

                def close(self) -> None:
                    inner.close()

            resp.stream = _Stream()
            return resp

        def close(self) -> None:
            self.inner.close()

    return _Timed


def TimedTransport(proxy_url: str, verify: Any, chunks: list[tuple[float, bytes]]) -> Any:  # noqa: N802 - a class factory
    """An ``httpx2`` transport through ``proxy_url`` that records ``(time.monotonic(), raw
    chunk)`` for every response body chunk (httpx2 is imported lazily: the SDKs bring it)."""
    return _timed_transport_class()(proxy_url, verify, chunks)


def _data_of(piece: bytes) -> str | None:
    values = [v for k, v in sse_fields(piece) if k == "data"]
    return "\n".join(values) if values else None


def _event_of(piece: bytes) -> str | None:
    values = [v for k, v in sse_fields(piece) if k == "event"]
    return values[-1] if values else None


class Driver:
    """One SDK against one dialect's fixtures."""

    dialect = ""

    def applies(self, fx: FixtureResponse) -> bool:
        """Whether the SDK can make this request and read this answer as a stream."""
        req = fx.request_json
        return (
            fx.status == 200
            and fx.end == "eof"
            and fx.content_type.split(";")[0].strip() == "text/event-stream"
            and fx.content_encoding in (None, "gzip", "deflate")
            and isinstance(req, dict)
            and self.route_ok(fx, req)
        )

    def route_ok(self, fx: FixtureResponse, req: dict[str, Any]) -> bool:
        raise NotImplementedError

    def yields(self, piece: bytes) -> bool:
        """Whether the SDK surfaces this wire event as one raw stream item."""
        data = _data_of(piece)
        return data is not None and data != "" and not data.startswith("[DONE]")

    def run(self, fx: FixtureResponse, t: Target) -> SdkRun:
        raise NotImplementedError


def _split(fx: FixtureResponse) -> tuple[str, dict[str, str]]:
    parts = urlsplit(fx.path)
    return parts.path, dict(parse_qsl(parts.query, keep_blank_values=True))


class OpenAIChatDriver(Driver):
    """``openai`` ``chat.completions.stream`` (``AzureOpenAI`` for ``/openai/deployments/...``)."""

    dialect = "openai.chat"

    def yields(self, piece: bytes) -> bool:
        # ``chat.completions.stream`` drops chunks whose ``object`` is not
        # ``chat.completion.chunk`` (Azure's asynchronous-filter annotations).
        if not super().yields(piece):
            return False
        try:
            obj = json.loads(_data_of(piece) or "")
        except ValueError:
            return True
        return not isinstance(obj, dict) or obj.get("object") == "chat.completion.chunk" or "error" in obj

    def route_ok(self, fx: FixtureResponse, req: dict[str, Any]) -> bool:
        path, _ = _split(fx)
        return path.endswith("/chat/completions") and req.get("stream") is True and "messages" in req

    def run(self, fx: FixtureResponse, t: Target) -> SdkRun:
        import openai

        path, query = _split(fx)
        req = dict(fx.request_json)
        out = SdkRun()
        http = openai.DefaultHttpxClient(transport=t.transport(out), trust_env=False)
        if path.startswith("/openai/deployments/"):
            deployment = unquote(path.split("/")[3])
            api_version = query.pop("api-version", "2024-10-21")
            client: Any = openai.AzureOpenAI(
                azure_endpoint=t.origin,
                azure_deployment=deployment,
                api_version=api_version,
                api_key="azure-test-key",
                http_client=http,
                max_retries=0,
                default_headers=t.headers,
            )
            model = req.pop("model", deployment)
        else:
            client = openai.OpenAI(
                base_url=t.origin + path.removesuffix("/chat/completions"),
                api_key="sk-test",
                http_client=http,
                max_retries=0,
                default_headers=t.headers,
            )
            model = req.pop("model")
        messages = req.pop("messages")
        req.pop("stream", None)
        try:
            with client.chat.completions.stream(
                model=model, messages=messages, extra_body=req, extra_query=query or None
            ) as stream:
                try:
                    for ev in stream:
                        if ev.type == "chunk":
                            out.times.append(time.monotonic())
                    final: Any = stream.get_final_completion()
                except openai.LengthFinishReasonError:  # the helper's structured-output check, not a failure
                    final = stream.current_completion_snapshot
                except Exception as e:  # noqa: BLE001 - a mid-stream error: keep what was accumulated
                    out.error = e
                    final = stream.current_completion_snapshot
        finally:
            client.close()
        choices = sorted(final.choices, key=lambda c: c.index)
        out.text = "".join(c.message.content or "" for c in choices)
        for c in choices:
            for tc in c.message.tool_calls or []:
                out.tool_calls.append({"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments})
        if choices:
            out.stop_raw = choices[-1].finish_reason  # the record's message-level reason: the last to finish
        if len(choices) > 1:
            out.choices = [(c.index, c.message.content or "", c.finish_reason) for c in choices]
        if final.usage is not None:
            u = final.usage
            out.input_tokens, out.output_tokens = u.prompt_tokens, u.completion_tokens
            out.usage_extra = {
                "cache_read_input_tokens": u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details else None,
                "reasoning_output_tokens": (
                    u.completion_tokens_details.reasoning_tokens if u.completion_tokens_details else None
                ),
                "total_tokens": u.total_tokens,
            }
        return out


class OpenAIResponsesDriver(Driver):
    """``openai`` ``responses.create(stream=True)``: the SDK's typed events. Text is the SDK's
    ``Response.output_text`` of the terminal event (``response.completed`` / ``.incomplete`` /
    ``.failed``) when it carries output, else the ``response.output_text.delta`` events joined;
    function calls are the terminal response's ``function_call`` items, else those announced by
    ``response.output_item.added`` with their ``function_call_arguments.delta`` fragments.
    (The ``responses.stream`` helper is not used: it refuses a text delta whose output item was
    not announced first, which trimmed captures do.)"""

    dialect = "openai.responses"

    def route_ok(self, fx: FixtureResponse, req: dict[str, Any]) -> bool:
        path, _ = _split(fx)
        return path.endswith("/responses") and req.get("stream") is True

    def run(self, fx: FixtureResponse, t: Target) -> SdkRun:
        import openai

        path, query = _split(fx)
        req = dict(fx.request_json)
        out = SdkRun()
        http = openai.DefaultHttpxClient(transport=t.transport(out), trust_env=False)
        client = openai.OpenAI(
            base_url=t.origin + path.removesuffix("/responses"),
            api_key="sk-test",
            http_client=http,
            max_retries=0,
            default_headers=t.headers,
        )
        model = req.pop("model")
        inp = req.pop("input", None)
        req.pop("stream", None)
        final: Any = None
        deltas: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        try:
            stream = client.responses.create(
                model=model, input=inp, stream=True, extra_body=req, extra_query=query or None
            )
            try:
                for ev in stream:
                    out.times.append(time.monotonic())
                    if ev.type in ("response.completed", "response.incomplete", "response.failed"):
                        final = ev.response
                    elif ev.type == "response.output_text.delta":
                        deltas.append(ev.delta)
                    elif ev.type == "response.output_item.added" and ev.item.type == "function_call":
                        calls[ev.output_index] = {
                            "id": ev.item.call_id,
                            "item_id": ev.item.id,
                            "name": ev.item.name,
                            "arguments": ev.item.arguments or "",
                        }
                    elif ev.type == "response.function_call_arguments.delta" and ev.output_index in calls:
                        calls[ev.output_index]["arguments"] += ev.delta
                    out.error_event |= ev.type in ("error", "response.failed")
            except Exception as e:  # noqa: BLE001 - the SDK could not go on
                out.error = e
            finally:
                stream.close()
        finally:
            client.close()
        if final is not None and final.output:
            out.text = final.output_text
            out.tool_calls = [
                {"id": i.call_id, "item_id": i.id, "name": i.name, "arguments": i.arguments}
                for i in final.output
                if i.type == "function_call"
            ]
        else:
            out.text = "".join(deltas)
            out.tool_calls = [calls[i] for i in sorted(calls)]
        if final is not None and final.usage is not None:
            u = final.usage
            out.input_tokens, out.output_tokens = u.input_tokens, u.output_tokens
            out.usage_extra = {
                "cache_read_input_tokens": u.input_tokens_details.cached_tokens if u.input_tokens_details else None,
                "reasoning_output_tokens": (
                    u.output_tokens_details.reasoning_tokens if u.output_tokens_details else None
                ),
                "total_tokens": u.total_tokens,
            }
        return out


_ANTHROPIC_DERIVED = frozenset({"text", "input_json", "citation", "thinking", "signature", "compaction"})


class AnthropicDriver(Driver):
    """``anthropic`` ``messages.stream`` (its ``MessageStream`` accumulator)."""

    dialect = "anthropic.messages"

    def route_ok(self, fx: FixtureResponse, req: dict[str, Any]) -> bool:
        path, _ = _split(fx)
        return path == "/v1/messages" and req.get("stream") is True and "model" in req

    def yields(self, piece: bytes) -> bool:
        # anthropic's Stream skips events without an ``event`` field, ``ping``, empty data and
        # ``[DONE]``.
        ev = _event_of(piece)
        return ev is not None and ev != "ping" and super().yields(piece)

    def run(self, fx: FixtureResponse, t: Target) -> SdkRun:
        import anthropic

        path, query = _split(fx)
        req = dict(fx.request_json)
        out = SdkRun()
        http = anthropic.DefaultHttpxClient(transport=t.transport(out), trust_env=False)
        client = anthropic.Anthropic(
            base_url=t.origin, api_key="sk-ant-test", http_client=http, max_retries=0, default_headers=t.headers
        )
        model, messages, max_tokens = req.pop("model"), req.pop("messages"), req.pop("max_tokens", 1024)
        req.pop("stream", None)
        msg: Any = None
        try:
            with client.messages.stream(
                model=model, messages=messages, max_tokens=max_tokens, extra_body=req, extra_query=query or None
            ) as stream:
                try:
                    for ev in stream:
                        if ev.type not in _ANTHROPIC_DERIVED:
                            out.times.append(time.monotonic())
                    msg = stream.get_final_message()
                except Exception as e:  # noqa: BLE001 - an ``error`` event: keep the snapshot
                    out.error = e
                    msg = stream._current_snapshot_or_none()
        finally:
            client.close()
        if msg is None:
            return out
        out.text = "".join(b.text for b in msg.content if b.type == "text")
        for b in msg.content:
            if b.type in ("tool_use", "server_tool_use"):
                out.tool_calls.append({"id": b.id, "name": b.name, "arguments": b.input})
        out.input_tokens, out.output_tokens = msg.usage.input_tokens, msg.usage.output_tokens
        out.usage_extra = {
            "cache_read_input_tokens": msg.usage.cache_read_input_tokens,
            "cache_creation_input_tokens": msg.usage.cache_creation_input_tokens,
        }
        out.stop_raw = msg.stop_reason
        return out


class GeminiDriver(Driver):
    """``google-genai`` ``models.generate_content_stream`` on the Gemini API route
    (``/{v1,v1beta}/models/{model}:streamGenerateContent?alt=sse``); no accumulator exists in
    the SDK, so its typed chunks are joined: text parts that are not thoughts, per candidate,
    and every ``function_call`` part."""

    dialect = "gemini"

    def route_ok(self, fx: FixtureResponse, req: dict[str, Any]) -> bool:
        path, query = _split(fx)
        segs = unquote(path).split("/")
        return (
            len(segs) == 4
            and segs[1] in ("v1", "v1beta", "v1alpha")
            and segs[2] == "models"
            and segs[3].endswith(":streamGenerateContent")
            and query.get("alt") == "sse"
            and "contents" in req
        )

    def run(self, fx: FixtureResponse, t: Target) -> SdkRun:
        import httpx2
        from google import genai
        from google.genai import types

        path, _ = _split(fx)
        segs = unquote(path).split("/")
        version, model = segs[1], segs[3].removesuffix(":streamGenerateContent")
        req = dict(fx.request_json)
        config: dict[str, Any] = dict(req.pop("generationConfig", None) or req.pop("generation_config", None) or {})
        for k in (
            "systemInstruction",
            "system_instruction",
            "tools",
            "toolConfig",
            "tool_config",
            "safetySettings",
            "safety_settings",
            "cachedContent",
            "cached_content",
            "labels",
        ):
            if k in req:
                config[k] = req.pop(k)
        out = SdkRun()
        http = httpx2.Client(transport=t.transport(out), trust_env=False, timeout=30.0)
        client = genai.Client(
            api_key="gemini-test-key",
            http_options=types.HttpOptions(
                base_url=t.origin + "/",
                api_version=version,
                headers=t.headers,
                httpx_client=http,
                retry_options=types.HttpRetryOptions(attempts=1),
            ),
        )
        texts: dict[int, list[str]] = {}
        finished: dict[int, str] = {}  # candidate index -> its finish reason
        try:
            stream = client.models.generate_content_stream(
                model=model, contents=req.pop("contents"), config=types.GenerateContentConfig.model_validate(config)
            )
            for chunk in stream:
                out.times.append(time.monotonic())
                for cand in chunk.candidates or []:
                    idx = cand.index or 0
                    for part in cand.content.parts if cand.content and cand.content.parts else []:
                        if part.text and not part.thought:
                            texts.setdefault(idx, []).append(part.text)
                        if part.function_call is not None and part.function_call.name:
                            fc = part.function_call
                            out.tool_calls.append({"id": fc.id, "name": fc.name, "arguments": fc.args})
                    if cand.finish_reason is not None:
                        out.stop_raw = getattr(cand.finish_reason, "value", str(cand.finish_reason))
                        finished[idx] = out.stop_raw
                if chunk.usage_metadata is not None:
                    um = chunk.usage_metadata
                    out.input_tokens = um.prompt_token_count
                    # output = candidates + thoughts (thinking is generated output; the dialect's
                    # documented convention, as Anthropic and OpenAI count it)
                    if um.candidates_token_count is not None or um.thoughts_token_count is not None:
                        out.output_tokens = (um.candidates_token_count or 0) + (um.thoughts_token_count or 0)
                    for key, value in (
                        ("cache_read_input_tokens", um.cached_content_token_count),
                        ("reasoning_output_tokens", um.thoughts_token_count),
                        ("total_tokens", um.total_token_count),
                    ):
                        if value is not None or key not in out.usage_extra:
                            out.usage_extra[key] = value
        except Exception as e:  # noqa: BLE001 - a mid-stream error
            out.error = e
        finally:
            client.close()
            http.close()
        out.text = "".join("".join(texts[i]) for i in sorted(texts))
        if len(finished) > 1:  # candidateCount > 1: each candidate's text and finish reason
            out.choices = [(i, "".join(texts.get(i, [])), finished[i]) for i in sorted(finished)]
        return out


DRIVERS: dict[str, Driver] = {
    d.dialect: d for d in (OpenAIChatDriver(), OpenAIResponsesDriver(), AnthropicDriver(), GeminiDriver())
}


def _sdk_cases() -> list[Any]:
    """(dialect, case) of every fixture an SDK can consume; one skipping entry per dialect
    that has none yet (so the report says why)."""
    out: list[Any] = []
    for dialect in SDK_DIALECTS:
        found = []
        for case in case_names(dialect):
            try:
                fx = fixture_response(dialect, case)
            except FileNotFoundError:
                continue
            if DRIVERS[dialect].applies(fx):
                found.append(pytest.param(dialect, case, id=f"{dialect}/{case}"))
        out += found or [
            pytest.param(
                dialect,
                None,
                id=f"{dialect}/none",
                marks=pytest.mark.skip(reason=f"no {dialect} streaming fixture an SDK can consume yet"),
            )
        ]
    return out


# --------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def replay() -> Any:
    with ReplayUpstream(default_gap_ms=GAP_MS) as up:
        yield up


def _target(replay: ReplayUpstream, proxy: Any, fx: FixtureResponse, tid: str) -> Target:
    headers = {"x-upstream-case": fx.id, "x-upstream-gap-ms": str(GAP_MS), "x-test-id": tid}
    return Target(f"https://127.0.0.1:{replay.https_port}", proxy.proxy_url, proxy.ca_path, headers)


# --------------------------------------------------------------------------------------------
# checks


_BLANK_LINE_END = re.compile(rb"(?:\r\n|\r|\n)(?:\r\n|\r|\n)$")


def assert_bytes_timely(chunks: list[tuple[float, bytes]], ex: Any, who: str, complete: bool = True) -> None:
    """The client's transport got the bytes of every piece the upstream sent before the upstream
    sent the next one (``chunks``: ``(time.monotonic(), raw bytes)`` as received). With
    ``complete`` false (the client stopped reading after an error), only a prefix arrived."""
    got_bytes = b"".join(c for _, c in chunks)
    if complete:
        assert got_bytes == ex.raw_body, (
            f"{who}: received {len(got_bytes)} raw body bytes, the upstream sent {len(ex.raw_body)}"
        )
    else:
        assert ex.raw_body.startswith(got_bytes), f"{who}: the bytes received are not what the upstream sent"
    total, k = 0, 0
    for i, end in enumerate(ex.event_end_offsets[:-1]):
        if end > len(got_bytes):
            break
        while total < end:
            total += len(chunks[k][1])
            k += 1
        late = chunks[k - 1][0] - ex.send_times[i + 1]
        assert late < 0, (
            f"{who}: wire event {i} reached the client {late * 1000:.0f} ms AFTER the upstream sent "
            f"event {i + 1} (held back, not streamed)"
        )


def assert_items_timely(
    times: list[float], ex: Any, yields: Any, who: str, errored: bool, slack_s: float = 0.0
) -> None:
    """The SDK surfaced one stream item per wire event that carries one (a terminated SSE event,
    see ``Driver.yields``), in order, each after its event was sent and before the upstream sent
    the next event (+ ``slack_s``). When the SDK raised a mid-stream error, the event that
    raised it surfaced no item."""
    carrying = [i for i, piece in enumerate(ex.events) if _BLANK_LINE_END.search(piece) and yields(piece)]
    detail = f"(pieces: {[p[:50] for p in ex.events]})"
    if errored:
        assert len(carrying) - 1 <= len(times) <= len(carrying), (
            f"{who} surfaced {len(times)} items for {len(carrying)} events {detail}"
        )
        carrying = carrying[: len(times)]
    else:
        assert len(times) == len(carrying), f"{who} surfaced {len(times)} items for {len(carrying)} events {detail}"
    for k, i in enumerate(carrying):
        assert times[k] >= ex.send_times[i], f"{who}: item {k} surfaced before its event {i} was sent?"
        if i + 1 < len(ex.send_times):
            late = times[k] - ex.send_times[i + 1]
            assert late < slack_s, (
                f"{who}: the item of wire event {i} surfaced {late * 1000:.0f} ms after the upstream sent event {i + 1}"
            )


def is_api_error(e: BaseException) -> bool:
    """An error the SDK raised because the API said so (an error event / payload), as opposed
    to the SDK failing to read the stream."""
    kinds: list[type] = []
    for mod, name in (("openai", "APIError"), ("anthropic", "APIError"), ("google.genai.errors", "APIError")):
        try:
            kinds.append(getattr(__import__(mod, fromlist=[name]), name))
        except (ImportError, AttributeError):
            pass
    return isinstance(e, tuple(kinds)) and not isinstance(e, ValueError)


def _args(v: Any) -> Any:
    if isinstance(v, str):
        try:
            return json.loads(v) if v else None
        except ValueError:
            return v
    return v


def assert_record_equals_sdk(rec: dict[str, Any], run: SdkRun, fx: FixtureResponse) -> None:
    """The record holds what the SDK accumulated. When the SDK itself failed to read the stream
    (not an API error), what it accumulated before failing must be a prefix of the record."""
    partial = run.error is not None and not is_api_error(run.error)
    if partial:
        assert rec["text"].startswith(run.text), f"text: record {rec['text']!r} does not start with SDK {run.text!r}"
    else:
        assert rec["text"] == run.text, f"text: record {rec['text']!r} != SDK {run.text!r}"
    got = rec["tool_calls"]
    if partial:
        got = got[: len(run.tool_calls)]
    assert len(got) == len(run.tool_calls), f"tool calls: record {got!r} != SDK {run.tool_calls!r}"
    for r, s in zip(got, run.tool_calls, strict=True):
        assert r["name"] == s["name"], (r, s)
        assert r["id"] in (s["id"], s.get("item_id")), f"tool call id: record {r['id']!r} != SDK {s['id']!r}"
        if isinstance(s["arguments"], str):
            assert r["arguments"] == s["arguments"], (r, s)  # a string as streamed: byte for byte
        else:
            assert (_args(r["arguments"]) or {}) == (s["arguments"] or {}), (r, s)  # an object: compared parsed
    usage = rec["usage"]
    if run.input_tokens is not None or run.output_tokens is not None:
        assert (usage["input_tokens"], usage["output_tokens"]) == (run.input_tokens, run.output_tokens), (
            f"usage: record {usage} != SDK ({run.input_tokens}, {run.output_tokens})"
        )
    else:
        assert usage["reported"] is False or (usage["input_tokens"], usage["output_tokens"]) == (None, None), usage
    if run.choices is not None:
        got_choices = [(c["index"], c["text"], c["stop_reason_raw"]) for c in rec["choices"] or ()]
        assert got_choices == run.choices, f"choices: record {got_choices} != SDK {run.choices}"
    for key, value in run.usage_extra.items():  # cached, cache-write, reasoning, total: as the SDK's usage object says
        assert usage[key] == value, f"usage.{key}: record {usage[key]!r} != SDK {value!r}"
    if run.stop_raw is not None:
        assert rec["stop_reason_raw"] == run.stop_raw, (
            f"stop: record {rec['stop_reason_raw']!r} != SDK {run.stop_raw!r}"
        )
    if run.error_event or (run.error is not None and is_api_error(run.error)):
        assert rec["outcome"] == "error", f"the SDK raised {run.error!r} but the record's outcome is {rec['outcome']!r}"
        assert rec["error"] is not None
    elif run.error is not None:
        # The SDK could not read what the server sent (a client-side limit, not an API error):
        # the record keeps what was sent; the fixture's expectation decides its outcome.
        warnings.warn(f"{fx.id}: the SDK failed reading the stream: {run.error!r}", stacklevel=1)
    else:
        assert rec["outcome"] in ("completed", "truncated"), rec["outcome"]


# --------------------------------------------------------------------------------------------
# the SDK tests


@pytest.mark.parametrize(("dialect", "case"), _sdk_cases())
def test_sdk_streams_fixture_through_proxy(
    dialect: str, case: str, replay: ReplayUpstream, recorded: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_dialect(dialect)
    pytest.importorskip(
        {
            "openai.chat": "openai",
            "openai.responses": "openai",
            "anthropic.messages": "anthropic",
            "gemini": "google.genai",
        }[dialect]
    )
    monkeypatch.setenv("SSL_CERT_FILE", recorded.ca_path)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(k, raising=False)
    fx = fixture_response(dialect, case)
    driver = DRIVERS[dialect]
    if fx.id in SDK_CANNOT_READ:
        tid = "sdk-broken-" + uuid.uuid4().hex[:12]
        run = driver.run(fx, _target(replay, recorded, fx, tid))
        assert run.error is not None and not is_api_error(run.error), (
            f"the SDK read {fx.id} ({SDK_CANNOT_READ[fx.id]}): check it as the other cases; got {run.error!r}"
        )
        return
    problems: list[str] = []
    for attempt in (1, 2):  # timing only is retried once: this machine's 2 cores are shared
        tid = f"sdk-{attempt}-" + uuid.uuid4().hex[:12]
        records = NewRecords(recorded.api)
        run = driver.run(fx, _target(replay, recorded, fx, tid))
        ex = replay.wait_exchange(tid, timeout=30)
        assert ex.raw_body == fx.body
        rec = records.one()
        late = timing_problems(
            lambda run=run, ex=ex: (
                assert_bytes_timely(run.chunks, ex, f"{dialect} SDK transport", complete=run.error is None),
                assert_items_timely(run.times, ex, driver.yields, f"{dialect} SDK", run.error is not None),
            )
        )
        if late is None:
            break
        problems.append(f"attempt {attempt}: {late}")
        warnings.warn(f"{fx.id}: timing retried once: {late}", stacklevel=1)
    else:
        pytest.fail("events were held back on both attempts:\n" + "\n".join(problems))
    context = f"SDK error: {run.error!r}" if run.error else "SDK finished"
    assert rec["dialect"] == dialect, (rec["dialect"], rec["path"])
    want = {k: v for k, v in fx.expected.items() if k in RESPONSE_KEYS}
    if sum(len(c) for _, c in run.chunks) < len(fx.body):
        # The SDK stopped reading after an error: the record also saw the client go away, so the
        # events after it and the end-of-stream violation cannot match the fixture's.
        for k in ("violations", "events"):
            want.pop(k, None)
    elif run.error is not None and "violations" in want:
        # The SDK read every byte, raised on the error chunk and closed its connection at once:
        # the proxy may see that close before the upstream's end of the body (a race; seen once in
        # CI on gemini/error_chunk), and the record then truly says the client aborted. Exactly that
        # one alternative ending is accepted; everything else must still match.
        ended = {"upstream closed the stream before stream.end": "client aborted before stream.end"}
        if any(v["kind"] == "missing_stream_end" and v["detail"] in ended.values() for v in rec["violations"]):
            want["violations"] = [
                dict(v, detail=ended.get(v["detail"], v["detail"])) if v["kind"] == "missing_stream_end" else v
                for v in want["violations"]
            ]
    try:
        assert_matches(rec, want)
    except AssertionError as e:
        raise AssertionError(f"record differs from {fx.id}.expected.json ({context}): {e}") from e
    if fx.id in SDK_DIVERGES:
        with pytest.raises(AssertionError):
            assert_record_equals_sdk(rec, run, fx)
        pytest.xfail(
            f"the SDK accumulates differently from the record (the record follows the wire): {SDK_DIVERGES[fx.id]}"
        )
    assert_record_equals_sdk(rec, run, fx)


def timing_problems(check: Any) -> str | None:
    """``check()``'s assertion message when it fails, else ``None``."""
    try:
        check()
    except AssertionError as e:
        return str(e).splitlines()[0]
    return None


# --------------------------------------------------------------------------------------------
# curl: every case of every dialect folder, exact request bytes


def _all_cases() -> list[Any]:
    from observer.dialects.registry import default_registry

    names = set(default_registry().names)
    out = []
    for d in sorted(p.name for p in FIXTURES.iterdir() if p.is_dir() and p.name in names):
        for case in case_names(d):
            out.append(pytest.param(d, case, id=f"{d}/{case}"))
    return out


def curl_stream(
    url: str, body: bytes, headers: dict[str, str], proxy_url: str, ca_path: str, timeout: float = 30.0
) -> tuple[int, list[tuple[float, bytes]], str]:
    """``curl -N`` through the proxy; returns (exit code, [(arrival time, stdout bytes)], stderr).
    The response body goes to stdout unbuffered (``-N``), read here as it arrives."""
    argv = [
        "curl",
        "-sS",
        "-N",
        "--http1.1",
        "--proxy",
        proxy_url,
        "--cacert",
        ca_path,
        "--max-time",
        str(int(timeout)),
        "-X",
        "POST",
        "--data-binary",
        "@-",
        "-o",
        "-",
        url,
    ]
    for k, v in headers.items():
        argv += ["-H", f"{k}: {v}"]
    env = proxy_env(proxy_url, ca_path)
    for k in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
        env.pop(k, None)
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert p.stdin is not None and p.stdout is not None and p.stderr is not None
    p.stdin.write(body)
    p.stdin.close()
    chunks: list[tuple[float, bytes]] = []
    deadline = time.monotonic() + timeout + 5
    fd = p.stdout.fileno()
    try:
        while time.monotonic() < deadline:
            r, _, _ = select.select([fd], [], [], 0.5)
            if r:
                data = os.read(fd, 65536)
                if not data:
                    break
                chunks.append((time.monotonic(), data))
        code = p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(5)
    err = p.stderr.read().decode("utf-8", "replace")
    p.stdout.close()
    p.stderr.close()
    return code, chunks, err


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
@pytest.mark.parametrize(("dialect", "case"), _all_cases())
def test_curl_replays_fixture_through_proxy(dialect: str, case: str, replay: ReplayUpstream, recorded: Any) -> None:
    require_dialect(dialect)
    fx = fixture_response(dialect, case)
    if fx.end not in ("eof", "upstream_failed"):
        pytest.skip(f"end={fx.end}: needs the client or the observer to stop mid-stream")
    req_headers = {
        "content-type": "application/json",
        **{k.lower(): v for k, v in fx.meta.get("request_headers", {}).items()},
    }
    problems: list[str] = []
    for attempt in (1, 2):  # timing only is retried once: this machine's 2 cores are shared
        tid = f"curl-{attempt}-" + uuid.uuid4().hex[:12]
        req_headers.update(
            {
                "x-upstream-case": fx.id,
                "x-upstream-gap-ms": str(GAP_MS),
                "x-test-id": tid,
                "accept-encoding": "identity",
            }
        )
        records = NewRecords(recorded.api)
        code, chunks, err = curl_stream(
            f"https://127.0.0.1:{replay.https_port}{fx.path}",
            fx.request,
            req_headers,
            recorded.proxy_url,
            recorded.ca_path,
        )
        ex = replay.wait_exchange(tid, timeout=30)
        rec = records.one()
        body = b"".join(c for _, c in chunks)
        if fx.end == "eof":
            assert code == 0, f"curl exit {code}: {err}"
        assert body == fx.body, f"curl got {len(body)} bytes, the fixture has {len(fx.body)} (curl: {err.strip()})"
        late = timing_problems(lambda chunks=chunks, ex=ex: assert_bytes_timely(chunks, ex, "curl"))
        if late is None:
            break
        problems.append(f"attempt {attempt}: {late}")
        warnings.warn(f"{fx.id}: timing retried once: {late}", stacklevel=1)
    else:
        pytest.fail("events were held back on both attempts:\n" + "\n".join(problems))
    assert rec["dialect"] == dialect
    assert rec["path"].split("?")[0] == fx.path.split("?")[0], rec["path"]
    assert_matches(rec, {k: v for k, v in fx.expected.items() if k != "request"})
    want_req = fx.expected.get("request")
    if want_req is not None:
        differ = {k: (rec["request"].get(k), v) for k, v in want_req.items() if rec["request"].get(k) != v}
        assert not differ, f"stored request differs from {fx.id}.expected.json (got, want): {differ}"


def test_replay_pieces_rebuild_every_fixture() -> None:
    """The replay upstream's pieces of every stored body join to the body byte for byte."""
    for p in FIXTURES.iterdir():
        if p.is_dir():
            for case in case_names(p.name):
                fx = fixture_response(p.name, case)
                assert b"".join(fx.pieces) == fx.body, fx.id
