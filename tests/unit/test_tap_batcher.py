"""The capture path's batched hand-over (``TapBatcher`` + ``StreamTap``): the client's chunk is
returned at once (the same object); observation happens in the next sweep on the running loop,
with each chunk's own arrival time, in order; a flow is flushed before its record is finished;
a flow with its flush bytes waiting is observed at once; failures fail open. A sweep
parses in slices of at most ``slice_s`` per loop callback (other callbacks run in between), a
flow out of budget goes behind the others, and a flow finished or drained in the middle of a
sliced sweep is observed completely, exactly once."""

from __future__ import annotations

import asyncio
import itertools

from observer.capture.batcher import TapBatcher, running_loop
from observer.capture.tap import StreamTap
from observer.tap import feed_pending


class OneObserver:
    """A backend that feeds one observer, as ``InProcessBackend`` does."""

    def __init__(self, observer) -> None:
        self.observer = observer

    def data(self, key, pending, nbytes, deadline=None, clock=None) -> int:
        return feed_pending(self.observer, pending, deadline, clock)


def batcher_of(interval_s: float = 0.05, **kwargs) -> TapBatcher:
    return TapBatcher(running_loop, interval_s, **kwargs)


def tap_of(observer, batcher: TapBatcher, flush_bytes: int = 32 << 10) -> StreamTap:
    return StreamTap("k", OneObserver(observer), flush_bytes, batcher)


class FakeObserver:
    """Records what the tap feeds it; raises on a chosen chunk. Needs every arrival time (so the
    tap feeds chunk by chunk) until ``settled`` is set."""

    def __init__(self, raise_on: bytes | None = None) -> None:
        self.fed: list[tuple[bytes, float]] = []
        self.failed: list[BaseException] = []
        self.raise_on = raise_on
        self.needs_arrival_times = True

    def feed(self, data: bytes, now_s: float) -> None:
        if data == self.raise_on and not self.failed:
            raise RuntimeError("boom")
        self.fed.append((data, now_s))

    def fail(self, exc: BaseException) -> None:
        self.failed.append(exc)


def test_without_a_running_loop_chunks_are_observed_inline():
    obs = FakeObserver()
    tap = tap_of(obs, batcher_of(interval_s=0.05))
    chunk = b"data: {}\n\n"
    assert tap(chunk) is chunk
    assert [d for d, _ in obs.fed] == [chunk]


def test_interval_zero_observes_inline_even_on_a_loop():
    async def run() -> FakeObserver:
        obs = FakeObserver()
        tap = tap_of(obs, batcher_of(interval_s=0))
        tap(b"a")
        assert [d for d, _ in obs.fed] == [b"a"]
        return obs

    asyncio.run(run())


def test_chunks_wait_for_the_sweep_with_their_own_arrival_times():
    async def run() -> None:
        obs = FakeObserver()
        batcher = batcher_of(interval_s=0.05)
        tap = tap_of(obs, batcher)
        chunks = [b"one", b"two", b"three"]
        for c in chunks:
            assert tap(c) is c  # forwarded at once, the same object
            await asyncio.sleep(0.005)
        assert obs.fed == []  # not observed yet: the sweep has not run
        await asyncio.sleep(0.1)
        assert [d for d, _ in obs.fed] == chunks
        times = [t for _, t in obs.fed]
        assert times == sorted(times) and times[-1] - times[0] >= 0.009  # arrival times, not sweep time
        tap(b"four")  # a later chunk schedules a new sweep
        await asyncio.sleep(0.1)
        assert [d for d, _ in obs.fed][-1] == b"four"

    asyncio.run(run())


def test_flush_before_finish_and_flush_is_idempotent():
    async def run() -> None:
        obs = FakeObserver()
        batcher = batcher_of(interval_s=10.0)  # the sweep would come far too late
        tap = tap_of(obs, batcher)
        tap(b"x")
        tap(b"y")
        tap.flush()
        tap.flush()
        assert [d for d, _ in obs.fed] == [b"x", b"y"]
        batcher.sweep()  # the queued (already flushed) tap: nothing more
        assert len(obs.fed) == 2

    asyncio.run(run())


def test_a_flow_with_max_pending_bytes_waiting_is_observed_at_once():
    async def run() -> None:
        obs = FakeObserver()
        tap = tap_of(obs, batcher_of(interval_s=10.0), flush_bytes=100)
        tap(b"a" * 60)
        assert obs.fed == []
        tap(b"b" * 60)  # 120 bytes waiting >= 100
        assert [len(d) for d, _ in obs.fed] == [60, 60]

    asyncio.run(run())


def test_an_observer_failure_in_a_sweep_fails_open_and_counts_the_rest():
    async def run() -> None:
        obs = FakeObserver(raise_on=b"bad")
        tap = tap_of(obs, batcher_of(interval_s=0.01))
        out = [tap(c) for c in (b"ok", b"bad", b"after")]
        assert out == [b"ok", b"bad", b"after"]
        await asyncio.sleep(0.05)
        assert len(obs.failed) == 1
        assert [d for d, _ in obs.fed] == [b"ok", b"after"]  # chunks after the failure still reach feed

    asyncio.run(run())


# ----- slicing: one sweep parses at most ``slice_s`` per loop callback -----
#
# The budget is measured with an injected clock that reads "chunks fed so far", so a slice ends
# after a chosen number of chunks whatever the machine's speed: no timing asserts.


class Journal:
    """One log shared by several observers and a loop ticker: ``(flow, chunk)`` per fed chunk,
    ``"tick"`` per run of the ticker callback; ``clock`` = chunks fed so far."""

    def __init__(self) -> None:
        self.entries: list = []
        self.fed = 0
        self.observers: dict[str, JournalObserver] = {}

    def clock(self) -> float:
        return float(self.fed)

    def observer(self, name: str) -> JournalObserver:
        self.observers[name] = JournalObserver(self, name)
        return self.observers[name]

    def chunks(self, name: str | None = None) -> list[bytes]:
        return [c for e in self.entries if e != "tick" and (name is None or e[0] == name) for c in [e[1]]]

    def groups(self) -> list[list[bytes]]:
        """The fed chunks split at every ticker run (what one loop callback fed, in order)."""
        out: list[list[bytes]] = [[]]
        for e in self.entries:
            if e == "tick":
                if out[-1]:
                    out.append([])
            else:
                out[-1].append(e[1])
        return [g for g in out if g]


class JournalObserver:
    needs_arrival_times = True  # chunk by chunk, so a slice can end after any chunk

    def __init__(self, journal: Journal, name: str) -> None:
        self.journal = journal
        self.name = name
        self.fed: list[tuple[bytes, float]] = []

    def feed(self, data: bytes, now_s: float) -> None:
        self.fed.append((data, now_s))
        self.journal.fed += 1
        self.journal.entries.append((self.name, data))

    def fail(self, exc: BaseException) -> None:  # pragma: no cover - not used here
        raise AssertionError(exc)


async def _run_with_ticker(journal: Journal, until, max_iterations: int = 10_000) -> None:
    """Lets the loop run, with a callback that logs ``"tick"`` on every loop iteration
    (re-scheduled with ``call_soon``), until ``until()`` is true; bounded by iterations, not time."""
    loop = asyncio.get_running_loop()
    running = True

    def tick() -> None:
        if running:
            journal.entries.append("tick")
            loop.call_soon(tick)

    loop.call_soon(tick)
    try:
        for _ in range(max_iterations):
            if until():
                return
            await asyncio.sleep(0.001)
        raise AssertionError("the sweep did not finish")
    finally:
        running = False


def test_a_sweep_is_sliced_and_the_loop_runs_other_callbacks_in_between():
    """Budget 3 chunks: A's 5 chunks, B's 2, C's 1 are fed in three loop callbacks with the
    ticker in between; A (out of budget) goes behind B and C; each flow keeps its order and its
    own arrival times."""

    async def run() -> Journal:
        j = Journal()
        batcher = batcher_of(interval_s=0.001, slice_s=3, clock=j.clock)
        taps = {n: tap_of(j.observer(n), batcher) for n in "ABC"}
        sent = {"A": [b"a1", b"a2", b"a3", b"a4", b"a5"], "B": [b"b1", b"b2"], "C": [b"c1"]}
        for n in "ABC":
            for c in sent[n]:
                assert taps[n](c) is c
        assert j.entries == []  # nothing observed inline
        await _run_with_ticker(j, lambda: j.fed == 8)
        assert j.groups() == [[b"a1", b"a2", b"a3"], [b"b1", b"b2", b"c1"], [b"a4", b"a5"]]
        for n in "ABC":
            fed = j.observers[n].fed
            assert [d for d, _ in fed] == sent[n]
            times = [t for _, t in fed]
            assert times == sorted(times)
        return j

    asyncio.run(run())


def test_a_flow_with_many_chunks_waiting_does_not_starve_the_others():
    """A has 10 chunks waiting, B, C and D one each, budget 3: B, C and D are fed in the second
    slice, not after all of A."""

    async def run() -> None:
        j = Journal()
        batcher = batcher_of(interval_s=0.001, slice_s=3, clock=j.clock)
        taps = {n: tap_of(j.observer(n), batcher) for n in "ABCD"}
        for i in range(10):
            taps["A"](b"a%d" % i)
        for n in "BCD":
            taps[n](n.lower().encode())
        await _run_with_ticker(j, lambda: j.fed == 13)
        order = j.chunks()
        assert order[:6] == [b"a0", b"a1", b"a2", b"b", b"c", b"d"]
        assert j.chunks("A") == [b"a%d" % i for i in range(10)]

    asyncio.run(run())


def test_flush_in_the_middle_of_a_sliced_sweep_observes_everything_exactly_once():
    """The addon's finishing path (``flush``) between two slices: the flow's remaining chunks and
    one that arrived meanwhile are fed at once, in order; the next slice feeds the other flow and
    nothing of A again; afterwards nothing is left queued or scheduled."""

    async def run() -> None:
        j = Journal()
        batcher = batcher_of(interval_s=10.0, slice_s=2, clock=j.clock)  # only direct sweeps
        a, b = tap_of(j.observer("A"), batcher), tap_of(j.observer("B"), batcher)
        for c in (b"a1", b"a2", b"a3", b"a4", b"a5"):
            a(c)
        b(b"b1")
        b(b"b2")
        batcher.sweep()  # the first slice runs now, the rest is scheduled with call_soon
        assert j.chunks() == [b"a1", b"a2"]
        a(b"a6")  # arrives while A's older chunks are still waiting in the sweep
        a.flush()  # what LLMAudit._finish does before finishing the record
        assert j.chunks("A") == [b"a1", b"a2", b"a3", b"a4", b"a5", b"a6"]
        assert j.chunks("B") == []
        await _run_with_ticker(j, lambda: j.fed == 8 and batcher._cont is None)
        assert j.chunks("A") == [b"a1", b"a2", b"a3", b"a4", b"a5", b"a6"]  # exactly once
        assert j.chunks("B") == [b"b1", b"b2"]
        assert not a.queued and not b.queued and not batcher._sweep and not batcher._dirty
        a(b"a7")  # a later chunk is queued for the next timed sweep again
        assert a.queued and batcher._dirty == [a]
        batcher.drain()

    asyncio.run(run())


def test_pending_bytes_flush_in_the_middle_of_a_sliced_sweep_keeps_the_order():
    """A flow out of its slice keeps collecting chunks; when its flush bytes are reached it
    is observed at once (remaining older chunks first), and the next slice does not repeat them."""

    async def run() -> None:
        j = Journal()
        batcher = batcher_of(interval_s=10.0, slice_s=1, clock=j.clock)
        a = tap_of(j.observer("A"), batcher, flush_bytes=40)
        for c in (b"a1", b"a2", b"a3"):
            a(c)
        batcher.sweep()
        assert j.chunks() == [b"a1"]
        a(b"x" * 40)  # 44 bytes waiting >= 40
        assert j.chunks() == [b"a1", b"a2", b"a3", b"x" * 40]
        await _run_with_ticker(j, lambda: batcher._cont is None and not batcher._sweep)
        assert j.fed == 4

    asyncio.run(run())


def test_chunks_queued_during_a_sweep_wait_for_the_next_timed_sweep():
    """A sweep observes what was queued when it started; a flow already visited that gets a new
    chunk meanwhile is queued for the next timed sweep (a sweep that kept taking new arrivals
    would never end under load)."""

    async def run() -> None:
        j = Journal()
        batcher = batcher_of(interval_s=10.0, slice_s=1, clock=j.clock)
        a, b = tap_of(j.observer("A"), batcher), tap_of(j.observer("B"), batcher)
        a(b"a1")
        b(b"b1")
        batcher.sweep()  # slice 1: a1 (A done), the budget is spent: B waits for slice 2
        assert j.chunks() == [b"a1"]
        a(b"a2")  # A already visited: next timed sweep
        await _run_with_ticker(j, lambda: batcher._cont is None and not batcher._sweep)
        assert j.chunks() == [b"a1", b"b1"]
        assert batcher._dirty == [a]
        batcher.sweep()
        await _run_with_ticker(j, lambda: batcher._cont is None and not batcher._sweep)
        assert j.chunks() == [b"a1", b"b1", b"a2"]

    asyncio.run(run())


def test_slice_zero_sweeps_in_one_callback():
    """``slice_s`` 0: no budget, the whole sweep in one callback (the behaviour before slicing)."""

    async def run() -> None:
        j = Journal()
        batcher = batcher_of(interval_s=0.001, slice_s=0, clock=j.clock)
        taps = [tap_of(j.observer(n), batcher) for n in "AB"]
        for i in range(5):
            for t in taps:
                t(b"%d" % i)
        await _run_with_ticker(j, lambda: j.fed == 10)
        assert len(j.groups()) == 1

    asyncio.run(run())


def test_drain_observes_everything_queued_and_cancels_the_callbacks():
    """Shutdown (``LLMAudit.done``): a sweep in the middle and a timed sweep pending are both
    finished now; no callback of the batcher runs afterwards."""

    async def run() -> None:
        j = Journal()
        batcher = batcher_of(interval_s=0.001, slice_s=1, clock=j.clock)
        a, b = tap_of(j.observer("A"), batcher), tap_of(j.observer("B"), batcher)
        for c in (b"a1", b"a2", b"a3"):
            a(c)
        b(b"b1")
        batcher.sweep()  # slice 1 ran; the rest is scheduled
        a(b"a4")  # still queued in the sweep
        c = tap_of(j.observer("C"), batcher)
        c(b"c1")  # a new flow: queued for the next timed sweep
        assert j.chunks() == [b"a1"]
        handles = [batcher._timer, batcher._cont]  # the next timed sweep and the sweep's next slice
        assert all(h is not None for h in handles)
        batcher.drain()
        assert all(h.cancelled() for h in handles)
        assert j.chunks("A") == [b"a1", b"a2", b"a3", b"a4"] and j.chunks("B") == [b"b1"] and j.chunks("C") == [b"c1"]
        assert batcher._timer is None and batcher._cont is None
        await asyncio.sleep(0.02)  # cancelled callbacks do not run: nothing fed twice
        assert j.fed == 6

    asyncio.run(run())


# ----- the addon around it -----


def test_addon_finishes_a_flow_in_the_middle_of_a_sliced_sweep_and_at_shutdown():
    """Through the addon's hooks on a running loop: one flow ends (``response``) while its chunks
    are half observed by a sliced sweep, another is open at shutdown (``done``); both records hold
    the whole stream, and no batcher callback is left."""
    from mitmproxy.test import taddons

    from observer.capture.hooks import LLMAudit
    from tests.unit.test_addon import BODY, Sink, llm_flow, open_stream

    ticks = itertools.count()

    async def run() -> Sink:
        sink = Sink()
        addon = LLMAudit(sink=sink)
        with taddons.context(addon) as tctx:
            tctx.configure(addon, observer_tap_batch_ms=10_000)  # sweeps only when called here
            batcher = addon._batcher
            batcher._clock = lambda: float(next(ticks))  # one unit per clock read: ~one chunk
            batcher.slice_s = 3
            ended, shut = llm_flow(), llm_flow()
            taps = [open_stream(addon, f) for f in (ended, shut)]
            events = [e + b"\n\n" for e in BODY.rstrip(b"\n").split(b"\n\n")]
            pieces = [p for e in events for p in (e[: len(e) // 2], e[len(e) // 2 :])]  # events split in two
            assert b"".join(pieces) == BODY and len(pieces) == 16
            for i, p in enumerate(pieces):
                for t in taps[: 1 if i >= len(pieces) - 2 else 2]:  # ``shut`` never gets its stream.end
                    assert t(p) is p
            batcher.sweep()  # first slice only
            assert batcher._cont is not None and batcher._sweep
            addon.response(ended)
            addon.done()
            assert batcher._cont is None and batcher._timer is None and not batcher._sweep
            await asyncio.sleep(0.02)
        return sink

    sink = asyncio.run(run())
    ended, shut = sink.records
    assert (ended.outcome, shut.outcome) == ("completed", "interrupted")
    assert ended.response_bytes == len(BODY) and ended.violations == []
    assert shut.response_bytes == BODY.rindex(b"event: stream.end")
    assert ended.text == shut.text == "The weather in Vienna is 24C and sunny."


def test_slice_option_is_wired_and_checked():
    import pytest
    from mitmproxy import exceptions
    from mitmproxy.test import taddons

    from observer.capture.hooks import LLMAudit

    addon = LLMAudit(sink=lambda r: True)
    with taddons.context(addon) as tctx:
        assert addon._batcher.slice_s == 0.0005  # default 500 µs
        tctx.configure(addon, observer_tap_slice_us=250)
        assert addon._batcher.slice_s == 0.00025
        tctx.configure(addon, observer_tap_slice_us=0)
        assert addon._batcher.slice_s == 0
        with pytest.raises(exceptions.OptionsError):
            tctx.configure(addon, observer_tap_slice_us=-1)


# ----- joining: once the observer needs no more arrival times, the rest of a batch is one feed -----


def test_chunks_after_the_first_text_are_joined_into_one_feed():
    """The tap feeds chunk by chunk while the observer needs arrival times, then the rest of
    the batch as one chunk with the last arrival time; a failure in the joined feed fails
    open with every byte already passed on."""

    class Settling(FakeObserver):
        def feed(self, data: bytes, now_s: float) -> None:
            super().feed(data, now_s)
            if data == b"first-text":
                self.needs_arrival_times = False

    async def run() -> None:
        obs = Settling()
        tap = tap_of(obs, batcher_of(interval_s=10.0))
        for c in (b"start", b"first-text", b"a", b"b", b"c"):
            tap(c)
        tap.flush()
        assert [d for d, _ in obs.fed] == [b"start", b"first-text", b"abc"]
        times = [t for _, t in obs.fed]
        assert times == sorted(times)
        tap(b"d")
        tap.flush()  # a lone chunk is fed as it is
        assert obs.fed[-1][0] == b"d"

        failing = Settling(raise_on=b"xy")
        failing.needs_arrival_times = False
        tap = tap_of(failing, batcher_of(interval_s=10.0))
        tap(b"x")
        tap(b"y")
        tap.flush()
        assert len(failing.failed) == 1 and failing.fed == []  # nothing left to count: one feed had it all

    asyncio.run(run())


def test_joined_feeding_gives_the_record_of_chunk_by_chunk_feeding():
    """With the real core: a stream fed chunk by chunk (each with its own time) and the same
    chunks through a tap that joins them after the first text give the same record, ttft
    included (hand-checked below)."""
    from dataclasses import asdict

    from observer.dialects.registry import default_registry
    from observer.reassembly import EndCause
    from observer.response import ResponseSpec, StreamEnd
    from observer.tap import StreamObserver

    head = b'{"id":"c1","object":"chat.completion.chunk","model":"gpt","choices":[{"index":0,"delta":'
    events = [b"data: " + head + b'{"role":"assistant","content":""},"finish_reason":null}]}\n\n']
    events += [b"data: " + head + b'{"content":"t%d "},"finish_reason":null}]}\n\n' % i for i in range(50)]
    events += [b"data: " + head + b'{},"finish_reason":"stop"}]}\n\n', b"data: [DONE]\n\n"]
    body = b"".join(events)
    chunks = [body[i : i + 37] for i in range(0, len(body), 37)]  # boundaries inside events
    t0 = 1_749_292_800.0

    def observer() -> StreamObserver:
        dialect = default_registry().get("openai.chat")
        spec = ResponseSpec(dialect.name, 200, "text/event-stream", started_at_s=t0, request_stream=True)
        return StreamObserver(dialect, spec)

    one_by_one = observer()
    for i, c in enumerate(chunks):
        one_by_one.feed(c, t0 + 0.1 * (i + 1))
    expected = asdict(one_by_one.finish(StreamEnd(EndCause.EOF, t0 + 100)))

    joined = observer()
    tap = tap_of(joined, batcher_of(interval_s=10.0))
    fed: list[int] = []
    feed = joined.feed
    joined.feed = lambda data, now_s: (fed.append(len(data)), feed(data, now_s))[1]  # type: ignore[method-assign]
    clock = iter(t0 + 0.1 * (i + 1) for i in range(len(chunks)))
    import observer.capture.tap as audit

    async def stream() -> None:  # on a running loop, so the chunks wait for a sweep
        for c in chunks:
            tap(c)
        tap.flush()

    real_time = audit.time.time
    audit.time.time = lambda: next(clock)  # the tap reads each chunk's arrival time from time.time()
    try:
        asyncio.run(stream())
    finally:
        audit.time.time = real_time
    got = asdict(joined.finish(StreamEnd(EndCause.EOF, t0 + 100)))
    assert got == expected
    assert [b["text"] for b in expected["blocks"]] == ["".join(f"t{i} " for i in range(50))]
    # The first text's event (bytes 153-289: 153 + 137 bytes of events) is complete with the 8th
    # 37-byte chunk (bytes 259-295), which arrived 0.8 s after the start.
    assert abs(expected["ttft_s"] - 0.8) < 1e-6
    assert len(fed) < len(chunks) and sum(fed) == len(body)  # joined after the first text
