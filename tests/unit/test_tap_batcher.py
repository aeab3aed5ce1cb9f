"""The addon's batched observation (``TapBatcher`` + ``StreamTap``): the client's chunk is
returned at once (the same object); observation happens in the next sweep on the running loop,
with each chunk's own arrival time, in order; a flow is flushed before its record is finished;
a flow with ``max_pending_bytes`` waiting is observed at once; failures fail open."""

from __future__ import annotations

import asyncio

from addons.llm_audit import StreamTap, TapBatcher


class FakeObserver:
    """Records what the tap feeds it; raises on a chosen chunk."""

    def __init__(self, raise_on: bytes | None = None) -> None:
        self.fed: list[tuple[bytes, float]] = []
        self.failed: list[BaseException] = []
        self.raise_on = raise_on

    def feed(self, data: bytes, now_s: float) -> None:
        if data == self.raise_on and not self.failed:
            raise RuntimeError("boom")
        self.fed.append((data, now_s))

    def fail(self, exc: BaseException) -> None:
        self.failed.append(exc)


def test_without_a_running_loop_chunks_are_observed_inline():
    obs = FakeObserver()
    tap = StreamTap(obs, TapBatcher(interval_s=0.05))
    chunk = b"data: {}\n\n"
    assert tap(chunk) is chunk
    assert [d for d, _ in obs.fed] == [chunk]


def test_interval_zero_observes_inline_even_on_a_loop():
    async def run() -> FakeObserver:
        obs = FakeObserver()
        tap = StreamTap(obs, TapBatcher(interval_s=0))
        tap(b"a")
        assert [d for d, _ in obs.fed] == [b"a"]
        return obs

    asyncio.run(run())


def test_chunks_wait_for_the_sweep_with_their_own_arrival_times():
    async def run() -> None:
        obs = FakeObserver()
        batcher = TapBatcher(interval_s=0.05)
        tap = StreamTap(obs, batcher)
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
        batcher = TapBatcher(interval_s=10.0)  # the sweep would come far too late
        tap = StreamTap(obs, batcher)
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
        tap = StreamTap(obs, TapBatcher(interval_s=10.0, max_pending_bytes=100))
        tap(b"a" * 60)
        assert obs.fed == []
        tap(b"b" * 60)  # 120 bytes waiting >= 100
        assert [len(d) for d, _ in obs.fed] == [60, 60]

    asyncio.run(run())


def test_an_observer_failure_in_a_sweep_fails_open_and_counts_the_rest():
    async def run() -> None:
        obs = FakeObserver(raise_on=b"bad")
        tap = StreamTap(obs, TapBatcher(interval_s=0.01))
        out = [tap(c) for c in (b"ok", b"bad", b"after")]
        assert out == [b"ok", b"bad", b"after"]
        await asyncio.sleep(0.05)
        assert len(obs.failed) == 1
        assert [d for d, _ in obs.fed] == [b"ok", b"after"]  # chunks after the failure still reach feed

    asyncio.run(run())
