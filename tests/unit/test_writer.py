"""RecordWriter: never blocks submit, writes everything, spools through outages, isolates bad records."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa

from observer.records import Block, Exchange, Violation
from observer.store.store import AuditStore
from observer.store.writer import RecordWriter

T0 = datetime(2025, 6, 1, 8, 0, 0, tzinfo=timezone.utc)


def _records(make_exchange: Callable[..., Exchange], n: int, prefix: str = "r") -> list[Exchange]:
    return [
        make_exchange(
            f"{prefix}-{i:04d}",
            T0 + timedelta(milliseconds=i),
            blocks=[Block(index=0, text=f"answer {i} ✓")],
            violations=[Violation(kind="seq_gap", seq=2**53 + i, detail="gap")],
        )
        for i in range(n)
    ]


def _wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


def _db_down() -> sa.exc.OperationalError:
    return sa.exc.OperationalError("INSERT INTO exchanges", {}, ConnectionRefusedError("connection refused"))


class RecordingStore:
    """Delegates to a real store; raises "connection refused" while ``down`` is set; records the
    ids of every successful write in order."""

    def __init__(self, store: AuditStore) -> None:
        self.store = store
        self.down = threading.Event()
        self.calls = 0
        self.written_ids: list[str] = []

    def write_many(self, records: Sequence[Exchange]) -> None:
        self.calls += 1
        if self.down.is_set():
            raise _db_down()
        self.store.write_many(records)
        self.written_ids.extend(r.id for r in records)


class BlockingStore:
    """write_many blocks until ``release`` is set (a hung database)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.written: list[str] = []

    def write_many(self, records: Sequence[Exchange]) -> None:
        self.entered.set()
        self.release.wait(30)
        self.written.extend(r.id for r in records)


def _count(store: AuditStore) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM exchanges")).scalar_one())


def test_everything_submitted_is_written_by_close(store: AuditStore, make_exchange: Callable[..., Exchange]) -> None:
    """1,200 records in batches of at most 500 are all in the database after close()."""
    records = _records(make_exchange, 1200)
    writer = RecordWriter(store, batch_max=500, flush_interval_s=0.05)
    writer.start()
    assert all(writer.submit(r) for r in records)
    writer.close()
    assert writer.written == 1200
    assert (writer.dropped, writer.failed_batches, writer.spooled, writer.rejected, writer.lost) == (0, 0, 0, 0, 0)
    assert _count(store) == 1200
    assert store.get("r-0000") == records[0].to_dict()
    assert store.get("r-1199") == records[1199].to_dict()
    assert writer.stats()["alive"] is False


def test_queue_full_drops_without_blocking(
    make_exchange: Callable[..., Exchange], caplog: pytest.LogCaptureFixture
) -> None:
    """With the thread stuck in the database, submit fills the queue, then returns False at once,
    counts each drop, and warns once (not once per drop)."""
    stuck = BlockingStore()
    writer = RecordWriter(stuck, queue_max=3, batch_max=1, flush_interval_s=0.01)  # type: ignore[arg-type]
    writer.start()
    records = _records(make_exchange, 8)
    assert writer.submit(records[0])
    assert stuck.entered.wait(5)
    assert [writer.submit(r) for r in records[1:4]] == [True, True, True]
    with caplog.at_level(logging.WARNING, logger="observer.store.writer"):
        started = time.perf_counter()
        results = [writer.submit(r) for r in records[4:]]
        elapsed_s = time.perf_counter() - started
    assert results == [False, False, False, False]
    assert elapsed_s < 0.05
    assert writer.dropped == 4
    assert writer.stats()["queued"] == 3
    assert len([r for r in caplog.records if "dropped" in r.getMessage()]) == 1
    stuck.release.set()
    writer.close()
    assert stuck.written == ["r-0000", "r-0001", "r-0002", "r-0003"]
    assert writer.written == 4


def test_outage_spools_then_replays_in_order(
    store: AuditStore, make_exchange: Callable[..., Exchange], tmp_path: Path
) -> None:
    """Database down: batches go to the spool; back up: the spool is replayed first, in order,
    then truncated; nothing lost, nothing duplicated."""
    flaky = RecordingStore(store)
    spool = tmp_path / "spool.jsonl"
    writer = RecordWriter(
        flaky,  # type: ignore[arg-type]
        batch_max=4,
        flush_interval_s=0.01,
        spool_path=spool,
        retry_min_s=0.02,
        retry_max_s=0.05,
    )
    records = _records(make_exchange, 15)
    writer.start()
    flaky.down.set()
    for r in records[:5]:
        writer.submit(r)
    _wait_until(lambda: writer.spooled == 5)
    for r in records[5:10]:
        writer.submit(r)
    _wait_until(lambda: writer.spooled == 10)
    lines = spool.read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == [r.id for r in records[:10]]
    assert writer.failed_batches >= 1
    assert spool.stat().st_mode & 0o777 == 0o600

    flaky.down.clear()
    # The spool is truncated just after its last record is written: wait for both.
    _wait_until(lambda: writer.written == 10 and spool.stat().st_size == 0)
    for r in records[10:]:
        writer.submit(r)
    writer.close()

    assert flaky.written_ids == [r.id for r in records]
    assert writer.written == 15
    assert _count(store) == 15
    assert all(store.get(r.id) == r.to_dict() for r in records)


def test_outage_without_spool_holds_the_batch(store: AuditStore, make_exchange: Callable[..., Exchange]) -> None:
    """Without a spool the failed batch is retried (backoff) until the database is back."""
    flaky = RecordingStore(store)
    writer = RecordWriter(flaky, flush_interval_s=0.01, retry_min_s=0.01, retry_max_s=0.02)  # type: ignore[arg-type]
    records = _records(make_exchange, 3)
    flaky.down.set()
    writer.start()
    for r in records:
        writer.submit(r)
    _wait_until(lambda: flaky.calls >= 3)
    assert writer.written == 0
    flaky.down.clear()
    writer.close()
    assert writer.written == 3
    assert writer.failed_batches >= 3
    assert flaky.written_ids == [r.id for r in records]


def test_close_during_an_outage_spools_everything_queued(
    store: AuditStore, make_exchange: Callable[..., Exchange], tmp_path: Path
) -> None:
    """Database down at shutdown: every queued record reaches the spool, and close() does not
    wait for its timeout; the next writer replays them."""
    flaky = RecordingStore(store)
    flaky.down.set()
    spool = tmp_path / "spool.jsonl"
    writer = RecordWriter(flaky, batch_max=3, spool_path=spool, retry_min_s=1.0)  # type: ignore[arg-type]
    records = _records(make_exchange, 10)
    for r in records:
        writer.submit(r)
    writer.start()
    started = time.monotonic()
    writer.close(timeout_s=5.0)
    assert time.monotonic() - started < 2.0
    assert (writer.written, writer.spooled, writer.lost) == (0, 10, 0)
    assert [json.loads(line)["id"] for line in spool.read_text().splitlines()] == [r.id for r in records]

    flaky.down.clear()
    again = RecordWriter(flaky, spool_path=spool)  # type: ignore[arg-type]
    again.start()
    again.close()
    assert flaky.written_ids == [r.id for r in records]
    assert spool.stat().st_size == 0


def test_spool_left_by_a_previous_run_is_replayed_at_start(
    store: AuditStore, make_exchange: Callable[..., Exchange], tmp_path: Path
) -> None:
    """Records spooled before a restart reach the database; a torn last line is rejected."""
    records = _records(make_exchange, 3)
    spool = tmp_path / "spool.jsonl"
    spool.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in records) + '{"id": "torn')
    writer = RecordWriter(store, spool_path=spool, flush_interval_s=0.01)
    writer.start()
    writer.close()
    assert all(store.get(r.id) == r.to_dict() for r in records)
    assert writer.written == 3
    assert writer.rejected == 1
    assert spool.stat().st_size == 0
    rejected = [json.loads(line) for line in (tmp_path / "spool.jsonl.rejected").read_text().splitlines()]
    assert rejected[0]["record"] == {"spool_line": '{"id": "torn'}


@pytest.mark.parametrize(
    "bad_field",
    [
        pytest.param({"violations": [Violation(kind="seq_gap", seq=2**70, detail="")]}, id="seq-beyond-64-bits"),
        pytest.param({"blocks": [Block(index=0, text="lone \ud800 surrogate")]}, id="lone-surrogate"),
    ],
)
def test_a_refused_record_does_not_block_the_others(
    store: AuditStore,
    make_exchange: Callable[..., Exchange],
    tmp_path: Path,
    bad_field: dict[str, object],
) -> None:
    """A record the database cannot store is rejected alone (and kept beside the spool); the rest
    of its batch is written."""
    good = _records(make_exchange, 2)
    bad = make_exchange("bad-0001", T0, **bad_field)
    spool = tmp_path / "spool.jsonl"
    writer = RecordWriter(store, spool_path=spool, flush_interval_s=0.05)
    writer.submit(good[0])
    writer.submit(bad)
    writer.submit(good[1])
    writer.start()
    writer.close()
    assert (writer.written, writer.rejected, writer.failed_batches) == (2, 1, 0)
    assert store.get(bad.id) is None
    assert store.get(good[1].id) == good[1].to_dict()
    (entry,) = [json.loads(line) for line in (tmp_path / "spool.jsonl.rejected").read_text().splitlines()]
    assert entry["record"]["id"] == "bad-0001"
    assert not spool.exists() or spool.stat().st_size == 0


def test_close_with_a_stuck_database_returns_in_time_and_spools(
    make_exchange: Callable[..., Exchange], tmp_path: Path
) -> None:
    """close(timeout_s) returns on time although write_many hangs; the in-flight and queued
    records are in the spool."""
    stuck = BlockingStore()
    spool = tmp_path / "spool.jsonl"
    writer = RecordWriter(stuck, batch_max=2, flush_interval_s=0.01, spool_path=spool)  # type: ignore[arg-type]
    writer.start()
    records = _records(make_exchange, 5)
    for r in records:
        writer.submit(r)
    assert stuck.entered.wait(5)
    started = time.monotonic()
    writer.close(timeout_s=0.3)
    assert time.monotonic() - started < 1.0
    assert [json.loads(line)["id"] for line in spool.read_text().splitlines()] == [r.id for r in records]
    assert writer.spooled == 5
    assert writer.lost == 0
    stuck.release.set()


def test_close_with_a_stuck_database_and_no_spool_counts_lost(make_exchange: Callable[..., Exchange]) -> None:
    """Without a spool, what could not be written by the deadline is counted in ``lost``."""
    stuck = BlockingStore()
    writer = RecordWriter(stuck, batch_max=2, flush_interval_s=0.01)  # type: ignore[arg-type]
    writer.start()
    for r in _records(make_exchange, 5):
        writer.submit(r)
    assert stuck.entered.wait(5)
    started = time.monotonic()
    writer.close(timeout_s=0.2)
    assert time.monotonic() - started < 1.0
    assert writer.lost == 5
    stuck.release.set()


def test_close_during_an_outage_without_spool_counts_lost(
    store: AuditStore, make_exchange: Callable[..., Exchange]
) -> None:
    """No spool and the database refusing: close() retries until its deadline (backing off, not
    spinning), then counts what it holds and what is queued as lost."""
    flaky = RecordingStore(store)
    flaky.down.set()
    writer = RecordWriter(flaky, batch_max=2, retry_min_s=0.05, retry_max_s=0.1)  # type: ignore[arg-type]
    for r in _records(make_exchange, 5):
        writer.submit(r)
    writer.start()
    started = time.monotonic()
    writer.close(timeout_s=0.4)
    assert time.monotonic() - started < 1.0
    assert writer.lost == 5
    assert writer.written == 0
    assert 2 <= flaky.calls <= 10


def test_submit_after_close_is_refused(store: AuditStore, make_exchange: Callable[..., Exchange]) -> None:
    """A closed writer takes no more records (and counts them as dropped)."""
    writer = RecordWriter(store)
    writer.start()
    writer.close()
    assert writer.submit(_records(make_exchange, 1)[0]) is False
    assert writer.dropped == 1
    assert set(writer.stats()) == {
        "written",
        "dropped",
        "failed_batches",
        "spooled",
        "rejected",
        "lost",
        "queued",
        "spool_bytes",
        "alive",
    }


def test_start_twice_is_an_error(store: AuditStore) -> None:
    """One writer, one thread."""
    writer = RecordWriter(store)
    writer.start()
    with pytest.raises(RuntimeError):
        writer.start()
    writer.close()


def test_poison_record_of_any_error_type_is_rejected_not_retried(
    store: AuditStore, make_exchange: Callable[..., Exchange], tmp_path: Path
) -> None:
    """Trial finding: a RecursionError from one record was taken for "database unavailable" and
    retried forever, stopping every later record. Errors that are not the database's are now
    the record's: it is rejected, the others are written."""

    class Poisoning:
        def __init__(self, inner: AuditStore) -> None:
            self.inner = inner

        def write_many(self, records):
            if any(r.id == "poison" for r in records):
                raise RecursionError("maximum recursion depth exceeded")
            self.inner.write_many(records)

    writer = RecordWriter(Poisoning(store), batch_max=10, flush_interval_s=0.01, spool_path=tmp_path / "s.jsonl")  # type: ignore[arg-type]
    writer.start()
    recs = _records(make_exchange, 3)
    writer.submit(recs[0])
    writer.submit(make_exchange("poison", recs[0].started_at))
    writer.submit(recs[1])
    writer.submit(recs[2])
    writer.close()
    assert (writer.written, writer.rejected) == (3, 1)
    assert _count(store) == 3
    assert (tmp_path / "s.jsonl.rejected").read_text().count('"poison"') >= 1


def _thread_wakeups(thread: threading.Thread) -> int:
    """Voluntary context switches of ``thread`` (each wake-up from a blocking wait is one)."""
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("voluntary_ctxt_switches:")).split()[1])


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_idle_writer_blocks_without_polling(store: AuditStore, make_exchange: Callable[..., Exchange]) -> None:
    """An idle writer does not wake up periodically (it runs inside the proxy process: polling
    there is proxy CPU). Before the fix it woke every flush_interval_s (5 times a second)."""
    writer = RecordWriter(store, flush_interval_s=0.02)
    writer.start()
    try:
        time.sleep(0.2)
        thread = writer._thread
        assert thread is not None
        before = _thread_wakeups(thread)
        time.sleep(1.0)
        assert _thread_wakeups(thread) - before <= 2  # was ~50 at 20 ms
        # Still writes what arrives after the idle spell, within the flush interval.
        record = _records(make_exchange, 1, prefix="idle")[0]
        assert writer.submit(record)
        _wait_until(lambda: writer.written == 1, timeout_s=5.0)
    finally:
        writer.close()
    assert _count(store) == 1


def test_close_of_an_idle_writer_is_immediate(store: AuditStore, make_exchange: Callable[..., Exchange]) -> None:
    """close() wakes an idle writer at once: it used to wait out the rest of flush_interval_s."""
    writer = RecordWriter(store, flush_interval_s=2.0)
    writer.start()
    time.sleep(0.1)
    t = time.monotonic()
    writer.close()
    assert time.monotonic() - t < 0.5
    assert writer.stats()["alive"] is False
    assert (writer.lost, writer.dropped, writer.stats()["queued"]) == (0, 0, 0)
