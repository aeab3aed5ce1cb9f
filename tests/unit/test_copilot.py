"""Copilot over WebSocket (``signalr.copilot``): the SignalR hub traffic fixtures of
``tests/fixtures/wire/signalr/`` (Sydney and M365 ChatHub shapes of the shared reference
binary-formats §3.1-3.2, MessagePack as pysignalr and @microsoft/signalr speak it) driven through
``CopilotSession`` and ``capture.sockets.SocketRecorder`` as the WebSocket hooks drive them, one
message at a time. Expected records are written by hand from the fixtures' messages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from observer.capture.flows import FlowTable
from observer.capture.sockets import Socket, SocketRecorder, turn_record_id
from observer.dialects.base import RequestView
from observer.dialects.copilot import CopilotDialect
from observer.dialects.registry import default_registry
from observer.limits import DEFAULT_LIMITS
from observer.records import Exchange

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "wire" / "signalr"
PROMPT = "Wie ist das Wetter in Wien?"
A3 = "Hello, this is Bing. The weather in Vienna is sunny, 24 °C."
SYDNEY_PARAMETERS = {"source": "cib", "optionsSets": ["nlu_direct_response_filter", "deepleo", "h3imaginative"]}


def hub_socket(
    path: str = "/sydney/ChatHub", host: str = "h", dialect: Any = None
) -> tuple[list[Exchange], SocketRecorder, Socket]:
    """An observed socket on ``host`` at ``path`` (the records its recorder makes, the recorder,
    the socket), as ``LLMAudit.websocket_start`` makes one."""
    records: list[Exchange] = []
    recorder = SocketRecorder(FlowTable(sink=lambda r: records.append(r) or True), DEFAULT_LIMITS)
    dialect = dialect or CopilotDialect()
    sock = Socket(
        "flow-1",
        "client-1",
        dialect,
        dialect.new_session(),
        RequestView("GET", host, path, {}),
        {"scheme": "https", "host": host, "port": 443, "path": path, "method": "GET", "http_version": "HTTP/1.1"},
        [],
    )
    recorder.sockets[sock.flow_id] = sock
    return records, recorder, sock


def replay(name: str, *, close: bool = True, dialect: Any = None) -> tuple[list[Exchange], Socket]:
    """The fixture's messages through a recorder; the socket closed as the fixture says."""
    case = json.loads((FIXTURES / f"{name}.ws.json").read_text())
    host, _, path = case["url"].removeprefix("wss://").partition("/")
    records, recorder, sock = hub_socket("/" + path, host, dialect)
    t = 1_780_000_000.0
    for m in case["messages"]:
        t += 0.25
        content = m["text"].encode() if "text" in m else bytes.fromhex(m["hex"])
        recorder.message(sock, m["from_client"], content, t)
    if close:
        recorder.end(sock, case["close"]["by_client"], t + 0.25)
    return records, sock


def summary(r: Exchange) -> dict[str, Any]:
    d = r.to_dict()
    return {
        "dialect": d["dialect"],
        "status_code": d["status_code"],
        "messages": d["request"]["messages"],
        "request_model": d["request_model"],
        "text": d["text"],
        "blocks": [(b["index"], b["type"], b["text"]) for b in d["blocks"]],
        "stop": (d["stop_reason"], d["stop_reason_raw"]),
        "usage_reported": d["usage"]["reported"],
        "error": d["error"],
        "outcome": d["outcome"],
        "violations": [v["kind"] for v in d["violations"]],
    }


def test_the_registry_finds_the_chathub_sockets_on_llm_hosts_only():
    registry = default_registry()
    hub = RequestView("GET", "sydney.bing.com", "/sydney/ChatHub?id=t", {})
    assert registry.classify_websocket(hub).name == "signalr.copilot"
    assert (
        registry.classify_websocket(RequestView("GET", "x", "/m365Copilot/Chathub/o@t", {})).name == "signalr.copilot"
    )
    assert registry.classify_websocket(hub, llm_host=False) is None
    assert registry.classify_websocket(RequestView("GET", "x", "/socket", {})) is None
    assert (
        registry.classify(RequestView("GET", "sydney.bing.com", "/sydney/ChatHub", {})) is None
    )  # not an HTTP dialect


def test_a_sydney_turn():
    (record,), sock = replay("sydney_turn")
    assert summary(record) == {
        "dialect": "signalr.copilot",
        "status_code": 101,
        "messages": [{"role": "user", "content": PROMPT}],
        "request_model": None,
        "text": A3,
        "blocks": [(0, "text", A3)],
        "stop": (None, None),
        "usage_reported": False,
        "error": None,
        "outcome": "completed",
        "violations": [],
    }
    d = record.to_dict()
    assert d["request"]["parameters"] == SYDNEY_PARAMETERS and d["request"]["metadata"] == {"conversationId": "conv-1"}
    assert d["path"] == "/sydney/ChatHub" and d["method"] == "GET"
    assert d["ttft_s"] == pytest.approx(0.75)  # the first text, three messages after the chat request
    assert record.id == turn_record_id("flow-1", "0", 0) and sock.turns == {}


def test_an_m365_turn_of_write_at_cursor_deltas_and_its_token_redacted():
    (record,), _ = replay("m365_turn")
    s = summary(record)
    assert (s["text"], s["request_model"], s["outcome"]) == (
        "The meeting agreed on Q3 goals.",
        "Reasoning",
        "completed",
    )
    assert s["messages"] == [{"role": "user", "content": "Summarise my last meeting"}]
    assert "eyJhbGciOiJub25lIn0" not in record.path and "access_token=" in record.path


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "sydney_apology",
            {
                "text": "I'm sorry, I",
                "blocks": [(0, "text", "I'm sorry, I"), (1, "refusal", "I'm sorry, I cannot help with that.")],
                "stop": ("content_filter", "Apology"),
                "error": None,
                "outcome": "completed",
                "violations": [],
            },
        ),
        (
            "sydney_throttled",
            {
                "text": "",
                "blocks": [],
                "stop": (None, None),
                "error": {"code": "Throttled", "message": "Request is throttled."},
                "outcome": "error",
                "violations": [],
            },
        ),
        (
            "sydney_completion_error",
            {
                "text": "Hello, this is",
                "blocks": [(0, "text", "Hello, this is")],
                "stop": (None, None),
                "error": {"code": "completion_error", "message": "An unexpected error occurred."},
                "outcome": "error",
                "violations": [],
            },
        ),
        (
            "sydney_close_error",
            {
                "text": "Hello, this is",
                "blocks": [(0, "text", "Hello, this is")],
                "stop": (None, None),
                "error": {"code": "close", "message": "Connection closed with an error."},
                "outcome": "error",
                "violations": [],
            },
        ),
        (
            "sydney_dropped",
            {
                "text": "Hello, this is Bing. The weather",
                "blocks": [(0, "text", "Hello, this is Bing. The weather")],
                "stop": (None, None),
                "error": None,
                "outcome": "truncated",
                "violations": ["missing_stream_end"],
            },
        ),
        (
            "msgpack_pysignalr",
            {
                "text": A3,
                "blocks": [(0, "text", A3)],
                "stop": (None, None),
                "error": None,
                "outcome": "completed",
                "violations": [],
            },
        ),
        (
            "msgpack_js",
            {
                "text": "Hi there",
                "blocks": [(0, "text", "Hi there")],
                "stop": (None, None),
                "error": {"code": "completion_error", "message": "Stream failed: quota exceeded."},
                "outcome": "error",
                "violations": [],
            },
        ),
    ],
)
def test_turn_endings(name, expected):
    (record,), _ = replay(name)
    s = summary(record)
    assert {k: s[k] for k in expected} == expected


def test_a_socket_closed_by_the_client_mid_turn_and_the_proxy_stopping():
    records, sock = replay("sydney_dropped", close=False)
    assert records == [] and len(sock.turns) == 1
    recorder_records: list[Exchange] = []
    flows = FlowTable(sink=lambda r: recorder_records.append(r) or True)
    recorder = SocketRecorder(flows, DEFAULT_LIMITS)
    recorder.sockets[sock.flow_id] = sock
    recorder.end(sock, True, 1_780_000_010.0)
    (record,) = recorder_records
    assert record.outcome == "client_aborted" and record.text == "Hello, this is Bing. The weather"
    records, sock = replay("sydney_dropped", close=False)
    flows = FlowTable(sink=lambda r: recorder_records.append(r) or True)
    recorder = SocketRecorder(flows, DEFAULT_LIMITS)
    recorder.end(sock, None, 1_780_000_010.0, shutdown=True)
    assert recorder_records[-1].outcome == "interrupted"


def test_a_hub_protocol_it_cannot_read_leaves_the_socket_unobserved():
    dialect = CopilotDialect()
    session = dialect.new_session()
    out = session.feed(True, b'{"protocol":"blazorpack","version":1}\x1e', 1.0)
    assert [v.kind for v in out] == ["malformed_frame"] and "blazorpack" in out[0].detail
    assert session.feed(True, b'{"type":4,"target":"chat","invocationId":"0","arguments":[{}]}\x1e', 2.0) == []


# ----- through the addon's hooks (mitmproxy's own test flows) -----


def ws_flow(host: str, path: str):
    from mitmproxy.test import tflow

    f = tflow.twebsocketflow(messages=False)
    f.request.host, f.request.path, f.request.scheme = host, path, "https"
    f.request.headers["authorization"] = "Bearer sk-hub-secret-0123456789"
    return f


def send(addon, f, from_client: bool, text: str) -> None:
    from mitmproxy import websocket

    f.websocket.messages.append(websocket.WebSocketMessage(1, from_client, text.encode(), 1_780_000_000.0))
    addon.websocket_message(f)


def test_the_hooks_record_a_turn_and_keep_one_message():
    from mitmproxy.test import taddons

    from observer.capture.hooks import LLMAudit

    records: list[Exchange] = []
    addon = LLMAudit(sink=lambda r: records.append(r) or True)
    case = json.loads((FIXTURES / "sydney_turn.ws.json").read_text())
    with taddons.context(addon) as tctx:
        tctx.configure(addon, observer_llm_hosts_extra="chat.corp.example")
        f = ws_flow("chat.corp.example", "/sydney/ChatHub?access_token=tok-9")
        other = ws_flow("elsewhere.example", "/sydney/ChatHub")  # not an LLM host
        addon.websocket_start(f)
        addon.websocket_start(other)
        for m in case["messages"]:
            send(addon, f, m["from_client"], m["text"])
            send(addon, other, m["from_client"], m["text"])
            assert len(f.websocket.messages) == 1 and len(other.websocket.messages) == 1  # trimmed, both
        f.websocket.closed_by_client = True
        addon.websocket_end(f)
        addon.websocket_end(other)
    (record,) = records
    assert (record.dialect, record.host, record.text, record.outcome) == (
        "signalr.copilot",
        "chat.corp.example",
        A3,
        "completed",
    )
    assert "tok-9" not in record.path and record.id == turn_record_id(f.id, "0", 0)
    assert "sk-hub-secret" not in json.dumps(record.to_dict())


def test_consumer_copilots_chat_socket():
    """Not SignalR: concatenated JSON events; ``send`` opens the turn, ``appendText`` deltas
    (two in one message without a separator), ``done`` ends it; ``titleUpdate`` after it is not
    a turn."""
    from observer.dialects.copilot import CopilotChatDialect

    assert (
        default_registry()
        .classify_websocket(RequestView("GET", "copilot.microsoft.com", "/c/api/chat?api-version=2", {}))
        .name
        == "websocket.copilot"
    )
    (record,), _ = replay("copilot_consumer", dialect=CopilotChatDialect())
    s = summary(record)
    assert (s["dialect"], s["messages"], s["request_model"]) == (
        "websocket.copilot",
        [{"role": "user", "content": PROMPT}],
        "smart",
    )
    assert (s["text"], s["outcome"], s["violations"]) == ('Hallo "Wien" {sonnig}, 24 °C – tschüß', "completed", [])
    assert record.to_dict()["request"]["metadata"] == {"conversationId": "c-1"}
    records, _ = replay("copilot_consumer_ok", dialect=CopilotChatDialect())
    assert records == []  # the server's events alone: no send, no turn


def test_credential_fields_of_a_chat_invocation_are_redacted():
    """As in an HTTP request (``observer.redact``): a credential-named parameter of the chat
    invocation is not stored, nor is its value where an error echoes it; the generated text is
    kept as generated (as for every dialect)."""
    records, recorder, sock = hub_socket("/ChatHub")
    chat = {
        "type": 4,
        "target": "chat",
        "invocationId": "1",
        "arguments": [
            {
                "message": {"author": "user", "text": "hi"},
                "plugins": [{"Id": "x", "api_key": "sk-live-0123456789abcdef"}],
            }
        ],
    }
    recorder.message(sock, True, b'{"protocol":"json","version":1}\x1e', 1.0)
    recorder.message(sock, False, b"{}\x1e", 1.1)
    recorder.message(sock, True, json.dumps(chat).encode() + b"\x1e", 1.2)
    update = {
        "type": 1,
        "target": "update",
        "arguments": [{"messages": [{"author": "bot", "text": "your key sk-live-0123456789abcdef"}]}],
    }
    recorder.message(sock, False, json.dumps(update).encode() + b"\x1e", 1.3)
    recorder.message(sock, False, b'{"type":3,"invocationId":"1","error":"bad key sk-live-0123456789abcdef"}\x1e', 1.4)
    (record,) = records
    d = record.to_dict()
    assert "sk-live-0123456789abcdef" not in json.dumps(d["request"]) + json.dumps(d["error"])
    assert d["request"]["parameters"]["plugins"][0]["Id"] == "x" and d["text"] == "your key sk-live-0123456789abcdef"


def test_the_connection_token_is_redacted_and_a_client_close_aborts_the_turn():
    """Found by the end-to-end peers: SignalR's ``?id=<connectionToken>`` stayed in the stored
    path (the token is a secret: ASP.NET SignalR TransportProtocols.md), and the JS client's
    ``stop()`` (a Close message, type 7, from the client) was not read as the client's abort."""
    records, recorder, sock = hub_socket("/sydney/ChatHub?id=tok-secret-1&x=1")
    chat = {"type": 4, "target": "chat", "invocationId": "1", "arguments": [{"message": {"text": "hi"}}]}
    update = {"type": 1, "target": "update", "arguments": [{"messages": [{"author": "bot", "text": "Hel"}]}]}
    recorder.message(sock, True, b'{"protocol":"json","version":1}\x1e', 1.0)
    recorder.message(sock, False, b"{}\x1e", 1.1)
    recorder.message(sock, True, json.dumps(chat).encode() + b"\x1e", 1.2)
    recorder.message(sock, False, json.dumps(update).encode() + b"\x1e", 1.3)
    recorder.message(sock, True, b'{"type":7}\x1e', 1.4)
    (record,) = records
    assert (record.outcome, record.text) == ("client_aborted", "Hel")
    assert record.path == "/sydney/ChatHub?id=REDACTED&x=1"


# ----- break-it trial findings -----


def _chat(invocation: str) -> bytes:
    return (
        json.dumps(
            {"type": 4, "target": "chat", "invocationId": invocation, "arguments": [{"message": {"text": "hi"}}]}
        ).encode()
        + b"\x1e"
    )


def test_a_huge_answer_is_not_kept_whole_by_the_session():
    """Trial finding: every writeAtCursor delta was appended to one string (copied per message,
    never capped): 200 MB held and 135 ms per message at the end. Past the record's cap the
    session keeps nothing more, and the record says it was cut."""
    from observer.dialects.copilot import MAX_TEXT_CHARS

    records, recorder, sock = hub_socket()
    recorder.message(sock, True, b'{"protocol":"json","version":1}\x1e', 1.0)
    recorder.message(sock, False, b"{}\x1e", 1.1)
    recorder.message(sock, True, _chat("1"), 1.2)
    delta = "x" * (256 << 10)
    for i in range(MAX_TEXT_CHARS // len(delta) + 4):
        update = {"type": 1, "target": "update", "arguments": [{"writeAtCursor": delta}]}
        recorder.message(sock, False, json.dumps(update).encode() + b"\x1e", 2.0 + i)
    turn = sock.session._turns["1"]
    assert turn.capped and turn.parts == []
    recorder.message(sock, False, b'{"type":3,"invocationId":"1"}\x1e', 99.0)
    (record,) = records
    assert "oversize_stream" in [v.kind for v in record.violations] and len(record.text) <= MAX_TEXT_CHARS


def test_open_turns_are_bounded_in_the_session_too():
    """Trial finding: the recorder kept 16 turns open, but the session's own table grew with
    every unanswered invocation (200,000 held)."""
    from observer.dialects.copilot import MAX_OPEN_TURNS

    records, recorder, sock = hub_socket()
    recorder.message(sock, True, b'{"protocol":"json","version":1}\x1e', 1.0)
    recorder.message(sock, False, b"{}\x1e", 1.1)
    for i in range(MAX_OPEN_TURNS + 5):
        recorder.message(sock, True, _chat(str(i)), 2.0 + i)
    assert sock.session.open_turns == MAX_OPEN_TURNS and len(sock.turns) == MAX_OPEN_TURNS
    assert len(records) == 5 and all("oversize_record" in [v.kind for v in r.violations] for r in records)


def test_a_handshake_split_over_two_messages_is_joined():
    records, recorder, sock = hub_socket()
    recorder.message(sock, True, b'{"protocol":"json",', 1.0)
    recorder.message(sock, True, b'"version":1}\x1e', 1.05)
    recorder.message(sock, False, b"{}\x1e", 1.1)
    recorder.message(sock, True, _chat("1"), 1.2)
    update = {"type": 1, "target": "update", "arguments": [{"messages": [{"author": "bot", "text": "Done."}]}]}
    recorder.message(sock, False, json.dumps(update).encode() + b"\x1e" + b'{"type":3,"invocationId":"1"}\x1e', 1.3)
    (record,) = records
    assert (record.text, record.outcome) == ("Done.", "completed")


@pytest.mark.parametrize(
    ("first", "said"),
    [
        (b'{"protocol":"blazorpack","version":1}\x1e', "blazorpack"),
        (b'{"type":4,"target":"chat"}\x1e', ""),  # no handshake: a hub message first
    ],
)
def test_a_socket_that_cannot_be_read_leaves_a_record_saying_so(first, said):
    """Trial finding: a ChatHub socket whose handshake failed was not audited, and nothing said
    so. It leaves one ``unreadable`` record with the reason."""
    records, recorder, sock = hub_socket()
    recorder.message(sock, True, first, 1.0)
    recorder.message(sock, True, _chat("1"), 1.2)
    recorder.end(sock, True, 2.0)
    (record,) = records
    assert record.outcome == "unreadable" and record.status_code == 101
    (violation,) = record.violations
    assert violation.kind in ("malformed_frame", "invalid_json") and said in violation.detail


# -- crashes: the journal -------------------------------------------------------------------------


def journaled_replay(tmp_path: Path, name: str, *, close: bool, upto: int | None = None) -> tuple[list[Exchange], Path]:
    """``replay`` of the fixture's first ``upto`` messages (default all) with a real journal in
    ``tmp_path`` that is then closed as a kill leaves it (no record for a turn still open): the
    live records and the journal's folder."""
    from observer.journal.journal import Journal

    journal = Journal(tmp_path / "j")
    journal.open()
    journal.start()
    case = json.loads((FIXTURES / f"{name}.ws.json").read_text())
    host, _, path = case["url"].removeprefix("wss://").partition("/")
    records, recorder, sock = hub_socket("/" + path, host)
    recorder.journal = journal
    t = 1_780_000_000.0
    for m in case["messages"][:upto]:
        t += 0.25
        content = m["text"].encode() if "text" in m else bytes.fromhex(m["hex"])
        recorder.message(sock, m["from_client"], content, t)
    if close:
        recorder.end(sock, case["close"]["by_client"], t + 0.25)
    for record in records:
        journal.record(record)
    journal.close()
    return records, journal.directory


def test_a_turn_open_at_a_kill_is_recovered_from_its_journaled_events(tmp_path: Path):
    """Killed after the ninth message (the full answer's ``update``, before the final item and
    the ``Completion``): recovery rebuilds the turn from the events its messages gave, with the
    live id and request, ``interrupted`` (source of the values: ``test_a_sydney_turn``, the same
    fixture recorded live to its end)."""
    from observer.journal.recovery import RECOVERED, recover

    live, directory = journaled_replay(tmp_path, "sydney_turn", close=False, upto=9)
    assert live == []
    (record,) = recover(directory, default_registry()).records
    s = summary(record)
    assert (s["text"], s["blocks"], s["messages"]) == (A3, [(0, "text", A3)], [{"role": "user", "content": PROMPT}])
    assert (s["dialect"], s["status_code"], s["outcome"], s["violations"]) == (
        "signalr.copilot",
        101,
        "interrupted",
        ["missing_stream_end"],
    )
    assert record.id == turn_record_id("flow-1", "0", 0) and record.transport_error == RECOVERED
    assert record.to_dict()["request"]["parameters"] == SYDNEY_PARAMETERS
    assert record.ttft_s == pytest.approx(0.75)


def test_a_recorded_turn_is_not_recovered_and_no_credential_reaches_the_journal(tmp_path: Path):
    """A turn whose record was journaled is closed there; the M365 socket's access token (in its
    URL) is in no journal byte: the skeleton's path is redacted and raw messages are never
    journaled."""
    from observer.journal.recovery import recover

    (record,), directory = journaled_replay(tmp_path, "m365_turn", close=True)
    assert record.outcome == "completed"
    assert recover(directory, default_registry()).records == []
    journaled = b"".join(p.read_bytes() for p in directory.iterdir() if p.is_file())
    assert b"Summarise my last meeting" in journaled  # the turn's request facts are there
    assert b"eyJhbGciOiJub25lIn0" not in journaled


def test_the_turn_log_round_trips_every_item_and_refuses_what_it_did_not_write():
    from observer.events import (
        ContentDelta,
        ResponseIdentity,
        StopEvent,
        StreamEnd,
        StreamStart,
        ToolCallDelta,
        UsageEvent,
    )
    from observer.journal import turnlog
    from observer.records import Violation

    items = [
        StreamStart(None, "m", "r1"),
        ResponseIdentity(None, "resp-1", None, "default"),
        ContentDelta(3, 0, "Grüß ☕", "text"),
        ToolCallDelta(None, "k", 1, "c1", "get", '{"a":'),
        StopEvent(None, "end_turn", "done", choice=1),
        UsageEvent(None, None, 7),
        UsageEvent(None, 3, 7, cache_read_input_tokens=2, total_tokens=10, details=(("input", "audio", 1),)),
        Violation("invalid_json", 4, "bad"),
        StreamEnd(5, None),
    ]
    assert turnlog.decode(turnlog.encode(items)) == items
    # A chunk the previous version journaled (before the added usage counts and the choice).
    older = b'[["UsageEvent", null, null, 7], ["StopEvent", null, "end_turn", "done"]]'
    assert turnlog.decode(older) == [UsageEvent(None, None, 7), StopEvent(None, "end_turn", "done")]
    for bad in (
        b"{",
        b"{}",
        b'[["Nope", 1]]',
        b'[["UsageEvent", null]]',
        b"[1]",
        b'[["UsageEvent", null, 1, 2, null, null, null, null, [["input", "audio"]]]]',
    ):
        with pytest.raises(ValueError):
            turnlog.decode(bad)


def test_turn_events_reach_the_journal_in_the_sweep_and_before_the_record():
    """Off the relay path: a message's events wait for the batcher's sweep (one ``DATA`` entry
    for the messages since); the turn's close hands over what is left before its record."""

    class FakeJournal:
        def __init__(self) -> None:
            self.calls: list[tuple[str, object]] = []

        def open_exchange(self, rid, skeleton, spec, violations) -> None:
            self.calls.append(("open", rid))

        def data(self, rid, pending, nbytes) -> None:
            self.calls.append(("data", len(pending) // 2))

        def record(self, record) -> bool:
            self.calls.append(("record", record.id))
            return True

    class FakeBatcher:
        def __init__(self) -> None:
            self.marked: list = []

        def mark(self, tap) -> bool:
            tap.queued = True
            self.marked.append(tap)
            return True

        def sweep(self) -> None:
            for tap in self.marked:
                tap.queued = False
                tap.observe(None, None)
            self.marked = []

    journal, batcher = FakeJournal(), FakeBatcher()
    case = json.loads((FIXTURES / "sydney_turn.ws.json").read_text())
    records, recorder, sock = hub_socket()
    recorder._flows.set_sink(journal.record)
    recorder.journal, recorder.batcher = journal, batcher
    t = 1_780_000_000.0
    for i, m in enumerate(case["messages"]):
        t += 0.25
        recorder.message(sock, m["from_client"], m["text"].encode(), t)
        if i == 6:  # the batcher's sweep after the seventh message: the updates so far in one entry
            assert [c[0] for c in journal.calls] == ["open"]
            batcher.sweep()
    rid = turn_record_id("flow-1", "0", 0)
    assert [c[0] for c in journal.calls] == ["open", "data", "data", "record"]
    assert (journal.calls[0], journal.calls[-1]) == (("open", rid), ("record", rid))
    assert journal.calls[1] == ("data", 3)  # the three updates before the sweep (messages 5-7)
