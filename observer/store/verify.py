"""``verify``: recomputes every writer's hash chain (``observer.store.chain``) from the rows as
stored and checks its signed checkpoints (``observer.store.checkpoint``).

Per writer, its records and gaps in ``seq`` order must number 1, 2, 3, ... (a gap takes
``seq``..``seq_end``) and each stored ``record_hash`` must equal the hash recomputed from the row
and the previous entry's hash. What each kind of change looks like:

- a changed field (metadata or content): ``hash mismatch`` at that row;
- a row deleted in the middle: ``seq missing`` at the next row;
- rows reordered (seq values swapped) or a forged row inserted: ``hash mismatch`` (the seq is
  committed) or ``seq missing`` / ``seq repeated``;
- the newest rows deleted (the tail): ``tail deleted`` when a checkpoint names a seq beyond the
  last row (or one kept elsewhere does: ``exported``);
- a checkpoint changed or signed by another key: ``checkpoint`` breaks (signature, key, its
  note against its columns, its head hash against the chain, its link to the one before).

The first break of each writer is reported (writer, seq, record id, reason), and the rest of that
writer's chain is not trusted: reading it stops there. With ``since``/``until`` only the entries
from the first record started at or after ``since`` to the last started at or before ``until``
are recomputed, from the stored hash of the entry before them (trusted as the anchor).

Rows without ``writer_id`` (stored before the journal) are counted as ``unchained``.

**The store's own chain** (writer ``store_id``: legal holds and purges, ``observer.store.events``)
is recomputed whole, its checkpoints checked (each may be signed by any trusted key; with keys,
every event must have one: the commands sign each event in its own transaction, so an event
without one was written without the key), each purge event's ``runs_sha256`` against the
``purged_runs`` rows it names, and the ``holds`` and ``hold_records`` tables against the hold
events (a hold row changed, added or deleted is a break of the store's chain). A writer's
checkpoint naming a store event (``events`` line) must name one the store has, with that hash. A
writer's seqs inside a purged run are skipped: the chain goes on from the run's last hash, so a
purge leaves a verifying chain, and a deletion that no purge event covers is still ``seq
missing``.

**The access log** (writer ``access_writer(store_id)``, ``observer.store.access``: who called
the API) is recomputed whole; with keys, its checkpoints are checked as the store chain's (any
trusted key), so a changed, deleted or inserted entry, or a deleted tail up to its last
checkpoint, is a break. ``since``/``until`` do not narrow it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlalchemy import func, select

from observer.shape import parse_rfc3339
from observer.store.access import access_writer
from observer.store.access import chain_break as access_chain_break
from observer.store.access import entries as access_entries
from observer.store.chain import (
    GENESIS,
    canonical_gap,
    canonical_record,
    chain_hash,
    event_chain_break,
    purges_not_matching_runs,
)
from observer.store.checkpoint import ZERO_HASH, check_checkpoint, key_id, note_hash
from observer.store.events import events as store_events
from observer.store.holds import HOLD_COLUMNS, expected_holds, hold_record_ids, list_holds
from observer.store.models import ApiTokenRow, ExchangeRow, GapRow, KeyOwnerRow, PurgedRunRow
from observer.store.reader import RecordFilter, RecordReader
from observer.store.store import AuditStore

PAGE = 1000

#: A writer's purged runs: first seq -> (last seq, hash of the last, the purge's event seq).
Runs = dict[int, tuple[int, str, int]]


@dataclass(frozen=True, slots=True)
class Break:
    """Where a writer's chain stops being trustworthy."""

    writer_id: str
    seq: int | None
    record_id: str | None
    reason: str

    def line(self) -> str:
        where = f"seq {self.seq}" if self.seq is not None else "its end"
        rid = f", record {self.record_id}" if self.record_id else ""
        return f"writer {self.writer_id}, {where}{rid}: {self.reason}"


@dataclass(slots=True)
class Report:
    """``verify``'s result: entries checked per writer, the time of each writer's last
    checkpoint (a deleted tail with its checkpoints shows as a silence since then), checkpoints
    checked, rows outside any chain, the breaks (first per writer) and warnings (not breaks);
    ``purged``: entries skipped as purged, ``store_events``: events of the store's chain checked,
    ``access_entries``: entries of the access log checked."""

    entries: dict[str, int] = field(default_factory=dict)
    store_id: str | None = None
    purged: int = 0
    store_events: int = 0
    access_entries: int = 0
    last_checkpoint: dict[str, datetime] = field(default_factory=dict)
    checkpoints: int = 0
    unchained: int = 0
    breaks: list[Break] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.breaks


def verify(
    store: AuditStore,
    trusted: Sequence[Ed25519PublicKey] | Ed25519PublicKey | None,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    exported: list[dict[str, Any]] | None = None,
    progress: Callable[[int], None] | None = None,
    total: Callable[[int], None] | None = None,
) -> Report:
    """Checks every writer of ``store`` (see the module docstring). ``trusted``: the checkpoint
    keys trusted (each writer's checkpoints must all be signed by one of them, the same one;
    ``None`` or empty: checkpoints are not checked, a warning says so). ``exported``:
    checkpoint rows kept elsewhere (``observer checkpoint export``), compared with the store.
    ``progress(n)`` is called with the entries done since its last call; ``total(n)`` once
    with the number to do. Database errors propagate."""
    report = Report()
    store_id = report.store_id = store.store_id()
    ex = ExchangeRow.__table__
    with store.engine.connect() as conn:
        events = store_events(conn)
        report.unchained = conn.scalar(select(func.count()).select_from(ex).where(ex.c.writer_id.is_(None))) or 0
        # When the chains began: the oldest chained record, or an older one a purge removed (its
        # event keeps it), so a purge does not open room for "old" unchained rows.
        began = [conn.scalar(select(func.min(ex.c.started_at)).where(ex.c.writer_id.is_not(None)))]
        began += [parse_rfc3339(e["detail"]["chain_began"]) for e in events if e["detail"].get("chain_began")]
        chain_began = min((b for b in began if b is not None), default=None)
        late = None
        if report.unchained and chain_began is not None:
            late = conn.execute(
                select(ex.c.id, ex.c.started_at)
                .where(ex.c.writer_id.is_(None), ex.c.started_at >= chain_began)
                .order_by(ex.c.started_at)
                .limit(1)
            ).first()
    if late is not None:
        report.breaks.append(
            Break(
                "(none)",
                None,
                late.id,
                "a record outside any chain, started after the chains began (inserted?): only records stored"
                " before the journal existed may be unchained",
            )
        )
    runs = _purged_runs(store)
    access = access_writer(store_id)
    writers = [w for w in store.writers() if w not in (store_id, access)]
    plans = {w: _range(store, w, since, until) for w in writers}
    if total is not None:
        total(sum(stop - start + 1 for start, stop in plans.values() if stop >= start))
    if isinstance(trusted, Ed25519PublicKey):
        trusted = [trusted]
    keys = {key_id(k): k for k in trusted or ()}
    if not keys:
        report.warnings.append("no checkpoint key given: checkpoints were not checked")
    brk, event_hashes = _verify_store_chain(store, store_id, events, keys, runs, exported, report)
    if brk is not None:
        report.breaks.append(brk)
    brk = _verify_access_log(store, store_id, keys, exported, report)
    if brk is not None:
        report.breaks.append(brk)
    for writer in writers:
        start, stop = plans[writer]
        checkpoints = store.checkpoints(writer)
        if checkpoints:
            report.last_checkpoint[writer] = checkpoints[-1]["created_at"]
        wanted = {c["seq"] for c in checkpoints}
        heads: dict[int, str] = {}
        brk, count, last_seq, purged = _walk(store, writer, start, stop, wanted, heads, progress, runs.get(writer, {}))
        report.entries[writer] = count
        report.purged += purged
        if brk is None and keys:
            brk = _check_checkpoints(
                writer, checkpoints, heads, keys, store_id, last_seq, since, until, events=event_hashes
            )
            report.checkpoints += len(checkpoints)
        if brk is None and exported:
            brk = _check_exported(writer, exported, checkpoints, last_seq)
        if brk is not None:
            report.breaks.append(brk)
        if not checkpoints and count:
            report.warnings.append(f"writer {writer} has no checkpoints (deleted, or it never made one)")
    for cp in exported or ():
        if cp.get("store_id") not in (None, store_id):
            report.breaks.append(
                Break(cp["writer_id"], None, None, f"the export is of the store {cp['store_id']}, this is {store_id}")
            )
            break
    for writer in sorted({cp["writer_id"] for cp in exported or ()} - set(writers) - {store_id, access}):
        last = max((cp for cp in exported or () if cp["writer_id"] == writer), key=lambda cp: cp["number"])
        report.breaks.append(
            Break(
                writer,
                1,
                None,
                f"every row of this writer deleted: exported checkpoint {last['number']} covers seq {last['seq']},"
                " the store has none",
            )
        )
    return report


def _range(store: AuditStore, writer: str, since: datetime | None, until: datetime | None) -> tuple[int, int]:
    """(first seq, last seq) to recompute: all, or those of records started in the range
    (gaps between them included)."""
    ex = ExchangeRow.__table__
    last = store.max_seq(writer)  # records, gaps and purged runs
    with store.engine.connect() as conn:
        first = 1
        if since is not None:
            first = (
                conn.scalar(select(func.min(ex.c.seq)).where(ex.c.writer_id == writer, ex.c.started_at >= since))
                or last + 1
            )
        if until is not None:
            last = (
                conn.scalar(select(func.max(ex.c.seq)).where(ex.c.writer_id == writer, ex.c.started_at <= until)) or 0
            )
    return first, last


#: The columns that copy a part of the record for the list endpoint and queries: checked
#: against the record (the flattened usage and error columns are the record's own data).
COPIED = ("text", "request_model", "end_user")


def _entries(store: AuditStore, writer: str, start: int, stop: int) -> Iterator[tuple[int, Any, bool]]:
    """(seq, entry, is_gap) of the writer from ``start`` to ``stop``, in seq order (a record and
    a gap with one seq both come: the walk reports it). A record is its ``Exchange.to_dict()``
    with ``writer_id``, ``seq``, ``record_hash`` and, under ``"copied"``, the ``COPIED``
    columns as stored; read a page of ``PAGE`` at a time with ``observer.store.reader`` (the
    export's reader: the record's own columns, no ORM), its copied columns with one more
    statement per page."""
    gaps = [g for g in store.gaps(writer) if g["seq_end"] >= start and g["seq"] <= stop]
    gi = 0
    ex = ExchangeRow.__table__
    with store.engine.connect() as conn:
        reader = RecordReader(conn, PAGE)
        for page in reader.chained(RecordFilter(), writer, start, stop):
            copies = {
                r.seq: r
                for r in conn.execute(
                    select(ex.c.seq, *(ex.c[c] for c in COPIED)).where(
                        ex.c.writer_id == writer, ex.c.seq >= page[0]["seq"], ex.c.seq <= page[-1]["seq"]
                    )
                )
            }
            for item in page:
                seq = item["seq"]
                while gi < len(gaps) and gaps[gi]["seq"] <= seq:
                    yield gaps[gi]["seq"], gaps[gi], True
                    gi += 1
                item["copied"] = copies.get(seq)
                yield seq, item, False
    while gi < len(gaps):
        yield gaps[gi]["seq"], gaps[gi], True
        gi += 1


def _anchor(store: AuditStore, writer: str, start: int, runs: Runs) -> bytes:
    """The stored hash of the entry before ``start`` (``GENESIS`` before seq 1), also when it
    was purged (its run's last hash)."""
    if start <= 1:
        return GENESIS
    purged = next((h for last, h, _e in runs.values() if last == start - 1), None)
    if purged is not None:
        return bytes.fromhex(purged)
    ex, gap = ExchangeRow.__table__, GapRow.__table__
    with store.engine.connect() as conn:
        h = conn.scalar(select(ex.c.record_hash).where(ex.c.writer_id == writer, ex.c.seq == start - 1))
        if h is None:
            h = conn.scalar(select(gap.c.record_hash).where(gap.c.writer_id == writer, gap.c.seq_end == start - 1))
    return bytes.fromhex(h) if h else GENESIS


def _walk(
    store: AuditStore,
    writer: str,
    start: int,
    stop: int,
    wanted: set[int],
    heads: dict[int, str],
    progress: Callable[[int], None] | None,
    runs: Runs,
) -> tuple[Break | None, int, int, int]:
    """Recomputes the chain, skipping purged runs; (first break, entries checked, last seq
    reached, entries skipped as purged)."""
    prev = _anchor(store, writer, start, runs)
    expected = start
    count = 0
    pending = 0
    purged = 0

    def skip_purged(limit: int) -> None:
        nonlocal prev, expected, purged
        while expected in runs and expected <= limit:
            last, h, _event = runs[expected]
            if last in wanted:
                heads[last] = h
            purged += last - expected + 1
            prev, expected = bytes.fromhex(h), last + 1

    for seq, row, is_gap in _entries(store, writer, start, stop):
        rid = None if is_gap else row["id"]
        skip_purged(seq)
        if seq < expected:
            run = next((e for first, (last, _h, e) in runs.items() if first <= seq <= last), None)
            reason = (
                "seq repeated (a row inserted, or rows reordered)"
                if run is None
                else f"a row inside the run that purge event {run} removed (inserted again?)"
            )
            return Break(writer, seq, rid, reason), count, expected - 1, purged
        if seq > expected:
            upto = min((f for f in runs if f > expected), default=seq) if runs else seq
            upto = min(upto, seq) - 1  # (a purged run after the hole is not part of it)
            missing = f"{expected}" if upto == expected else f"{expected}..{upto}"
            after = f"; the next row is seq {seq}" + (f", record {rid}" if rid else " (a gap)")
            return (
                Break(writer, expected, None, f"seq {missing} missing (a row deleted{after})"),
                count,
                expected - 1,
                purged,
            )
        if is_gap:
            canonical = canonical_gap(row, writer)
            stored = row["record_hash"]
            end = row["seq_end"]
        else:
            stored = row.pop("record_hash")
            copied_row = row.pop("copied")
            canonical = canonical_record(row, writer, seq)
            end = seq
        h = chain_hash(prev, canonical)
        if stored != h.hex():
            what = "gap" if is_gap else "record"
            return (
                Break(writer, seq, rid, f"hash mismatch: this {what}, or the order before it, was changed"),
                count,
                expected - 1,
                purged,
            )
        copied = None if is_gap else _copied_column_changed(copied_row, row)
        if copied is not None:
            reason = f"column {copied} differs from the record it is copied from (changed)"
            return Break(writer, seq, rid, reason), count, expected - 1, purged
        if end in wanted:
            heads[end] = stored
        prev = h
        expected = end + 1
        count += 1
        pending += 1
        if progress is not None and pending >= PAGE:
            progress(pending)
            pending = 0
    skip_purged(stop)
    if progress is not None and pending:
        progress(pending)
    return None, count, expected - 1, purged


def _purged_runs(store: AuditStore) -> dict[str, Runs]:
    table = PurgedRunRow.__table__
    out: dict[str, Runs] = {}
    with store.engine.connect() as conn:
        for r in conn.execute(select(table)):
            out.setdefault(r.writer_id, {})[r.first_seq] = (r.last_seq, r.last_hash, r.event_seq)
    return out


def _verify_store_chain(
    store: AuditStore,
    store_id: str,
    events: list[dict[str, Any]],
    keys: dict[str, Ed25519PublicKey],
    runs: dict[str, Runs],
    exported: list[dict[str, Any]] | None,
    report: Report,
) -> tuple[Break | None, dict[int, str]]:
    """The store's own chain (events, their checkpoints, the purged runs and holds they
    determine): its first break, and each event's hash by seq (what writers' checkpoints name)."""
    report.store_events = len(events)
    checkpoints = store.checkpoints(store_id)
    if checkpoints:
        report.last_checkpoint[store_id] = checkpoints[-1]["created_at"]
    heads: dict[int, str] = {}
    broken = event_chain_break(events, store_id)
    if broken is not None:
        i, why = broken
        reason = (
            f"store event {i} missing (deleted)"
            if why == "missing"
            else (f"hash mismatch: store event {i} ({events[i - 1]['kind']}) was changed")
        )
        return Break(store_id, i, None, reason), heads
    heads = {e["seq"]: e["record_hash"] for e in events}
    purges = {e["seq"] for e in events if e["kind"] == "purge"}
    flat = []
    for writer, wruns in sorted(runs.items()):
        for first, (last, h, event_seq) in sorted(wruns.items()):
            if event_seq not in purges:
                brk = Break(writer, first, None, f"purged run {first}..{last} names no purge event ({event_seq})")
                return brk, heads
            flat.append((writer, first, last, h, event_seq))
    differing = purges_not_matching_runs(events, flat)
    if differing:
        reason = (
            f"purge event {differing[0]}: the purged runs differ from those it committed to (added, changed or deleted)"
        )
        return Break(store_id, differing[0], None, reason), heads
    brk = (
        _check_holds(store, store_id, events)
        or _check_tokens(store, store_id, events)
        or _check_key_owners(store, store_id, events)
    )
    if brk is None and keys:
        brk = _check_checkpoints(store_id, checkpoints, heads, keys, store_id, len(events), None, None, any_key=True)
        report.checkpoints += len(checkpoints)
        signed = {cp["seq"] for cp in checkpoints}
        unsigned = next((i for i in heads if i not in signed), None)
        if brk is None and unsigned is not None:
            # Each hold and purge command signs its event in the same transaction: an event
            # without its checkpoint was written without the key (forged), or its checkpoint deleted.
            brk = Break(store_id, unsigned, None, f"store event {unsigned} has no signed checkpoint (forged?)")
    elif events:
        report.warnings.append("the store's holds and purges were not checked against signatures (no key given)")
    if brk is None and exported:
        brk = _check_exported(store_id, exported, checkpoints, len(events))
    return brk, heads


def _verify_access_log(
    store: AuditStore,
    store_id: str,
    keys: dict[str, Ed25519PublicKey],
    exported: list[dict[str, Any]] | None,
    report: Report,
) -> Break | None:
    """The access log's chain and checkpoints (``observer.store.access``): its first break."""
    writer = access_writer(store_id)
    checkpoints = store.checkpoints(writer)
    if checkpoints:
        report.last_checkpoint[writer] = checkpoints[-1]["created_at"]
    heads: dict[int, str] = {}
    with store.engine.connect() as conn:
        broken, count = access_chain_break(access_entries(conn), writer, {c["seq"] for c in checkpoints}, heads)
    report.access_entries = count
    if broken is not None:
        i, why = broken
        reason = (
            f"access log entry {i} missing (deleted)"
            if why == "missing"
            else f"hash mismatch: access log entry {i} was changed"
        )
        return Break(writer, i, None, reason)
    brk = None
    if keys:
        brk = _check_checkpoints(writer, checkpoints, heads, keys, store_id, count, None, None, any_key=True)
        report.checkpoints += len(checkpoints)
        if brk is None and count and not checkpoints:
            brk = Break(writer, 1, None, "the access log has no signed checkpoint (deleted, or written without a key)")
    elif count:
        report.warnings.append("the access log was not checked against signatures (no key given)")
    if brk is None and exported:
        brk = _check_exported(writer, exported, checkpoints, count)
    return brk


def _check_holds(store: AuditStore, store_id: str, events: list[dict[str, Any]]) -> Break | None:
    expected, problems = expected_holds(events)
    if problems:
        return Break(store_id, None, None, problems[0])
    stored = {h["id"]: h for h in list_holds(store.engine, include_released=True)}
    with store.engine.connect() as conn:
        named = hold_record_ids(conn)
    for hold_id in sorted(set(expected) | set(stored)):
        want, have = expected.get(hold_id), stored.get(hold_id)
        if want is None:
            return Break(store_id, None, None, f"hold {hold_id} has no chained event (inserted)")
        if have is None:
            return Break(store_id, want["created_seq"], None, f"hold {hold_id} deleted from the holds table")
        changed = next((c for c in HOLD_COLUMNS if want[c] != have[c]), None)
        if changed is None and set(want["exchange_ids"] or ()) != named.get(hold_id, set()):
            changed = "the record ids of hold_records"
        if changed is not None:
            return Break(
                store_id, want["created_seq"], None, f"hold {hold_id}: {changed} differs from its chained events"
            )
    stray = sorted(set(named) - set(expected))
    if stray:
        return Break(
            store_id, None, None, f"hold_records names hold {stray[0]}, which no chained event made (inserted)"
        )
    return None


def _check_tokens(store: AuditStore, store_id: str, events: list[dict[str, Any]]) -> Break | None:
    """``api_tokens`` against the ``token_created`` / ``token_revoked`` events: a token row
    inserted, deleted, renamed, given another role or hash, or revoked (or un-revoked) without
    its event is a break (a role raised in the table would otherwise pass unseen)."""
    expected: dict[str, dict[str, Any]] = {}
    for e in events:
        detail = e["detail"]
        if e["kind"] == "token_created":
            expected[detail["token_id"]] = {**detail, "seq": e["seq"], "revoked": False}
        elif e["kind"] == "token_revoked" and detail["token_id"] in expected:
            expected[detail["token_id"]]["revoked"] = True
    table = ApiTokenRow.__table__
    with store.engine.connect() as conn:
        stored = {r.id: r for r in conn.execute(select(table))}

    def actual(have: Any, want: dict[str, Any]) -> dict[str, Any]:
        got = {"name": have.name, "role": have.role, "revoked": have.revoked_at is not None}
        if "token_sha256" in want:
            got["token_sha256"] = have.token_sha256
        return got

    return _rows_against_events(store_id, expected, stored, "api_tokens", lambda k: f"token {k}", actual)


def _check_key_owners(store: AuditStore, store_id: str, events: list[dict[str, Any]]) -> Break | None:
    """``key_owners`` against the ``key_owner_set`` events (``observer.store.keyowners``): a row
    inserted, deleted, or given another owner, team or note without its event is a break (an
    attribution forged in the table would otherwise name the wrong person in every record)."""
    expected: dict[str, dict[str, Any]] = {}
    for e in events:
        if e["kind"] == "key_owner_set":
            detail = e["detail"]
            expected[detail["fingerprint"]] = {**detail, "seq": e["seq"]}
    table = KeyOwnerRow.__table__
    with store.engine.connect() as conn:
        stored = {r.fingerprint: r for r in conn.execute(select(table))}
    return _rows_against_events(
        store_id,
        expected,
        stored,
        "key_owners",
        lambda k: f"key owner of {k}",
        lambda have, _want: {"owner": have.owner, "team": have.team, "note": have.note},
    )


def _rows_against_events(
    store_id: str,
    expected: dict[str, dict[str, Any]],
    stored: dict[str, Any],
    table: str,
    label: Callable[[str], str],
    actual: Callable[[Any, dict[str, Any]], dict[str, Any]],
) -> Break | None:
    """The first difference between a table's rows (``stored``, by key) and what its chained
    events say they are (``expected``, by key, each with its event's ``seq``): a row without an
    event (inserted), an event without its row (deleted), or a value of ``actual(row, want)``
    other than the events' (changed); ``None`` when they agree."""
    for key in sorted(set(expected) | set(stored)):
        want, have = expected.get(key), stored.get(key)
        if want is None:
            return Break(store_id, None, None, f"{label(key)} has no chained event (inserted)")
        if have is None:
            return Break(store_id, want["seq"], None, f"{label(key)} deleted from {table}")
        got = actual(have, want)
        changed = next((k for k in got if want[k] != got[k]), None)
        if changed is not None:
            return Break(store_id, want["seq"], None, f"{label(key)}: {changed} differs from its chained events")
    return None


def _copied_column_changed(copied: Any, record: dict[str, Any]) -> str | None:
    """The first ``COPIED`` column whose stored value is not what the record gives it (the
    list endpoint serves them and queries filter on them, so a change to a copy must break
    too): ``text`` and ``request_model`` are the record's derived keys, ``end_user`` its
    ``request.end_user``."""
    request = record.get("request") or {}
    expected = {"text": record["text"], "request_model": record["request_model"], "end_user": request.get("end_user")}
    for column in COPIED:
        if getattr(copied, column) != expected[column]:
            return column
    return None


def _check_checkpoints(
    writer: str,
    checkpoints: list[dict[str, Any]],
    heads: dict[int, str],
    keys: dict[str, Ed25519PublicKey],
    store_id: str,
    last_seq: int,
    since: datetime | None,
    until: datetime | None,
    *,
    any_key: bool = False,
    events: dict[int, str] | None = None,
) -> Break | None:
    """The first problem of a chain's checkpoints: each signed by a trusted key (all by the
    same one unless ``any_key``), numbered 1, 2, ..., linked, naming the chain's heads, and
    naming store events the store has (``events``: each event's hash by seq)."""
    prev = ZERO_HASH
    public = keys.get(checkpoints[0]["key_id"]) if checkpoints else None
    if checkpoints and public is None:
        trusted = ", ".join(sorted(keys))
        return Break(
            writer,
            checkpoints[0]["seq"],
            None,
            f"checkpoint 1: signed by an unknown key ({checkpoints[0]['key_id']}; trusted: {trusted})",
        )
    for i, cp in enumerate(checkpoints, 1):
        where = f"checkpoint {cp['number']}"
        if any_key:
            public = keys.get(cp["key_id"])
            if public is None:
                return Break(writer, cp["seq"], None, f"{where}: signed by an unknown key ({cp['key_id']})")
        if cp["number"] != i:
            return Break(writer, cp["seq"], None, f"{where}: checkpoint {i} missing (deleted)")
        problem = check_checkpoint(cp, public, store_id)  # type: ignore[arg-type]
        if problem is not None:
            return Break(writer, cp["seq"], None, f"{where}: {problem}")
        if cp["prev_hash"] != prev:
            return Break(writer, cp["seq"], None, f"{where}: does not follow checkpoint {i - 1}")
        prev = note_hash(cp["note"])
        if since is None and until is None and cp["seq"] > last_seq:
            return Break(
                writer,
                last_seq + 1,
                None,
                f"tail deleted: {where} covers seq {cp['seq']}, the store ends at seq {last_seq}",
            )
        head = heads.get(cp["seq"])
        if head is not None and head != cp["head_hash"]:
            return Break(writer, cp["seq"], None, f"{where}: names another head than the chain (rewritten)")
        named = cp.get("events_seq")
        if events is not None and named is not None and events.get(named) != cp.get("events_hash"):
            what = "which the store does not have (deleted)" if named not in events else "whose hash differs (changed)"
            return Break(writer, cp["seq"], None, f"{where}: names the store's event {named}, {what}")
    return None


def _check_exported(
    writer: str, exported: list[dict[str, Any]], checkpoints: list[dict[str, Any]], last_seq: int
) -> Break | None:
    stored = {c["number"]: c for c in checkpoints}
    for cp in exported:
        if cp["writer_id"] != writer:
            continue
        mine = stored.get(cp["number"])
        if mine is None:
            if cp["seq"] > last_seq:
                return Break(
                    writer,
                    last_seq + 1,
                    None,
                    f"tail deleted: exported checkpoint {cp['number']} covers seq {cp['seq']},"
                    f" the store ends at seq {last_seq}",
                )
            return Break(writer, cp["seq"], None, f"exported checkpoint {cp['number']} is missing from the store")
        if mine["note"] != cp["note"] or mine["signature"] != cp["signature"]:
            return Break(writer, cp["seq"], None, f"checkpoint {cp['number']} differs from its exported copy")
    return None


__all__ = ["Break", "Report", "verify"]
