"""``observer purge`` of one month of records: a partition drop on PostgreSQL against a
row-by-row delete, and the same purge on SQLite.

Builds ``--records`` realistic chained records (``bench/store.py``'s ``make_records``) started
in March 2026 (more than 183 days before the bench's "now", 2026-12-01) and a tenth as many
recent ones, then per case measures the **removal**: records removed per second by ``purge``
with its first step, the chain's verification up to the cutoff, stubbed (that step is
``verify``, measured by ``bench/verify.py``; the end-to-end figure is given too, on SQLite):

- PostgreSQL, no hold in March: the month's partitions are dropped (``DROP TABLE``);
- PostgreSQL, a legal hold over 1 % of March: the month cannot go whole; its due records are
  deleted by runs of seqs, row by row;
- SQLite (no partitions), no hold: deleted by runs.

Baseline of each: on an identical store, one bare ``DELETE FROM exchanges WHERE started_at <
cutoff AND NOT held`` (the children by cascade; no runs, event or checkpoint): the row-by-row
cost the partition drop is compared against. ``verify`` must pass after every purge.

    .venv/bin/python bench/purge.py                     # 50,000 old records (~4 min)
    .venv/bin/python bench/purge.py --smoke
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import sqlalchemy as sa  # noqa: E402

import observer.store.purge as purge_module  # noqa: E402
from bench._common import Report  # noqa: E402
from bench._pg import PgDatabase  # noqa: E402
from bench.store import DEFAULT_PG_URL, make_records  # noqa: E402
from observer.store.checkpoint import CheckpointKey  # noqa: E402
from observer.store.holds import Scope, create_hold, held, list_holds  # noqa: E402
from observer.store.migrate import upgrade  # noqa: E402
from observer.store.models import ExchangeRow  # noqa: E402
from observer.store.purge import cutoff_for, purge  # noqa: E402
from observer.store.store import AuditStore  # noqa: E402
from observer.store.verify import Report as VerifyReport  # noqa: E402
from observer.store.verify import verify  # noqa: E402

WRITER = "bench-writer"
NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)
MONTH = datetime(2026, 3, 1, tzinfo=timezone.utc)
RETENTION = 183


def _fill(url: str, n_old: int, key: CheckpointKey, hold: bool) -> AuditStore:
    """A migrated store with ``n_old`` records spread over March and ``n_old // 10`` recent
    ones, chained; with ``hold``, every 100th March record is of the end user ``held``, who is
    under a legal hold."""
    upgrade(url)
    store = AuditStore(url)
    pool = make_records(min(n_old, 5_000))
    step = timedelta(days=28) / max(n_old, 1)
    total = n_old + n_old // 10
    seq = 1
    for start in range(0, total, 500):
        batch = []
        for i in range(start, min(total, start + 500)):
            r = pool[i % len(pool)]
            r.id = f"p-{i:08d}"
            r.started_at = MONTH + step * i if i < n_old else NOW - timedelta(hours=1)
            r.request.end_user = "held" if hold and i < n_old and i % 100 == 0 else None
            batch.append(r)
        store.write_many(batch, writer_id=WRITER, seqs=list(range(seq, seq + len(batch))))
        seq += len(batch)
    if hold:
        create_hold(store.engine, key, store.store_id(), Scope(end_user="held"), "bench", "bench", NOW)
    return store


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def _purge(store: AuditStore, key: CheckpointKey, *, check: bool) -> Any:
    """``purge`` at NOW; ``check=False``: its first step (``verify`` up to the cutoff) stubbed."""
    real = purge_module.verify
    if not check:
        purge_module.verify = lambda *a, **k: VerifyReport()  # type: ignore[assignment]
    try:
        return purge(store, key, now=NOW, retention_days=RETENTION, retention_override=False, actor="bench")
    finally:
        purge_module.verify = real  # type: ignore[assignment]


def _case(
    name: str,
    make_url: Callable[[str], str],
    n_old: int,
    key: CheckpointKey,
    report: Report,
    *,
    hold: bool = False,
    with_verify: bool = False,
) -> bool:
    cutoff = cutoff_for(NOW, RETENTION)
    expected = n_old - (n_old + 99) // 100 if hold else n_old
    store = _fill(make_url("purge"), n_old, key, hold)
    try:
        removal_s, result = _timed(lambda: _purge(store, key, check=False))
        ok = result.total == expected and verify(store, key.public).ok
    finally:
        store.dispose()
    end_to_end = ""
    if with_verify:
        store = _fill(make_url("full"), n_old, key, hold)
        try:
            full_s, full = _timed(lambda: _purge(store, key, check=True))
            ok = ok and full.total == expected
            end_to_end = f"; with its verify first: {full.total / full_s:,.0f}/s"
        finally:
            store.dispose()
    base = _fill(make_url("base"), n_old, key, hold)
    try:
        holds = list_holds(base.engine)
        t = ExchangeRow.__table__

        def bare() -> int:
            with base.engine.begin() as conn:
                return conn.execute(sa.delete(t).where(t.c.started_at < cutoff, sa.not_(held(holds)))).rowcount

        bare_s, bare_n = _timed(bare)
        ok = ok and bare_n == expected
    finally:
        base.dispose()
    how = f"{len(result.dropped)} month dropped" if result.dropped else f"{len(result.runs)} runs deleted"
    report.add(
        f"purge removal records/s ({name})",
        result.total / removal_s,
        "records/s",
        baseline=bare_n / bare_s,
        note=f"{how}; {result.total} of {n_old} March records removed in {removal_s:.2f} s (bare DELETE"
        f" {bare_s:.2f} s){end_to_end}",
    )
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=50_000, help="March records")
    ap.add_argument("--pg-url", default=os.environ.get("OBSERVER_TEST_PG_URL", DEFAULT_PG_URL))
    ap.add_argument("--no-pg", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    n_old = 1_000 if args.smoke else args.records
    started = time.monotonic()
    report = Report("purge", smoke=args.smoke)
    ok = True
    with tempfile.TemporaryDirectory(prefix="bench-purge-") as tmp:
        key = CheckpointKey.load_or_create(Path(tmp) / "key.pem")
        if not args.no_pg:
            db = PgDatabase(args.pg_url)
            try:
                counter = iter(range(100))
                url = lambda name: db.schema_url(f"{name}_{next(counter)}")  # noqa: E731
                ok = _case("PostgreSQL, month dropped", url, n_old, key, report) and ok
                ok = _case("PostgreSQL, 1 % held: rows deleted", url, n_old, key, report, hold=True) and ok
            finally:
                db.drop()
        sqlite = lambda name: f"sqlite:///{Path(tmp) / name}.db"  # noqa: E731
        ok = _case("SQLite", sqlite, n_old, key, report, with_verify=True) and ok
    return report.finish(started, args.json, ok)


if __name__ == "__main__":
    raise SystemExit(main())
