"""A multi-turn stream (Cursor's agent ``Run``: the HTTP/2 stream stays open after
``turn_ended`` and may carry the next turn, binary-formats §4.4 and §5.2) gives one record per
turn, each made when its turn ends, while the stream is still open: in the sans-IO observer
(``observer.tap``), through the addon's hooks (``observer.capture.flows``), and from the journal
after a crash (``observer.journal.recovery``), with the same ids everywhere
(``observer.capture.turns``).

The messages are built by hand from the field numbers of binary-formats §5.2:
``AgentServerMessage.interaction_update`` 1 {``text_delta`` 1.1, ``heartbeat`` 1.13,
``turn_ended`` 1.14 {1 input, 2 output}}; ``AgentClientMessage.run_request`` 1 {``action``
1.2.1.1.1 prompt, ``model_details`` 1.3.1, ``conversation_id`` 1.5} and ``conversation_action`` 4
(the next turn's user text at 4.1.1.1). Every expected value below is written from those bytes."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from mitmproxy import http
from mitmproxy.flow import Error
from mitmproxy.test import taddons, tflow

from observer.capture.hooks import LLMAudit
from observer.capture.request import flow_record_id
from observer.capture.turns import stream_turn_record_id
from observer.dialects.registry import default_registry
from observer.journal import format as fmt
from observer.journal.journal import segment_name
from observer.journal.recovery import RECOVERED, recover
from observer.reassembly import EndCause
from observer.records import Exchange, RequestFacts
from observer.response import ResponseSpec, StreamEnd
from observer.tap import StreamObserver
from tests.unit.test_connect import L, U, env, update

RUN = "/agent.v1.AgentService/Run"
MEDIA = "application/connect+proto"
T0 = 1_750_000_000.0


def text(s: str) -> bytes:
    return env(0, update(L(1, L(1, s))))


def turn_ended(inp: int, out: int) -> bytes:
    return env(0, update(L(14, U(1, inp) + U(2, out))))


HEARTBEAT = env(0, update(L(13, b"")))
TURN0 = [text("Hello"), text(" there."), turn_ended(10, 4)]
TURN1 = [text("Tomorrow: rain."), turn_ended(30, 5)]
RUN_REQUEST = env(0, L(1, L(2, L(1, L(1, L(1, "Weather?")))) + L(3, L(1, "claude-4-sonnet")) + L(5, "conv-1")))
FOLLOWUP = env(0, L(4, L(1, L(1, L(1, "And tomorrow?")))))


def spec(started: float = T0) -> ResponseSpec:
    return ResponseSpec("connect.cursor", 200, MEDIA, started_at_s=started, path=RUN)


def observer() -> StreamObserver:
    return StreamObserver(default_registry().get("connect.cursor"), spec())


def utc(s: float) -> datetime:
    return datetime.fromtimestamp(s, timezone.utc)


# ----- the sans-IO observer ------------------------------------------------------------------


def test_each_turn_is_cut_when_it_ends_and_the_rest_is_empty():
    obs = observer()
    obs.feed(TURN0[0], T0 + 0.5)
    obs.feed(TURN0[1], T0 + 0.6)
    assert obs.take_turns() == []  # not ended yet
    obs.feed(TURN0[2], T0 + 0.7)
    ((i0, f0),) = obs.take_turns()
    assert (i0, f0.outcome, [b.text for b in f0.blocks]) == (0, "completed", ["Hello there."])
    assert (f0.usage.input_tokens, f0.usage.output_tokens, f0.stop_reason) == (10, 4, "end_turn")
    assert f0.ended_at == utc(T0 + 0.7) and abs(f0.ttft_s - 0.5) < 1e-6
    assert f0.response_bytes == sum(map(len, TURN0)) and f0.violations == []
    obs.feed(HEARTBEAT, T0 + 1.0)
    obs.feed(TURN1[0], T0 + 2.0)  # ttft of turn 1 counts from turn 0's end
    obs.feed(TURN1[1] + HEARTBEAT, T0 + 2.5)
    ((i1, f1),) = obs.take_turns()
    assert (i1, f1.outcome, f1.blocks[0].text, f1.blocks[0].index) == (1, "completed", "Tomorrow: rain.", 0)
    assert (f1.usage.input_tokens, f1.usage.output_tokens) == (30, 5)
    assert f1.ended_at == utc(T0 + 2.5) and abs(f1.ttft_s - 1.3) < 1e-6
    assert f1.response_bytes == len(HEARTBEAT) + sum(map(len, TURN1)) + len(HEARTBEAT)
    obs.feed(HEARTBEAT, T0 + 3.0)
    obs.finish(StreamEnd(EndCause.CLIENT_ABORTED, T0 + 4.0, transport_error="stream reset (cancel)"))
    assert obs.tail_empty and obs.turns_cut == 2


def test_a_reset_in_the_middle_of_a_later_turn_records_what_arrived():
    obs = observer()
    for chunk in TURN0:
        obs.feed(chunk, T0 + 1.0)
    obs.take_turns()
    obs.feed(TURN1[0], T0 + 2.0)
    tail = obs.finish(StreamEnd(EndCause.CLIENT_ABORTED, T0 + 3.0, transport_error="stream reset (cancel)"))
    assert not obs.tail_empty
    assert (tail.outcome, tail.blocks[0].text, tail.usage.reported) == ("client_aborted", "Tomorrow: rain.", False)
    assert [v.kind for v in tail.violations] == ["missing_stream_end"]
    assert tail.response_bytes == len(TURN1[0]) and abs(tail.ttft_s - 1.0) < 1e-6


def test_a_single_turn_dialect_is_never_cut():
    """Windsurf ends its stream with the turn (END_STREAM): one record, made at the end."""
    obs = StreamObserver(
        default_registry().get("connect.windsurf"),
        ResponseSpec("connect.windsurf", 200, MEDIA, path="/exa.api_server_pb.ApiServerService/GetChatMessage"),
    )
    obs.feed(env(0, L(3, "Hi")) + env(2, b"{}"), T0 + 1.0)
    facts = obs.finish(StreamEnd(EndCause.EOF, T0 + 2.0))
    assert (obs.turns_cut, obs.tail_empty, obs.take_turns()) == (0, False, [])
    assert (facts.outcome, facts.blocks[0].text, facts.violations) == ("completed", "Hi", [])


# ----- through the addon's hooks -------------------------------------------------------------


def _flow() -> http.HTTPFlow:
    f = tflow.tflow()
    f.request = http.Request.make(
        "POST", f"https://api2.cursor.sh{RUN}", b"", {"content-type": MEDIA, "connect-protocol-version": "1"}
    )
    del f.request.headers["content-length"]  # a streamed (bidi) upload, as Cursor's
    return f


def test_the_addon_records_each_turn_before_the_stream_ends():
    """In-process: each turn's record reaches the sink inside the chunk that ended it; a later
    turn holds the request as received by then (the follow-up), and starts when the previous
    turn ended; heartbeats and a client reset after the last turn make no record."""
    got: list[Exchange] = []
    forgotten: list[str] = []
    addon = LLMAudit(sink=lambda r: got.append(r) or True, worker=False)
    with taddons.context(addon):
        addon._flows.set_sink(lambda r: got.append(r) or True, forgotten.append)  # as the journal's
        f = _flow()
        addon.requestheaders(f)
        upload = f.request.stream
        assert upload(RUN_REQUEST) is RUN_REQUEST
        f.response = http.Response.make(200, b"", {"content-type": MEDIA})
        addon.responseheaders(f)
        tap = f.response.stream
        for chunk in TURN0:
            assert tap(chunk) is chunk
        key = flow_record_id(f.id)
        (first,) = got
        assert first.id == stream_turn_record_id(key, 0) != key
        assert (first.outcome, first.text, first.stop_reason_raw) == ("completed", "Hello there.", "turn_ended")
        assert first.request.messages == [{"role": "user", "content": "Weather?"}]
        assert first.request.model == "claude-4-sonnet" and first.request.metadata == {"conversation_id": "conv-1"}
        assert first.transport_error is None
        upload(FOLLOWUP)
        for chunk in [HEARTBEAT, *TURN1]:
            tap(chunk)
        second = got[1]
        assert second.id == stream_turn_record_id(key, 1)
        assert second.text == "Tomorrow: rain." and (second.usage.input_tokens, second.usage.output_tokens) == (30, 5)
        assert second.request.messages == [
            {"role": "user", "content": "Weather?"},
            {"role": "user", "content": "And tomorrow?"},
        ]
        assert first.ended_at < second.started_at < second.ended_at  # from the follow-up (below: exact)
        assert first.request.messages == [{"role": "user", "content": "Weather?"}]  # not changed by the later read
        tap(HEARTBEAT)
        f.error = Error("stream reset by client (CANCEL)")
        addon.error(f)
        assert len(got) == 2
        assert forgotten == [key]  # the journal no longer holds the stream open
        addon.done()


def test_the_addon_records_a_turn_cut_short_by_a_reset_with_the_next_turn_id():
    got: list[Exchange] = []
    addon = LLMAudit(sink=lambda r: got.append(r) or True, worker=False)
    with taddons.context(addon):
        f = _flow()
        addon.requestheaders(f)
        f.request.stream(RUN_REQUEST)
        f.response = http.Response.make(200, b"", {"content-type": MEDIA})
        addon.responseheaders(f)
        for chunk in [*TURN0, TURN1[0]]:
            f.response.stream(chunk)
        f.error = Error("stream reset by client (CANCEL)")
        addon.error(f)
        addon.done()
    key = flow_record_id(f.id)
    assert [r.id for r in got] == [stream_turn_record_id(key, 0), stream_turn_record_id(key, 1)]
    assert (got[1].outcome, got[1].text) == ("client_aborted", "Tomorrow: rain.")
    assert got[1].started_at == got[0].ended_at


# ----- the journal after a crash -------------------------------------------------------------


def stream_skeleton(key: str) -> Exchange:
    """The skeleton the proxy journals for a Cursor ``Run`` stream whose record id is ``key``."""
    return Exchange(
        id=key,
        dialect="connect.cursor",
        host="api2.cursor.sh",
        path=RUN,
        method="POST",
        http_version="HTTP/2.0",
        started_at=utc(T0),
        status_code=200,
        request=RequestFacts(model="claude-4-sonnet", stream=True),
    )


def test_recovery_rebuilds_the_turns_not_journaled_with_the_live_ids(tmp_path: Path):
    """Turn 0's record was journaled, turn 1 ended but its record was not, turn 2 was cut by the
    kill: recovery gives turn 1 (``completed``) and turn 2 (``interrupted``), with the ids the
    live proxy gives them, and not turn 0 again."""
    key = flow_record_id("a-flow-id")
    ex = stream_skeleton(key)
    turn0 = Exchange.from_dict({**ex.to_dict(), "id": stream_turn_record_id(key, 0), "outcome": "completed"})
    entries = [
        fmt.open_entry(key, ex.to_dict(), spec().to_dict(), []),
        fmt.data_entry(key, [b"".join(TURN0), T0 + 1.0]),
        fmt.record_entry(1, fmt.dumps(turn0.to_dict())),
        fmt.data_entry(key, [b"".join(TURN1), T0 + 2.0, text("Par"), T0 + 3.0]),
    ]
    directory = tmp_path / "j"
    directory.mkdir(mode=0o700)
    (directory / segment_name(1)).write_bytes(fmt.SEGMENT_MAGIC + b"".join(entries))
    rebuilt = recover(directory, default_registry()).records
    assert [r.id for r in rebuilt] == [stream_turn_record_id(key, 1), stream_turn_record_id(key, 2)]
    one, two = rebuilt
    assert (one.outcome, one.text, one.transport_error) == ("completed", "Tomorrow: rain.", None)
    assert one.started_at == utc(T0 + 1.0) and one.ended_at == utc(T0 + 2.0)
    assert (two.outcome, two.text, two.transport_error) == ("interrupted", "Par", RECOVERED)
    assert two.started_at == utc(T0 + 2.0) and two.request.model == "claude-4-sonnet"


def test_a_forgotten_stream_is_not_recovered(tmp_path: Path):
    """After the last turn the proxy writes ``FORGET`` for the stream's own id (no record has
    it; the addon's side: ``test_the_addon_records_each_turn_before_the_stream_ends``): a
    restart then rebuilds nothing."""
    key = flow_record_id("b-flow-id")
    ex = stream_skeleton(key)
    entries = [
        fmt.open_entry(key, ex.to_dict(), spec().to_dict(), []),
        fmt.data_entry(key, [b"".join(TURN0), T0 + 1.0]),
        fmt.forget_entry(key),
    ]
    directory = tmp_path / "j"
    directory.mkdir(mode=0o700)
    (directory / segment_name(1)).write_bytes(fmt.SEGMENT_MAGIC + b"".join(entries))
    assert recover(directory, default_registry()).records == []


def test_a_later_turn_holds_the_request_as_it_was_when_the_turn_ended():
    """The record of a turn may be made after the client already sent its next prompt (the parse
    runs behind the relay: batches, the worker): turn 1's request is the upload as it had arrived
    when turn 1 ended, and it starts at its own follow-up, ``ttft_s`` counted from there (helper
    trial finding: later prompts leaked into earlier turns). Times by hand: run request at 100,
    turn 0 ends at 101, follow-up f1 at 102, turn 1's first text at 102.5 and end at 103, f2 at
    103.2, turn 1's record made after that."""
    from observer.capture.flows import FlowState, FlowTable
    from observer.capture.hooks import _rereader
    from observer.capture.request import RequestTap, read_request
    from observer.dialects.base import RequestView
    from observer.limits import DEFAULT_LIMITS
    from observer.response import ResponseFacts

    clock = iter([100.0, 102.0, 103.2])
    tap = RequestTap(1 << 20, clock=lambda: next(clock))
    dialect = default_registry().get("connect.cursor")
    view = RequestView("POST", "api2.cursor.sh", RUN, {"content-type": MEDIA})
    tap(RUN_REQUEST)
    first_read = read_request(dialect, view, tap.body(), None, DEFAULT_LIMITS)
    got: list[Exchange] = []
    flows = FlowTable(sink=lambda r: got.append(r) or True)
    ex = stream_skeleton(flow_record_id("c-flow-id"))
    ex.request = first_read.facts
    state = FlowState(dialect, ex, view, request_tap=tap, parsed=True)
    state.reread = _rereader(tap, dialect, view, None, DEFAULT_LIMITS)
    flows.track("c-flow-id", state)
    flows.on_turn(state.key, 0, ResponseFacts(ended_at=utc(101.0), ttft_s=0.5, outcome="completed"))
    tap(FOLLOWUP)  # f1 at 102
    tap(env(0, L(4, L(1, L(1, L(1, "And the day after?"))))))  # f2 at 103.2, before turn 1's record
    flows.on_turn(state.key, 1, ResponseFacts(ended_at=utc(103.0), ttft_s=1.5, outcome="completed"))
    zero, one = got
    assert zero.request.messages == [{"role": "user", "content": "Weather?"}]
    assert one.request.messages == [
        {"role": "user", "content": "Weather?"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    assert (one.started_at, one.ended_at, one.ttft_s) == (utc(102.0), utc(103.0), 0.5)


def test_a_later_turn_of_an_upload_over_its_copy_says_its_request_was_not_read():
    """The upload outgrew ``max_request_bytes`` after turn 0: turn 1 keeps the stream's request
    (as read) and says why it is not its own, ``oversize_request`` (helper trial finding)."""
    from observer.capture.flows import FlowState, FlowTable
    from observer.capture.hooks import _rereader
    from observer.capture.request import RequestTap, read_request
    from observer.dialects.base import RequestView
    from observer.limits import Limits
    from observer.response import ResponseFacts

    limits = Limits(max_request_bytes=200)
    tap = RequestTap(limits.max_request_bytes, clock=lambda: 100.0)
    dialect = default_registry().get("connect.cursor")
    view = RequestView("POST", "api2.cursor.sh", RUN, {"content-type": MEDIA})
    tap(RUN_REQUEST)
    got: list[Exchange] = []
    flows = FlowTable(sink=lambda r: got.append(r) or True)
    ex = stream_skeleton(flow_record_id("d-flow-id"))
    ex.request = read_request(dialect, view, tap.body(), None, limits).facts
    state = FlowState(dialect, ex, view, request_tap=tap, parsed=True)
    state.reread = _rereader(tap, dialect, view, None, limits)
    flows.track("d-flow-id", state)
    flows.on_turn(state.key, 0, ResponseFacts(ended_at=utc(101.0), outcome="completed"))
    tap(env(0, L(4, L(1, L(1, L(1, "B" * 300))))))
    flows.on_turn(state.key, 1, ResponseFacts(ended_at=utc(103.0), outcome="completed"))
    assert got[1].request.messages == [{"role": "user", "content": "Weather?"}]
    assert [(v.kind, v.detail) for v in got[1].violations] == [
        ("oversize_request", "request body over 200 bytes not parsed")
    ]
