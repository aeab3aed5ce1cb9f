"""The mitmproxy addon (``observer.capture.hooks``) driven through mitmproxy's own test helpers (``taddons``, ``tflow``):
chunks are returned unchanged (the same object), failures never reach the proxy, non-LLM
flows are streamed and not recorded, and ``response``/``error`` produce the right record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mitmproxy import exceptions, http
from mitmproxy.flow import Error
from mitmproxy.test import taddons, tflow

from observer.capture.hooks import METADATA_KEY, LLMAudit, end_cause_from_error
from observer.capture.tap import StreamTap
from observer.dialects.standard import StandardAdapter
from observer.reassembly import EndCause
from observer.records import Exchange

FIX = Path(__file__).parent.parent / "fixtures" / "wire" / "llm-stream-1.0"
BODY = (FIX / "complete_example.sse").read_bytes()
REQUEST = (FIX / "complete_example.request.json").read_bytes()


class Sink:
    def __init__(self, accept: bool = True) -> None:
        self.records: list[Exchange] = []
        self.accept = accept

    def __call__(self, record: Exchange) -> bool:
        self.records.append(record)
        return self.accept


def llm_flow(content_type: str = "application/llm-request+json; version=1.0; charset=utf-8") -> http.HTTPFlow:
    f = tflow.tflow()
    f.request.method = "POST"
    f.request.host = "llm.example"
    f.request.path = "/v1/stream?key=sk-secret&x=1"
    f.request.headers["content-type"] = content_type
    f.request.content = REQUEST
    return f


def respond(f: http.HTTPFlow, status: int = 200, content_type: str = "text/event-stream") -> None:
    f.response = http.Response.make(status, b"", {"content-type": content_type})
    f.response.stream = False


def open_stream(addon: LLMAudit, f: http.HTTPFlow, status: int = 200, content_type: str = "text/event-stream"):
    """Drives the hooks up to the installed stream callable and returns it."""
    addon.requestheaders(f)
    addon.request(f)
    respond(f, status, content_type)
    addon.responseheaders(f)
    return f.response.stream


def run_stream(addon: LLMAudit, f: http.HTTPFlow, chunks: list[bytes], status: int = 200) -> list[bytes]:
    tap = open_stream(addon, f, status)
    out = []
    for c in chunks:
        r = tap(c)
        assert r is c  # the same object: never rewritten, never b"" for non-empty input
        out.append(r)
    tap(b"")
    return out


def test_complete_stream_is_recorded():
    """A streamed §5.5 example becomes one completed record; credentials in the query are redacted."""
    sink = Sink()
    addon = LLMAudit(sink=sink)
    with taddons.context(addon):
        f = llm_flow()
        run_stream(addon, f, [BODY[:100], BODY[100:101], BODY[101:]])
        addon.response(f)
    (rec,) = sink.records
    d = rec.to_dict()
    assert d["dialect"] == "llm-stream-1.0"
    assert d["path"] == "/v1/stream?key=REDACTED&x=1"
    assert d["host"] == "llm.example"
    assert d["text"] == "The weather in Vienna is 24C and sunny."
    assert d["outcome"] == "completed"
    assert d["usage"] == {
        "input_tokens": 42,
        "output_tokens": 8,
        "cache_read_input_tokens": None,
        "cache_creation_input_tokens": None,
        "reasoning_output_tokens": None,
        "total_tokens": None,
        "details": None,
        "reported": True,
    }
    assert d["response_bytes"] == len(BODY)
    assert d["violations"] == []
    assert METADATA_KEY not in f.metadata  # no reference kept after the flow ended


def test_response_record_is_finished_after_the_hook_returns():
    """mitmproxy sends a streamed response's end to the client after the ``response`` hook, so
    the record is finished a few ms later (``FINISH_DELAY_S``); ``done`` finishes any still
    waiting, once."""
    import asyncio

    async def run() -> list[int]:
        sink = Sink()
        addon = LLMAudit(sink=sink)
        counts = []
        with taddons.context(addon):
            f = llm_flow()
            run_stream(addon, f, [BODY])
            addon.response(f)
            counts.append(len(sink.records))  # the hook returned first
            await asyncio.sleep(0.05)
            counts.append(len(sink.records))
            g = llm_flow()
            run_stream(addon, g, [BODY])
            addon.response(g)
            addon.done()  # before the callback ran
            counts.append(len(sink.records))
            await asyncio.sleep(0.01)  # the cancelled callback adds nothing
            counts.append(len(sink.records))
        assert [r.text for r in sink.records] == ["The weather in Vienna is 24C and sunny."] * 2
        assert [r.outcome for r in sink.records] == ["completed", "completed"]
        return counts

    assert asyncio.run(run()) == [0, 1, 2, 2]


@pytest.mark.parametrize("ctype", ["application/json", "text/plain", ""])
def test_non_llm_flow_streams_and_is_not_recorded(ctype):
    """Other traffic: request and response streamed (never buffered), nothing recorded."""
    assert_unobserved(llm_flow(ctype))


def assert_unobserved(f: http.HTTPFlow) -> None:
    """``f`` through every hook: both directions streamed on, no state kept, no record."""
    sink = Sink()
    addon = LLMAudit(sink=sink)
    with taddons.context(addon):
        addon.requestheaders(f)
        assert f.request.stream is True and METADATA_KEY not in f.metadata
        addon.request(f)
        respond(f, 200, "application/json")
        addon.responseheaders(f)
        assert f.response.stream is True
        addon.response(f)
    assert sink.records == []


def test_media_type_is_case_insensitive():
    sink = Sink()
    addon = LLMAudit(sink=sink)
    with taddons.context(addon):
        f = llm_flow("Application/LLM-Request+JSON")
        run_stream(addon, f, [BODY])
        addon.response(f)
    assert len(sink.records) == 1


def test_exception_in_core_fails_open(monkeypatch):
    """A bug in the core: chunks still pass unchanged, the flow is recorded with observer_error."""
    sink = Sink()
    addon = LLMAudit(sink=sink)
    with taddons.context(addon):
        f = llm_flow()

        def boom(*a, **k):
            raise RuntimeError("boom")

        for name in ("on_message", "on_object", "fast"):  # a bug in the dialect's adapter
            monkeypatch.setattr(StandardAdapter, name, boom)
        tap: StreamTap = open_stream(addon, f)
        chunks = [BODY[:50], BODY[50:]]
        assert [tap(c) for c in chunks] == chunks
        addon.response(f)
    (rec,) = sink.records
    kinds = [v.kind for v in rec.violations]
    assert "observer_error" in kinds
    assert rec.response_bytes == len(BODY)


def test_client_abort_records_partial_text():
    sink = Sink()
    addon = LLMAudit(sink=sink)
    with taddons.context(addon):
        f = llm_flow()
        cut = BODY.index(b"event: content.delta", BODY.index(b'" weather"'))
        open_stream(addon, f)(BODY[:cut])
        f.error = Error("Client disconnected.")
        addon.error(f)
    (rec,) = sink.records
    assert rec.outcome == "client_aborted"
    assert rec.text == "The weather"
    assert rec.transport_error == "Client disconnected."
    assert [v.kind for v in rec.violations] == ["missing_stream_end"]


def test_upstream_failure_is_truncated():
    sink = Sink()
    addon = LLMAudit(sink=sink)
    with taddons.context(addon):
        f = llm_flow()
        open_stream(addon, f)(BODY[:400])
        f.error = Error(
            "HTTP/1 protocol error: peer closed connection without sending complete message body "
            "(incomplete chunked read)"
        )
        addon.error(f)
    (rec,) = sink.records
    assert rec.outcome == "truncated"


def test_error_before_response_headers():
    """Upstream unreachable: no response at all -> outcome error, code no_response."""
    sink = Sink()
    addon = LLMAudit(sink=sink)
    with taddons.context(addon):
        f = llm_flow()
        addon.requestheaders(f)
        addon.request(f)
        f.error = Error("Connection refused")
        addon.error(f)
    (rec,) = sink.records
    assert rec.outcome == "error"
    assert rec.error.code == "no_response"
    assert rec.request.model == "example-model"


def test_http_error_keeps_body():
    sink = Sink()
    addon = LLMAudit(sink=sink)
    with taddons.context(addon):
        f = llm_flow()
        body = b'{"error":{"code":"rate_limited","message":"slow down"}}'
        open_stream(addon, f, 429, "application/json")(body)
        addon.response(f)
    (rec,) = sink.records
    assert rec.outcome == "http_error"
    assert rec.status_code == 429
    assert rec.response_body == body.decode()
    assert rec.violations == []


def test_dropped_records_are_counted():
    addon = LLMAudit(sink=Sink(accept=False))
    with taddons.context(addon):
        f = llm_flow()
        run_stream(addon, f, [BODY])
        addon.response(f)
    assert (addon.records_submitted, addon.records_dropped) == (0, 1)


def test_invalid_option_is_rejected():
    addon = LLMAudit(sink=Sink())
    with taddons.context(addon) as tctx:
        with pytest.raises(exceptions.OptionsError):
            tctx.configure(addon, observer_max_event_bytes=0)


def test_oversize_request_by_content_length_streams_request():
    sink = Sink()
    addon = LLMAudit(sink=sink)
    with taddons.context(addon) as tctx:
        tctx.configure(addon, observer_max_request_bytes=100)
        f = llm_flow()
        addon.requestheaders(f)
        assert f.request.stream is True
        respond(f)
        addon.responseheaders(f)
        f.response.stream(BODY)
        addon.response(f)
    (rec,) = sink.records
    assert rec.violations[0].kind == "oversize_request"
    assert rec.text == "The weather in Vienna is 24C and sunny."


@pytest.mark.parametrize(
    ("msg", "client_closed", "server_closed", "cause"),
    [
        ("Client disconnected.", True, True, EndCause.CLIENT_ABORTED),
        ("stream reset by client (CANCEL)", False, False, EndCause.CLIENT_ABORTED),
        ("stream reset by client (INTERNAL_ERROR)", False, False, EndCause.UPSTREAM_FAILED),
        ("peer closed connection", False, True, EndCause.UPSTREAM_FAILED),
        ("peer closed connection", True, False, EndCause.CLIENT_ABORTED),  # h2 client closed its TCP connection
        ("peer closed connection", False, False, EndCause.UPSTREAM_FAILED),
    ],
)
def test_end_cause_from_error(msg, client_closed, server_closed, cause):
    """mitmproxy's free-text error messages (shared reference §2.4) classified by prefix, and
    HTTP/2's ambiguous "peer closed connection" by which connection closed."""
    assert end_cause_from_error(msg, client_closed=client_closed, server_closed=server_closed) is cause


def test_shutdown_records_open_streams_as_interrupted():
    """Streams still open when the proxy stops are recorded (outcome interrupted) before the
    writer closes; a late error hook for the same flow adds nothing (trial finding: records
    of in-flight streams were lost on every restart)."""
    sink = Sink()
    addon = LLMAudit(sink=sink)
    with taddons.context(addon):
        f = llm_flow()
        open_stream(addon, f)(BODY[: BODY.index(b"event: content.delta", BODY.index(b'" weather"'))])
        waiting = llm_flow()  # sent, no response headers yet
        addon.requestheaders(waiting)
        addon.request(waiting)
        addon.done()
        f.error = Error("Client disconnected.")
        addon.error(f)
    assert sorted(r.outcome for r in sink.records) == ["interrupted", "interrupted"]
    streamed = next(r for r in sink.records if r.response_bytes)
    assert streamed.text == "The weather"
    assert [v.kind for v in streamed.violations] == ["missing_stream_end"]
    assert streamed.violations[0].detail == "observer shut down before stream.end"
    unanswered = next(r for r in sink.records if not r.response_bytes)
    assert unanswered.request_id == "550e8400-e29b-41d4-a716-446655440000"  # from metadata


def test_oversize_request_records_its_size():
    sink = Sink()
    addon = LLMAudit(sink=sink)
    with taddons.context(addon) as tctx:
        tctx.configure(addon, observer_max_request_bytes=100)
        f = llm_flow()
        run_stream(addon, f, [BODY])
        addon.response(f)
    assert sink.records[0].request.body_bytes == len(REQUEST)


def test_compressed_request_bomb_is_not_inflated():
    """Trial finding: a 1 MB gzip request expanding to 1 GiB stalled the proxy 4.5 s. Now the
    request is decoded with bounded output and flagged oversize_request."""
    import gzip

    sink = Sink()
    addon = LLMAudit(sink=sink)
    with taddons.context(addon) as tctx:
        tctx.configure(addon, observer_max_request_bytes=1 << 20)
        f = llm_flow()
        f.request.headers["content-encoding"] = "gzip"
        f.request.raw_content = gzip.compress(b" " * (64 << 20))
        run_stream(addon, f, [BODY])
        addon.response(f)
    (rec,) = sink.records
    assert rec.violations[0].kind == "oversize_request"
    assert "decompression" in rec.violations[0].detail or "exceed" in rec.violations[0].detail
    assert rec.request.model is None
    assert rec.text == "The weather in Vienna is 24C and sunny."


def test_compressed_request_is_decoded():
    import gzip

    sink = Sink()
    addon = LLMAudit(sink=sink)
    with taddons.context(addon):
        f = llm_flow()
        f.request.headers["content-encoding"] = "gzip"
        f.request.raw_content = gzip.compress(REQUEST)
        run_stream(addon, f, [BODY])
        addon.response(f)
    assert sink.records[0].request.model == "example-model"
    assert sink.records[0].violations == []


def test_response_bomb_stops_observation_not_the_stream():
    """A gzip response expanding far beyond max_decode_ratio: observation stops with a
    content_decoding_error, every chunk still passes unchanged."""
    import zlib

    sink = Sink()
    addon = LLMAudit(sink=sink)
    comp = zlib.compressobj(wbits=31)
    wire = comp.compress(BODY + b": pad\n" * (8 << 20)) + comp.flush()
    with taddons.context(addon):
        f = llm_flow()
        addon.requestheaders(f)
        addon.request(f)
        f.response = http.Response.make(200, b"", {"content-type": "text/event-stream", "content-encoding": "gzip"})
        addon.responseheaders(f)
        chunks = [wire[i : i + 16384] for i in range(0, len(wire), 16384)]
        assert [f.response.stream(c) for c in chunks] == chunks
        addon.response(f)
    (rec,) = sink.records
    assert [v.kind for v in rec.violations] == ["content_decoding_error"]
    assert rec.outcome == "unreadable"
    assert rec.response_bytes == len(wire)


def test_chunked_upload_is_streamed_with_a_bounded_copy():
    """Trial finding: a 400 MB chunked upload was buffered whole. A request without a declared
    size is streamed; the record parses a bounded copy."""
    from observer.capture.request import RequestTap

    sink = Sink()
    addon = LLMAudit(sink=sink)
    with taddons.context(addon):
        f = llm_flow()
        del f.request.headers["content-length"]
        f.request.headers["transfer-encoding"] = "chunked"
        addon.requestheaders(f)
        tap = f.request.stream
        assert isinstance(tap, RequestTap)
        pieces = [REQUEST[:100], REQUEST[100:]]
        out = [tap(p) for p in pieces]
        assert all(o is p for o, p in zip(out, pieces, strict=True))  # forwarded unchanged, same objects
        f.request.raw_content = None
        addon.request(f)
        respond(f)
        addon.responseheaders(f)
        f.response.stream(BODY)
        addon.response(f)
    (rec,) = sink.records
    assert rec.request.model == "example-model"
    assert rec.violations == []


def test_chunked_upload_over_the_cap_is_counted_not_kept():
    from observer.capture.request import RequestTap

    sink = Sink()
    addon = LLMAudit(sink=sink)
    with taddons.context(addon) as tctx:
        tctx.configure(addon, observer_max_request_bytes=100)
        f = llm_flow()
        del f.request.headers["content-length"]
        addon.requestheaders(f)
        tap: RequestTap = f.request.stream
        for i in range(0, len(REQUEST), 50):
            tap(REQUEST[i : i + 50])
        f.request.raw_content = None
        addon.request(f)
        respond(f)
        addon.responseheaders(f)
        addon.response(f)
    (rec,) = sink.records
    assert rec.request.body_bytes == len(REQUEST)
    assert rec.violations[0].kind == "oversize_request"


def test_client_disconnect_finishes_flows_mitmproxy_never_ended():
    """Trial finding: HTTP/2 streams reset before their request completed got no response or
    error hook; their state leaked until shutdown. The client's disconnect now ends them."""
    sink = Sink()
    addon = LLMAudit(sink=sink)
    with taddons.context(addon):
        f = llm_flow()
        addon.requestheaders(f)
        other = llm_flow()  # another client's flow stays open
        addon.requestheaders(other)
        addon.client_disconnected(f.client_conn)
        assert [r.outcome for r in sink.records] == ["client_aborted"]
        assert sink.records[0].transport_error == "client disconnected"
        f.error = Error("Client disconnected.")
        addon.error(f)  # a late hook adds nothing
        assert len(sink.records) == 1
        addon.done()
    assert [r.outcome for r in sink.records] == ["client_aborted", "interrupted"]


def test_upload_cut_before_the_body_was_complete_is_recorded():
    """Trial finding: a chunked upload to an unreachable upstream was recorded with an empty
    request and no violation. The record now says the body never arrived whole, with the bytes
    the streamed upload had passed on."""
    sink = Sink()
    addon = LLMAudit(sink=sink)
    with taddons.context(addon):
        f = llm_flow()
        del f.request.headers["content-length"]
        f.request.headers["transfer-encoding"] = "chunked"
        addon.requestheaders(f)
        f.request.stream(b"{bad")  # 4 bytes passed on, then the upstream connection fails
        f.error = Error("Connection refused")
        addon.error(f)  # no request hook: the body never completed
    (rec,) = sink.records
    assert rec.outcome == "error" and rec.error.code == "no_response"
    assert rec.request.body_bytes == 4
    assert [(v.kind, v.detail) for v in rec.violations] == [
        ("incomplete_request", "exchange ended before the request body was complete (4 bytes received); not parsed")
    ]


def test_buffered_body_that_never_completed_is_recorded():
    sink = Sink()
    addon = LLMAudit(sink=sink)
    with taddons.context(addon):
        f = llm_flow()
        addon.requestheaders(f)  # Content-Length declared: mitmproxy buffers; the request hook never comes
        f.error = Error("Client disconnected.")
        addon.error(f)
    (rec,) = sink.records
    assert rec.outcome == "client_aborted"
    assert rec.request.body_bytes == 0 and rec.request.model is None
    assert [(v.kind, v.detail) for v in rec.violations] == [
        ("incomplete_request", "exchange ended before the request body was complete; not parsed")
    ]


def test_complete_request_has_no_incomplete_request_violation():
    sink = Sink()
    addon = LLMAudit(sink=sink)
    with taddons.context(addon):
        f = llm_flow()
        addon.requestheaders(f)
        addon.request(f)
        f.error = Error("Connection refused")
        addon.error(f)
    (rec,) = sink.records
    assert all(v.kind != "incomplete_request" for v in rec.violations)


def test_credentials_in_the_request_body_are_redacted():
    """An OpenAI-compatible gateway's ``api_key`` in the body and a credential in ``metadata``
    are stored as ``REDACTED``; ordinary parameters, and a schema that declares a ``password``
    property, are kept (trial finding: ``api_key`` was stored verbatim)."""
    sink = Sink()
    addon = LLMAudit(sink=sink)
    body = (
        b'{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}],'
        b'"api_key":"sk-live-abc","prompt_cache_key":"u-1","max_tokens":9,'
        b'"response_format":{"type":"json_schema","json_schema":{"name":"s","schema":{"type":"object",'
        b'"properties":{"password":{"type":"string"}}}}},'
        b'"metadata":{"aws_session_token":"FwoG-1","team":"red"}}'
    )
    with taddons.context(addon):
        f = llm_flow("application/json")
        f.request.host = "api.openai.com"
        f.request.path = "/v1/chat/completions"
        f.request.content = body
        run_stream(addon, f, [(FIX.parent / "openai.chat" / "text_include_usage.sse").read_bytes()])
        addon.response(f)
    (rec,) = sink.records
    req = rec.to_dict()["request"]
    assert rec.dialect == "openai.chat"
    assert req["parameters"] == {
        "api_key": "REDACTED",
        "prompt_cache_key": "u-1",
        "max_tokens": 9,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "s", "schema": {"type": "object", "properties": {"password": {"type": "string"}}}},
        },
    }
    assert req["metadata"] == {"aws_session_token": "REDACTED", "team": "red"}


def test_an_upstream_error_that_echoes_a_redacted_credential_is_scrubbed():
    """Trial finding: a 422 that quoted the request (FastAPI/pydantic ``extra_forbidden``) kept
    the ``api_key`` value in ``response_body``."""
    sink = Sink()
    addon = LLMAudit(sink=sink)
    echo = (
        b'{"detail":[{"type":"extra_forbidden","loc":["body","api_key"],'
        b'"msg":"Extra inputs are not permitted","input":"sk-live-abc123"}]}'
    )
    with taddons.context(addon):
        f = llm_flow("application/json")
        f.request.host = "api.openai.com"
        f.request.path = "/v1/chat/completions"
        f.request.content = b'{"model":"m","stream":true,"messages":[],"api_key":"sk-live-abc123"}'
        tap = open_stream(addon, f, status=422, content_type="application/json")
        assert tap(echo) is echo
        tap(b"")
        addon.response(f)
    (rec,) = sink.records
    assert rec.outcome == "http_error"
    assert rec.request.parameters == {"api_key": "REDACTED"}
    assert rec.response_body == (
        '{"detail":[{"type":"extra_forbidden","loc":["body","api_key"],'
        '"msg":"Extra inputs are not permitted","input":"REDACTED"}]}'
    )


def test_request_parameters_too_big_to_check_for_credentials_are_dropped_with_a_violation():
    """Bounded work on the proxy's loop: a part with more than ``MAX_FIELDS`` values is not
    walked; it is stored empty and the record says why."""
    import json

    from observer.redact import MAX_CHARS, MAX_FIELDS

    doc = json.loads(REQUEST)
    doc["parameters"] = {f"p{i}": i for i in range(MAX_FIELDS + 1)}
    sink = Sink()
    addon = LLMAudit(sink=sink)
    with taddons.context(addon):
        f = llm_flow()
        f.request.content = json.dumps(doc).encode()
        run_stream(addon, f, [BODY])
        addon.response(f)
    (rec,) = sink.records
    assert rec.request.parameters == {}
    assert rec.request.metadata["request_id"] == "550e8400-e29b-41d4-a716-446655440000"
    assert rec.text == "The weather in Vienna is 24C and sunny."
    assert [(v.kind, v.detail) for v in rec.violations] == [
        (
            "oversize_request",
            f"request parameters: more than {MAX_FIELDS} values or {MAX_CHARS} characters; "
            "not kept (not checked for credentials in bounded time)",
        )
    ]


def test_the_dialect_registry_option_chooses_the_dialects():
    """``observer_dialect_registry`` names the registry factory: with one that knows only OpenAI
    chat, a draft-format request passes unobserved; a name that cannot be imported is refused."""
    addon = LLMAudit(sink=Sink())
    with taddons.context(addon) as tctx:
        f = llm_flow()
        addon.requestheaders(f)
        assert METADATA_KEY in f.metadata  # the default registry knows the draft's media type
        tctx.configure(addon, observer_dialect_registry="tests.unit.test_capture:only_openai_chat")
        g = llm_flow()
        addon.requestheaders(g)
        assert METADATA_KEY not in g.metadata and g.request.stream is True
        with pytest.raises(exceptions.OptionsError, match="observer_dialect_registry: ModuleNotFoundError"):
            tctx.configure(addon, observer_dialect_registry="no_such_module:registry")
        with pytest.raises(exceptions.OptionsError, match="observer_dialect_registry must be"):
            tctx.configure(addon, observer_dialect_registry="not a name")


def test_without_a_sink_the_addon_writes_to_its_store(tmp_path):
    """No ``sink``: ``running`` migrates the ``observer_db`` store and starts the writer; the
    stream's record is in the store once ``done`` has closed it."""
    from observer.store.store import AuditStore

    url = f"sqlite:///{tmp_path / 'audit.db'}"
    addon = LLMAudit(worker=False)
    with taddons.context(addon) as tctx:
        tctx.configure(addon, observer_db=url, observer_gc_freeze=False, observer_journal_dir=str(tmp_path / "j"))
        addon.running()
        f = llm_flow()
        run_stream(addon, f, [BODY])
        addon.response(f)
        addon.done()
    store = AuditStore(url)
    try:
        (item,), _ = store.list()
        rec = store.get(item["id"])
    finally:
        store.dispose()
    assert (rec["text"], rec["outcome"], rec["path"]) == (
        "The weather in Vienna is 24C and sunny.",
        "completed",
        "/v1/stream?key=REDACTED&x=1",
    )
    assert addon.records_submitted == 1 and addon.records_dropped == 0


@pytest.mark.parametrize(
    ("where", "secret"),
    [
        ("query", "AIzaSyQUERYsecret0123456789abcdefghijk"),
        ("header", "hdr-secret-value-0123456789"),
        ("unparsed body", "sk-bodySECRETunparsed0123456789"),
    ],
)
def test_credentials_echoed_in_an_error_body_are_not_stored(where, secret):
    """Trial findings: an upstream's 422 that quotes the request kept a credential from the URL
    query, from a header, or from a body the observer could not parse. Now the query's and the
    headers' values are scrubbed like the body's, and anything shaped like a key goes too."""
    sink = Sink()
    addon = LLMAudit(sink=sink)
    with taddons.context(addon):
        f = llm_flow("application/json")
        f.request.host = "api.openai.com"
        f.request.path = "/v1/chat/completions"
        f.request.content = b'{"model":"m","stream":true,"messages":[]}'
        if where == "query":
            f.request.path += f"?key={secret}"
        elif where == "header":
            f.request.headers["authorization"] = f"Bearer {secret}"
        else:
            f.request.content = b'{"model":"m","api_key":"' + secret.encode() + b'","metadata":' + b"[" * 1100
        echo = f'{{"detail":"bad request","input":{{"url":"{f.request.path}","auth":"{secret}"}}}}'.encode()
        tap = open_stream(addon, f, status=422, content_type="application/json")
        assert tap(echo) == echo  # passed on unchanged (metadata only: counted, not read)
        addon.response(f)
    (rec,) = sink.records
    assert rec.outcome == "http_error"
    assert secret not in (rec.response_body or "") and secret not in rec.path
    if where == "unparsed body":  # not JSON: not an LLM request, metadata only (neither body kept)
        assert rec.response_body is None and rec.response_bytes == len(echo)
        assert [v.kind for v in rec.violations] == ["not_llm_request"]
    else:
        assert "REDACTED" in rec.response_body


BUILT: list[int] = []


def counted_registry():
    """A registry factory that counts its calls (``test_the_registry_is_built_once``)."""
    from observer.dialects.registry import default_registry

    BUILT.append(1)
    return default_registry()


def test_the_registry_is_built_once_per_change():
    """The named registry is built when the option changes, not again on every later
    ``configure`` (start-up used to build it twice: once to check it, once to use it)."""
    BUILT.clear()
    addon = LLMAudit(sink=Sink())
    with taddons.context(addon) as tctx:
        tctx.configure(addon, observer_dialect_registry="tests.unit.test_addon:counted_registry")
        tctx.configure(addon, observer_max_event_bytes=4096)
        tctx.configure(addon, observer_tap_batch_ms=10)
    assert len(BUILT) == 1


def test_fail_closed_refuses_llm_requests_while_recording_fails(tmp_path):
    """``fail_closed``: while the journal would drop records (here: marked full), an LLM request
    gets the proxy's own 503 with a JSON body saying why, and is not recorded; other traffic
    passes; once the journal accepts again, LLM requests pass too. Without ``fail_closed`` the
    request passes (and its record is counted in a gap)."""
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    addon = LLMAudit(worker=False)
    with taddons.context(addon) as tctx:
        tctx.configure(
            addon,
            observer_db=url,
            observer_gc_freeze=False,
            observer_journal_dir=str(tmp_path / "j"),
            observer_fail_closed=True,
        )
        addon.running()
        journal = addon._journal
        journal._full = True  # what a round sets when the spool is full
        f = llm_flow()
        addon.requestheaders(f)
        assert f.response is not None and f.response.status_code == 503
        assert json.loads(f.response.content)["error"]["type"] == "recording_unavailable"
        assert f.response.headers["retry-after"] == "5"
        assert METADATA_KEY not in f.metadata and addon.refused_requests == 1
        other = tflow.tflow()
        addon.requestheaders(other)
        assert other.response is None  # not an LLM request: untouched
        journal._full = False
        g = llm_flow()
        addon.requestheaders(g)
        assert g.response is None and METADATA_KEY in g.metadata
        tctx.configure(addon, observer_fail_closed=False)
        journal._full = True
        h = llm_flow()
        addon.requestheaders(h)
        assert h.response is None and addon.refused_requests == 1
        journal._full = False
        addon.done()


# ----- issue 14: which traffic is recorded, which connections are intercepted or refused -----

SURVEY = b'{"survey":"hr-2026","responses":[{"q":"How is your manager?","a":"Fine"}]}'


def vendor_flow(host: str, path: str, body: bytes) -> http.HTTPFlow:
    f = tflow.tflow()
    f.request.method, f.request.host, f.request.port, f.request.path = "POST", host, 443, path
    f.request.headers["content-type"] = "application/json"
    f.request.content = body
    return f


@pytest.mark.parametrize(
    ("host", "path", "body"),
    [
        ("intranet.corp.example", "/hr/survey/responses", SURVEY),
        ("chat.corp.example", "/api/chat", b'{"channel":"devs","text":"lunch?"}'),
        ("intranet.corp.example", "/v1/chat/completions", b'{"model":"m","messages":[]}'),
    ],
)
def test_a_vendor_path_on_a_host_that_is_not_an_llm_host_is_not_recorded(host, path, body):
    """Issue 14 item 8, trial finding: an HR survey posted to /hr/survey/responses was stored as
    openai.responses. Off the LLM host list nothing is classified: both directions stream on."""
    assert_unobserved(vendor_flow(host, path, body))


def test_the_draft_media_type_is_recorded_from_any_host():
    sink = Sink()
    addon = LLMAudit(sink=sink)
    with taddons.context(addon):
        f = llm_flow()
        f.request.host = "intranet.corp.example"
        run_stream(addon, f, [BODY])
        addon.response(f)
    (rec,) = sink.records
    assert (rec.dialect, rec.host, rec.outcome) == ("llm-stream-1.0", "intranet.corp.example", "completed")


def test_a_near_miss_on_an_llm_host_is_metadata_only():
    """An LLM host and path, not the dialect's request shape: the record says that it happened
    (host, path, status, times) and why, and holds nothing of either body."""
    sink = Sink()
    addon = LLMAudit(sink=sink)
    with taddons.context(addon):
        f = vendor_flow("api.openai.com", "/v1/responses", SURVEY)
        addon.requestheaders(f)
        addon.request(f)
        respond(f, 200, "application/json")
        addon.responseheaders(f)
        stream = f.response.stream
        assert callable(stream)  # not read: passed on unchanged, only counted
        assert stream(b'{"survey": "thanks"}') == b'{"survey": "thanks"}' and stream(b"") == b""
        addon.response(f)
    (rec,) = sink.records
    d = rec.to_dict()
    assert (d["dialect"], d["host"], d["path"], d["status_code"]) == (
        "openai.responses",
        "api.openai.com",
        "/v1/responses",
        200,
    )
    assert d["outcome"] == "unreadable"
    assert d["request"]["body_bytes"] == len(SURVEY)
    assert (d["request"]["messages"], d["request"]["parameters"], d["request"]["model"]) == ([], {}, None)
    # the size as it passed (trial finding: 0), nothing of it kept
    assert (d["response_body"], d["text"], d["blocks"], d["response_bytes"]) == (None, "", [], 20)
    assert d["violations"] == [
        {"kind": "not_llm_request", "seq": None, "detail": "no model string; recorded as metadata only"}
    ]
    assert "hr-2026" not in json.dumps(d)


def test_a_near_miss_answered_with_an_error_is_an_http_error():
    sink = Sink()
    addon = LLMAudit(sink=sink)
    with taddons.context(addon):
        f = vendor_flow("api.anthropic.com", "/v1/messages", b'{"model":"claude"}')
        addon.requestheaders(f)
        addon.request(f)
        respond(f, 400, "application/json")
        addon.responseheaders(f)
        addon.response(f)
    (rec,) = sink.records
    assert (rec.outcome, rec.status_code, [v.kind for v in rec.violations]) == ("http_error", 400, ["not_llm_request"])


def test_an_operator_host_is_an_llm_host():
    sink = Sink()
    addon = LLMAudit(sink=sink)
    with taddons.context(addon) as tctx:
        tctx.configure(addon, observer_llm_hosts_extra="*.corp.example")
        f = vendor_flow("gw.corp.example", "/v1/chat/completions", b'{"model":"m","messages":[]}')
        addon.requestheaders(f)
        assert METADATA_KEY in f.metadata
        tctx.configure(addon, observer_llm_hosts="api.openai.com", observer_llm_hosts_extra="")
        g = vendor_flow("gw.corp.example", "/v1/chat/completions", b'{"model":"m","messages":[]}')
        addon.requestheaders(g)
        assert METADATA_KEY not in g.metadata
        with pytest.raises(
            exceptions.OptionsError, match="observer_llm_hosts_extra: 'http://x/' is not a host pattern"
        ):
            tctx.configure(addon, observer_llm_hosts_extra="http://x/")


def hello(sni: str | None, address: tuple[str, int] | None):
    from types import SimpleNamespace

    return SimpleNamespace(
        context=SimpleNamespace(server=SimpleNamespace(address=address)),
        client_hello=SimpleNamespace(sni=sni),
        ignore_connection=False,
    )


@pytest.mark.parametrize(
    ("sni", "address", "intercepted"),
    [
        ("api.openai.com", ("api.openai.com", 443), True),
        ("www.bank.example", ("www.bank.example", 443), False),
        (None, ("www.bank.example", 443), False),
        ("api.anthropic.com", ("160.79.104.10", 443), True),  # CONNECT to an address, SNI names the host
        (None, ("myres.openai.azure.com", 443), True),
        ("myres.openai.azure.com", None, True),  # (transparent mode: SNI only)
        (None, None, False),
    ],
)
def test_tls_to_a_host_that_is_not_an_llm_host_is_not_intercepted(sni, address, intercepted):
    addon = LLMAudit(sink=Sink())
    with taddons.context(addon):
        data = hello(sni, address)
        addon.tls_clienthello(data)
        assert data.ignore_connection is (not intercepted)


def test_intercept_all_intercepts_every_host():
    addon = LLMAudit(sink=Sink())
    with taddons.context(addon) as tctx:
        tctx.configure(addon, observer_intercept="all")
        data = hello("www.bank.example", ("www.bank.example", 443))
        addon.tls_clienthello(data)
        assert data.ignore_connection is False


def connection(address: tuple[str, int], peer: tuple[str, int] | None = None):
    from types import SimpleNamespace

    return SimpleNamespace(
        server=SimpleNamespace(address=address, via=None, error=None, peername=peer, id=f"s-{address}"),
        client=SimpleNamespace(peername=("192.0.2.7", 50000), id=f"c-{address}"),
    )


def test_the_proxy_refuses_loopback_metadata_and_its_own_database():
    """Trial finding: ``CONNECT 127.0.0.1:5432`` through the proxy reached the audit database.
    Refused by default; ``proxy_allow_loopback`` opens loopback, never the database."""
    import asyncio

    addon = LLMAudit(sink=Sink())

    async def errors(*addresses: tuple[str, int]) -> list[str | None]:
        out = []
        for address in addresses:
            data = connection(address)
            await addon.server_connect(data)
            out.append(data.server.error)
        return out

    with taddons.context(addon) as tctx:
        tctx.configure(addon, observer_db="postgresql+psycopg://u@127.0.0.1:5432/test")
        db, other, meta, public = asyncio.run(
            errors(("127.0.0.1", 5432), ("localhost", 40000), ("169.254.169.254", 80), ("192.0.2.1", 443))
        )
        assert "a protected port of this host" in db
        assert "a loopback address of the proxy's host" in other
        assert "the cloud metadata service" in meta
        assert public is None
        tctx.configure(addon, observer_proxy_allow_loopback=True)
        db, other, meta, public = asyncio.run(
            errors(("127.0.0.1", 5432), ("localhost", 40000), ("169.254.169.254", 80), ("192.0.2.1", 443))
        )
        assert "a protected port of this host" in db
        assert (other, public) == (None, None)
        assert "the cloud metadata service" in meta
    assert addon.refused_connections == 5


def test_a_refused_connect_is_answered_403_before_any_connection():
    """``http_connect``: the refusal is the proxy's answer to the CONNECT (403, the reason as
    text), so mitmproxy never tries the upstream; an allowed target is checked once, not again
    by the ``server_connect`` of the same client connection."""
    import asyncio

    addon = LLMAudit(sink=Sink())

    def connect(host: str, port: int):
        flow = tflow.tflow()
        flow.request.method, flow.request.host, flow.request.port = "CONNECT", host, port
        asyncio.run(addon.http_connect(flow))
        return flow

    with taddons.context(addon) as tctx:
        tctx.configure(addon, observer_db="postgresql+psycopg://u@127.0.0.1:5432/test")
        refused = connect("127.0.0.1", 5432)
        assert refused.response.status_code == 403
        assert refused.response.headers["content-type"] == "text/plain; charset=utf-8"
        assert refused.response.text == (
            "The audit proxy does not connect to 127.0.0.1:5432: a protected port of this host"
            " (the observer's own, or protected_upstreams).\n"
        )
        allowed = connect("192.0.2.1", 443)
        assert allowed.response is None
        data = connection(("192.0.2.1", 443))
        data.client.id = allowed.client_conn.id
        asyncio.run(addon.server_connect(data))
        assert data.server.error is None and addon._connect_allowed == {}
    assert addon.refused_connections == 1


def test_a_name_that_rebinds_to_loopback_after_the_check_is_refused_when_connected():
    """DNS rebinding: allowed when checked, loopback when connected. The connection is marked
    failed (mitmproxy answers its requests with the error) and its flows are killed."""
    import asyncio

    addon = LLMAudit(sink=Sink())
    with taddons.context(addon):
        data = connection(("rebind.example", 443), peer=("127.0.0.1", 443))
        data.server.address = ("192.0.2.1", 443)  # what the check saw
        asyncio.run(addon.server_connect(data))
        assert data.server.error is None
        data.server.address = ("rebind.example", 443)
        addon.server_connected(data)
        assert "127.0.0.1" in data.server.error and "loopback" in data.server.error
        f = llm_flow()
        f.server_conn.id = data.server.id
        addon.requestheaders(f)
        assert f.error is not None and f.error.msg == "Connection killed."
        addon.server_disconnected(data)
        g = llm_flow()
        g.server_conn.id = data.server.id
        addon.requestheaders(g)
        assert g.error is None
