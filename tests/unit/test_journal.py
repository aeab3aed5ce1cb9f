"""The journal and its drainer: durable before the database, stored once, gaps for what is lost,
interrupted records after a crash, files readable by the owner only."""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from observer.dialects.registry import default_registry
from observer.journal import format as fmt
from observer.journal.journal import Journal, segment_name, segment_numbers
from observer.journal.recovery import RECOVERED, recover
from observer.limits import Limits
from observer.records import Block, Exchange, RequestFacts, Violation
from observer.response import ResponseSpec
from observer.store.drain import Drainer, read_ack, unstored_records
from observer.store.store import AuditStore

T0 = datetime(2026, 6, 1, 8, 0, 0, tzinfo=timezone.utc)


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


def _wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


def _stored(store: AuditStore) -> list[tuple[str, int]]:
    with store.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT id, seq FROM exchanges ORDER BY seq")).all()
    return [(r[0], r[1]) for r in rows]


class FlakyStore:
    """A real store that answers "connection refused" while ``down`` is set."""

    def __init__(self, store: AuditStore) -> None:
        self.store = store
        self.down = threading.Event()
        self.calls = 0

    def _check(self) -> None:
        self.calls += 1
        if self.down.is_set():
            raise sa.exc.OperationalError("INSERT", {}, ConnectionRefusedError("connection refused"))

    def write_many(self, records: Sequence[Exchange], **kw: Any) -> int:
        self._check()
        return self.store.write_many(records, **kw)

    def store_id(self) -> str:
        self._check()
        return self.store.store_id()

    def max_seq(self, writer_id: str) -> int:
        self._check()
        return self.store.max_seq(writer_id)


def _pipeline(directory: Path, store: Any, **journal_kw: Any) -> tuple[Journal, Drainer]:
    journal = Journal(directory, **journal_kw)
    journal.open()
    (_pos, acked) = read_ack(directory)
    rec = recover(directory, default_registry())
    journal.start(max(rec.max_seq, acked) + 1, rec.records)
    drainer = Drainer(store, journal, retry_min_s=0.01, retry_max_s=0.05)
    drainer.start()
    return journal, drainer


def _stop(journal: Journal, drainer: Drainer) -> None:
    journal.close()
    drainer.close(timeout_s=5.0)


# ----- the format -----


def test_entries_read_back_and_damage_is_told_apart() -> None:
    seg = fmt.SEGMENT_MAGIC + fmt.record_entry(7, b'{"a":1}') + fmt.data_entry("x", [b"ab", 1.5, b"", 2.0])
    scan = fmt.read_entries(seg)
    assert scan.damage is None and scan.end == len(seg)
    assert [e.kind for e in scan.entries] == [fmt.Kind.RECORD, fmt.Kind.DATA]
    assert scan.entries[0].seq == 7 and scan.entries[0].json == {"a": 1}
    assert scan.entries[1].record_id == "x" and scan.entries[1].chunks() == [b"ab", 1.5, b"", 2.0]
    first = len(fmt.SEGMENT_MAGIC) + scan.entries[0].size
    torn = fmt.read_entries(seg[:-3])
    assert (torn.damage, torn.end, len(torn.entries)) == (fmt.Damage.TORN, first, 1)
    assert fmt.read_entries(seg[:-3], final=False).damage is None
    flipped = bytearray(seg)
    flipped[first + fmt.HEADER.size + 3] ^= 0x01  # inside the data entry's body
    corrupt = fmt.read_entries(bytes(flipped))
    assert (corrupt.damage, corrupt.end, len(corrupt.entries)) == (fmt.Damage.CORRUPT, first, 1)
    with pytest.raises(ValueError, match="magic"):
        fmt.read_entries(b"nope" + seg)


def test_json_that_orjson_refuses_is_journaled_losslessly() -> None:
    value = {"s": "lone \ud800 surrogate", "n": 2**70}
    assert fmt.loads(fmt.dumps(value)) == value


# ----- journal -> drainer -> store -----


def test_records_are_stored_once_in_journal_order_with_seqs(
    tmp_path: Path, store: AuditStore, make_exchange: Callable[..., Exchange]
) -> None:
    journal, drainer = _pipeline(tmp_path / "j", store)
    records = _records(make_exchange, 120)
    assert all(journal.record(r) for r in records)
    _wait_until(lambda: drainer.written == 120)
    _stop(journal, drainer)
    assert _stored(store) == [(f"r-{i:04d}", i + 1) for i in range(120)]
    with store.engine.connect() as conn:
        assert conn.scalar(sa.text("SELECT count(DISTINCT writer_id) FROM exchanges")) == 1
        assert conn.scalar(sa.text("SELECT writer_id FROM exchanges LIMIT 1")) == journal.writer_id
    assert store.get("r-0007")["blocks"][0]["text"] == "answer 7 ✓"
    assert read_ack(tmp_path / "j")[1] == 120
    assert unstored_records(tmp_path / "j") == 0


def test_a_lost_acknowledgement_replays_without_duplicates(
    tmp_path: Path, store: AuditStore, make_exchange: Callable[..., Exchange]
) -> None:
    directory = tmp_path / "j"
    journal, drainer = _pipeline(directory, store, segment_bytes=4096)
    for r in _records(make_exchange, 50):
        journal.record(r)
    _wait_until(lambda: drainer.written == 50)
    _stop(journal, drainer)
    (directory / "ack.json").unlink()  # as if the process died between the commit and the ack
    journal, drainer = _pipeline(directory, store)
    for r in _records(make_exchange, 5, prefix="s"):
        journal.record(r)
    _wait_until(lambda: drainer.written + drainer.duplicates >= 5)
    _stop(journal, drainer)
    ids = [i for i, _ in _stored(store)]
    assert len(ids) == len(set(ids)) == 55
    assert [s for _, s in _stored(store)] == list(range(1, 56))


def test_a_database_outage_drops_nothing_and_keeps_order(
    tmp_path: Path, store: AuditStore, make_exchange: Callable[..., Exchange]
) -> None:
    flaky = FlakyStore(store)
    flaky.down.set()
    journal, drainer = _pipeline(tmp_path / "j", flaky)
    records = _records(make_exchange, 300)
    for r in records:
        assert journal.record(r)
    _wait_until(lambda: journal.journaled == 300)
    _wait_until(lambda: drainer.failed_batches >= 3)
    assert journal.stats()["queued"] == 0  # the journal on disk holds them, not memory
    assert _stored(store) == []
    flaky.down.clear()
    _wait_until(lambda: drainer.written == 300)
    _stop(journal, drainer)
    assert [i for i, _ in _stored(store)] == [r.id for r in records]
    assert store.gaps() == []


def test_a_full_spool_drops_newest_into_one_gap_then_recovers(
    tmp_path: Path, store: AuditStore, make_exchange: Callable[..., Exchange]
) -> None:
    flaky = FlakyStore(store)
    flaky.down.set()
    journal, drainer = _pipeline(tmp_path / "j", flaky, max_bytes=20_000, segment_bytes=4096)
    records = _records(make_exchange, 200)
    for r in records:
        journal.record(r)
        time.sleep(0.0005)
    _wait_until(lambda: journal.journaled + journal.dropped == 200)
    kept, dropped = journal.journaled, journal.dropped
    assert kept > 0 and dropped > 0
    assert not journal.accepting
    assert journal.spool_bytes() < 20_000 + 4096 + 1024  # the bound, one segment's overshoot at most
    flaky.down.clear()
    _wait_until(lambda: drainer.written == kept and journal.accepting)  # stored, segments deleted
    journal.record(make_exchange("after", T0))  # room again: accepted, and the gap is written
    _wait_until(lambda: store.get("after") is not None and len(store.gaps()) == 1)
    _stop(journal, drainer)
    (gap,) = store.gaps()
    assert (gap["reason"], gap["dropped"], gap["seq"], gap["seq_end"]) == ("spool_full", dropped, kept + 1, kept + 1)
    assert gap["first_at"] <= gap["last_at"]
    stored = _stored(store)
    assert [i for i, _ in stored[:kept]] == [r.id for r in records[:kept]]  # drop newest: the oldest are kept
    assert stored[-1] == ("after", kept + 2)


def test_the_queue_bound_drops_into_a_queue_full_gap(
    tmp_path: Path, store: AuditStore, make_exchange: Callable[..., Exchange]
) -> None:
    journal = Journal(tmp_path / "j", queue_max=3)
    journal.open()  # not started: nothing takes from the queue
    results = [journal.record(r) for r in _records(make_exchange, 5)]
    assert results == [True, True, True, False, False]
    journal.start(1)
    drainer = Drainer(store, journal)
    drainer.start()
    _wait_until(lambda: drainer.written == 3 and drainer.gaps == 1)
    _stop(journal, drainer)
    (gap,) = store.gaps()
    assert (gap["reason"], gap["dropped"], gap["seq"]) == ("queue_full", 2, 4)


def test_an_open_exchange_at_a_crash_becomes_an_interrupted_record(tmp_path: Path, store: AuditStore) -> None:
    """Written as the journal writes it, never closed (kill -9): recovery parses the journaled
    bytes with the live parser; one exchange had its stream end, one had not."""
    directory = tmp_path / "j"
    directory.mkdir(mode=0o700)
    spec = ResponseSpec(
        dialect="openai.chat", status_code=200, content_type="text/event-stream", started_at_s=1000.0, limits=Limits()
    )
    chunk = b'data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-x","choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\n'
    chunk2 = b'data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-x","choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    entries = []
    for rid in ("open-1", "done-1"):
        ex = _skeleton(rid)
        ex.request = RequestFacts(model="gpt-x", stream=True)
        entries.append(fmt.open_entry(rid, ex.to_dict(), spec.to_dict(), []))
        entries.append(fmt.data_entry(rid, [chunk, 1000.5]))
    entries.append(fmt.data_entry("done-1", [chunk2, 1001.0]))
    (directory / segment_name(1)).write_bytes(fmt.SEGMENT_MAGIC + b"".join(entries) + b"\x07\x00")  # torn tail
    journal, drainer = _pipeline(directory, store)
    _wait_until(lambda: drainer.written == 2)
    _stop(journal, drainer)
    cut = store.get("open-1")
    assert (cut["outcome"], cut["text"], cut["transport_error"]) == ("interrupted", "Hel", RECOVERED)
    assert cut["ended_at"] == "1970-01-01T00:16:40.500000Z"
    assert cut["request"]["model"] == "gpt-x"
    done = store.get("done-1")
    assert (done["outcome"], done["text"], done["stop_reason_raw"]) == ("completed", "Hello", "stop")
    # Recovered once: a second start finds nothing open.
    assert recover(directory, default_registry()).records == []


def test_a_journal_of_another_store_is_refused_while_it_holds_records(
    tmp_path: Path, store: AuditStore, make_exchange: Callable[..., Exchange], caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "j"
    flaky = FlakyStore(store)
    flaky.down.set()
    journal, drainer = _pipeline(directory, flaky)
    journal.record(make_exchange("kept", T0))
    _wait_until(lambda: journal.journaled == 1)
    _stop(journal, drainer)
    identity = directory / "identity.json"
    identity.write_bytes(fmt.dumps({"writer_id": journal.writer_id, "store_id": "another-store"}))
    with caplog.at_level(logging.CRITICAL, logger="observer.store"):
        journal, drainer = _pipeline(directory, store)
        _wait_until(lambda: drainer.refused)
    _stop(journal, drainer)
    assert "holds records of the store another-store" in caplog.text
    assert _stored(store) == []
    assert unstored_records(directory) == 1  # still there, for the store it belongs to


def test_files_are_readable_by_the_owner_only(
    tmp_path: Path, store: AuditStore, make_exchange: Callable[..., Exchange]
) -> None:
    directory = tmp_path / "j"
    old = os.umask(0o022)
    try:
        journal, drainer = _pipeline(directory, store)
        journal.record(make_exchange("x", T0))
        _wait_until(lambda: drainer.written == 1)
        _stop(journal, drainer)
    finally:
        os.umask(old)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    names = {p.name: stat.S_IMODE(p.stat().st_mode) for p in directory.iterdir()}
    assert set(names) >= {"identity.json", "ack.json", "lock", segment_name(segment_numbers(directory)[-1])}
    assert all(mode == 0o600 for mode in names.values()), names


def test_a_second_process_cannot_share_a_journal(tmp_path: Path) -> None:
    from observer.errors import ConfigError

    first = Journal(tmp_path / "j")
    first.open()
    try:
        with pytest.raises(ConfigError, match="in use by another observer process"):
            Journal(tmp_path / "j").open()
    finally:
        first.close()


# ----- open exchanges across segments, caps, failures -----

OPENAI_SPEC = ResponseSpec(
    dialect="openai.chat", status_code=200, content_type="text/event-stream", started_at_s=1000.0, limits=Limits()
)


def _chunk(text: str) -> bytes:
    return (
        b'data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-x","choices":[{"index":0,"delta":{"content":"'
        + text.encode()
        + b'"}}]}\n\n'
    )


def _skeleton(rid: str) -> Exchange:
    return Exchange(
        id=rid,
        dialect="openai.chat",
        host="api.openai.com",
        path="/v1/chat/completions",
        method="POST",
        http_version="HTTP/1.1",
        started_at=datetime.fromtimestamp(1000.0, timezone.utc),
        status_code=200,
        outcome="completed",
    )


def test_an_open_exchange_survives_segment_rolls_and_deletions(
    tmp_path: Path, store: AuditStore, make_exchange: Callable[..., Exchange]
) -> None:
    """Its entries are carried into each new segment, so the segments deleted behind it (their
    records stored) take nothing recovery needs. Recovery runs on the folder of a journal that is
    still running, as after a kill."""
    directory = tmp_path / "j"
    journal, drainer = _pipeline(directory, store, segment_bytes=2048)
    journal.open_exchange("long-1", _skeleton("long-1"), OPENAI_SPEC, [])
    journal.data("long-1", [_chunk("one "), 1000.1], 0)
    for i, r in enumerate(_records(make_exchange, 40)):
        journal.record(r)
        if i == 20:
            journal.data("long-1", [_chunk("two"), 1000.2], 0)
    _wait_until(lambda: drainer.written == 40)
    _wait_until(lambda: segment_numbers(directory)[0] > 2)  # the first segments are gone
    (rebuilt,) = recover(directory, default_registry()).records
    _stop(journal, drainer)
    assert (rebuilt.id, rebuilt.text, rebuilt.outcome) == ("long-1", "one two", "interrupted")


def test_a_segment_deleted_while_recovery_reads_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A running journal deletes a stored segment between recovery's listing and its read (the
    CI failure of the test above): recovery skips it and still finds the exchange left open."""
    directory = tmp_path / "j"
    journal = Journal(directory)
    journal.open()
    journal.start(1)
    journal.open_exchange("open-1", _skeleton("open-1"), OPENAI_SPEC, [])
    journal.data("open-1", [_chunk("kept"), 1000.1], 0)
    journal.close()
    (only,) = segment_numbers(directory)
    monkeypatch.setattr("observer.journal.recovery.segment_numbers", lambda d: [only, only + 1])
    result = recover(directory, default_registry())
    assert (result.segments, [r.text for r in result.records], result.damaged) == (1, ["kept"], [])


def test_bytes_past_the_per_exchange_cap_are_cut_and_recovery_says_so(tmp_path: Path) -> None:
    directory = tmp_path / "j"
    journal = Journal(directory, flow_data_max=200)
    journal.open()
    journal.start(1)
    journal.open_exchange("big", _skeleton("big"), OPENAI_SPEC, [])
    first, second = _chunk("kept"), _chunk("lost")
    assert len(first) < 200 < len(first) + len(second)
    journal.data("big", [first, 1000.1], len(first))
    journal.data("big", [second, 1000.2], len(second))
    journal.close()
    (rebuilt,) = recover(directory, default_registry()).records
    assert rebuilt.text == "kept"
    assert ("observer_error", "recovery: response bytes after those kept were not in the journal") in [
        (v.kind, v.detail) for v in rebuilt.violations
    ]


def test_a_record_dropped_for_a_full_spool_is_not_revived_by_recovery(tmp_path: Path) -> None:
    """Its open entry is on disk, its record was dropped into a gap: a FORGET entry tells
    recovery so (else the exchange would be counted twice: in the gap and as interrupted)."""
    directory = tmp_path / "j"
    journal = Journal(directory, max_bytes=600)
    journal.open()
    journal.start(1)
    journal.open_exchange("x1", _skeleton("x1"), OPENAI_SPEC, [])
    journal.data("x1", [b"y" * 600, 1000.1], 600)  # fills the spool
    _wait_until(lambda: not journal.accepting)
    record = _skeleton("x1")
    journal.record(record)
    journal.close()
    assert journal.dropped == 1
    result = recover(directory, default_registry())
    assert result.records == []
    gaps = [
        e
        for n in segment_numbers(directory)
        for e in fmt.read_entries((directory / segment_name(n)).read_bytes()).entries
        if e.kind is fmt.Kind.GAP
    ]
    assert [(g.json["reason"], g.json["dropped"]) for g in gaps] == [("spool_full", 1)]


def test_a_failing_disk_drops_into_a_disk_error_gap_and_recovers(
    tmp_path: Path, store: AuditStore, make_exchange: Callable[..., Exchange], monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    failing = threading.Event()
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        if failing.is_set():
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    journal, drainer = _pipeline(tmp_path / "j", store, retry_s=0.2)
    journal.record(make_exchange("before", T0))
    _wait_until(lambda: journal.journaled == 1)
    failing.set()
    assert journal.record(make_exchange("lost-1", T0))  # queued; the write fails
    _wait_until(lambda: journal.disk_errors >= 1)
    assert not journal.accepting
    journal.record(make_exchange("lost-2", T0))  # while blocked: not written at all
    _wait_until(lambda: journal.dropped == 2)
    failing.clear()
    time.sleep(0.25)  # the retry time passes
    journal.record(make_exchange("after", T0))
    _wait_until(lambda: store.get("after") is not None and len(store.gaps()) == 1)
    _stop(journal, drainer)
    (gap,) = store.gaps()
    assert (gap["reason"], gap["dropped"]) == ("disk_error", 2)
    assert [i for i, _ in _stored(store)] == ["before", "after"]
    assert [s for _, s in _stored(store)] == [1, 3] and gap["seq"] == 2  # the gap first: no hole, in order


def test_a_record_the_database_refuses_leaves_a_rejected_gap_and_a_copy(
    tmp_path: Path, store: AuditStore, make_exchange: Callable[..., Exchange]
) -> None:
    class Refusing(FlakyStore):
        def write_many(self, records: Sequence[Exchange], **kw: Any) -> int:
            if any(r.id == "poison" for r in records):
                raise sa.exc.DataError("INSERT", {}, ValueError("value out of range"))
            return self.store.write_many(records, **kw)

    directory = tmp_path / "j"
    journal = Journal(directory)
    journal.open()
    for rid in ("a", "poison", "b"):  # queued before the thread starts: one round, one batch
        journal.record(make_exchange(rid, T0))
    journal.start(1)
    drainer = Drainer(Refusing(store), journal)
    drainer.start()
    _wait_until(lambda: drainer.written == 2 and drainer.rejected == 1)
    _stop(journal, drainer)
    assert _stored(store) == [("a", 1), ("b", 3)]
    (gap,) = store.gaps()
    assert (gap["seq"], gap["reason"], gap["dropped"], gap["detail"]) == (2, "rejected", 1, "record poison: DataError")
    kept = [fmt.loads(line) for line in (directory / "rejected.jsonl").read_bytes().splitlines()]
    assert [(k["seq"], k["record"]["id"], k["error"]) for k in kept] == [(2, "poison", "DataError")]
    from observer.store.verify import verify

    assert verify(store, None).ok  # the rejected gap is in the chain, in its place (it was not at first)


def test_seqs_missing_from_the_journal_are_recorded_as_lost(
    tmp_path: Path, store: AuditStore, make_exchange: Callable[..., Exchange]
) -> None:
    """A segment deleted behind the observer's back: the drainer finds the hole in the numbering
    against what the store already holds of this writer."""
    directory = tmp_path / "j"
    flaky = FlakyStore(store)
    journal, drainer = _pipeline(directory, flaky, segment_bytes=1024)
    journal.record(make_exchange("first", T0))
    _wait_until(lambda: drainer.written == 1)
    flaky.down.set()
    for r in _records(make_exchange, 12):
        journal.record(r)
    _wait_until(lambda: journal.journaled == 13)
    _stop(journal, drainer)

    def seqs(n: int) -> list[int]:
        entries = fmt.read_entries((directory / segment_name(n)).read_bytes()).entries
        return [e.seq for e in entries if e.kind is fmt.Kind.RECORD]

    victim = next(n for n in segment_numbers(directory) if 5 in seqs(n))  # not yet stored
    lost = seqs(victim)
    (directory / segment_name(victim)).unlink()
    flaky.down.clear()
    journal, drainer = _pipeline(directory, flaky)
    _wait_until(lambda: drainer.written == 12 - len(lost) and drainer.gaps == 1)  # "first" was stored before
    _stop(journal, drainer)
    (gap,) = store.gaps()
    assert (gap["reason"], gap["seq"], gap["seq_end"], gap["dropped"]) == ("journal_lost", lost[0], lost[-1], len(lost))
    assert len(_stored(store)) == 13 - len(lost)


def test_check_journal_store_names_the_mismatch(
    tmp_path: Path, store: AuditStore, make_exchange: Callable[..., Exchange]
) -> None:
    from observer.store.drain import StoreMismatch, check_journal_store

    directory = tmp_path / "j"
    check_journal_store(directory, store)  # no journal yet: nothing to check
    flaky = FlakyStore(store)
    journal, drainer = _pipeline(directory, flaky)
    _wait_until(lambda: journal.store_id is not None)  # bound to this store
    flaky.down.set()
    journal.record(make_exchange("waiting", T0))
    _wait_until(lambda: journal.journaled == 1)
    _stop(journal, drainer)
    check_journal_store(directory, store)  # its own store: fine
    other = AuditStore(f"sqlite:///{tmp_path / 'other.db'}")
    from observer.store.migrate import upgrade

    upgrade(f"sqlite:///{tmp_path / 'other.db'}")
    with pytest.raises(StoreMismatch, match=r"holds records of the store .* and this database is the store"):
        check_journal_store(directory, other)
    other.dispose()


def test_a_legacy_spool_is_imported_once(tmp_path: Path, make_exchange: Callable[..., Exchange]) -> None:
    from observer.capture.hooks import _legacy_spool

    spool = tmp_path / "spool.jsonl"
    spool.write_bytes(fmt.dumps(make_exchange("old-1", T0).to_dict()) + b"\n{torn\n")
    (record,) = _legacy_spool(spool)
    assert record.id == "old-1"
    assert not spool.exists() and (tmp_path / "spool.jsonl.imported").exists()
    assert _legacy_spool(spool) == []


def test_short_writes_are_resumed_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``os.writev`` may write less than asked (a signal, a full disk at the edge): the rest of
    the part it stopped in, then the following parts, are written in order."""
    from observer.journal import journal as journal_module

    real = os.writev

    def short(fd: int, buffers: list[bytes]) -> int:
        return real(fd, [bytes(buffers[0])[:3]]) if len(buffers) > 1 else real(fd, buffers)

    monkeypatch.setattr(os, "writev", short)
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        journal_module._write_all(fd, [b"abcdef", b"gh", b"ijk"] * 2)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"abcdefghijk" * 2


def test_an_empty_journal_bound_to_another_store_says_where_its_records_are(
    tmp_path: Path, make_exchange: Callable[..., Exchange]
) -> None:
    """Trial finding: pointed at a new database, the journal kept its numbering, and verify
    called the first records of the new store deleted. Now an ``other_store`` gap takes them."""
    from observer.store.migrate import upgrade
    from observer.store.verify import verify

    stores = []
    for name in ("a", "b"):
        upgrade(f"sqlite:///{tmp_path / name}.db")
        stores.append(AuditStore(f"sqlite:///{tmp_path / name}.db"))
    first, second = stores
    directory = tmp_path / "j"
    journal, drainer = _pipeline(directory, first)
    for r in _records(make_exchange, 3, prefix="a"):
        journal.record(r)
    _wait_until(lambda: drainer.written == 3)
    _stop(journal, drainer)
    journal, drainer = _pipeline(directory, second)
    for r in _records(make_exchange, 2, prefix="b"):
        journal.record(r)
    _wait_until(lambda: drainer.written == 2)
    _stop(journal, drainer)
    (gap,) = second.gaps()
    assert (gap["seq"], gap["seq_end"], gap["reason"], gap["detail"]) == (
        1,
        3,
        "other_store",
        f"stored in the store {first.store_id()}",
    )
    assert _stored(second) == [("b-0000", 4), ("b-0001", 5)]
    assert verify(second, None).ok and verify(first, None).ok
    for s in stores:
        s.dispose()


def test_a_first_segment_lost_before_anything_was_stored_is_a_gap(
    tmp_path: Path, store: AuditStore, make_exchange: Callable[..., Exchange]
) -> None:
    """Trial finding: with nothing of this writer in the store yet, deleting the journal's first
    segment went unnoticed (and verify later blamed the database)."""
    directory = tmp_path / "j"
    flaky = FlakyStore(store)
    flaky.down.set()
    journal, drainer = _pipeline(directory, flaky)
    for r in _records(make_exchange, 5):
        journal.record(r)
    _wait_until(lambda: journal.journaled == 5)
    _stop(journal, drainer)
    for n in segment_numbers(directory):
        (directory / segment_name(n)).unlink()
    flaky.down.clear()
    journal, drainer = _pipeline(directory, flaky)
    journal.record(make_exchange("after", T0))
    _wait_until(lambda: drainer.written == 1 and drainer.gaps == 1)
    _stop(journal, drainer)
    (gap,) = store.gaps()
    assert (gap["reason"], gap["seq"], gap["seq_end"], gap["dropped"]) == ("journal_lost", 1, 5, 5)
    assert _stored(store) == [("after", 6)]


# ----- damaged journals and files (recovery and the drainer read what they can, say what they cannot) -----


def test_damage_in_an_older_segment_is_named_and_the_rest_is_read(
    tmp_path: Path, store: AuditStore, make_exchange: Callable[..., Exchange], caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "j"
    directory.mkdir(mode=0o700)
    good = [fmt.record_entry(i, fmt.dumps(make_exchange(f"d-{i}", T0).to_dict())) for i in (1, 2)]
    corrupt = bytearray(fmt.SEGMENT_MAGIC + good[0] + good[1])
    corrupt[len(fmt.SEGMENT_MAGIC) + len(good[0]) + 12] ^= 0xFF  # inside the second entry
    (directory / segment_name(1)).write_bytes(bytes(corrupt))
    (directory / segment_name(2)).write_bytes(b"not a segment")
    (directory / segment_name(3)).write_bytes(fmt.SEGMENT_MAGIC + fmt.record_entry(3, b"{not json"))
    (directory / "ack.json").write_bytes(b"{damaged")
    with caplog.at_level(logging.INFO):
        result = recover(directory, default_registry())
        assert result.max_seq == 3 and result.records_after(0) == 2
        assert [d.split(":")[0] for d in result.damaged] == [segment_name(1), segment_name(2)]
        assert read_ack(directory) == ((0, 0), 0)
        assert "is damaged; reading the journal from its oldest segment" in caplog.text
        journal, drainer = _pipeline(directory, store)
        _wait_until(lambda: drainer.written == 1 and drainer.rejected == 1 and drainer.gaps == 2)
        _stop(journal, drainer)
    assert _stored(store) == [("d-1", 1)]
    assert sorted((g["seq"], g["reason"]) for g in store.gaps()) == [(2, "journal_lost"), (3, "unreadable")]
    assert "has a corrupt entry" in caplog.text


def test_an_unreadable_open_entry_is_named(tmp_path: Path) -> None:
    directory = tmp_path / "j"
    directory.mkdir(mode=0o700)
    broken = fmt.open_entry("o-1", {"id": "o-1"}, {"dialect": "x"}, [])  # not a record, not a spec
    (directory / segment_name(1)).write_bytes(fmt.SEGMENT_MAGIC + broken)
    result = recover(directory, default_registry())
    assert result.records == [] and result.damaged == ["open exchange o-1: unreadable"]


def test_a_record_entry_of_too_long_an_id_is_refused() -> None:
    with pytest.raises(ValueError, match="a record id has 1..255 bytes"):
        fmt.forget_entry("x" * 256)


def test_an_open_exchange_whose_bytes_a_failing_disk_lost_is_cut_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The data write fails: the exchange's later bytes are not journaled, a CUT entry follows
    when the disk works again, it is carried into new segments like the rest of the exchange,
    and the recovered record says bytes are missing (a bug kept the CUT out of the carried
    entries at first)."""
    import errno

    failing = threading.Event()
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        if failing.is_set():
            raise OSError(errno.EIO, "I/O error")
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    directory = tmp_path / "j"
    journal = Journal(directory, retry_s=0.05, segment_bytes=4096)
    journal.open()
    journal.start(1)
    journal.open_exchange("x", _skeleton("x"), OPENAI_SPEC, [])
    journal.data("x", [_chunk("kept "), 1000.1], 100)
    _wait_until(lambda: "x" in journal._live and journal._live["x"].data_bytes == 100)
    failing.set()
    journal.data("x", [_chunk("lost"), 1000.2], 100)
    _wait_until(lambda: journal.disk_errors >= 1)
    failing.clear()
    time.sleep(0.1)
    for i in range(8):  # past a few segments: the open exchange is carried each time
        journal.data("x", [_chunk(f"after{i}"), 1000.3], 100)
        journal.record(Exchange.from_dict(_skeleton(f"filler-{i}").to_dict()))
    _wait_until(lambda: journal.journaled == 8)
    (rebuilt,) = [r for r in recover(directory, default_registry()).records if r.id == "x"]
    journal.close()
    assert rebuilt.text == "kept "
    assert ("observer_error", "recovery: response bytes after those kept were not in the journal") in [
        (v.kind, v.detail) for v in rebuilt.violations
    ]


def test_the_drainer_takes_records_bigger_than_a_read_and_prepares_the_database_first(
    tmp_path: Path, store: AuditStore, make_exchange: Callable[..., Exchange]
) -> None:
    """An entry larger than ``READ_BYTES`` is read whole; ``prepare`` (the migration) runs
    before the first write; the drainer refuses bad settings and a second start."""
    from observer.store.drain import READ_BYTES

    with pytest.raises(ValueError, match="batch_max"):
        Drainer(store, Journal(tmp_path / "x"), batch_max=0)
    journal = Journal(tmp_path / "j")
    journal.open()
    journal.start(1)
    prepared: list[bool] = []
    drainer = Drainer(store, journal, prepare=lambda: prepared.append(True))
    drainer.start()
    with pytest.raises(RuntimeError, match="already started"):
        drainer.start()
    big = make_exchange("big", T0, blocks=[Block(index=0, text="y" * (READ_BYTES + 4096))])
    journal.record(big)
    journal.record(make_exchange("small", T0))
    _wait_until(lambda: drainer.written == 2)
    assert prepared == [True] and not drainer.pending() and drainer.position == journal.durable()
    assert drainer.stats()["written"] == 2 and drainer.stats()["database_down"] is False
    _stop(journal, drainer)
    assert len(store.get("big")["text"]) == READ_BYTES + 4096


def test_an_integer_beyond_64_bits_survives_the_journal() -> None:
    """Trial finding: orjson read a 30-digit integer of request JSON back as a float."""
    from observer.jsontext import dumps, loads

    big = {"parameters": {"seed": 123456789012345678901234567890, "n": -9223372036854775809}}
    assert loads(dumps(big)) == big
    assert type(loads(dumps(big))["parameters"]["seed"]) is int
