"""Retention, legal holds and purges (``observer.store.{events,holds,purge}``): what a purge
removes and keeps, written down by hand; a clean ``verify`` after a purge and after a hold; one
tamper test per thing a purge or a hold leaves behind; the commands. SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from observer.cli import app
from observer.records import Exchange
from observer.store.alerts import add_alert, list_alerts
from observer.store.chain import GENESIS, canonical_event, chain_hash, runs_digest
from observer.store.checkpoint import CheckpointKey, make_checkpoint
from observer.store.events import ConcurrentChange, append_event
from observer.store.holds import HoldError, Scope, create_hold, list_holds, release_hold
from observer.store.purge import PurgeRefused, purge
from observer.store.store import AuditStore
from observer.store.verify import verify

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=timezone.utc)
OLD = NOW - timedelta(days=400)  # past a 183-day retention
NEW = NOW - timedelta(days=1)
W = "00000000-0000-4000-8000-000000000001"
GAP = {"seq": 6, "seq_end": 6, "first_at": OLD, "last_at": OLD, "dropped": 1, "reason": "queue_full", "detail": None}


@pytest.fixture
def key(tmp_path: Path) -> CheckpointKey:
    return CheckpointKey.load_or_create(tmp_path / "keys" / "checkpoint-key.pem")


@pytest.fixture
def filled(store: AuditStore, make_exchange: Callable[..., Exchange], key: CheckpointKey) -> AuditStore:
    """Writer W: seq 1..5 records r1..r5 (old; r4 of end user "held"), seq 6 a gap, seq 7..12
    r7..r12 (old), seq 13..16 r13..r16 (new); a signed checkpoint of W at seq 12 (a purged
    head) and at 16. Plus one old record from before the chain (no writer), "legacy"."""
    records = {}
    for seq in [*range(1, 6), *range(7, 17)]:
        r = make_exchange(f"r{seq}", (OLD if seq <= 12 else NEW) + timedelta(seconds=seq))
        if seq == 4:
            r.request.end_user = "held"
        records[seq] = r
    store.write_many([records[s] for s in range(1, 6)], writer_id=W, seqs=list(range(1, 6)))
    store.write_many([], writer_id=W, seqs=[], gaps=[GAP])
    store.write_many([records[s] for s in range(7, 17)], writer_id=W, seqs=list(range(7, 17)))
    store.write_many([make_exchange("legacy", OLD)])
    store_id = store.store_id()
    prev = "0" * 64
    for number, seq in enumerate((12, 16), 1):
        head = _scalar(store, "SELECT record_hash FROM exchanges WHERE seq = :s", s=seq)
        row = make_checkpoint(key, store_id, W, number, seq, head, NOW, prev)
        store.add_checkpoint(row)
        prev = hashlib.sha256(row["note"].encode()).hexdigest()
    return store


def _alert(alert_id: str, fired_at: datetime, exchange_id: str | None) -> dict[str, object]:
    return {
        "id": alert_id,
        "fired_at": fired_at,
        "rule": "r",
        "kind": "undeclared_tool" if exchange_id else "recording_gap",
        "severity": "warning",
        "summary": "s",
        "proxy": "p",
        "exchange_id": exchange_id,
        "details": {},
        "deliveries": {},
    }


def _scalar(store: AuditStore, statement: str, **params: object) -> object:
    with store.engine.connect() as conn:
        return conn.execute(sa.text(statement), params).scalar()


def _sql(store: AuditStore, statement: str, **params: object) -> None:
    with store.engine.begin() as conn:
        conn.execute(sa.text(statement), params)


def _ids(store: AuditStore) -> list[str]:
    with store.engine.connect() as conn:
        return sorted(conn.execute(sa.text("SELECT id FROM exchanges")).scalars())


def _purge(store: AuditStore, key: CheckpointKey, **kwargs: object):  # type: ignore[no-untyped-def]
    args: dict[str, object] = {"now": NOW, "retention_days": 183, "retention_override": False, "actor": "ops"}
    return purge(store, key, **(args | kwargs))  # type: ignore[arg-type]


def _only_break(store: AuditStore, key: CheckpointKey) -> str:
    report = verify(store, key.public)
    assert len(report.breaks) == 1, report.breaks
    return report.breaks[0].line()


# ----- the store's chain, by hand -----


def test_store_event_bytes_and_runs_digest_by_hand() -> None:
    event = {"seq": 1, "kind": "purge", "at": NOW, "actor": "ops", "detail": {"runs": 0, "b": [1, "x"]}}
    expected = (
        '{"actor":"ops","at":"2026-12-01T12:00:00.000000Z","detail":{"b":[1,"x"],"runs":0},'
        '"event":"purge","kind":"store_event","seq":1,"writer_id":"S"}'
    )
    assert canonical_event(event, "S").decode() == expected
    runs = [("w2", 1, 1, "bb"), ("w1", 5, 7, "aa")]
    assert runs_digest(runs) == hashlib.sha256(b'[["w1",5,7,"aa"],["w2",1,1,"bb"]]').hexdigest()


# ----- what a purge removes and keeps -----


def test_a_purge_removes_the_due_records_keeps_held_and_new_ones_and_verify_passes(
    filled: AuditStore, key: CheckpointKey
) -> None:
    hold = create_hold(filled.engine, key, filled.store_id(), Scope(end_user="held"), "case 7", "legal", NOW)
    for alert_id, fired_at, exchange_id in (
        ("a-old-r1", OLD, "r1"),  # due: its record goes
        ("a-old-r4", OLD, "r4"),  # kept: its record is held
        ("a-old-none", OLD, None),  # due: about no record (a recording gap, the spool)
        ("a-new-none", NEW, None),  # kept: not past retention
    ):
        add_alert(filled.engine, _alert(alert_id, fired_at, exchange_id))
    result = _purge(filled, key)
    # r4 is held: the runs are 1..3, 5..5 (the gap at 6 ends it) and 7..12.
    assert [(w, a, b) for w, a, b, _h in result.runs] == [(W, 1, 3), (W, 5, 5), (W, 7, 12)]
    assert (result.records, result.unchained, result.held, result.total) == ({W: 10}, 1, 1, 11)
    assert _ids(filled) == ["r13", "r14", "r15", "r16", "r4"]
    assert result.alerts == 2 and sorted(a["id"] for a in list_alerts(filled.engine)) == ["a-new-none", "a-old-r4"]
    assert [g["seq"] for g in filled.gaps()] == [6]  # gaps are kept
    with filled.engine.connect() as conn:  # the children went with their records
        assert conn.execute(sa.text("SELECT count(*) FROM exchange_blocks")).scalar() == 0
        runs = conn.execute(sa.text("SELECT first_seq, last_seq, event_seq FROM purged_runs ORDER BY 1")).all()
    assert [tuple(r) for r in runs] == [(1, 3, 2), (5, 5, 2), (7, 12, 2)]
    event = result.event
    assert event is not None and (event["seq"], event["kind"], event["actor"]) == (2, "purge", "ops")
    assert event["detail"] == {
        "cutoff": "2026-06-01T12:00:00.000000Z",
        "retention_days": 183,
        "retention_override": False,
        "records": 10,
        "unchained": 1,
        "held": 1,
        "alerts": 2,
        "runs": 3,
        "runs_sha256": runs_digest(result.runs),
        "chain_began": "2025-10-27T12:00:01.000000Z",  # r1, the oldest chained record
    }
    report = verify(filled, key.public)
    assert report.ok, report.breaks
    assert (report.entries, report.purged, report.store_events) == ({W: 6}, 10, 2)
    assert report.checkpoints == 4  # W's 2 (the one at purged seq 12 checked against its run) + the store's 2
    assert [h["id"] for h in list_holds(filled.engine)] == [hold["id"]]


def test_the_chain_goes_on_after_a_purge_even_of_everything(
    filled: AuditStore, key: CheckpointKey, make_exchange: Callable[..., Exchange]
) -> None:
    result = _purge(filled, key, now=NOW + timedelta(days=200))  # everything is due
    assert result.records == {W: 15} and len(result.runs) == 2  # 1..5 and 7..16 around the gap
    assert _ids(filled) == []
    assert filled.chain_head(W) == (16, bytes.fromhex(result.runs[-1][3]))
    assert filled.max_seq(W) == 16
    filled.write_many([make_exchange("r17", NOW)], writer_id=W, seqs=[17])
    report = verify(filled, key.public)
    assert report.ok, report.breaks
    assert (report.entries, report.purged) == ({W: 2}, 15)  # the gap and r17


def test_a_dry_run_counts_and_removes_nothing(filled: AuditStore, key: CheckpointKey) -> None:
    result = _purge(filled, None, dry_run=True)
    assert (result.records, result.unchained, result.held, result.event) == ({W: 11}, 1, 0, None)
    assert len(_ids(filled)) == 16
    assert _scalar(filled, "SELECT count(*) FROM store_events") == 0


def test_a_hold_keeps_its_records_until_released(filled: AuditStore, key: CheckpointKey) -> None:
    store_id = filled.store_id()
    scope = Scope(since=OLD + timedelta(seconds=7), until=OLD + timedelta(seconds=8))  # r7, r8
    hold = create_hold(filled.engine, key, store_id, scope, "audit request 12", "legal", NOW)
    ids_hold = create_hold(filled.engine, key, store_id, Scope(exchange_ids=("r1",)), "case 9", "legal", NOW)
    assert verify(filled, key.public).ok
    _purge(filled, key)
    assert _ids(filled) == ["r1", "r13", "r14", "r15", "r16", "r7", "r8"]
    release_hold(filled.engine, key, store_id, hold["id"], "request answered", "legal", NOW + timedelta(days=1))
    assert [h["id"] for h in list_holds(filled.engine)] == [ids_hold["id"]]
    (released,) = [h for h in list_holds(filled.engine, include_released=True) if h["id"] == hold["id"]]
    assert (released["released_by"], released["release_reason"], released["released_seq"]) == (
        "legal",
        "request answered",
        4,
    )
    assert verify(filled, key.public).ok
    second = _purge(filled, key)
    assert [(a, b) for _w, a, b, _h in second.runs] == [(7, 8)]
    assert _ids(filled) == ["r1", "r13", "r14", "r15", "r16"]
    report = verify(filled, key.public)
    assert report.ok, report.breaks
    assert report.store_events == 5


@pytest.mark.parametrize(
    ("scope", "message"),
    [
        ({}, "a hold needs a scope"),
        ({"since": NOW, "until": OLD}, "since is after its until"),
        ({"exchange_ids": ("x" * 37,)}, "not a record id"),
        ({"end_user": ""}, "end_user must be 1..2000 characters"),
    ],
)
def test_a_bad_scope_is_refused(scope: dict[str, object], message: str) -> None:
    with pytest.raises(HoldError, match=message):
        Scope(**scope)  # type: ignore[arg-type]


def test_releasing_an_unknown_or_released_hold_is_refused(filled: AuditStore, key: CheckpointKey) -> None:
    store_id = filled.store_id()
    with pytest.raises(HoldError, match="no hold nope"):
        release_hold(filled.engine, key, store_id, "nope", "x", "legal", NOW)
    hold = create_hold(filled.engine, key, store_id, Scope(host="api.openai.com"), "r", "legal", NOW)
    release_hold(filled.engine, key, store_id, hold["id"], "done", "legal", NOW)
    with pytest.raises(HoldError, match="was released at 2026-12-01T12:00:00.000000Z"):
        release_hold(filled.engine, key, store_id, hold["id"], "again", "legal", NOW)
    with pytest.raises(HoldError, match="reason must be"):
        create_hold(filled.engine, key, store_id, Scope(host="h"), "  ", "legal", NOW)


@pytest.mark.parametrize(
    ("reason", "code"),
    [("x\x1b]0;title\x07", "001B"), ("bad\x1b[31mreason", "001B"), ("a\u202eb", "202E"), ("a\x00b", "0000")],
)
def test_a_reason_with_a_control_or_format_character_is_refused(
    filled: AuditStore, key: CheckpointKey, reason: str, code: str
) -> None:
    """Trial finding: ``hold release --reason $'x\\e]0;title\\a'`` was kept, and ``hold list``
    printed the escape raw (it set the terminal's title). Lines and tabs stay allowed; the actor
    (an API token's name, ``--by``) is held to the same rule."""
    store_id = filled.store_id()
    with pytest.raises(HoldError, match=f"reason must be printable characters, lines and tabs \\(U\\+{code} is not\\)"):
        create_hold(filled.engine, key, store_id, Scope(host="h"), reason, "legal", NOW)
    hold = create_hold(filled.engine, key, store_id, Scope(host="h"), "case 7:\n\tcourt order", "legal", NOW)
    with pytest.raises(HoldError, match=f"U\\+{code} is not"):
        release_hold(filled.engine, key, store_id, hold["id"], reason, "legal", NOW)
    with pytest.raises(HoldError, match=f"actor must be printable .*U\\+{code}"):
        create_hold(filled.engine, key, store_id, Scope(host="h"), "r", reason, NOW)
    # A scope's user or host is what records hold, whatever it is: only NUL is refused there.
    if code != "0000":
        assert Scope(end_user=reason).end_user == reason


def test_a_purge_refuses_to_erase_a_break(filled: AuditStore, key: CheckpointKey) -> None:
    _sql(filled, "UPDATE exchanges SET model = 'forged' WHERE id = 'r3'")
    with pytest.raises(PurgeRefused, match="seq 3, record r3: hash mismatch"):
        _purge(filled, key)
    assert len(_ids(filled)) == 16


def test_two_commands_at_once_collide_and_write_nothing(
    filled: AuditStore, key: CheckpointKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_id = filled.store_id()
    create_hold(filled.engine, key, store_id, Scope(host="h"), "first", "legal", NOW)
    # The second command read the head before the first one committed.
    monkeypatch.setattr("observer.store.events.event_head", lambda conn: (0, GENESIS))
    with pytest.raises(ConcurrentChange, match="at the same time"):
        create_hold(filled.engine, key, store_id, Scope(host="h2"), "second", "legal", NOW)
    assert [h["host"] for h in list_holds(filled.engine)] == ["h"]
    with pytest.raises(ValueError, match="unknown store event kind"):
        with filled.engine.begin() as conn:
            append_event(conn, key, store_id, "nonsense", "x", {}, NOW)


# ----- tampering with what a purge or a hold leaves -----


@pytest.fixture
def purged(filled: AuditStore, key: CheckpointKey) -> AuditStore:
    create_hold(filled.engine, key, filled.store_id(), Scope(end_user="held"), "case 7", "legal", NOW)
    _purge(filled, key)
    assert verify(filled, key.public).ok  # the clean control
    return filled


def test_a_record_deleted_after_a_purge_is_still_found(purged: AuditStore, key: CheckpointKey) -> None:
    _sql(purged, "DELETE FROM exchanges WHERE id = 'r14'")
    assert _only_break(purged, key).endswith("seq 14 missing (a row deleted; the next row is seq 15, record r15)")


def test_a_deleted_held_record_is_found(purged: AuditStore, key: CheckpointKey) -> None:
    _sql(purged, "DELETE FROM exchanges WHERE id = 'r4'")
    assert "seq 4 missing (a row deleted" in _only_break(purged, key)


def test_a_forged_run_excusing_a_deletion_is_found(purged: AuditStore, key: CheckpointKey) -> None:
    h = _scalar(purged, "SELECT record_hash FROM exchanges WHERE id = 'r14'")
    _sql(purged, "DELETE FROM exchanges WHERE id = 'r14'")
    _sql(purged, f"INSERT INTO purged_runs VALUES ('{W}', 14, 14, '{h}', 2)")
    assert _only_break(purged, key).endswith(
        "seq 2: purge event 2: the purged runs differ from those it committed to (added, changed or deleted)"
    )


def test_a_run_of_no_purge_is_found(purged: AuditStore, key: CheckpointKey) -> None:
    _sql(purged, "UPDATE purged_runs SET event_seq = 1 WHERE first_seq = 5")
    assert _only_break(purged, key).endswith("seq 5: purged run 5..5 names no purge event (1)")


def test_a_changed_run_hash_is_found(purged: AuditStore, key: CheckpointKey) -> None:
    _sql(purged, "UPDATE purged_runs SET last_hash = :h WHERE first_seq = 7", h="0" * 64)
    report = verify(purged, key.public)
    lines = sorted(b.line() for b in report.breaks)
    assert len(lines) == 2, lines
    assert lines[0].endswith("seq 13, record r13: hash mismatch: this record, or the order before it, was changed")
    assert "seq 2: purge event 2: the purged runs differ" in lines[1]  # the store's chain


def test_a_record_inserted_into_a_purged_run_is_found(
    purged: AuditStore, key: CheckpointKey, make_exchange: Callable[..., Exchange]
) -> None:
    purged.write_many([make_exchange("fake", OLD)])
    _sql(purged, "UPDATE exchanges SET writer_id = :w, seq = 8, record_hash = :h WHERE id = 'fake'", w=W, h="0" * 64)
    assert _only_break(purged, key).endswith(
        "seq 8, record fake: a row inside the run that purge event 2 removed (inserted again?)"
    )


@pytest.mark.parametrize(
    ("statement", "reason"),
    [
        ("UPDATE holds SET reason = 'other'", "reason differs from its chained events"),
        ("UPDATE holds SET end_user = 'someone'", "end_user differs from its chained events"),
        ("DELETE FROM holds", "deleted from the holds table"),
        ("UPDATE store_events SET actor = 'nobody' WHERE seq = 1", "hash mismatch: store event 1 (hold_created)"),
        ("DELETE FROM store_events WHERE seq = 1", "store event 1 missing (deleted)"),
        ("DELETE FROM store_events WHERE seq = 2", "seq 1: purged run 1..3 names no purge event (2)"),
    ],
)
def test_a_changed_hold_or_store_event_is_found(
    purged: AuditStore, key: CheckpointKey, statement: str, reason: str
) -> None:
    _sql(purged, statement)
    assert reason in _only_break(purged, key)


def test_an_inserted_hold_is_found(purged: AuditStore, key: CheckpointKey) -> None:
    _sql(
        purged,
        "INSERT INTO holds (id, reason, created_at, created_by, created_seq) VALUES ('h2', 'x', :t, 'x', 1)",
        t="2026-12-01 12:00:00.000000" if purged.engine.dialect.name == "sqlite" else NOW,
    )
    assert _only_break(purged, key).endswith("hold h2 has no chained event (inserted)")


def test_a_deleted_last_store_event_is_found_against_its_checkpoint(purged: AuditStore, key: CheckpointKey) -> None:
    hold = create_hold(purged.engine, key, purged.store_id(), Scope(host="h"), "case 8", "legal", NOW)
    _sql(purged, "DELETE FROM store_events WHERE seq = 3")
    _sql(purged, "DELETE FROM holds WHERE id = :id", id=hold["id"])
    assert _only_break(purged, key).endswith("tail deleted: checkpoint 3 covers seq 3, the store ends at seq 2")


def test_a_store_checkpoint_by_an_unknown_key_is_found(purged: AuditStore, key: CheckpointKey, tmp_path: Path) -> None:
    other = CheckpointKey.load_or_create(tmp_path / "other.pem")
    report = verify(purged, other.public)
    store_line = [b.reason for b in report.breaks if b.writer_id == purged.store_id()]
    assert store_line and "signed by an unknown key" in store_line[0]
    assert verify(purged, [key.public, other.public]).ok  # any trusted key may sign the store's chain


def test_events_and_head_hash_by_hand(purged: AuditStore) -> None:
    with purged.engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(sa.text("SELECT * FROM store_events ORDER BY seq"))]
    prev = GENESIS
    for row in rows:
        row["detail"] = row["detail"] if isinstance(row["detail"], dict) else __import__("json").loads(row["detail"])
        row["at"] = NOW
        prev = chain_hash(prev, canonical_event(row, purged.store_id()))
        assert row["record_hash"] == prev.hex()


# ----- the commands -----


def _cli(args: list[str], db_url: str, key: CheckpointKey) -> object:
    return CliRunner().invoke(app, [*args, "--db", db_url, "--key", str(key.path)], catch_exceptions=False)


def test_hold_and_purge_commands(
    filled: AuditStore, key: CheckpointKey, migrated_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("observer.store.purge.cutoff_for", lambda now, days: NOW - timedelta(days=days))
    made = _cli(["hold", "create", "--reason", "case 7", "--user", "held", "--by", "legal"], migrated_url, key)
    assert made.exit_code == 0, made.output  # type: ignore[attr-defined]
    hold_id = made.stdout.strip()  # type: ignore[attr-defined]
    listed = CliRunner().invoke(app, ["hold", "list", "--db", migrated_url])
    assert listed.exit_code == 0
    assert listed.stdout.startswith(f"{hold_id}  ") and "by legal  user 'held'  reason: case 7" in listed.stdout
    dry = _cli(["purge", "--dry-run"], migrated_url, key)
    assert dry.exit_code == 0, dry.output  # type: ignore[attr-defined]
    assert "would remove 11 records started before 2026-06-01T12:00:00.000000Z (retention 183 days)" in dry.stdout  # type: ignore[attr-defined]
    done = _cli(["purge", "--by", "ops"], migrated_url, key)
    assert done.exit_code == 0, done.output  # type: ignore[attr-defined]
    assert (
        "removed 11 records started before 2026-06-01T12:00:00.000000Z (retention 183 days): 10 chained in 3 runs,"
        " 1 from before the chain; 1 kept under a legal hold; 0 alerts; store event 2" in done.stdout  # type: ignore[attr-defined]
    )
    released = _cli(["hold", "release", hold_id, "--reason", "closed"], migrated_url, key)
    assert released.exit_code == 0 and f"hold {hold_id} released" in released.stdout  # type: ignore[attr-defined]
    assert CliRunner().invoke(app, ["hold", "list", "--db", migrated_url]).stderr.strip() == "observer: no active holds"
    again = _cli(["hold", "release", hold_id, "--reason", "closed"], migrated_url, key)
    assert again.exit_code == 2 and "was released at" in again.stderr  # type: ignore[attr-defined]
    wide = [
        *("hold", "create", "--reason", "order 3", "--since", "2026-01-01T00:00:00Z", "--until"),
        *("2026-02-01T00:00:00+01:00", "--host", "api.openai.com", "--id", "r1", "--id", "r2"),
    ]
    assert _cli(wide, migrated_url, key).exit_code == 0  # type: ignore[attr-defined]
    everything = CliRunner().invoke(app, ["hold", "list", "--all", "--db", migrated_url])
    first, second = everything.stdout.splitlines()
    assert re.search(r"  released 2\d{3}-\S+Z by \S+: closed$", first), first  # (--by not given: the OS user)
    assert (
        "since 2026-01-01T00:00:00.000000Z, until 2026-01-31T23:00:00.000000Z, host api.openai.com, 2 record ids"
        "  reason: order 3" in second
    )
    verified = CliRunner().invoke(app, ["verify", "--db", migrated_url, "--key", str(key.path)])
    assert verified.exit_code == 0, verified.output


def test_command_errors(filled: AuditStore, key: CheckpointKey, migrated_url: str, tmp_path: Path) -> None:
    no_scope = _cli(["hold", "create", "--reason", "x"], migrated_url, key)
    assert no_scope.exit_code == 2 and "a hold needs a scope" in no_scope.stderr  # type: ignore[attr-defined]
    missing = CliRunner().invoke(app, ["purge", "--db", migrated_url, "--key", str(tmp_path / "none.pem")])
    assert missing.exit_code == 2 and "no checkpoint key" in missing.stderr
    short = _cli(["purge", "--retention-days", "30"], migrated_url, key)
    assert short.exit_code == 2  # type: ignore[attr-defined]
    assert "--retention-days is 30 days, under the 183 (six months)" in short.stderr  # type: ignore[attr-defined]
    _sql(filled, "UPDATE exchanges SET model = 'forged' WHERE id = 'r2'")
    refused = _cli(["purge"], migrated_url, key)
    assert refused.exit_code == 1 and "nothing was purged" in refused.stderr  # type: ignore[attr-defined]
    blank = _cli(["hold", "create", "--reason", "x", "--host", "h", "--by", " "], migrated_url, key)
    assert blank.exit_code == 2 and "--by must not be blank" in blank.stderr  # type: ignore[attr-defined]


def test_a_short_retention_needs_the_override(
    filled: AuditStore, key: CheckpointKey, migrated_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OBSERVER_RETENTION_OVERRIDE", "true")
    result = _cli(["purge", "--retention-days", "30", "--dry-run"], migrated_url, key)
    assert result.exit_code == 0, result.output  # type: ignore[attr-defined]
    assert "retention_days is 30, under six months (retention_override is set)" in result.stderr  # type: ignore[attr-defined]
    assert "(retention 30 days)" in result.stdout  # type: ignore[attr-defined]


def test_a_store_without_the_new_tables_is_named(tmp_path: Path, key: CheckpointKey) -> None:
    from observer.store.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade(url, revision="0003")
    result = CliRunner().invoke(app, ["hold", "list", "--db", url])
    assert result.exit_code == 2
    assert "run observer db upgrade" in result.stderr


# ----- trial findings -----


def _forge_event(store: AuditStore, kind: str, detail: dict[str, object]) -> None:
    """Appends a store event as someone with SQL access but not the key would: a correct hash,
    no checkpoint."""
    import json

    store_id = store.store_id()
    with store.engine.begin() as conn:
        seq, head = conn.execute(sa.text("SELECT seq, record_hash FROM store_events ORDER BY seq DESC")).first()  # type: ignore[misc]
        row = {"seq": seq + 1, "kind": kind, "at": NOW, "actor": "dba", "detail": detail}
        h = chain_hash(bytes.fromhex(head), canonical_event(row, store_id)).hex()
        at = "2026-12-01 12:00:00.000000" if store.engine.dialect.name == "sqlite" else NOW
        conn.execute(
            sa.text(
                "INSERT INTO store_events (seq, kind, at, actor, detail, record_hash) VALUES (:s, :k, :a, 'dba', :d, :h)"
            ),
            {"s": seq + 1, "k": kind, "a": at, "d": json.dumps(detail), "h": h},
        )


def test_a_store_event_forged_without_the_key_is_found(purged: AuditStore, key: CheckpointKey) -> None:
    """Trial finding: a forged release (a correct hash, no checkpoint) verified."""
    (hold,) = list_holds(purged.engine)
    _forge_event(purged, "hold_released", {"hold_id": hold["id"], "reason": "forged"})
    _sql(
        purged,
        "UPDATE holds SET released_at = created_at, released_by = 'dba', release_reason = 'forged', released_seq = 3",
    )
    assert _only_break(purged, key).endswith("seq 3: store event 3 has no signed checkpoint (forged?)")


def test_deleted_store_checkpoints_are_a_break(purged: AuditStore, key: CheckpointKey) -> None:
    _sql(purged, "DELETE FROM checkpoints WHERE writer_id = :s", s=purged.store_id())
    assert _only_break(purged, key).endswith("seq 1: store event 1 has no signed checkpoint (forged?)")


def test_a_deleted_tail_event_with_its_checkpoint_is_found_by_a_writer_checkpoint(
    purged: AuditStore, key: CheckpointKey, make_exchange: Callable[..., Exchange]
) -> None:
    """Trial finding: a hold row, its event (the tail) and the store chain's last checkpoint
    deleted verified, and the next purge removed the held records unseen. A writer's checkpoint
    names the store chain's head it saw."""
    hold = create_hold(purged.engine, key, purged.store_id(), Scope(host="h"), "case 8", "legal", NOW)
    purged.write_many([make_exchange("r17", NOW)], writer_id=W, seqs=[17])
    last = purged.last_checkpoint(W)
    assert last is not None
    events = purged.events_head()
    assert events is not None and events[0] == 3
    row = make_checkpoint(
        key,
        purged.store_id(),
        W,
        last["number"] + 1,
        17,
        _scalar(purged, "SELECT record_hash FROM exchanges WHERE id = 'r17'"),
        NOW,
        hashlib.sha256(last["note"].encode()).hexdigest(),
        events,  # type: ignore[arg-type]
    )
    assert row["note"].endswith(f"events 3 {events[1]}\n")
    purged.add_checkpoint(row)
    assert verify(purged, key.public).ok
    _sql(purged, "DELETE FROM holds WHERE id = :h", h=hold["id"])
    _sql(purged, "DELETE FROM store_events WHERE seq = 3")
    _sql(purged, "DELETE FROM checkpoints WHERE writer_id = :s AND seq = 3", s=purged.store_id())
    assert _only_break(purged, key).endswith(
        "checkpoint 3: names the store's event 3, which the store does not have (deleted)"
    )
    with pytest.raises(PurgeRefused):  # the purge checks with the key too
        _purge(purged, key)


def test_a_purge_refuses_when_a_hold_and_its_event_were_deleted(purged: AuditStore, key: CheckpointKey) -> None:
    """Trial finding: the purge's check ignored checkpoints, so it removed the held records of a
    hold whose row and tail event were deleted (its checkpoint kept)."""
    hold = create_hold(purged.engine, key, purged.store_id(), Scope(end_user="held"), "case 9", "legal", NOW)
    _sql(purged, "DELETE FROM holds WHERE id = :h", h=hold["id"])
    _sql(purged, "DELETE FROM store_events WHERE seq = 3")
    with pytest.raises(PurgeRefused, match="tail deleted: checkpoint 3 covers seq 3, the store ends at seq 2"):
        _purge(purged, key, now=NOW + timedelta(days=1))


def test_exported_checkpoints_cover_the_store_chain(purged: AuditStore, key: CheckpointKey) -> None:
    """Trial finding: ``verify --checkpoints`` broke on every store with a hold or purge."""
    exported = [{"store_id": purged.store_id(), **c} for c in purged.checkpoints()]
    assert verify(purged, key.public, exported=exported).ok
    _sql(purged, "DELETE FROM checkpoints WHERE writer_id = :s AND seq = 2", s=purged.store_id())
    _sql(purged, "DELETE FROM store_events WHERE seq = 2")
    _sql(purged, "DELETE FROM purged_runs")
    lines = [b.line() for b in verify(purged, None, exported=exported).breaks]
    assert any(
        line.endswith("tail deleted: exported checkpoint 2 covers seq 2, the store ends at seq 1") for line in lines
    ), lines


def test_an_unchained_record_newer_than_the_purged_chain_start_is_found(
    purged: AuditStore, key: CheckpointKey, make_exchange: Callable[..., Exchange]
) -> None:
    """Trial finding: once the oldest chained records were purged, an inserted unchained record
    dated after them (but before the oldest left) verified."""
    purged.write_many([make_exchange("forged", OLD + timedelta(days=30))])
    line = _only_break(purged, key)
    assert "record forged: a record outside any chain, started after the chains began" in line


def test_a_hold_waits_for_a_purge_to_commit(filled: AuditStore, key: CheckpointKey) -> None:
    """Trial finding: a hold made while a purge ran was not seen by it (PostgreSQL). Admin
    commands take the store chain's lock first."""
    import threading

    from observer.store.events import lock

    store_id = filled.store_id()
    made: list[dict[str, object]] = []
    with filled.engine.connect() as conn:
        tx = conn.begin()
        lock(conn)
        worker = threading.Thread(
            target=lambda: made.append(create_hold(filled.engine, key, store_id, Scope(host="h"), "r", "legal", NOW))
        )
        worker.start()
        worker.join(0.5)
        assert worker.is_alive() and not made  # waiting for the lock
        tx.commit()
    worker.join(10)
    assert made and not worker.is_alive()


@pytest.mark.postgres
def test_many_large_id_holds_do_not_stop_a_purge(pg_migrated_url: str, key: CheckpointKey) -> None:
    """Trial finding: 7 holds of 10,000 ids passed PostgreSQL's 65,535 parameters and every purge
    failed."""
    store = AuditStore(pg_migrated_url)
    try:
        for h in range(7):
            scope = Scope(exchange_ids=tuple(f"id-{h}-{i}" for i in range(10_000)))
            create_hold(store.engine, key, store.store_id(), scope, f"case {h}", "legal", NOW)
        result = _purge(store, key, dry_run=True)
        assert result.total == 0
        assert _scalar(store, "SELECT count(*) FROM hold_records") == 70_000
        assert verify(store, key.public).ok
    finally:
        store.dispose()


def test_a_changed_hold_record_is_found(filled: AuditStore, key: CheckpointKey) -> None:
    create_hold(filled.engine, key, filled.store_id(), Scope(exchange_ids=("r1", "r2")), "case", "legal", NOW)
    assert verify(filled, key.public).ok
    _sql(filled, "UPDATE hold_records SET exchange_id = 'r3' WHERE exchange_id = 'r2'")
    assert "the record ids of hold_records differs from its chained events" in _only_break(filled, key)
    _sql(filled, "UPDATE hold_records SET exchange_id = 'r2' WHERE exchange_id = 'r3'")
    _sql(filled, "INSERT INTO hold_records VALUES ('nohold', 'r5')")
    assert _only_break(filled, key).endswith("hold_records names hold nohold, which no chained event made (inserted)")


@pytest.mark.postgres
def test_a_purge_gives_up_on_tables_locked_too_long(
    pg_migrated_url: str, key: CheckpointKey, make_exchange: Callable[..., Exchange]
) -> None:
    """Trial finding: a purge waited without end behind a long transaction, the writer and
    the API waiting behind it."""
    from observer.store.purge import PurgeBusy

    store = AuditStore(pg_migrated_url)
    try:
        store.write_many([make_exchange("old", OLD)], writer_id=W, seqs=[1])
        blocker = sa.create_engine(pg_migrated_url)
        with blocker.connect() as conn:
            conn.execute(sa.text("BEGIN"))
            conn.execute(sa.text("LOCK TABLE exchanges IN ROW EXCLUSIVE MODE"))  # a writer mid-transaction
            with pytest.raises(PurgeBusy, match="stayed locked by another transaction for 0.3 s; nothing was purged"):
                purge(
                    store, key, now=NOW, retention_days=183, retention_override=False, actor="ops", lock_timeout_s=0.3
                )
            conn.execute(sa.text("ROLLBACK"))
        blocker.dispose()
        assert _ids(store) == ["old"]
        assert _purge(store, key).total == 1
    finally:
        store.dispose()


def test_times_out_of_range_are_one_line_errors(filled: AuditStore, key: CheckpointKey, migrated_url: str) -> None:
    """Trial finding: year 1 gave tracebacks (rfc3339 wrote '1-01-01...'; +01:00 overflowed)."""
    ok = _cli(["hold", "create", "--reason", "x", "--since", "0001-01-01T00:00:00Z"], migrated_url, key)
    assert ok.exit_code == 0, ok.output  # type: ignore[attr-defined]
    assert "since 0001-01-01T00:00:00.000000Z" in CliRunner().invoke(app, ["hold", "list", "--db", migrated_url]).stdout
    bad = _cli(["hold", "create", "--reason", "x", "--since", "0001-01-01T00:00:00+01:00"], migrated_url, key)
    assert bad.exit_code == 2 and "--since must be an RFC 3339 time" in bad.stderr  # type: ignore[attr-defined]
