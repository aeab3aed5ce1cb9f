"""Retention: removing the records past ``retention_days``, except those under a legal hold, so
that ``observer verify`` still passes afterwards.

A record is **due** when it started before the cutoff (now minus ``retention_days``) and no
active hold's scope covers it (``observer.store.holds.held``). Due records of a writer are
removed as **runs** of consecutive seqs (a held record, a gap or a record not yet due ends a
run); each run is kept as a ``purged_runs`` row with the hash of its last record, from which the
writer's chain goes on, and the purge's chained store event commits to all of its runs
(``chain.runs_digest``). Gaps are kept (they hold no content and say what was lost), as are
checkpoints. Records stored before the chain existed (no writer) are removed when due and
counted. Everything (records, their blocks, tool calls and violations by ``ON DELETE CASCADE``,
the runs, the event and its checkpoint) is one transaction: a purge that fails removes nothing.

On PostgreSQL, a month's partitions (``observer.store.partitions``) that end before the cutoff
and hold no held record are dropped whole (``DROP TABLE``, no row-by-row delete); the rest of
the due records are deleted by their runs. The runs are recorded either way, so ``verify``
cannot tell the two apart.

Before removing anything the chain up to the cutoff is recomputed (``observer.store.verify``):
a purge never erases the evidence of a break.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, bindparam, delete, func, insert, not_, select, text

from observer.errors import ObserverError
from observer.shape import rfc3339
from observer.store import partitions
from observer.store.chain import runs_digest
from observer.store.checkpoint import CheckpointKey
from observer.store.events import append_event
from observer.store.holds import held, list_holds
from observer.store.models import ExchangeRow, PurgedRunRow
from observer.store.store import AuditStore
from observer.store.verify import Break, verify

#: Rows fetched per round trip while the due records are read.
_FETCH = 10_000


class PurgeRefused(ObserverError):
    """The chain up to the cutoff does not verify: purging would erase the evidence."""

    code = "purge_refused"

    def __init__(self, breaks: list[Break]) -> None:
        self.breaks = breaks
        super().__init__(
            "the chain does not verify up to the cutoff, so nothing was purged (it would erase the evidence): "
            + "; ".join(b.line() for b in breaks)
        )


@dataclass(slots=True)
class PurgeResult:
    """What a purge removed (or, dry, would remove): chained records per writer, unchained
    records, due records kept for a hold, the runs, and the store event (``None`` when dry)."""

    cutoff: datetime
    records: dict[str, int] = field(default_factory=dict)
    unchained: int = 0
    held: int = 0
    runs: list[tuple[str, int, int, str]] = field(default_factory=list)
    event: dict[str, Any] | None = None
    dropped: list[partitions.Month] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.records.values()) + self.unchained


def cutoff_for(now: datetime, retention_days: int) -> datetime:
    """The cutoff: records started before it are past retention."""
    return now - timedelta(days=retention_days)


def purge(
    store: AuditStore,
    key: CheckpointKey | None,
    *,
    now: datetime,
    retention_days: int,
    retention_override: bool,
    actor: str,
    dry_run: bool = False,
) -> PurgeResult:
    """Removes (or, ``dry_run``, counts) what is past retention at ``now``. ``key`` signs the
    purge's checkpoint (not needed when dry). Raises ``PurgeRefused`` when the chain up to the
    cutoff does not verify (not checked when dry), ``ConcurrentChange`` when a hold or purge ran
    at the same time; database errors propagate; nothing is removed when it raises."""
    cutoff = cutoff_for(now, retention_days)
    result = PurgeResult(cutoff)
    if not dry_run:
        if key is None:
            raise ValueError("a purge needs the checkpoint key")
        report = verify(store, None, until=cutoff)
        if not report.ok:
            raise PurgeRefused(report.breaks)
    store_id = store.store_id()
    holds = list_holds(store.engine)
    ex = ExchangeRow.__table__
    due = (ex.c.started_at < cutoff) & not_(held(holds))
    with store.engine.begin() as conn:
        for run in _runs(conn, due):
            result.runs.append(run)
            result.records[run[0]] = result.records.get(run[0], 0) + run[2] - run[1] + 1
        result.unchained = conn.scalar(select(func.count()).select_from(ex).where(ex.c.writer_id.is_(None), due)) or 0
        result.held = (
            conn.scalar(select(func.count()).select_from(ex).where(ex.c.started_at < cutoff, held(holds))) or 0
            if holds
            else 0
        )
        if dry_run:
            conn.rollback()
            return result
        assert key is not None
        detail = {
            "cutoff": rfc3339(cutoff),
            "retention_days": retention_days,
            "retention_override": retention_override,
            "records": sum(result.records.values()),
            "unchained": result.unchained,
            "held": result.held,
            "runs": len(result.runs),
            "runs_sha256": runs_digest(result.runs),
        }
        event = append_event(conn, key, store_id, "purge", actor, detail, now)
        if conn.dialect.name == "postgresql":
            result.dropped = _drop_months(conn, cutoff, holds)
        if result.runs:
            by_seq = delete(ex).where(
                ex.c.writer_id == bindparam("w"), ex.c.seq >= bindparam("a"), ex.c.seq <= bindparam("b")
            )
            conn.execute(by_seq, [{"w": w, "a": a, "b": b} for w, a, b, _h in result.runs])
            conn.execute(
                insert(PurgedRunRow.__table__),
                [
                    {"writer_id": w, "first_seq": a, "last_seq": b, "last_hash": h, "event_seq": event["seq"]}
                    for w, a, b, h in result.runs
                ],
            )
        if result.unchained:
            conn.execute(delete(ex).where(ex.c.writer_id.is_(None), due))
        result.event = event
    return result


def _drop_months(conn: Connection, cutoff: datetime, holds: list[dict[str, Any]]) -> list[partitions.Month]:
    """PostgreSQL: drops each month's partitions that end at or before ``cutoff`` and hold no
    record under a hold (all its rows are due, and in the runs); the months dropped. The four
    tables are locked first, parent first as the writer inserts, so the drops cannot deadlock
    with a writer's transaction (writers and readers wait until the purge commits)."""
    ex = ExchangeRow.__table__
    due = []
    for month in sorted(partitions.existing(conn)):
        start, end = partitions.bounds(month)
        if end > cutoff:
            continue
        if holds:
            in_month = (ex.c.started_at >= start) & (ex.c.started_at < end)
            if conn.scalar(select(func.count()).select_from(ex).where(in_month, held(holds))):
                continue
        due.append(month)
    if due:
        for table in partitions.TABLES:
            conn.execute(text(f'LOCK TABLE "{table}" IN ACCESS EXCLUSIVE MODE'))
        for month in due:
            partitions.drop_month(conn, month)
    return due


def _runs(conn: Connection, due: Any) -> Iterator[tuple[str, int, int, str]]:
    """(writer_id, first seq, last seq, last hash) of each run of consecutive due records, by
    writer and seq (streamed: memory holds one fetch, not the month)."""
    ex = ExchangeRow.__table__
    stmt = (
        select(ex.c.writer_id, ex.c.seq, ex.c.record_hash)
        .where(ex.c.writer_id.is_not(None), due)
        .order_by(ex.c.writer_id, ex.c.seq)
        .execution_options(yield_per=_FETCH)
    )
    run: list[Any] | None = None
    for writer, seq, record_hash in conn.execute(stmt):
        if run is not None and run[0] == writer and run[2] + 1 == seq:
            run[2], run[3] = seq, record_hash
            continue
        if run is not None:
            yield (run[0], run[1], run[2], run[3])
        run = [writer, seq, seq, record_hash]
    if run is not None:
        yield (run[0], run[1], run[2], run[3])


__all__ = ["PurgeRefused", "PurgeResult", "cutoff_for", "purge"]
