"""The capture path's parts with plain objects (no mitmproxy): the failover policy between the
worker and in-process parsing (a fake worker link), the flow table's finishing, request reading,
and a custom dialect registry reaching the worker process."""

from __future__ import annotations

import asyncio
import gzip
import time
from dataclasses import dataclass, field

from observer.capture.backend import IN_PROCESS_FLUSH_BYTES, WORKER_FLUSH_BYTES, FailoverBackend, InProcessBackend
from observer.capture.flows import FlowState, FlowTable
from observer.capture.messages import Data, Finish, Open
from observer.capture.request import read_request, skeleton
from observer.capture.worker import WorkerCore
from observer.dialects.base import RequestView
from observer.dialects.openai_chat import OpenAIChatDialect
from observer.dialects.registry import DialectRegistry, default_registry
from observer.limits import Limits
from observer.reassembly import EndCause
from observer.records import ViolationKind
from observer.response import ResponseFacts, ResponseSpec, StreamEnd

T0 = 1_749_292_800.0
CHAT = b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
SPEC = ResponseSpec("openai.chat", 200, "text/event-stream", started_at_s=T0, request_stream=True)


def only_openai_chat() -> DialectRegistry:
    """A custom registry factory: OpenAI Chat Completions only."""
    return DialectRegistry([OpenAIChatDialect()])


@dataclass
class FakeLink:
    """Stands in for ``WorkerLink``: takes what it is given, refuses flows or data when told."""

    on_facts: object
    on_death: object
    on_turn: object = None
    max_buffer_bytes: int = 0
    nice: int = 0
    registry_factory: str = ""
    accept_flows: bool = True
    accept_data: bool = True
    alive: bool = True
    started_at: float = field(default_factory=time.monotonic)
    pid: int = 4242
    opened: list = field(default_factory=list)
    data_sent: list = field(default_factory=list)
    finished: list = field(default_factory=list)

    def start(self, loop) -> None:
        pass

    def open(self, key, spec) -> bool:
        self.opened.append(key)
        return self.accept_flows

    def data(self, key, pending, nbytes) -> bool:
        if self.accept_data:
            self.data_sent.append((key, nbytes))
        return self.accept_data

    def finish(self, key, end, skipped_bytes) -> None:
        self.finished.append((key, skipped_bytes))


def failover(links: list[FakeLink], got: dict, restart_after_s: float = 60.0) -> FailoverBackend:
    def make(**kw) -> FakeLink:
        links.append(FakeLink(**kw))
        return links[-1]

    backend = FailoverBackend(
        default_registry(), "x:y", got.__setitem__, restart_after_s=restart_after_s, link_factory=make
    )
    backend.start(asyncio.new_event_loop())
    return backend


def test_flows_go_to_the_worker_while_it_takes_them_else_in_process():
    """An accepted flow gets the worker's batch size; a refused one (the worker is over half its
    bound) is parsed in-process, at the in-process batch size, and its facts come at once."""
    links: list[FakeLink] = []
    got: dict = {}
    backend = failover(links, got)
    assert backend.open("a", SPEC) == WORKER_FLUSH_BYTES
    links[0].accept_flows = False
    assert backend.open("b", SPEC) == IN_PROCESS_FLUSH_BYTES
    assert backend.data("b", [CHAT, T0 + 0.1], len(CHAT)) == 2
    backend.finish("b", StreamEnd(EndCause.EOF, T0 + 1))
    assert [b.text for b in got["b"].blocks] == ["hi"]
    assert backend.held("a") and not backend.held("b")
    assert links[0].opened == ["a", "b"]


def test_a_refused_batch_stops_that_flows_observation_and_counts_its_bytes():
    links: list[FakeLink] = []
    got: dict = {}
    backend = failover(links, got)
    backend.open("a", SPEC)
    backend.data("a", [CHAT, T0 + 0.1], len(CHAT))
    links[0].accept_data = False
    backend.data("a", [CHAT, T0 + 0.2], len(CHAT))
    links[0].accept_data = True
    backend.data("a", [CHAT, T0 + 0.3], len(CHAT))  # not sent either: observation stopped at the first refusal
    assert links[0].data_sent == [("a", len(CHAT))]
    assert (backend.sent_bytes("a"), backend.skipped_bytes("a")) == (len(CHAT), 2 * len(CHAT))
    backend.finish("a", StreamEnd(EndCause.EOF, T0 + 1))
    assert links[0].finished == [("a", 2 * len(CHAT))]


def test_a_dead_workers_flows_are_finished_in_process_with_observer_error():
    """The flow already finished gets its facts at once; the open one goes on in-process, only
    counting; both keep every byte forwarded and name the death."""
    links: list[FakeLink] = []
    got: dict = {}
    backend = failover(links, got)
    for key in ("done", "open"):
        backend.open(key, SPEC)
        backend.data(key, [CHAT, T0 + 0.1], len(CHAT))
    backend.finish("done", StreamEnd(EndCause.EOF, T0 + 1))
    backend.open("behind", SPEC)
    links[0].accept_data = False
    backend.data("behind", [CHAT, T0 + 0.1], len(CHAT))  # refused: counted, not sent
    backend.finish("behind", StreamEnd(EndCause.EOF, T0 + 1))
    assert got == {}
    links[0].on_death("worker exited (killed by signal 9)")
    assert sorted(got) == ["behind", "done"]
    backend.data("open", [CHAT, T0 + 2], len(CHAT))
    backend.finish("open", StreamEnd(EndCause.EOF, T0 + 3))
    for key, nbytes in (("done", len(CHAT)), ("open", 2 * len(CHAT)), ("behind", len(CHAT))):
        facts = got[key]
        assert facts.response_bytes == nbytes
        assert facts.outcome == "unreadable" and facts.blocks == []
        assert [(v.kind, v.detail) for v in facts.violations] == [
            ("observer_error", "WorkerDied: worker exited (killed by signal 9)")
        ]
    assert backend.worker_deaths == 1 and backend.link is None
    assert backend.open("next", SPEC) == IN_PROCESS_FLUSH_BYTES  # died young: in-process from now on
    assert len(links) == 1


def test_a_worker_that_lived_long_enough_is_replaced():
    links: list[FakeLink] = []
    backend = failover(links, {}, restart_after_s=0.0)
    links[0].on_death("gone")
    assert len(links) == 2 and backend.link is links[1]
    assert backend.open("a", SPEC) == WORKER_FLUSH_BYTES


def test_in_process_backend_records_an_unknown_dialect_as_observer_error():
    got: dict = {}
    backend = InProcessBackend(only_openai_chat(), got.__setitem__)
    backend.open("a", ResponseSpec("anthropic.messages", 200, "text/event-stream"))
    event = b"event: x\ndata: {}\n\n"
    backend.data("a", [event, T0], len(event))
    backend.finish("a", StreamEnd(EndCause.EOF, T0 + 1))
    assert got["a"].response_bytes == len(event)
    assert [(v.kind, v.detail) for v in got["a"].violations] == [
        ("observer_error", "open: KeyError: 'anthropic.messages'")
    ]


def _state() -> FlowState:
    dialect = OpenAIChatDialect()
    ex = skeleton(
        dialect,
        scheme="https",
        host="h",
        port=443,
        path="/v1/chat/completions?api_key=sk-x",
        method="POST",
        http_version="HTTP/2.0",
        started_at_s=T0,
    )
    return FlowState(dialect, ex, RequestView("POST", "h", "/v1/chat/completions", {}), "client-1")


def test_a_flow_without_a_response_is_recorded_from_its_request_alone():
    records: list = []
    table = FlowTable(sink=lambda r: records.append(r) or True)
    state = _state()
    state.parsed = True
    table.track("f1", state)
    assert table.of_client("client-1") == [state]
    table.finish(state, StreamEnd(EndCause.UPSTREAM_FAILED, T0 + 1, transport_error="connect refused"), 502)
    table.finish(state, StreamEnd(EndCause.EOF, T0 + 2))  # once per flow
    (rec,) = records
    assert (rec.outcome, rec.status_code, rec.error.code, rec.transport_error) == (
        "error",
        502,
        "no_response",
        "connect refused",
    )
    assert rec.path == "/v1/chat/completions?api_key=REDACTED"
    assert table.records_submitted == 1


def test_a_flow_that_ended_before_its_request_body_says_so():
    records: list = []
    table = FlowTable(sink=lambda r: records.append(r) or True)
    table.finish(_state(), StreamEnd(EndCause.CLIENT_ABORTED, T0 + 1))
    (rec,) = records
    assert rec.outcome == "client_aborted"
    assert [v.kind for v in rec.violations] == ["incomplete_request"]


def test_a_sink_that_refuses_or_fails_counts_the_record_dropped():
    def boom(record) -> bool:
        raise RuntimeError("disk full")

    for sink in (lambda r: False, boom, None):
        table = FlowTable(sink=sink)
        state = _state()
        state.parsed = True
        table.finish(state, StreamEnd(EndCause.SHUTDOWN, T0))
        assert (table.records_submitted, table.records_dropped) == (0, 1)


def test_facts_for_an_unknown_record_are_ignored():
    table = FlowTable(sink=lambda r: True)
    table.on_facts("nobody", ResponseFacts())
    assert table.records_submitted == table.records_dropped == 0


def test_reading_a_request_is_bounded_and_reports_what_it_could_not_read():
    dialect, view = OpenAIChatDialect(), RequestView("POST", "h", "/v1/chat/completions", {})
    body = b'{"model":"m","stream":true,"messages":[],"api_key":"sk-live-abcdef123"}'
    read = read_request(dialect, view, gzip.compress(body), "gzip", Limits())
    assert read.facts is not None and read.facts.parameters == {"api_key": "REDACTED"}
    assert read.secrets == ["sk-live-abcdef123"] and read.violations == []
    bomb = gzip.compress(b" " * (4 << 20))
    read = read_request(dialect, view, bomb, "gzip", Limits(max_request_bytes=1 << 20))
    assert read.facts is None and read.body_bytes == len(bomb)
    assert [v.kind for v in read.violations] == [ViolationKind.OVERSIZE_REQUEST]
    read = read_request(dialect, view, b"\x00garbage", "gzip", Limits())
    assert read.facts is None and [v.kind for v in read.violations] == [ViolationKind.CONTENT_DECODING_ERROR]


def test_the_worker_builds_the_registry_it_is_named():
    """A custom registry reaches the worker by its factory name: a dialect it lacks is an
    ``observer_error``, one it has parses."""
    core = WorkerCore("tests.unit.test_capture:only_openai_chat")
    core.handle(Open("a", SPEC))
    core.handle(Open("b", ResponseSpec("anthropic.messages", 200, "text/event-stream")))
    core.handle(Data([("a", [CHAT, T0 + 0.1]), ("b", [CHAT, T0 + 0.1])]))
    (a,) = core.handle(Finish("a", StreamEnd(EndCause.EOF, T0 + 1)))
    (b,) = core.handle(Finish("b", StreamEnd(EndCause.EOF, T0 + 1)))
    assert [blk.text for blk in a.facts.blocks] == ["hi"]
    assert [v.detail for v in b.facts.violations] == ["worker open: KeyError: 'anthropic.messages'"]


def _imports(path) -> set[str]:
    import ast

    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_dependencies_point_inward():
    """Nothing in ``observer/`` imports ``addons/``; in the capture path only the hook module
    imports mitmproxy (the rest is tested with plain objects, above)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "observer"
    offenders = {
        str(p.relative_to(root)): sorted(n for n in _imports(p) if n.split(".")[0] == "addons")
        for p in root.rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}
    mitm = sorted(
        p.name for p in (root / "capture").glob("*.py") if any(n.split(".")[0] == "mitmproxy" for n in _imports(p))
    )
    assert mitm == ["hooks.py"]


def test_response_facts_are_the_records_response_side():
    """``ResponseFacts`` is made from ``Exchange``'s declaration: the same names, types and
    defaults for every response field, and every field of the record is either the request
    side's (the skeleton's) or the response's."""
    from dataclasses import fields

    from observer.records import Exchange
    from observer.response import RESPONSE_FIELDS

    record = {f.name: f for f in fields(Exchange)}
    facts = fields(ResponseFacts)
    assert tuple(f.name for f in facts) == RESPONSE_FIELDS
    for f in facts:
        assert (f.type, f.default, f.default_factory) == (
            record[f.name].type,
            record[f.name].default,
            record[f.name].default_factory,
        )
    request_side = {
        "id",
        "provenance",
        "dialect",
        "scheme",
        "host",
        "port",
        "path",
        "method",
        "http_version",
        "client_address",
        "proxy_user",
        "key_fingerprint",
        "request_last_event_id",
        "status_code",
        "started_at",
        "request",
    }
    assert set(record) == request_side | set(RESPONSE_FIELDS)


def _serve(
    frames: bytes, registry: str = "observer.dialects.registry:default_registry", close: bool = True
) -> tuple[int, list]:
    """Runs the worker's loop (``serve``) in a thread on two real pipes: writes ``frames`` (then
    closes the data pipe when ``close``) and returns its exit status and every answer."""
    import os
    import threading

    from observer.capture.messages import FrameReader
    from observer.capture.worker import serve

    d_r, d_w = os.pipe()
    r_r, r_w = os.pipe()
    status: list[int] = []
    thread = threading.Thread(target=lambda: status.append(serve(d_r, r_w, registry)), daemon=True)
    thread.start()
    os.write(d_w, frames)
    if close:
        os.close(d_w)
    thread.join(10)
    assert status, "the worker loop did not end"  # (it closed r_w: the answers end with EOF)
    answers, reader = [], FrameReader()
    while chunk := os.read(r_r, 1 << 16):
        answers += reader.feed(chunk)
    os.close(r_r)
    os.close(d_r)
    if not close:
        os.close(d_w)
    return status[0], answers


def test_the_worker_loop_answers_until_stop():
    from observer.capture.messages import Facts, Stop, Stopped, encode

    frames = b"".join(
        encode(m)
        for m in (Open("a", SPEC), Data([("a", [CHAT, T0])]), Finish("a", StreamEnd(EndCause.EOF, T0 + 1)), Stop())
    )
    status, answers = _serve(frames, close=False)
    assert status == 0
    assert [a.__class__ for a in answers] == [Facts, Stopped]
    assert [b.text for b in answers[0].facts.blocks] == ["hi"]


def test_the_worker_loop_ends_on_eof_a_corrupt_frame_or_a_bad_registry():
    """EOF without ``Stop`` (the proxy went away), a frame announcing 2 GiB, a registry that
    cannot be built: exit status 1, nothing answered. A message it does not know (or a
    ``Finish`` of an unknown flow) is logged and the loop goes on."""
    from observer.capture.messages import Stop, Stopped, encode

    assert _serve(encode(Open("a", SPEC))) == (1, [])
    assert _serve(b"\xff\xff\xff\x7f") == (1, [])
    assert _serve(encode(Stop()), registry="no_such_module:registry") == (1, [])
    status, answers = _serve(
        encode("not a message") + encode(Finish("x", StreamEnd(EndCause.EOF, T0))) + encode(Stop()), close=False
    )
    assert status == 0 and [a.__class__ for a in answers] == [Stopped]


def test_a_failing_finish_still_gives_facts_with_the_bytes():
    from observer.capture.parsing import finish_observer, open_observer

    obs = open_observer(default_registry(), SPEC, "open")
    obs.feed(CHAT, T0)

    def boom(end):
        raise RuntimeError("bug")

    obs.finish = boom  # type: ignore[method-assign]
    facts = finish_observer(obs, StreamEnd(EndCause.EOF, T0 + 1, transport_error="reset"))
    assert (facts.response_bytes, facts.transport_error) == (len(CHAT), "reset")
    assert [(v.kind, v.detail) for v in facts.violations] == [("observer_error", "finish: RuntimeError")]
