"""The access log: one chained entry per call of the query API (``access_log``).

Who read what is itself evidence (compliance-requirements item 21; NIST 800-53 AU-9): every
call, denied ones included, is appended here *before* its response leaves
(``observer.api.access``). The entries are a hash chain of their own, the writer
``access_writer(store_id)`` (``observer.store.chain.canonical_access``), with signed checkpoints
in ``checkpoints`` like a writer's records: one with the first entry, then whenever
``CHECKPOINT_EVERY`` entries or ``CHECKPOINT_AFTER`` have passed since the last, written in the
entry's transaction (``observer verify`` walks it; a deleted tail beyond the last checkpoint is
at most that much).

Appends are serialised by a row lock on ``store_meta``'s ``access_log`` row (made on first use),
so concurrent API workers and hosts extend one chain; an append is one short transaction.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, Text, bindparam, cast, insert, select, update
from sqlalchemy import exc as sa_exc

from observer.store.chain import GENESIS, canonical_access, chain_hash
from observer.store.checkpoint import ZERO_HASH, CheckpointKey, make_checkpoint, note_hash
from observer.store.models import AccessLogRow, CheckpointRow, StoreMetaRow

CHECKPOINT_EVERY = 100
CHECKPOINT_AFTER = timedelta(seconds=30)
LOCK_KEY = "access_log"
#: The endpoint of the entry that records a deletion of the log's newest entries (``append``).
TRUNCATED = "(access log truncated)"
#: Namespace of the access log's writer id (a UUID 5 of the store id: ``access_writer``).
log = logging.getLogger(__name__)
_NAMESPACE = uuid.UUID("3f1c6a52-4f0e-5b8e-9d6a-0c5f1e2d7a91")


# The append's statements, built once: building a statement costs more than running it (~0.2
# of ~0.35 ms per statement through SQLAlchemy; docs/performance.md). Immutable, as every
# SQLAlchemy construct.
_META, _LOG, _CHECKPOINTS = StoreMetaRow.__table__, AccessLogRow.__table__, CheckpointRow.__table__
_LOCK = update(_META).where(_META.c.key == LOCK_KEY).values(value=_META.c.value)
_APPEND = insert(_LOG)
_HEAD = select(_LOG.c.seq, _LOG.c.record_hash).order_by(_LOG.c.seq.desc()).limit(1)
_LAST_CHECKPOINT = (
    select(_CHECKPOINTS.c.number, _CHECKPOINTS.c.seq, _CHECKPOINTS.c.created_at, _CHECKPOINTS.c.note)
    .where(_CHECKPOINTS.c.writer_id == bindparam("writer"))
    .order_by(_CHECKPOINTS.c.number.desc())
    .limit(1)
)


def access_writer(store_id: str) -> str:
    """The writer id of ``store_id``'s access log: UUID 5 of the store id (36 characters, as
    every writer id; never a journal's, which are UUID 4)."""
    return str(uuid.uuid5(_NAMESPACE, store_id))


@dataclass(frozen=True, slots=True)
class Entry:
    """One access-log entry before it is chained (``AccessLogRow`` without ``seq`` and hash)."""

    at: datetime
    principal: str | None
    role: str | None
    client: str | None
    method: str
    endpoint: str
    path: str
    params: dict[str, Any]
    status: int
    rows: int | None = None
    ids: list[str] | None = None


#: A checkpoint of the log known to exist: (its seq, its ``created_at``).
Checkpointed = tuple[int, datetime]


@dataclass(frozen=True, slots=True)
class Appended:
    """What ``append`` wrote: the entry's row, the newest checkpoint it knows of (to pass back
    as ``checkpointed`` next time; ``None`` without a key), and whether it found the log's
    newest entries deleted (a ``TRUNCATED`` entry went first: ``row`` is the log's new head,
    the ``after`` to pass next)."""

    row: dict[str, Any]
    checkpointed: Checkpointed | None
    truncated: bool = False


def append(
    engine: Engine,
    store_id: str,
    entry: Entry,
    key: CheckpointKey | None,
    *,
    after: int = 0,
    checkpointed: Checkpointed | None = None,
    attempts: int = 3,
) -> Appended:
    """Appends ``entry`` (and a checkpoint when due, signed with ``key``; none without one) in
    one transaction. ``after``: the highest seq the caller appended before; a head below it
    means entries were deleted since, and a ``TRUNCATED`` entry saying so is appended first
    (chained and signed like any: the deletion cannot be hidden by the entries that follow).
    ``checkpointed``: a checkpoint the caller knows of (``Appended.checkpointed``); while the
    entry is fewer than ``CHECKPOINT_EVERY`` entries and less than ``CHECKPOINT_AFTER`` after it,
    no checkpoint can be due (the newest one is at least as new), so the newest is not read:
    one statement less per call (docs/performance.md). It is ignored when the log ends below
    it or below ``after`` (entries deleted, its checkpoint perhaps too: the ``TRUNCATED`` entry
    is signed at once). Against another host's clock a checkpoint may come up to the clocks'
    difference late; a deleted checkpoint alone (its entries kept) is made again only when the
    next is due. Raises
    ``sqlalchemy.exc.SQLAlchemyError`` when the database refuses (the caller must then not
    answer the call)."""
    for attempt in range(1, attempts + 1):
        try:
            with engine.begin() as conn:
                return _append(conn, store_id, entry, key, after, checkpointed)
        except sa_exc.IntegrityError:
            # The lock row was made by two processes at once, or a seq taken: read the head again.
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")


def _append(
    conn: Connection,
    store_id: str,
    entry: Entry,
    key: CheckpointKey | None,
    after: int,
    checkpointed: Checkpointed | None,
) -> Appended:
    if not conn.execute(_LOCK).rowcount:
        conn.execute(insert(_META), [{"key": LOCK_KEY, "value": ""}])
    last = conn.execute(_HEAD).first()
    seq = 0 if last is None else last.seq
    if seq < after or (checkpointed is not None and checkpointed[0] > seq):
        checkpointed = None  # entries deleted since: the checkpoint it names may be gone too
    if seq < after:
        log.error(
            "access log: the newest entries were deleted (this process wrote seq %d, the log ends at %d)", after, seq
        )
        marker = Entry(
            at=entry.at,
            principal=None,
            role=None,
            client=None,
            method="-",
            endpoint=TRUNCATED,
            path="",
            params={"last_seq_written": after, "last_seq_found": seq},
            status=0,
        )
        checkpointed = _insert(conn, store_id, marker, key, last, checkpointed).checkpointed
        last = conn.execute(_HEAD).first()
        done = _insert(conn, store_id, entry, key, last, checkpointed)
        return Appended(done.row, done.checkpointed, truncated=True)
    return _insert(conn, store_id, entry, key, last, checkpointed)


def _insert(
    conn: Connection,
    store_id: str,
    entry: Entry,
    key: CheckpointKey | None,
    last: Any,
    checkpointed: Checkpointed | None,
) -> Appended:
    seq, head = (0, GENESIS) if last is None else (last.seq, bytes.fromhex(last.record_hash))
    writer = access_writer(store_id)
    row: dict[str, Any] = {
        "seq": seq + 1,
        "at": entry.at,
        "principal": entry.principal,
        "role": entry.role,
        "client": entry.client,
        "method": entry.method,
        "endpoint": entry.endpoint,
        "path": entry.path,
        "params": entry.params,
        "status": entry.status,
        "rows": entry.rows,
        "ids": entry.ids,
    }
    row["record_hash"] = chain_hash(head, canonical_access(row, writer)).hex()
    conn.execute(_APPEND, row)
    if key is None:
        return Appended(row, None)
    if checkpointed is not None and not _due(row["seq"], entry.at, *checkpointed):
        return Appended(row, checkpointed)
    cp = conn.execute(_LAST_CHECKPOINT, {"writer": writer}).first()
    if cp is not None and not _due(row["seq"], entry.at, cp.seq, cp.created_at):
        return Appended(row, (cp.seq, cp.created_at))
    number, prev = (1, ZERO_HASH) if cp is None else (cp.number + 1, note_hash(cp.note))
    signed = make_checkpoint(key, store_id, writer, number, row["seq"], row["record_hash"], entry.at, prev)
    conn.execute(insert(_CHECKPOINTS), [signed])
    return Appended(row, (row["seq"], entry.at))


def _due(seq: int, at: datetime, checkpoint_seq: int, checkpoint_at: datetime) -> bool:
    """Whether entry ``seq`` at ``at`` is due a checkpoint after one at ``checkpoint_seq``."""
    return seq - checkpoint_seq >= CHECKPOINT_EVERY or at - checkpoint_at >= CHECKPOINT_AFTER


def entries(conn: Connection, *, batch: int = 5000) -> Iterator[dict[str, Any]]:
    """Every entry by seq, as dicts of the columns, read ``batch`` rows at a time."""
    table = AccessLogRow.__table__
    after = 0
    while True:
        rows = conn.execute(select(table).where(table.c.seq > after).order_by(table.c.seq).limit(batch)).all()
        for r in rows:
            yield dict(r._mapping)
        if len(rows) < batch:
            return
        after = rows[-1].seq


def chain_break(
    rows: Iterator[Mapping[str, Any]], writer: str, wanted: set[int], heads: dict[int, str]
) -> tuple[tuple[int, str] | None, int]:
    """Walks the entries: the first (its seq place, 1-based) that does not follow the ones
    before and why (``"missing"``: an entry deleted; ``"changed"``: its hash is not recomputed
    from it and its predecessor), or ``None`` when the chain holds; and the entries walked.
    ``heads`` gets the hash of each seq in ``wanted`` (the seqs checkpoints name)."""
    prev = GENESIS
    count = 0
    for i, row in enumerate(rows, 1):
        count = i
        if row["seq"] != i:
            return (i, "missing"), count
        h = chain_hash(prev, canonical_access(row, writer))
        if h.hex() != row["record_hash"]:
            return (i, "changed"), count
        if i in wanted:
            heads[i] = row["record_hash"]
        prev = h
    return None, count


@dataclass(frozen=True, slots=True)
class LogFilters:
    """Conditions of ``page`` (``None``: not filtered); ``exchange_id``: entries whose ``ids``
    name it."""

    since: datetime | None = None
    until: datetime | None = None
    principal: str | None = None
    endpoint: str | None = None
    status: int | None = None
    exchange_id: str | None = None


ENTRY_COLUMNS = (
    "seq",
    "at",
    "principal",
    "role",
    "client",
    "method",
    "endpoint",
    "path",
    "params",
    "status",
    "rows",
    "ids",
    "record_hash",
)


def page(
    engine: Engine, filters: LogFilters, limit: int = 100, before_seq: int | None = None
) -> tuple[list[dict[str, Any]], int | None]:
    """Entries newest first (``at`` as RFC 3339) and the ``before_seq`` of the next page
    (``None`` on the last)."""
    from observer.shape import rfc3339

    table = AccessLogRow.__table__
    stmt = select(*(table.c[c] for c in ENTRY_COLUMNS))
    if filters.since is not None:
        stmt = stmt.where(table.c.at >= filters.since)
    if filters.until is not None:
        stmt = stmt.where(table.c.at < filters.until)
    for name in ("principal", "endpoint", "status"):
        value = getattr(filters, name)
        if value is not None:
            stmt = stmt.where(table.c[name] == value)
    if before_seq is not None:
        stmt = stmt.where(table.c.seq < before_seq)
    if filters.exchange_id is not None:
        # ids is a JSON list: match its text (ids are UUIDs, quoted in the JSON), then check
        # exactly; autoescape: a % or _ in the id is no wildcard (its false matches would fill
        # the page's limit, then be dropped: a short page and no next_before_seq).
        stmt = stmt.where(cast(table.c.ids, Text).contains(f'"{filters.exchange_id}"', autoescape=True))
    stmt = stmt.order_by(table.c.seq.desc()).limit(limit + 1)
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(stmt)]
    if filters.exchange_id is not None:
        rows = [r for r in rows if filters.exchange_id in (r["ids"] or ())]
    more = len(rows) > limit
    rows = rows[:limit]
    for r in rows:
        r["at"] = rfc3339(r["at"])
    return rows, rows[-1]["seq"] if more and rows else None
