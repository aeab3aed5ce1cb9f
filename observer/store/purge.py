"""Retention: removing the records past ``retention_days``, except those under a legal hold, so
that ``observer verify`` still passes afterwards.

A record is **due** when it started before the cutoff (now minus ``retention_days``) and no
active hold's scope covers it (``observer.store.holds.held``). Due records of a writer are
removed as **runs** of consecutive seqs (a held record, a gap or a record not yet due ends a
run); each run is kept as a ``purged_runs`` row with the hash of its last record, from which the
writer's chain goes on, and the purge's chained store event commits to all of its runs
(``chain.runs_digest``). Gaps are kept (they hold no content and say what was lost), as are
checkpoints. Records stored before the chain existed (no writer) are removed when due and
counted. Alerts (``observer.alerting``: their summaries name tools and hosts) fired before the
cutoff are removed too, but for those about a held record; they are not chained (derived from
the records and the pipeline's state), the purge event counts them. Everything (records, their blocks, tool calls and violations by ``ON DELETE CASCADE``,
the runs, the event and its checkpoint) is one transaction: a purge that fails removes nothing.

A purge first takes the store chain's lock (``events.lock``): holds cannot be made or released
until it commits, and it reads the holds after taking it. On PostgreSQL, a month's partitions
(``observer.store.partitions``) that end before the cutoff and hold no held record are dropped
whole (``DROP TABLE``, no row-by-row delete); the four tables are then locked against writes
(``SHARE ROW EXCLUSIVE``, parent first, as writers insert) before the runs are read, so no record
can arrive in a month about to go, and exclusively for the drops; a lock not had within
``LOCK_TIMEOUT_S`` gives up (``PurgeBusy``, nothing removed). The rest of the due records are
deleted by their runs. The runs are recorded either way. The purge event also keeps when the
chains began (``chain_began``: the oldest chained record, removed or not), so ``verify`` still
refuses an unchained record newer than that once the old records are gone.

Before removing anything the chain up to the cutoff is recomputed (``observer.store.verify``):
a purge never erases the evidence of a break.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlalchemy import ColumnElement, Connection, bindparam, delete, exists, func, insert, not_, select, text
from sqlalchemy import exc as sa_exc

from observer.errors import ObserverError
from observer.shape import parse_rfc3339, rfc3339
from observer.store import partitions, search
from observer.store.chain import runs_digest
from observer.store.checkpoint import CheckpointKey
from observer.store.events import append_event, lock
from observer.store.holds import held, list_holds
from observer.store.models import AlertRow, ExchangeRow, PurgedRunRow, StoreEventRow
from observer.store.store import AuditStore
from observer.store.verify import Break, verify

#: Rows fetched per round trip while the due records are read.
_FETCH = 10_000


#: Seconds a purge waits for the tables' locks (PostgreSQL) before it gives up, removing nothing.
LOCK_TIMEOUT_S = 10.0


class PurgeBusy(ObserverError):
    """The tables stayed locked by another transaction; nothing was purged."""

    code = "purge_busy"


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
    records, due records kept for a hold, alerts, the runs, and the store event (``None`` when
    dry)."""

    cutoff: datetime
    records: dict[str, int] = field(default_factory=dict)
    unchained: int = 0
    held: int = 0
    alerts: int = 0
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
    trusted: Sequence[Ed25519PublicKey] = (),
    lock_timeout_s: float = LOCK_TIMEOUT_S,
) -> PurgeResult:
    """Removes (or, ``dry_run``, counts) what is past retention at ``now``. ``key`` signs the
    purge's checkpoint (not needed when dry); the chain is first verified with ``key``'s public
    half and the ``trusted`` keys (the other writers'). Raises ``PurgeRefused`` when the chain up
    to the cutoff does not verify (not checked when dry), ``PurgeBusy`` when the tables stayed
    locked by others for ``lock_timeout_s`` (PostgreSQL), ``ConcurrentChange`` when a hold or
    purge ran at the same time; database errors propagate; nothing is removed when it raises."""
    cutoff = cutoff_for(now, retention_days)
    result = PurgeResult(cutoff)
    if not dry_run:
        if key is None:
            raise ValueError("a purge needs the checkpoint key")
        report = verify(store, [key.public, *trusted], until=cutoff)
        if not report.ok:
            raise PurgeRefused(report.breaks)
    store_id = store.store_id()
    ex = ExchangeRow.__table__
    postgres = store.engine.dialect.name == "postgresql"
    try:
        with store.engine.begin() as conn:
            if postgres:
                conn.execute(text(f"SET LOCAL lock_timeout = '{int(lock_timeout_s * 1000)}ms'"))
            lock(conn)  # no hold made or released until this commits: the holds read next stay true
            holds = list_holds(conn)
            due = (ex.c.started_at < cutoff) & not_(held(holds))
            months = _droppable(conn, cutoff, holds) if postgres and not dry_run else []
            if months:
                # No record may arrive in a month to be dropped once its runs are listed.
                for table in partitions.TABLES:
                    conn.execute(text(f'LOCK TABLE "{table}" IN SHARE ROW EXCLUSIVE MODE'))
            began = conn.scalar(select(func.min(ex.c.started_at)).where(ex.c.writer_id.is_not(None), due))
            for run in _runs(conn, due):
                result.runs.append(run)
                result.records[run[0]] = result.records.get(run[0], 0) + run[2] - run[1] + 1
            result.unchained = (
                conn.scalar(select(func.count()).select_from(ex).where(ex.c.writer_id.is_(None), due)) or 0
            )
            result.held = (
                conn.scalar(select(func.count()).select_from(ex).where(ex.c.started_at < cutoff, held(holds))) or 0
                if holds
                else 0
            )
            alerts_due = _alerts_due(cutoff, holds)
            result.alerts = conn.scalar(select(func.count()).select_from(AlertRow).where(alerts_due)) or 0
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
                "alerts": result.alerts,
                "runs": len(result.runs),
                "runs_sha256": runs_digest(result.runs),
                "chain_began": _chain_began(conn, began),
            }
            event = append_event(conn, key, store_id, "purge", actor, detail, now)
            if months:
                for table in partitions.TABLES:
                    conn.execute(text(f'LOCK TABLE "{table}" IN ACCESS EXCLUSIVE MODE'))
                for month in months:
                    partitions.drop_month(conn, month)
                result.dropped = months
            if result.runs:
                by_seq = delete(ex).where(
                    ex.c.writer_id == bindparam("w"), ex.c.seq >= bindparam("a"), ex.c.seq <= bindparam("b")
                )
                runs = [{"w": w, "a": a, "b": b} for w, a, b, _h in result.runs]
                if not postgres:
                    search.unindex_sqlite(conn, by_seq.whereclause, runs)  # type: ignore[arg-type]
                conn.execute(by_seq, runs)
                conn.execute(
                    insert(PurgedRunRow.__table__),
                    [
                        {"writer_id": w, "first_seq": a, "last_seq": b, "last_hash": h, "event_seq": event["seq"]}
                        for w, a, b, h in result.runs
                    ],
                )
            if result.unchained:
                if not postgres:
                    search.unindex_sqlite(conn, ex.c.writer_id.is_(None) & due)
                conn.execute(delete(ex).where(ex.c.writer_id.is_(None), due))
            if result.alerts:
                conn.execute(delete(AlertRow).where(alerts_due))
            result.event = event
    except sa_exc.OperationalError as exc:
        if postgres and "lock timeout" in str(exc):
            raise PurgeBusy(
                f"the tables stayed locked by another transaction for {lock_timeout_s:g} s; nothing was purged:"
                " run it again (a long query or backup holds them)"
            ) from exc
        raise
    return result


def _alerts_due(cutoff: datetime, holds: list[dict[str, Any]]) -> ColumnElement[bool]:
    """The alerts a purge at ``cutoff`` removes: fired before it, and not about a record an
    active hold covers (that record stays, and so does what was said about it)."""
    alerts, ex = AlertRow.__table__, ExchangeRow.__table__
    due = alerts.c.fired_at < cutoff
    if holds:
        due &= not_(exists().where(ex.c.id == alerts.c.exchange_id, held(holds)))
    return due


def _chain_began(conn: Connection, due_began: datetime | None) -> str | None:
    """When the chains began, for the purge event: the oldest chained record about to go, or
    an earlier purge's value if older (``verify`` refuses unchained records newer than it)."""
    table = StoreEventRow.__table__
    earlier = [
        parse_rfc3339(d["chain_began"])
        for (d,) in conn.execute(select(table.c.detail).where(table.c.kind == "purge"))
        if d.get("chain_began")
    ]
    known = [t for t in (due_began, *earlier) if t is not None]
    return rfc3339(min(known)) if known else None


def _droppable(conn: Connection, cutoff: datetime, holds: list[dict[str, Any]]) -> list[partitions.Month]:
    """PostgreSQL: the months whose partitions end at or before ``cutoff`` and hold no record
    under a hold: all their rows are due (and in the runs), so they go whole."""
    ex = ExchangeRow.__table__
    out = []
    for month in sorted(partitions.existing(conn)):
        start, end = partitions.bounds(month)
        if end > cutoff:
            continue
        if holds:
            in_month = (ex.c.started_at >= start) & (ex.c.started_at < end)
            if conn.scalar(select(func.count()).select_from(ex).where(in_month, held(holds))):
                continue
        out.append(month)
    return out


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


__all__ = ["LOCK_TIMEOUT_S", "PurgeBusy", "PurgeRefused", "PurgeResult", "cutoff_for", "purge"]
