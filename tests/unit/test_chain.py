"""The hash chain and its checkpoints: canonical bytes written down by hand, one tamper test per
kind of change (SQLite and PostgreSQL), each against a clean control, and ``observer verify``."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from observer.cli import app
from observer.journal.journal import Journal
from observer.records import Block, Exchange, ToolCall
from observer.store.chain import DOMAIN, GENESIS, canonical_gap, canonical_record, chain_hash
from observer.store.checkpoint import CheckpointKey, make_checkpoint, public_pem
from observer.store.drain import Drainer
from observer.store.store import AuditStore
from observer.store.verify import verify

T0 = datetime(2026, 6, 1, 8, 0, 0, tzinfo=timezone.utc)
N = 30  # records stored; with the gap, N + 1 entries
LAST = N + 1


def _wait_until(predicate: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


# ----- canonical bytes, by hand -----


def test_canonical_record_bytes_and_hash_by_hand(make_exchange: Callable[..., Exchange]) -> None:
    record = make_exchange(
        "r1",
        T0,
        blocks=[Block(index=0, text="héllo")],
        tool_calls=[ToolCall(index=0, id="c1", name="f", arguments='{"a":1}')],
        ttft_s=2.0,
    )
    record.request.messages = [{"role": "user", "content": "hi"}]
    got = canonical_record(record.to_dict(), "w1", 7)
    sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    messages = sha(b'[{"content":"hi","role":"user"}]')
    expected = (
        '{"blocks":[{"index":0,"stop_reason":null,"text":{"sha256":"' + sha("héllo".encode()) + '"},"type":"text"}],'
        '"dialect":"openai-chat","ended_at":null,"error":null,"events":0,"host":"api.openai.com",'
        '"http_version":"HTTP/1.1","id":"r1","kind":"exchange","method":"POST","model":null,'
        '"outcome":"completed","path":"/v1/chat/completions","port":null,"request":{"body_bytes":0,'
        '"end_user":null,"extensions":[],"messages":{"sha256":"' + messages + '"},"metadata":{},"model":null,'
        '"parameters":{},"request_id":null,"stream":null,"tool_names":[],"tools":{"sha256":"' + sha(b"[]") + '"},'
        '"version":null},"request_id":null,"response_body":null,"response_bytes":0,"scheme":"http","seq":7,'
        '"started_at":"2026-06-01T08:00:00.000000Z","status_code":200,"stop_reason":null,"stop_reason_raw":null,'
        '"tool_calls":[{"arguments":{"sha256":"' + sha(b'{"a":1}') + '"},"declared":false,"id":"c1","index":0,'
        '"name":"f"}],"transport_error":null,"ttft_s":2.0,"usage":{"input_tokens":null,"output_tokens":null,'
        '"reported":false},"violations":[],"writer_id":"w1"}'
    )
    assert got.decode() == expected
    assert chain_hash(GENESIS, got) == hashlib.sha256(b"llm-audit/v1\x00" + expected.encode() + bytes(32)).digest()
    assert DOMAIN == b"llm-audit/v1\x00"


def test_canonical_gap_bytes_by_hand() -> None:
    gap = {
        "seq": 4,
        "seq_end": 6,
        "first_at": T0,
        "last_at": None,
        "dropped": 3,
        "reason": "spool_full",
        "detail": None,
    }
    assert canonical_gap(gap, "w1") == (
        b'{"detail":null,"dropped":3,"first_at":"2026-06-01T08:00:00.000000Z","kind":"gap","last_at":null,'
        b'"reason":"spool_full","seq":4,"seq_end":6,"writer_id":"w1"}'
    )


def test_content_is_committed_by_digest_only(make_exchange: Callable[..., Exchange]) -> None:
    """Erasing content and keeping its digest leaves the canonical bytes as they were
    (crypto-shredding keeps the chain verifiable): the bytes hold no content."""
    record = make_exchange("r1", T0, blocks=[Block(index=0, text="secret completion")])
    record.request.messages = [{"role": "user", "content": "secret prompt"}]
    got = canonical_record(record.to_dict(), "w", 1)
    assert b"secret" not in got


# ----- a chained store -----


@pytest.fixture
def key(tmp_path: Path) -> CheckpointKey:
    return CheckpointKey.load_or_create(tmp_path / "keys" / "checkpoint-key.pem")


@pytest.fixture
def chained(
    tmp_path: Path, store: AuditStore, key: CheckpointKey, make_exchange: Callable[..., Exchange]
) -> Iterator[AuditStore]:
    """Records r-000..r-030 through the journal and drainer, but r-012, dropped (the queue was
    full): seq 1..12 are r-000..r-011, seq 13 the gap, seq 14..31 r-013..r-030 (the record at
    seq s is r-{s-1}). The drainer starts once all is journaled and takes 10 records a batch:
    checkpoints after seq 10, 21 and 31."""
    records = [
        make_exchange(f"r-{i:03d}", T0 + timedelta(seconds=i), blocks=[Block(index=0, text=f"answer {i}")], model="m")
        for i in range(N + 1)
    ]
    journal = Journal(tmp_path / "j", queue_max=12)
    journal.open()
    assert all(journal.record(r) for r in records[:12])
    assert not journal.record(records[12])  # dropped: a queue_full gap
    journal.start(1)
    _wait_until(lambda: journal.journaled == 12 and journal.gaps_written == 1)
    for done, r in enumerate(records[13:], 13):  # one at a time: the queue holds 12
        assert journal.record(r)
        _wait_until(lambda done=done: journal.journaled == done)
    drainer = Drainer(store, journal, batch_max=10, checkpoint_key=key, checkpoint_every=10, checkpoint_interval_s=3600)
    drainer.start()
    _wait_until(lambda: drainer.written == N)
    journal.close()
    drainer.close()
    yield store


def _sql(store: AuditStore, statement: str, **params: object) -> None:
    with store.engine.begin() as conn:
        conn.execute(sa.text(statement), params)


def _only_break(store: AuditStore, key: CheckpointKey) -> str:
    report = verify(store, key.public)
    assert len(report.breaks) == 1, report.breaks
    return report.breaks[0].line()


def test_a_clean_store_verifies(chained: AuditStore, key: CheckpointKey) -> None:
    report = verify(chained, key.public)
    assert report.ok, report.breaks
    assert list(report.entries.values()) == [LAST]
    assert [c["seq"] for c in chained.checkpoints()] == [10, 21, LAST]
    assert report.checkpoints == 3
    (gap,) = chained.gaps()
    assert (gap["seq"], gap["reason"], gap["dropped"]) == (13, "queue_full", 1)


def test_a_changed_metadata_field_is_found(chained: AuditStore, key: CheckpointKey) -> None:
    _sql(chained, "UPDATE exchanges SET model = 'other' WHERE seq = 17")
    assert _only_break(chained, key).endswith(
        "seq 17, record r-016: hash mismatch: this record, or the order before it, was changed"
    )


@pytest.mark.parametrize(
    ("column", "value"),
    [("text", "'EVIL'"), ("request_model", "'gpt-5'"), ("end_user", "'alice'")],
)
def test_a_changed_copied_column_is_found(chained: AuditStore, key: CheckpointKey, column: str, value: str) -> None:
    """Trial finding: the columns copied out of the record for the list endpoint and queries
    (``text``, ``request_model``, ``end_user``) were outside the chain: a forged
    copy verified and the list served it."""
    _sql(chained, f"UPDATE exchanges SET {column} = {value} WHERE seq = 15")
    reason = f"seq 15, record r-014: column {column} differs from the record it is copied from (changed)"
    assert _only_break(chained, key).endswith(reason)


def test_a_changed_content_field_is_found(chained: AuditStore, key: CheckpointKey) -> None:
    _sql(chained, "UPDATE exchange_blocks SET text = 'forged' WHERE exchange_id = 'r-004'")
    assert "seq 5, record r-004: hash mismatch" in _only_break(chained, key)


def test_a_row_deleted_in_the_middle_is_found(chained: AuditStore, key: CheckpointKey) -> None:
    _sql(chained, "DELETE FROM exchanges WHERE seq = 9")
    assert _only_break(chained, key).endswith(
        "seq 9: seq 9 missing (a row deleted; the next row is seq 10, record r-009)"
    )


def test_a_deleted_tail_is_found_against_the_last_checkpoint(chained: AuditStore, key: CheckpointKey) -> None:
    _sql(chained, "DELETE FROM exchanges WHERE seq > 27")
    assert _only_break(chained, key).endswith(
        f"seq 28: tail deleted: checkpoint 3 covers seq {LAST}, the store ends at seq 27"
    )


def test_a_deleted_tail_with_its_checkpoints_is_found_against_an_export(
    chained: AuditStore, key: CheckpointKey, tmp_path: Path
) -> None:
    exported = [dict(c, created_at=c["created_at"]) for c in chained.checkpoints()]
    _sql(chained, "DELETE FROM exchanges WHERE seq > 25")
    _sql(chained, "DELETE FROM checkpoints WHERE seq > 25")
    assert verify(chained, key.public).ok  # what the store holds is consistent in itself
    report = verify(chained, key.public, exported=exported)
    (brk,) = report.breaks
    assert brk.line().endswith("seq 26: tail deleted: exported checkpoint 3 covers seq 31, the store ends at seq 25")


def test_a_deleted_writer_and_an_export_of_another_store_are_found(chained: AuditStore, key: CheckpointKey) -> None:
    """Trial findings: deleting all of a writer's rows and checkpoints passed even with an
    export, and an export of another store was ignored."""
    exported = [{"store_id": chained.store_id(), **c} for c in chained.checkpoints()]
    writer = exported[0]["writer_id"]
    _sql(chained, "DELETE FROM exchanges")
    _sql(chained, "DELETE FROM gaps")
    _sql(chained, "DELETE FROM checkpoints")
    (brk,) = verify(chained, key.public, exported=exported).breaks
    assert brk.line() == (
        f"writer {writer}, seq 1: every row of this writer deleted: exported checkpoint 3 covers seq 31, the store has none"
    )
    other = [dict(c, store_id="another-store") for c in exported]
    lines = [b.line() for b in verify(chained, key.public, exported=other).breaks]
    assert f"writer {writer}, its end: the export is of the store another-store, this is {chained.store_id()}" in lines


def test_an_unchained_row_newer_than_the_chain_is_found(
    chained: AuditStore, key: CheckpointKey, make_exchange: Callable[..., Exchange]
) -> None:
    """Trial finding: a forged row without writer, seq and hash passed as "stored before the
    chain". Rows older than the chain still may be (a store from before the journal)."""
    chained.write_many([make_exchange("old", T0 - timedelta(days=1))])
    assert verify(chained, key.public).ok and verify(chained, key.public).unchained == 1
    chained.write_many([make_exchange("forged", T0 + timedelta(seconds=5))])
    (brk,) = verify(chained, key.public).breaks
    assert brk.record_id == "forged" and "a record outside any chain, started after the chains began" in brk.reason


def test_reordered_rows_are_found(chained: AuditStore, key: CheckpointKey) -> None:
    _sql(chained, "UPDATE exchanges SET seq = -1 WHERE seq = 20")
    _sql(chained, "UPDATE exchanges SET seq = 20 WHERE seq = 21")
    _sql(chained, "UPDATE exchanges SET seq = 21 WHERE seq = -1")
    assert "seq 20, record r-020: hash mismatch" in _only_break(chained, key)


def test_an_inserted_row_is_found_even_when_chained_correctly(
    chained: AuditStore, key: CheckpointKey, make_exchange: Callable[..., Exchange]
) -> None:
    """The forger renumbers the rows after seq 14 and inserts one at 15 whose hash continues
    the chain correctly: the next row's hash no longer matches (its seq is committed)."""
    for seq in range(LAST, 14, -1):
        _sql(chained, "UPDATE exchanges SET seq = :new WHERE seq = :old", new=seq + 1, old=seq)
    writer = chained.writers()[0]
    forged = make_exchange("forged", T0)
    with chained.engine.connect() as conn:
        head14 = conn.scalar(sa.text("SELECT record_hash FROM exchanges WHERE seq = 14"))
    chained.write_many([forged])
    forged_hash = chain_hash(bytes.fromhex(head14), canonical_record(forged.to_dict(), writer, 15)).hex()
    _sql(
        chained,
        "UPDATE exchanges SET writer_id = :w, seq = 15, record_hash = :h WHERE id = 'forged'",
        w=writer,
        h=forged_hash,
    )
    assert "seq 16, record r-014: hash mismatch" in _only_break(chained, key)


def test_a_changed_gap_is_found(chained: AuditStore, key: CheckpointKey, store: AuditStore) -> None:
    (gap,) = chained.gaps()
    _sql(chained, "UPDATE gaps SET dropped = 0")
    assert f"seq {gap['seq']}: hash mismatch: this gap" in _only_break(chained, key)


def test_a_checkpoint_signed_by_another_key_is_found(chained: AuditStore, key: CheckpointKey, tmp_path: Path) -> None:
    other = CheckpointKey.load_or_create(tmp_path / "other.pem")
    last = chained.checkpoints()[-1]
    forged = make_checkpoint(
        other,
        chained.store_id(),
        last["writer_id"],
        last["number"],
        last["seq"],
        last["head_hash"],
        last["created_at"],
        last["prev_hash"],
    )
    _sql(chained, "DELETE FROM checkpoints WHERE number = :n", n=last["number"])
    chained.add_checkpoint(forged)
    line = _only_break(chained, key)
    assert f"checkpoint {last['number']}: signed by another key ({other.key_id}, this writer's: {key.key_id})" in line
    (brk,) = verify(chained, [other.public]).breaks  # trusting only the other key: the first is unknown
    assert brk.line().endswith(f"checkpoint 1: signed by an unknown key ({key.key_id}; trusted: {other.key_id})")
    assert verify(chained, [other.public, key.public]).breaks[0].line() == line  # several trusted keys


def test_a_rewritten_chain_is_found_by_its_signed_checkpoints(
    chained: AuditStore, key: CheckpointKey, make_exchange: Callable[..., Exchange]
) -> None:
    """An administrator changes a record and re-hashes every later row (all in SQL): the chain
    is consistent again, but the checkpoints signed before name other heads."""
    writer = chained.writers()[0]
    _sql(chained, "UPDATE exchanges SET model = 'other' WHERE seq = 3")
    with chained.engine.connect() as conn:
        prev = bytes.fromhex(conn.scalar(sa.text("SELECT record_hash FROM exchanges WHERE seq = 2")))
    gaps = {g["seq"]: g for g in chained.gaps()}
    for seq in range(3, LAST + 1):
        if seq in gaps:
            prev = chain_hash(prev, canonical_gap(gaps[seq], writer))
            _sql(chained, "UPDATE gaps SET record_hash = :h WHERE seq = :s", h=prev.hex(), s=seq)
            continue
        with chained.engine.connect() as conn:
            rid = conn.scalar(sa.text("SELECT id FROM exchanges WHERE seq = :s"), {"s": seq})
        if rid is None:
            continue
        prev = chain_hash(prev, canonical_record(chained.get(rid), writer, seq))
        _sql(chained, "UPDATE exchanges SET record_hash = :h WHERE seq = :s", h=prev.hex(), s=seq)
    assert verify(chained, None).ok  # without the trusted key, the rewrite cannot be seen
    assert "names another head than the chain (rewritten)" in _only_break(chained, key)


def test_verify_on_the_command_line(chained: AuditStore, key: CheckpointKey, db_url: str, tmp_path: Path) -> None:
    runner = CliRunner()
    printed = runner.invoke(app, ["checkpoint", "public-key", "--key", str(key.path)])
    assert printed.exit_code == 0 and printed.stdout == public_pem(key.public)
    public = tmp_path / "public.pem"
    public.write_text(printed.stdout)
    ok = runner.invoke(app, ["verify", "--db", db_url, "--key", str(public)])
    assert ok.exit_code == 0, ok.output
    assert f"observer: verified: {LAST} entries of 1 writers, 3 checkpoints checked" in ok.output
    assert f"observer: writer {chained.writers()[0]}: last checkpoint 20" in ok.output
    out = tmp_path / "cps.jsonl"
    exported = runner.invoke(app, ["checkpoint", "export", "--db", db_url, "--out", str(out)])
    assert exported.exit_code == 0 and len(out.read_text().splitlines()) == 3
    assert json.loads(out.read_text().splitlines()[0])["store_id"] == chained.store_id()
    _sql(chained, "DELETE FROM exchanges WHERE seq = 5")
    bad = runner.invoke(app, ["verify", "--db", db_url, "--key", str(public), "--checkpoints", str(out)])
    assert bad.exit_code == 1
    assert "observer: BROKEN: writer " in bad.output and "seq 5 missing (a row deleted;" in bad.output
    wrong = runner.invoke(app, ["verify", "--db", db_url, "--since", "yesterday"])
    assert wrong.exit_code == 2 and "--since must be an RFC 3339 time" in wrong.output


def test_verify_a_time_range(chained: AuditStore, key: CheckpointKey) -> None:
    _sql(chained, "UPDATE exchanges SET model = 'other' WHERE seq = 3")
    later = verify(chained, key.public, since=T0 + timedelta(seconds=10))  # r-010 (seq 11) on
    assert later.ok and list(later.entries.values()) == [LAST - 10]
    assert not verify(chained, key.public, since=T0).ok  # control: the range that holds seq 3


def test_the_chain_verifies_whatever_the_database_does_to_json(
    store: AuditStore, make_exchange: Callable[..., Exchange]
) -> None:
    """PostgreSQL's jsonb reorders object keys and keeps ``1e300`` as a decimal; SQLite keeps
    the text. The canonical bytes recomputed from either read back equal those hashed at write
    (control: a changed parameter is found)."""
    record = make_exchange("j1", T0)
    record.request.parameters = {"zeta": 1, "alpha": {"y": 2.0, "b": 1e300, "a": [0.1, -0.0, 2**70]}}
    record.request.metadata = {"b": "x", "a": "ünïcode ✓"}
    store.write_many([record], writer_id="w-json", seqs=[1])
    alpha = store.get("j1")["request"]["parameters"]["alpha"]
    assert alpha == {"y": 2.0, "b": int(1e300), "a": [0.1, 0.0, 2**70]}  # orjson alone read 2**70 as a float
    assert verify(store, None).ok
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE exchanges SET request = :r WHERE id = 'j1'"),
            {"r": json.dumps({**store.get("j1")["request"], "parameters": {}})},
        )
    assert not verify(store, None).ok


def test_keys_are_read_checked_and_refused_in_one_line(tmp_path: Path, key: CheckpointKey) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from observer.errors import ConfigError
    from observer.store.checkpoint import load_public_key

    assert CheckpointKey.load_or_create(key.path).key_id == key.key_id  # read back, not made anew
    assert load_public_key(public_pem(key.public).encode()).public_bytes_raw() == key.public.public_bytes_raw()
    assert load_public_key(key.path.read_bytes()).public_bytes_raw() == key.public.public_bytes_raw()
    other = ec.generate_private_key(ec.SECP256R1())
    ec_private = other.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    ec_public = other.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    for data in (ec_private, ec_public):
        with pytest.raises(ConfigError, match="not an Ed25519 key"):
            load_public_key(data)
    with pytest.raises(ConfigError, match="not an Ed25519 key in PEM"):
        load_public_key(b"-----BEGIN PUBLIC KEY-----\ngarbage\n-----END PUBLIC KEY-----\n")
    (tmp_path / "ec.pem").write_bytes(ec_private)
    with pytest.raises(ConfigError, match="is not an Ed25519 key"):
        CheckpointKey.load_or_create(tmp_path / "ec.pem")
    runner = CliRunner()
    missing = runner.invoke(app, ["checkpoint", "public-key", "--key", str(tmp_path / "none.pem")])
    assert missing.exit_code == 2 and "cannot read the key" in missing.output
    wrong = runner.invoke(app, ["checkpoint", "public-key", "--key", str(tmp_path / "ec.pem")])
    assert wrong.exit_code == 2 and "cannot use the key" in wrong.output


def test_verify_without_a_key_says_checkpoints_were_not_checked(
    chained: AuditStore, db_url: str, tmp_path: Path
) -> None:
    report = verify(chained, None)
    assert report.ok and report.checkpoints == 0
    assert report.warnings == ["no checkpoint key given: checkpoints were not checked"]
    _sql(chained, "DELETE FROM checkpoints")
    writer = chained.writers()[0]
    assert f"writer {writer} has no checkpoints (deleted, or it never made one)" in verify(chained, None).warnings
    progress: list[int] = []
    totals: list[int] = []
    ranged = verify(chained, None, until=T0 + timedelta(seconds=5), progress=progress.append, total=totals.append)
    assert ranged.ok and list(ranged.entries.values()) == [6] and totals == [6] and sum(progress) == 6


def test_a_key_readable_by_others_is_warned_about(
    tmp_path: Path, key: CheckpointKey, caplog: pytest.LogCaptureFixture
) -> None:
    """Trial finding: a 0644 key file was used without a word."""
    with caplog.at_level("WARNING", logger="observer.store.checkpoint"):
        CheckpointKey.load_or_create(key.path)
        assert not caplog.records  # made 0600
        key.path.chmod(0o644)
        CheckpointKey.load_or_create(key.path)
    (record,) = caplog.records
    assert "readable by others than its owner (mode 0644)" in record.getMessage()
