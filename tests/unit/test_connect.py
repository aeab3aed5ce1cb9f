"""Connect / gRPC observation: the envelope framing (``observer.wire.frames.EnvelopeFramer``), the
tap's binary path, and the ``connect.*`` dialects (``observer.dialects.connect``), with the
canonical events expected written by hand from the field maps of binary-formats §5.2 and §6."""

from __future__ import annotations

import gzip
import json
import struct
from typing import Any

import orjson
import pytest
from hypothesis import given, settings

from observer.dialects.base import RequestView
from observer.dialects.connect import CursorAdapter, UnknownConnectAdapter, WindsurfAdapter, redact_token
from observer.dialects.registry import default_registry
from observer.events import (
    ContentDelta,
    ErrorEvent,
    ModelEvent,
    StopEvent,
    StreamEnd,
    StreamStart,
    ToolCallDelta,
    UsageEvent,
)
from observer.limits import Limits
from observer.reassembly import EndCause
from observer.records import Violation, ViolationKind
from observer.response import ResponseSpec
from observer.response import StreamEnd as TransportEnd
from observer.tap import StreamObserver
from observer.wire.frames import EnvelopeFramer, Framing, make_framer
from tests.wirefeed import CUT_POINTS, feed_each_way, load, observe

V = ViolationKind


def pb_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def L(number: int, payload: bytes | str) -> bytes:
    raw = payload.encode() if isinstance(payload, str) else payload
    return pb_varint(number << 3 | 2) + pb_varint(len(raw)) + raw


def U(number: int, value: int) -> bytes:
    return pb_varint(number << 3) + pb_varint(value)


def env(flags: int, payload: bytes) -> bytes:
    return bytes([flags]) + struct.pack(">I", len(payload)) + payload


def gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def update(inner: bytes) -> bytes:
    return L(1, inner)


# -- framing --------------------------------------------------------------------------------------


def test_binary_framings():
    assert {f for f in Framing if f.binary} == {
        Framing.CONNECT,
        Framing.GRPC,
        Framing.GRPC_WEB,
        Framing.GRPC_WEB_TEXT,
    }
    assert not Framing.SSE.binary and not Framing.JSON.binary and not Framing.EVENT_STREAM.binary


@settings(max_examples=30, deadline=None)
@given(points=CUT_POINTS)
def test_connect_envelopes_become_message_tuples(points):
    body = env(1, gz(b"\x1a\x03Hel")) + env(0, b"\x1a\x02lo") + env(3, gz(b'{"error":{"code":"internal"}}'))
    got = feed_each_way(lambda: EnvelopeFramer(Framing.CONNECT, 1 << 20, "gzip"), body, points)
    assert got == [
        (None, b"\x1a\x03Hel", None, None, 5 + len(gz(b"\x1a\x03Hel"))),
        (None, b"\x1a\x02lo", None, None, 9),
        (b"end-stream", b'{"error":{"code":"internal"}}', None, None, 5 + len(gz(b'{"error":{"code":"internal"}}'))),
    ]


def test_grpc_web_trailer_frame_is_a_trailers_message():
    body = env(0, b"\x1a\x02hi") + env(0x80, b"grpc-status: 8\r\ngrpc-message: quota%20exceeded\r\n")
    got = feed_each_way(
        lambda: make_framer(Framing.GRPC_WEB, max_event_bytes=1 << 20, max_json_body_bytes=1), body, [3]
    )
    assert got[0] == (None, b"\x1a\x02hi", None, None, 9)
    event, data, *_ = got[1]
    assert event == b"trailers" and orjson.loads(data) == {"grpc-status": "8", "grpc-message": "quota exceeded"}


def test_grpc_web_text_is_decoded():
    import base64

    body = base64.b64encode(env(0, b"\x1a\x02hi")) + base64.b64encode(env(0x80, b"grpc-status: 0\r\n"))
    got = feed_each_way(lambda: EnvelopeFramer(Framing.GRPC_WEB_TEXT, 1 << 20), body, [7, 13])
    assert [m[0] for m in got] == [None, b"trailers"] and got[0][1] == b"\x1a\x02hi"


def test_no_declared_encoding_reads_gzip_and_identity_refuses_it():
    body = env(1, gz(b"\x1a\x02hi"))
    assert EnvelopeFramer(Framing.CONNECT, 1 << 20).feed(body)[0][1] == b"\x1a\x02hi"
    (bad,) = EnvelopeFramer(Framing.CONNECT, 1 << 20, "identity").feed(body)
    assert isinstance(bad, Violation) and bad.kind == V.CONTENT_DECODING_ERROR


def test_response_spec_keeps_the_message_encoding():
    spec = ResponseSpec("connect.cursor", 200, "application/connect+proto", message_encoding="gzip")
    assert ResponseSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    old = spec.to_dict()
    del old["message_encoding"]  # a journal entry written before the field existed
    assert ResponseSpec.from_dict(old).message_encoding is None


# -- the tap's binary path ------------------------------------------------------------------------


class SpyAdapter:
    """Records what the tap hands it; has ``on_object``/``fast`` that must never be called."""

    def __init__(self) -> None:
        self.seen: list[tuple] = []

    def on_binary(self, message):
        self.seen.append(message)
        return [StreamEnd(None)] if message[0] == b"end-stream" else []

    def on_object(self, message, obj):  # pragma: no cover - the binary path never parses JSON
        raise AssertionError("on_object called on a binary framing")

    def fast(self, *args):  # pragma: no cover
        raise AssertionError("fast called on a binary framing")

    def on_message(self, message):  # pragma: no cover
        raise AssertionError("on_message called although on_binary exists")

    def on_lost(self):
        pass

    def on_close(self):
        return []


class SpyDialect:
    name = "spy"

    def __init__(self) -> None:
        self.adapter = SpyAdapter()

    def framing(self, spec):
        return Framing.CONNECT

    def new_adapter(self, spec):
        return self.adapter


def test_binary_messages_reach_on_binary_unparsed():
    """A payload that happens to be JSON (``{}``) or invalid UTF-8 is handed over as bytes."""
    dialect = SpyDialect()
    obs = StreamObserver(dialect, ResponseSpec("spy", 200, "application/connect+proto"))  # type: ignore[arg-type]
    body = env(0, b"{}") + env(0, b"\xff\xfe") + env(2, b"{}")
    obs.feed(body, 1.0)
    facts = obs.finish(TransportEnd(EndCause.EOF, 2.0))
    assert dialect.adapter.seen == [
        (None, b"{}", None, None, 7),
        (None, b"\xff\xfe", None, None, 7),
        (b"end-stream", b"{}", None, None, 7),
    ]
    assert facts.outcome == "completed" and facts.violations == []


def test_binary_messages_count_against_the_event_cap():
    dialect = SpyDialect()
    limits = Limits(max_stream_events=2)
    obs = StreamObserver(dialect, ResponseSpec("spy", 200, "application/connect+proto", limits=limits))  # type: ignore[arg-type]
    obs.feed(env(0, b"a") * 3, 1.0)
    assert obs.broken and len(dialect.adapter.seen) == 2


def test_an_oversize_envelope_is_flagged_and_the_end_still_seen():
    body = env(0, L(3, "ok")) + env(0, b"\x00" * 64) + env(2, b"{}")
    record = observe(
        "connect.windsurf",
        b"",
        [body],
        content_type="application/connect+proto",
        path="/exa.api_server_pb.ApiServerService/GetChatMessage",
        limits=Limits(max_event_bytes=32),
    )
    assert record["text"] == "ok" and record["outcome"] == "completed"
    assert [v["kind"] for v in record["violations"]] == ["not_llm_request", "oversize_event"]


# -- Cursor ---------------------------------------------------------------------------------------


def test_cursor_agent_messages_map_to_canonical_events():
    a = CursorAdapter()
    msgs = [
        update(L(24, L(1, "routed-model"))),
        update(L(4, L(1, "thinking"))),
        update(L(1, L(1, "Hi"))),
        update(L(8, U(1, 3))),  # token_delta: not usage
        update(L(7, L(1, "c1") + L(3, '{"a":'))),
        update(L(2, L(1, "c1"))),
        update(L(7, L(1, "c1") + L(3, "1}"))),
        L(2, L(1, "exec")),  # exec_server_message: not part of the record
        update(L(14, U(1, 10) + U(2, 4))),
        update(L(13, b"")),
    ]
    events = [e for m in msgs for e in a.on_binary((None, m, None, None, len(m) + 5))]
    assert events == [
        StreamStart(None, None, None),
        ModelEvent(None, "routed-model"),
        ContentDelta(None, 0, "thinking", "reasoning"),
        ContentDelta(None, 1, "Hi", "text"),
        ToolCallDelta(None, "c1", 2, "c1", None, '{"a":'),
        ToolCallDelta(None, "c1", 2, "c1", None, ""),
        ToolCallDelta(None, "c1", 2, "c1", None, "1}"),
        StopEvent(None, "end_turn", "turn_ended"),
        UsageEvent(None, 10, 4),
        StreamEnd(None),
    ]


def test_cursor_turn_ended_without_usage_reports_none_not_zero():
    a = CursorAdapter()
    events = a.on_binary((None, update(L(14, U(2, 5))), None, None, 0))
    assert events == [
        StreamStart(None, None, None),
        StopEvent(None, "end_turn", "turn_ended"),
        UsageEvent(None, None, 5),
        StreamEnd(None),
    ]
    b = CursorAdapter()
    assert UsageEvent not in {type(e) for e in b.on_binary((None, update(L(14, b"")), None, None, 0))}


def test_cursor_content_after_turn_ended_is_one_violation():
    a = CursorAdapter()
    a.on_binary((None, update(L(14, b"")), None, None, 0))
    late = a.on_binary((None, update(L(1, L(1, "again"))), None, None, 0))
    later = a.on_binary((None, update(L(1, L(1, "more"))), None, None, 0))
    assert [v.kind for v in late] == [V.EVENT_AFTER_END] and later == []
    assert a.on_binary((b"end-stream", b"{}", None, None, 7)) == []  # RunSSE's END_STREAM after the turn


def test_cursor_malformed_protobuf_is_an_invalid_event():
    events = CursorAdapter().on_binary((None, b"\x0a\x09abc", None, None, 0))
    assert [type(e) for e in events] == [StreamStart, Violation] and events[1].kind == V.INVALID_EVENT


def test_cursor_request_fields():
    case = load("connect.cursor", "run_turn")
    view = RequestView("POST", "api2.cursor.sh", case.path, case.request_headers)
    facts, violations = default_registry().get("connect.cursor").parse_request(case.request, view)
    assert violations == []
    assert facts.model == "claude-4-sonnet"
    assert facts.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]
    assert facts.metadata == {"conversation_id": "conv-7f3a"}
    assert facts.tools == [
        {"name": "get_weather", "description": "Weather by city", "tool_name": "weather__get_weather"}
    ]
    assert facts.tool_names == ["weather__get_weather"] and facts.stream is True


# -- Windsurf -------------------------------------------------------------------------------------


def test_windsurf_messages_map_to_canonical_events():
    a = WindsurfAdapter()
    msgs = [
        L(1, "m") + L(9, "th"),
        L(3, "He"),
        L(6, L(1, "t1") + L(2, "get_weather") + L(3, "{")),
        L(6, L(1, "t1") + L(3, "}")),
        U(5, 10) + L(7, U(2, 12) + U(3, 7)),
    ]
    events = [e for m in msgs for e in a.on_binary((None, m, None, None, 0))]
    events += a.on_binary((b"end-stream", b"{}", None, None, 7))
    assert events == [
        StreamStart(None, None, None),
        ContentDelta(None, 0, "th", "reasoning"),
        ContentDelta(None, 1, "He", "text"),
        ToolCallDelta(None, "t1", 2, "t1", "get_weather", "{"),
        ToolCallDelta(None, "t1", 2, "t1", None, "}"),
        UsageEvent(None, 12, 7),
        StopEvent(None, "tool_use", "10"),
        StreamEnd(None),
    ]


@pytest.mark.parametrize(("value", "canonical"), [(3, "max_tokens"), (10, "tool_use"), (1, "1"), (7, "7")])
def test_windsurf_stop_reasons(value, canonical):
    (stop,) = [e for e in WindsurfAdapter().on_binary((None, U(5, value), None, None, 0)) if isinstance(e, StopEvent)]
    assert stop == StopEvent(None, canonical, str(value))


def test_end_stream_error_and_grpc_web_status():
    a = WindsurfAdapter()
    assert a.on_binary((b"end-stream", b'{"error":{"code":"unavailable","message":"down"}}', None, None, 0)) == [
        ErrorEvent(None, "unavailable", "down")
    ]
    trailers = orjson.dumps({"grpc-status": "8", "grpc-message": "quota"})
    assert WindsurfAdapter().on_binary((b"trailers", trailers, None, None, 0)) == [
        ErrorEvent(None, "resource_exhausted", "quota")
    ]
    assert WindsurfAdapter().on_binary((b"trailers", orjson.dumps({"grpc-status": "0"}), None, None, 0)) == [
        StreamEnd(None)
    ]
    assert WindsurfAdapter().on_binary((b"trailers", orjson.dumps({"grpc-status": "99"}), None, None, 0)) == [
        ErrorEvent(None, "99", None)
    ]


def test_windsurf_credentials_in_the_request_are_never_stored():
    case = load("connect.windsurf", "tool_call")
    view = RequestView("POST", "server.codeium.com", case.path, case.request_headers)
    facts, violations = default_registry().get("connect.windsurf").parse_request(case.request, view)
    stored = json.dumps(facts.to_dict())
    assert violations == []
    assert "SECRETAPIKEY" not in stored and "eyJhbGciOiJIUzI1NiJ9" not in stored
    assert facts.metadata["ide_name"] == "windsurf" and facts.model == "claude-3-7-sonnet"
    assert facts.messages[1] == {"role": "user", "content": "What is the weather in Paris?"}


# -- unknown endpoints and detection --------------------------------------------------------------


def test_unknown_endpoint_keeps_strings_with_credentials_redacted():
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJlLXZhbHVl"
    body = env(
        0,
        L(1, "hello there")
        + L(2, f"Bearer {jwt}")
        + L(3, "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWX")
        + L(4, "k" * 10 + "0123456789abcdef0123456789"),
    )
    view = RequestView("POST", "llm.example", "/x.v1.Y/Z", {"content-type": "application/grpc+proto"})
    facts, violations = default_registry().get("connect.unknown").parse_request(body, view)
    assert facts.parameters["strings"] == ["hello there", "REDACTED", "REDACTED", "REDACTED"]
    assert [v.kind for v in violations] == [V.SCHEMA_UNKNOWN]
    assert redact_token("a normal sentence with words") == "a normal sentence with words"
    events = UnknownConnectAdapter().on_binary((None, L(1, "text") + U(2, 5), None, None, 0))
    assert [type(e) for e in events] == [StreamStart, Violation, ContentDelta] and events[2].text == "text\n"


@pytest.mark.parametrize(
    ("path", "content_type", "llm_host", "expected"),
    [
        ("/agent.v1.AgentService/Run", "application/connect+proto", True, "connect.cursor"),
        ("/agent.v1.AgentService/RunSSE", "application/connect+proto", True, "connect.cursor"),
        ("/aiserver.v1.ChatService/StreamUnifiedChatWithToolsSSE", "application/connect+proto", True, "connect.cursor"),
        ("/exa.api_server_pb.ApiServerService/GetChatMessage", "application/connect+proto", True, "connect.windsurf"),
        ("/exa.api_server_pb.ApiServerService/GetChatMessage", "application/grpc", True, "connect.windsurf"),
        ("/acme.v1.Chat/Stream", "application/grpc-web+proto", True, "connect.unknown"),
        ("/acme.v1.Chat/Stream", "application/connect+json", True, "connect.unknown"),
        ("/acme.v1.Chat/Stream", "application/connect+proto", False, None),  # not an LLM host
        ("/agent.v1.AgentService/Run", "application/proto", True, None),  # Connect unary: no envelope
        ("/aiserver.v1.BidiService/BidiAppend", "application/proto", True, None),
    ],
)
def test_detection(path, content_type, llm_host, expected):
    found = default_registry().classify(RequestView("POST", "h", path, {"content-type": content_type}), llm_host)
    assert (found.name if found else None) == expected


def test_a_get_is_not_a_connect_stream():
    view = RequestView("GET", "h", "/agent.v1.AgentService/Run", {"content-type": "application/connect+proto"})
    assert default_registry().classify(view) is None


def test_unary_content_type_is_unexpected():
    dialect = default_registry().get("connect.cursor")
    assert dialect.framing(ResponseSpec("connect.cursor", 200, "application/proto")) is None
    assert dialect.framing(ResponseSpec("connect.cursor", 200, "application/grpc-web-text")) is Framing.GRPC_WEB_TEXT


def test_cursor_run_sse_request_is_a_bidi_request_id():
    body = env(1, gz(L(1, "4b5c3c1e-0000-4000-8000-000000000001")))
    view = RequestView(
        "POST", "api2.cursor.sh", "/agent.v1.AgentService/RunSSE", {"content-type": "application/connect+proto"}
    )
    facts, violations = default_registry().get("connect.cursor").parse_request(body, view)
    assert violations == [] and facts.messages == []
    assert facts.metadata == {"bidi_request_id": "4b5c3c1e-0000-4000-8000-000000000001"}


# -- gRPC status in HTTP/2 trailers ---------------------------------------------------------------

WINDSURF_PATH = "/exa.api_server_pb.ApiServerService/GetChatMessage"


def _grpc_stream(trailers: tuple[tuple[str, str], ...], cause: EndCause = EndCause.EOF) -> Any:
    obs = StreamObserver(
        default_registry().get("connect.windsurf"),
        ResponseSpec("connect.windsurf", 200, "application/grpc+proto", started_at_s=1.0, path=WINDSURF_PATH),
    )
    obs.feed(env(0, L(3, "Hi")), 1.5)
    return obs.finish(TransportEnd(cause, 2.0, trailers=trailers))


def test_grpc_status_in_the_http2_trailers_ends_the_stream():
    """gRPC ends a stream in its HTTP/2 trailers (grpc ``doc/PROTOCOL-HTTP2.md``): ``grpc-status:
    0`` is the stream's end; without trailers the same bytes are cut short."""
    done = _grpc_stream((("grpc-status", "0"), ("x-trace", "t1")))
    assert (done.outcome, done.blocks[0].text, done.violations) == ("completed", "Hi", [])
    cut = _grpc_stream(())
    assert (cut.outcome, [v.kind for v in cut.violations]) == ("truncated", [V.MISSING_STREAM_END])


def test_a_grpc_error_status_in_the_trailers_is_the_error_percent_decoded():
    """``grpc-message`` is percent-encoded on the wire (PROTOCOL-HTTP2.md); status 8 is
    ``RESOURCE_EXHAUSTED`` (grpc ``doc/statuscodes.md``)."""
    facts = _grpc_stream((("Grpc-Status", "8"), ("grpc-message", "quota%20exceeded")))
    assert (facts.outcome, facts.error.code, facts.error.message) == ("error", "resource_exhausted", "quota exceeded")
    assert facts.blocks[0].text == "Hi"


def test_trailers_of_a_stream_that_did_not_end_cleanly_are_not_read():
    """A reset has no trailers to trust (mitmproxy ends the flow with an error): the cause decides."""
    facts = _grpc_stream((("grpc-status", "0"),), EndCause.CLIENT_ABORTED)
    assert facts.outcome == "client_aborted"


def test_the_addon_passes_trailers_or_a_trailers_only_response():
    from mitmproxy import http

    from observer.capture.hooks import _trailers

    with_trailers = http.Response.make(200, b"", {"content-type": "application/grpc"})
    with_trailers.trailers = http.Headers(grpc_status="0")
    assert _trailers(with_trailers) == (("grpc-status", "0"),)
    only = http.Response.make(200, b"", {"content-type": "application/grpc", "grpc-status": "16", "grpc-message": "no"})
    assert _trailers(only) == (("grpc-status", "16"), ("grpc-message", "no"))
    assert _trailers(http.Response.make(200, b"", {"content-type": "text/event-stream"})) == ()


def test_a_long_bidi_upload_keeps_its_first_and_latest_envelopes():
    """20 envelopes (a run request, then 19 follow-ups): the first and the latest 15 are read, the
    4 between dropped with one ``oversize_request`` (a later turn's own prompt is always among
    the latest; helper trial finding: prompts after the 16th envelope were lost unsaid)."""
    from observer.dialects.connect import MAX_REQUEST_ENVELOPES, request_envelopes

    assert MAX_REQUEST_ENVELOPES == 16
    bodies = [L(1, L(5, "run"))] + [L(4, L(1, L(1, L(1, f"f{i}")))) for i in range(1, 20)]
    view = RequestView(
        "POST", "api2.cursor.sh", "/agent.v1.AgentService/Run", {"content-type": "application/connect+proto"}
    )
    payloads, violations = request_envelopes(b"".join(env(0, b) for b in bodies), view)
    assert payloads == [bodies[0], *bodies[5:]]
    assert [(v.kind, v.detail) for v in violations] == [
        ("oversize_request", "4 request envelopes between the first and the last 15 not read")
    ]
    assert request_envelopes(b"".join(env(0, b) for b in bodies[:16]), view) == (bodies[:16], [])
