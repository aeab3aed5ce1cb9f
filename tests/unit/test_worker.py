"""The observer worker process (``observer.capture.worker``, ``link``) and the addon's worker mode.

- frames survive any chunking of the pipe; a corrupt length is an error, not a hang;
- the facts the worker makes equal the facts the in-process observer makes from the same
  chunks and arrival times, for every wire fixture, sans-IO and through a real child process
  with all cases interleaved on one pipe;
- the addon in worker mode: a complete stream, a stream open at shutdown (``interrupted`` with
  its partial text), a worker killed mid-stream (``observer_error`` naming the signal, every
  forwarded byte counted, the next stream observed in-process), a stopped worker that lets the
  pipe fill (the flow over the bound is no longer observed, ``observer_error``, bytes counted),
  and a worker that cannot start or exits at once (streams observed in-process).

Every loop that waits for the child is bounded (``until``)."""

from __future__ import annotations

import asyncio
import os
import pickle
import random
import signal
from dataclasses import asdict, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mitmproxy.test import taddons

from observer.capture.hooks import METADATA_KEY, LLMAudit
from observer.capture.link import WorkerLink
from observer.capture.messages import Data, Facts, Finish, FrameReader, Open, Turn, encode
from observer.capture.worker import WorkerCore
from observer.dialects.registry import default_registry
from observer.response import ResponseFacts, ResponseSpec, StreamEnd
from observer.tap import StreamObserver
from tests.unit.test_addon import BODY, REQUEST, Sink, llm_flow, open_stream
from tests.wirefeed import T0, Case, cases, dialect_dirs, load, view_of


async def until(cond, timeout_s: float = 15.0) -> None:
    """Waits (polling every 10 ms) until ``cond()`` is true; fails after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not cond():
        if loop.time() > end:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(0.01)


# ----- frames -----


@settings(max_examples=80, deadline=None)
@given(
    messages=st.lists(
        st.tuples(st.integers(0, 5), st.integers(0, 10**6), st.binary(max_size=300), st.floats(allow_nan=False)),
        max_size=12,
    ),
    cuts=st.lists(st.integers(0, 5000), max_size=20),
)
def test_frames_survive_any_chunking(messages, cuts):
    wire = b"".join(encode(m) for m in messages)
    points = sorted({c for c in cuts if 0 < c < len(wire)})
    reader = FrameReader()
    got = []
    for a, b in zip([0, *points], [*points, len(wire)], strict=True):
        got += reader.feed(wire[a:b])
    assert got == messages
    assert reader.pending_bytes == 0


def test_a_frame_announcing_more_than_the_maximum_is_an_error():
    reader = FrameReader()
    assert reader.feed(b"\x01\x00") == []  # incomplete header: waits
    with pytest.raises(ValueError, match="corrupt pipe"):
        reader.feed(b"\x00\x7f")  # 0x7f000001 bytes announced


# ----- records: worker == in-process -----


def _spec(case: Case) -> ResponseSpec:
    facts, _ = default_registry().get(case.dialect).parse_request(case.request, view_of(case))
    return ResponseSpec(
        case.dialect,
        case.status,
        case.content_type,
        case.content_encoding,
        T0,
        case.path,
        tuple(facts.tool_names),
        facts.request_id,
        facts.stream,
    )


def _chunks(case: Case, rng: random.Random) -> list:
    """``[chunk, arrival_s, ...]``: the body cut at random points, 10 ms apart."""
    body = case.body
    points = sorted(rng.sample(range(1, len(body)), min(len(body) - 1, rng.randint(0, 12)))) if len(body) > 1 else []
    parts = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True) if b > a]
    out: list = []
    for i, p in enumerate(parts):
        out += [p, T0 + 0.01 * (i + 1)]
    return out


def _in_process(case: Case, pending: list) -> list[dict]:
    """The facts of each turn cut (one record each) and of the rest, unless it is empty."""
    obs = StreamObserver(default_registry().get(case.dialect), _spec(case))
    for i in range(0, len(pending), 2):
        obs.feed(pending[i], pending[i + 1])
    turns = [asdict(facts) for _, facts in obs.take_turns()]
    facts = obs.finish(StreamEnd(case.end, T0 + 1.0))
    return turns + ([] if obs.tail_empty else [asdict(facts)])


ALL_CASES = [(d, c) for d in dialect_dirs() for c in cases(d)]
# Fixtures of a stream cut into turns with nothing after the last (no final facts): by hand,
# from their bytes (tests/fixtures/wire/connect.cursor: each ends with turn_ended and heartbeats).
MULTI_TURN_EMPTY_TAIL = {
    ("connect.cursor", "cached_turn"),
    ("connect.cursor", "no_usage"),
    ("connect.cursor", "run_turn"),
    ("connect.cursor", "second_turn"),
}


def test_worker_core_facts_equal_in_process_facts():
    """Sans-IO: every fixture, its chunks sent in three ``Data`` frames (so some are joined), each
    message through encode/decode (what crosses the pipe: pickled specs and facts)."""
    assert len(ALL_CASES) > 40
    rng = random.Random(7)
    core = WorkerCore()
    reader = FrameReader()
    for n, (d, c) in enumerate(ALL_CASES):
        fid = str(n)
        case = load(d, c)
        pending = _chunks(case, rng)
        third = (len(pending) // 6) * 2
        msgs = [
            Open(fid, _spec(case)),
            Data([(fid, pending[:third])]),
            Data([(fid, pending[third:])]),
            Finish(fid, StreamEnd(case.end, T0 + 1.0)),
        ]
        answers = []
        for m in msgs:
            (decoded,) = reader.feed(encode(m))
            answers += core.handle(decoded)
        *turns, answer = answers
        assert answer.__class__ is Facts and answer.fid == fid
        assert [(t.__class__, t.fid, t.index) for t in turns] == [(Turn, fid, i) for i in range(len(turns))]
        got = [pickle.loads(pickle.dumps(m.facts, protocol=5)) for m in answers]
        assert [asdict(f) for f in got if f is not None] == _in_process(case, pending), (d, c)
        assert (answer.facts is None) == ((d, c) in MULTI_TURN_EMPTY_TAIL)
    assert core.open_flows == 0


def test_a_flow_the_worker_cannot_observe_still_gets_its_facts():
    """An ``Open`` the worker cannot turn into an observer (here: a dialect it does not know) gives a
    record with the skeleton, the bytes and one ``observer_error``; the next flow is unaffected."""
    case = load("llm-stream-1.0", cases("llm-stream-1.0")[0])
    core = WorkerCore()
    core.handle(Open("0", replace(_spec(case), dialect="no-such-dialect")))
    core.handle(Open("1", _spec(case)))
    for fid in ("0", "1"):
        core.handle(Data([(fid, [case.body, T0 + 0.01])]))
    (answer,) = core.handle(Finish("0", StreamEnd(case.end, T0 + 1.0)))
    rec = answer.facts
    (answer,) = core.handle(Finish("1", StreamEnd(case.end, T0 + 1.0)))
    good = answer.facts
    assert rec.response_bytes == len(case.body)
    assert rec.outcome == "unreadable"
    assert [(v.kind, v.detail) for v in rec.violations] == [
        ("observer_error", "worker open: KeyError: 'no-such-dialect'")
    ]
    assert [asdict(good)] == _in_process(case, [case.body, T0 + 0.01])


def test_worker_process_facts_equal_in_process_facts():
    """A real worker process; every fixture's frames interleaved on one pipe."""

    async def run() -> dict[str, ResponseFacts]:
        got: dict[str, ResponseFacts] = {}
        turns: dict[str, list] = {}
        deaths: list[str] = []
        link = WorkerLink(
            on_facts=got.__setitem__,
            on_death=deaths.append,
            on_turn=lambda fid, index, facts: turns.setdefault(fid, []).append((index, facts)),
        )
        link.start(asyncio.get_running_loop())
        rng = random.Random(11)
        plans = []
        for n, (d, c) in enumerate(ALL_CASES):
            case = load(d, c)
            plans.append((str(n), case, _chunks(case, rng)))
            link.open(str(n), _spec(case))
        pieces = {fid: [pending[i : i + 4] for i in range(0, len(pending), 4)] for fid, _, pending in plans}
        while any(pieces.values()):  # two chunks per flow per round, the flows interleaved
            for fid, left in pieces.items():
                if left:
                    piece = left.pop(0)
                    assert link.data(fid, piece, sum(map(len, piece[::2])))
            await asyncio.sleep(0)  # the staged batches of this round go out as one frame
        for fid, case, _ in plans:
            link.finish(fid, StreamEnd(case.end, T0 + 1.0), 0)
        await until(lambda: len(got) == len(plans) or deaths)
        assert link.close(timeout_s=10.0)
        assert deaths == []
        for fid, case, pending in plans:
            cut = turns.get(fid, [])
            assert [i for i, _ in cut] == list(range(len(cut)))
            made = [asdict(f) for _, f in cut] + ([] if got[fid] is None else [asdict(got[fid])])
            assert made == _in_process(case, pending), (case.dialect, case.name)
        return got

    assert len(asyncio.run(run())) == len(ALL_CASES)


# ----- the addon in worker mode -----

COMPLETE_TEXT = "The weather in Vienna is 24C and sunny."
DELTA = (
    b'event: content.delta\ndata: {"type":"content.delta","seq":%d,"index":0,"delta":{"type":"text","text":"x"}}\n\n'
)


def drive(scenario, restart_after_s: float = 60.0) -> tuple[Sink, LLMAudit]:
    """Runs ``await scenario(addon, sink)`` on a fresh event loop with the addon in worker mode
    (``running`` called: the worker started, or not), then ``done`` (also when the scenario
    failed, after waking a worker it may have stopped); returns the sink and addon."""

    async def run() -> tuple[Sink, LLMAudit]:
        sink = Sink()
        addon = LLMAudit(sink=sink, worker=True)
        addon.worker_restart_after_s = restart_after_s
        with taddons.context(addon):
            addon.running()
            try:
                await scenario(addon, sink)
            finally:
                if addon._link is not None and addon._link.alive:
                    os.kill(addon._link.pid, signal.SIGCONT)  # type: ignore[arg-type]
                addon.done()
        return sink, addon

    return asyncio.run(run())


def test_worker_tap_hands_over_data_in_batches_of_256_kib():
    """A bulk stream's data goes to the worker in batches of ``WORKER_FLUSH_BYTES`` (256 KiB),
    not at the in-process tap's 32 KiB: fewer pipe writes and worker wake-ups."""
    seen: dict[str, int] = {}

    async def scenario(addon: LLMAudit, sink: Sink) -> None:
        f = llm_flow()
        tap = open_stream(addon, f)
        assert in_worker(addon, f)
        chunk = DELTA % 1
        fed = 0
        key = f.metadata[METADATA_KEY].key
        while addon._backend.sent_bytes(key) == 0 and fed < 1 << 20:
            assert tap(chunk) is chunk
            fed += len(chunk)
        seen.update(fed=fed, sent=addon._backend.sent_bytes(key), chunk=len(chunk))
        tap(b"")
        addon.response(f)
        await until(lambda: sink.records)

    (rec,) = drive(scenario)[0].records
    assert seen["sent"] == seen["fed"]  # one batch: everything fed so far
    assert seen["fed"] - seen["chunk"] < 256 << 10 <= seen["fed"]  # sent at the first chunk that reached 256 KiB
    assert rec.response_bytes == seen["fed"]


def in_worker(addon: LLMAudit, f) -> bool:
    """Whether the worker parses flow ``f`` (its record's key is held by the worker)."""
    link = addon._link
    return link is not None and addon._backend.held(f.metadata[METADATA_KEY].key)


def _worker_pid(addon: LLMAudit) -> int:
    assert addon._link is not None and addon._link.alive
    return addon._link.pid  # type: ignore[return-value]


def test_addon_worker_records_a_complete_stream():
    async def scenario(addon: LLMAudit, sink: Sink) -> None:
        _worker_pid(addon)
        f = llm_flow()
        tap = open_stream(addon, f)
        assert in_worker(addon, f)
        for c in (BODY[:100], BODY[100:101], BODY[101:]):
            assert tap(c) is c
        addon.response(f)
        await until(lambda: sink.records)

    (rec,) = drive(scenario)[0].records
    assert rec.text == COMPLETE_TEXT
    assert rec.outcome == "completed"
    assert rec.usage.input_tokens == 42 and rec.usage.output_tokens == 8
    assert rec.response_bytes == len(BODY)
    assert rec.path == "/v1/stream?key=REDACTED&x=1"
    assert rec.violations == []


def test_addon_worker_shutdown_records_open_streams_as_interrupted():
    """As in-process (test_addon.py): the worker delivers the partial record before ``done`` returns."""

    async def scenario(addon: LLMAudit, sink: Sink) -> None:
        _worker_pid(addon)
        open_stream(addon, llm_flow())(BODY[: BODY.index(b"event: content.delta", BODY.index(b'" weather"'))])

    (rec,) = drive(scenario)[0].records
    assert rec.outcome == "interrupted"
    assert rec.text == "The weather"
    assert [v.kind for v in rec.violations] == ["missing_stream_end"]


def test_addon_worker_killed_mid_stream_records_observer_error_and_goes_on_in_process():
    async def scenario(addon: LLMAudit, sink: Sink) -> None:
        pid = _worker_pid(addon)
        f = llm_flow()
        tap = open_stream(addon, f)
        tap(BODY[:300])
        tap.flush()
        os.kill(pid, signal.SIGKILL)
        await until(lambda: addon._link is None)
        tap(BODY[300:])  # after the death: only counted, in-process
        addon.response(f)
        await until(lambda: len(sink.records) == 1)
        g = llm_flow()  # the next stream: in-process, complete
        tap2 = open_stream(addon, g)
        assert not in_worker(addon, g)
        tap2(BODY)
        addon.response(g)

    sink, addon = drive(scenario)
    rec, nxt = sink.records
    assert rec.outcome == "unreadable"  # clean end, content not read
    assert rec.response_bytes == len(BODY)
    assert rec.text == ""
    assert [(v.kind, v.detail) for v in rec.violations] == [
        ("observer_error", "WorkerDied: worker exited (killed by signal 9)")
    ]
    assert rec.request_id == "550e8400-e29b-41d4-a716-446655440000"  # the skeleton's request facts
    assert nxt.text == COMPLETE_TEXT
    assert nxt.violations == []
    assert addon.worker_deaths == 1


def test_addon_worker_finish_sent_before_the_death_is_recorded_in_process():
    """The record was asked of the worker, which died before answering: made in-process."""

    async def scenario(addon: LLMAudit, sink: Sink) -> None:
        pid = _worker_pid(addon)
        os.kill(pid, signal.SIGSTOP)  # it cannot answer
        f = llm_flow()
        open_stream(addon, f)(BODY)
        addon.response(f)
        assert sink.records == []
        os.kill(pid, signal.SIGKILL)
        await until(lambda: sink.records)

    (rec,) = drive(scenario)[0].records
    assert rec.response_bytes == len(BODY)
    assert rec.outcome == "unreadable"
    assert [v.kind for v in rec.violations] == ["observer_error"]


def test_addon_worker_over_its_buffer_bound_stops_observing_that_flow():
    """A stopped worker: the pipe fills (1 MiB), then the parent's queue reaches its bound; the
    flow crossing it is no longer sent, its bytes are counted, the client's chunks are the same
    objects throughout, and once the worker runs again the record says what happened."""
    seen: dict[str, int] = {"total": 0}

    async def scenario(addon: LLMAudit, sink: Sink) -> None:
        pid = _worker_pid(addon)
        addon._link.max_buffer_bytes = 1 << 20  # type: ignore[union-attr]  # (4 of the tap's 256 KiB batches)
        os.kill(pid, signal.SIGSTOP)
        f = llm_flow()
        tap = open_stream(addon, f)
        key = f.metadata[METADATA_KEY].key
        start = BODY[: BODY.index(b"event: content.delta")]
        for i, chunk in enumerate([start] + [DELTA % i for i in range(1, 30001)]):
            assert tap(chunk) is chunk
            seen["total"] += len(chunk)
            if i % 100 == 0:
                await asyncio.sleep(0)  # the staged batches go to the pipe, then to the queue
        tap.flush()
        assert addon._backend.skipped_bytes(key) > 0
        assert addon._link.queued_bytes > 0  # type: ignore[union-attr]  # the pipe is full
        seen["refused"] = addon._link.data_refused  # type: ignore[union-attr]
        g = llm_flow()  # a new flow while the worker is behind: observed in-process, complete
        tap2 = open_stream(addon, g)
        assert not in_worker(addon, g)
        tap2(BODY)
        addon.response(g)
        await until(lambda: sink.records)
        assert sink.records[0].text == COMPLETE_TEXT
        os.kill(pid, signal.SIGCONT)
        addon.response(f)
        await until(lambda: len(sink.records) == 2)

    rec = drive(scenario)[0].records[1]
    assert seen["refused"] >= 1
    assert rec.response_bytes == seen["total"]
    assert rec.outcome == "unreadable"
    (err,) = [v for v in rec.violations if v.kind == "observer_error"]
    assert err.detail.startswith("WorkerOverloaded: the worker fell behind; the last ")
    assert 0 < len(rec.text) < 30000  # what was observed before the bound: a prefix of the x's
    assert set(rec.text) == {"x"}


def test_a_stalled_worker_is_killed_and_reported():
    """A worker that answers nothing for ``stall_timeout_s`` while a record is awaited is hung."""

    async def run() -> list[str]:
        deaths: list[str] = []
        link = WorkerLink(on_facts=lambda fid, facts: None, on_death=deaths.append, stall_timeout_s=0.4)
        link.start(asyncio.get_running_loop())
        case = load("llm-stream-1.0", cases("llm-stream-1.0")[0])
        os.kill(link.pid, signal.SIGSTOP)  # type: ignore[arg-type]
        assert link.open("0", _spec(case))
        link.finish("0", StreamEnd(case.end, T0 + 1.0), 0)
        await until(lambda: deaths, timeout_s=10.0)
        assert not link.alive
        assert link.close() is False
        return deaths

    (reason,) = asyncio.run(run())
    assert reason.startswith("worker stalled: no progress for ")


def test_addon_worker_that_had_run_long_enough_is_replaced():
    pids: list[int] = []

    async def scenario(addon: LLMAudit, sink: Sink) -> None:
        pids.append(_worker_pid(addon))
        os.kill(pids[0], signal.SIGKILL)
        await until(lambda: addon._link is not None and addon._link.pid != pids[0])
        pids.append(_worker_pid(addon))
        f = llm_flow()
        tap = open_stream(addon, f)
        assert in_worker(addon, f)  # observed by the new worker
        tap(BODY)
        addon.response(f)
        await until(lambda: sink.records)

    sink, addon = drive(scenario, restart_after_s=0.0)
    assert pids[0] != pids[1]
    assert addon.worker_deaths == 1
    (rec,) = sink.records
    assert rec.text == COMPLETE_TEXT
    assert rec.violations == []


def test_addon_worker_ignores_sigterm():
    """systemd's default KillMode sends SIGTERM to every process of the service: the worker must
    stay to hand back the open streams' records (trial finding)."""

    async def scenario(addon: LLMAudit, sink: Sink) -> None:
        pid = _worker_pid(addon)
        await until(lambda: _ignores(pid, signal.SIGTERM))  # its first statements (a start-up window)
        os.kill(pid, signal.SIGTERM)
        os.kill(pid, signal.SIGINT)
        f = llm_flow()
        open_stream(addon, f)(BODY)
        addon.response(f)
        await until(lambda: sink.records)
        assert addon._link is not None and addon._link.alive and addon._link.pid == pid

    (rec,) = drive(scenario)[0].records
    assert rec.text == COMPLETE_TEXT


def test_a_worker_dies_with_its_proxy_even_when_stopped():
    """SIGKILL of the proxy process: the kernel kills its worker (PR_SET_PDEATHSIG), also a
    stopped one, which would otherwise stay stopped forever under PID 1 (trial finding), and
    also one stopped before its first statement ran (the signal is armed before exec: trial
    finding, a worker stopped at once was orphaned)."""
    script = (
        "import asyncio, os, signal, sys\n"
        "from observer.capture.link import WorkerLink\n"
        "async def main():\n"
        "    link = WorkerLink(on_facts=lambda f, r: None, on_death=lambda r: None)\n"
        "    link.start(asyncio.get_running_loop())\n"
        "    os.kill(link.pid, signal.SIGSTOP)\n"  # at once: before the worker's own first statement
        "    print(link.pid, flush=True)\n"
        "    await asyncio.sleep(60)\n"
        "asyncio.run(main())\n"
    )
    import subprocess
    import sys
    import time

    proxy = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    worker = 0
    try:
        worker = int(proxy.stdout.readline())  # type: ignore[union-attr]
        deadline = time.monotonic() + 10  # SIGSTOP takes effect asynchronously (seen as "R" on a busy machine)
        while _state(worker) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _state(worker) == "T"
        proxy.kill()
        proxy.wait(5)
        deadline = time.monotonic() + 10
        while _state(worker) not in ("gone", "Z") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _state(worker) in ("gone", "Z")
    finally:
        if proxy.poll() is None:
            proxy.kill()
        if worker and _state(worker) not in ("gone", "Z"):
            os.kill(worker, signal.SIGKILL)  # a failed check must not leave it stopped under PID 1


def _ignores(pid: int, sig: int) -> bool:
    """Whether process ``pid`` ignores ``sig`` (``SigIgn`` mask of ``/proc/<pid>/status``)."""
    with open(f"/proc/{pid}/status") as f:
        mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigIgn:"))
    return bool(mask >> (sig - 1) & 1)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


async def _one_stream_in_process(addon: LLMAudit, sink: Sink) -> None:
    await until(lambda: addon._link is None)
    f = llm_flow()
    tap = open_stream(addon, f)
    assert not in_worker(addon, f)
    tap(BODY)
    addon.response(f)


def test_addon_worker_that_cannot_start_observes_in_process(monkeypatch):
    def refuse(self, loop):
        raise OSError("no such interpreter")

    monkeypatch.setattr(WorkerLink, "start", refuse)
    sink, addon = drive(_one_stream_in_process)
    assert sink.records[0].text == COMPLETE_TEXT
    assert addon.worker_deaths == 0


def test_addon_worker_that_exits_at_once_is_noticed_and_streams_are_observed_in_process(monkeypatch):
    real_init = WorkerLink.__init__

    def init(self, **kw):
        real_init(self, **kw, python="/bin/false")  # starts, exits with status 1 without reading

    monkeypatch.setattr(WorkerLink, "__init__", init)
    sink, addon = drive(_one_stream_in_process)
    assert sink.records[0].text == COMPLETE_TEXT
    assert addon.worker_deaths == 1


def test_worker_option_off_observes_in_process():
    async def run() -> LLMAudit:
        addon = LLMAudit(sink=Sink())
        with taddons.context(addon) as tctx:
            tctx.configure(addon, observer_worker=False)
            addon.running()
            assert addon._link is None
            addon.done()
        return addon

    asyncio.run(run())


@pytest.mark.parametrize("mb", [0, -1, 4097, 10**6])
def test_worker_buffer_option_is_bounded(mb):
    """1-4096 MiB: the queue is the proxy's memory (trial note: 10**6 was accepted)."""
    from mitmproxy import exceptions

    addon = LLMAudit(sink=Sink())
    with taddons.context(addon) as tctx:
        with pytest.raises(exceptions.OptionsError, match=r"observer_worker_buffer_mb must be 1-4096 .*got " + str(mb)):
            tctx.configure(addon, observer_worker_buffer_mb=mb)
        tctx.configure(addon, observer_worker_buffer_mb=4096)


def test_worker_records_are_scrubbed_of_redacted_credentials_too():
    """The record the worker returns passes the same scrub as an in-process one: a 422 body
    that quotes the request's ``api_key`` is stored without it."""
    echo = b'{"detail":[{"loc":["body","api_key"],"input":"sk-live-abc123"}]}'

    async def scenario(addon: LLMAudit, sink: Sink) -> None:
        f = llm_flow("application/json")
        f.request.host = "api.openai.com"
        f.request.path = "/v1/chat/completions"
        f.request.content = b'{"model":"m","stream":true,"messages":[],"api_key":"sk-live-abc123"}'
        tap = open_stream(addon, f, status=422, content_type="application/json")
        assert in_worker(addon, f)
        tap(echo)
        tap(b"")
        addon.response(f)
        await until(lambda: sink.records)

    (rec,) = drive(scenario)[0].records
    assert rec.outcome == "http_error"
    assert rec.request.parameters == {"api_key": "REDACTED"}
    assert rec.response_body == '{"detail":[{"loc":["body","api_key"],"input":"REDACTED"}]}'


def test_a_request_nested_past_picklings_limit_is_parsed_by_the_worker():
    """Trial finding: a request whose metadata nests ~900 levels (orjson accepts 1024) was past
    pickle's recursion limit when the whole record crossed the pipe, and the flow lost its text.
    Only the response's spec crosses it now (no prompts, no metadata): the worker parses the
    flow and the record is complete."""
    import json

    doc = json.loads(REQUEST)
    deep: list = []
    for _ in range(1000):
        deep = [deep]
    doc["metadata"]["deep"] = deep

    async def scenario(addon: LLMAudit, sink: Sink) -> None:
        f = llm_flow()
        f.request.content = json.dumps(doc).encode()
        tap = open_stream(addon, f)
        assert in_worker(addon, f)
        tap(BODY)
        tap(b"")
        addon.response(f)
        await until(lambda: sink.records)

    (rec,) = drive(scenario)[0].records
    assert rec.outcome == "completed"
    assert rec.text == COMPLETE_TEXT
    assert rec.violations == []


def test_a_write_to_a_dead_worker_reports_its_exit_status():
    """A write that meets a broken pipe (the worker exited before its records pipe's EOF was
    read) reports the same reason as the EOF does: the e2e kill test saw "data pipe: [Errno 32]
    Broken pipe" in one CI run and "worker exited (killed by signal 9)" in the others."""
    deaths: list[str] = []

    async def run() -> None:
        link = WorkerLink(on_facts=lambda fid, facts: None, on_death=deaths.append)
        link.start(asyncio.get_running_loop())
        os.kill(link.pid, signal.SIGKILL)  # type: ignore[arg-type]
        os.waitid(os.P_PID, link.pid, os.WEXITED | os.WNOWAIT)  # exited; the loop has not run since
        assert link.data("0", [b"x" * 100, T0], 100)
        link.commit()  # the write meets the closed pipe now, before the EOF callback
        assert deaths == ["worker exited (killed by signal 9)"]
        link.close(timeout_s=1.0)

    asyncio.run(run())


def test_a_custom_registry_is_parsed_by_the_worker_too():
    """A registry named by its factory reaches the worker (it was in-process only before): the
    addon recognises an OpenAI chat request with it and the worker parses the stream."""
    chunk = (
        b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
        b'"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n'
    )

    async def run() -> list:
        sink = Sink()
        addon = LLMAudit(sink=sink, registry="tests.unit.test_capture:only_openai_chat", worker=True)
        with taddons.context(addon):
            addon.running()
            try:
                f = llm_flow("application/json")
                f.request.host = "api.openai.com"
                f.request.path = "/v1/chat/completions"
                f.request.content = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}'
                tap = open_stream(addon, f)
                assert in_worker(addon, f)
                tap(chunk)
                addon.response(f)
                await until(lambda: sink.records)
            finally:
                addon.done()
        return sink.records

    (rec,) = asyncio.run(run())
    assert (rec.dialect, rec.text, rec.outcome) == ("openai.chat", "hi", "completed")
