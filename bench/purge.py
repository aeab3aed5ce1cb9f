"""``observer purge`` over one month of records, SQLite and PostgreSQL.

Builds ``--records`` realistic chained records (``bench/store.py``'s ``make_records``) started
in one month more than 183 days ago, plus a tenth as many recent ones and a legal hold over 1 %
of the old ones (so the purge removes runs, not one range), then measures per engine:

1. **purge**: ``observer.store.purge.purge`` end to end (it first recomputes the chain up to
   the cutoff, ``verify``), records removed per second; and the **removal** alone: the purge's
   time minus a ``verify(until=cutoff)`` of the same store timed just before it.
2. **baseline**: on an identical store, one ``DELETE FROM exchanges WHERE started_at < cutoff
   AND NOT held`` (the children by cascade), no runs, event or checkpoint: what the removal costs
   at least row by row. On PostgreSQL also ``DROP TABLE`` of a table holding the same rows (and
   of its children's): what dropping a monthly partition would cost (partitions are not built
   yet; this is the figure they would be measured against).

After the purge ``verify`` must pass (checked).

    .venv/bin/python bench/purge.py                     # 50,000 old records (~3 min)
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import sqlalchemy as sa  # noqa: E402

from bench._common import Report  # noqa: E402
from bench._pg import PgDatabase  # noqa: E402
from bench.store import DEFAULT_PG_URL, make_records  # noqa: E402
from observer.store.checkpoint import CheckpointKey  # noqa: E402
from observer.store.holds import Scope, create_hold, held, list_holds  # noqa: E402
from observer.store.migrate import upgrade  # noqa: E402
from observer.store.models import ExchangeRow  # noqa: E402
from observer.store.purge import cutoff_for, purge  # noqa: E402
from observer.store.store import AuditStore  # noqa: E402
from observer.store.verify import verify  # noqa: E402

WRITER = "bench-writer"
NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)
MONTH = datetime(2026, 3, 1, tzinfo=timezone.utc)  # more than 183 days before NOW
RETENTION = 183


def _fill(store: AuditStore, n_old: int) -> None:
    """``n_old`` records spread over March, then ``n_old // 10`` recent ones, chained; every
    100th old record is of the end user ``held``."""
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
            r.request.end_user = "held" if i < n_old and i % 100 == 0 else None
            batch.append(r)
        store.write_many(batch, writer_id=WRITER, seqs=list(range(seq, seq + len(batch))))
        seq += len(batch)


def _timed(fn: Callable[[], object]) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def _engine(name: str, make_url: Callable[[str], str], n_old: int, key: CheckpointKey, report: Report) -> bool:
    cutoff = cutoff_for(NOW, RETENTION)
    ok = True
    # The observer's purge.
    store = AuditStore(make_url("purge"))
    try:
        upgrade(store.engine.url.render_as_string(hide_password=False))
        _fill(store, n_old)
        create_hold(store.engine, key, store.store_id(), Scope(end_user="held"), "bench", "bench", NOW)
        verify_s, _ = _timed(lambda: verify(store, None, until=cutoff))
        purge_s, result = _timed(
            lambda: purge(store, key, now=NOW, retention_days=RETENTION, retention_override=False, actor="bench")
        )
        removed = result.total  # type: ignore[attr-defined]
        ok = ok and removed == n_old - n_old // 100 and verify(store, key.public).ok
    finally:
        store.dispose()
    # The baselines: a bare predicate DELETE; on PostgreSQL a DROP TABLE of the same rows.
    base = AuditStore(make_url("base"))
    drop_s = None
    try:
        upgrade(base.engine.url.render_as_string(hide_password=False))
        _fill(base, n_old)
        create_hold(base.engine, key, base.store_id(), Scope(end_user="held"), "bench", "bench", NOW)
        ex = base.engine.dialect.name
        if ex == "postgresql":
            with base.engine.begin() as conn:
                conn.execute(
                    sa.text("CREATE TABLE month_copy AS SELECT * FROM exchanges WHERE started_at < :c"), {"c": cutoff}
                )
                for child in ("exchange_blocks", "exchange_tool_calls", "exchange_violations"):
                    conn.execute(
                        sa.text(
                            f"CREATE TABLE {child}_copy AS SELECT c.* FROM {child} c JOIN month_copy m ON m.id = c.exchange_id"
                        )
                    )

            def drop() -> None:
                with base.engine.begin() as conn:
                    for t in (
                        "month_copy",
                        "exchange_blocks_copy",
                        "exchange_tool_calls_copy",
                        "exchange_violations_copy",
                    ):
                        conn.execute(sa.text(f"DROP TABLE {t}"))

            drop_s, _ = _timed(drop)
        holds = list_holds(base.engine)

        def bare() -> int:
            t = ExchangeRow.__table__
            with base.engine.begin() as conn:
                return conn.execute(sa.delete(t).where(t.c.started_at < cutoff, sa.not_(held(holds)))).rowcount

        bare_s, bare_n = _timed(bare)
        ok = ok and bare_n == removed
    finally:
        base.dispose()
    removal_s = max(purge_s - verify_s, 1e-9)
    report.add(
        f"purge records/s ({name}, with its verify)",
        removed / purge_s,
        "records/s",
        note=f"{removed} removed of {n_old} old (1 % held), {n_old // 10} recent kept; verify part {verify_s:.1f} s",
    )
    report.add(
        f"purge removal records/s ({name})",
        removed / removal_s,
        "records/s",
        baseline=bare_n / bare_s,
        note="baseline: one bare DELETE ... WHERE started_at < cutoff AND NOT held (no runs, event, checkpoint)",
    )
    if drop_s is not None:
        report.add(
            f"drop of the same month as tables ({name})",
            drop_s * 1000,
            "ms",
            note="what dropping a monthly partition would cost (partitions not built yet)",
        )
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=50_000, help="old records (one month)")
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
        ok = _engine("SQLite", lambda name: f"sqlite:///{Path(tmp) / name}.db", n_old, key, report) and ok
        if not args.no_pg:
            db = PgDatabase(args.pg_url)
            try:
                ok = _engine("PostgreSQL", db.schema_url, n_old, key, report) and ok
            finally:
                db.drop()
    return report.finish(started, args.json, ok)


if __name__ == "__main__":
    raise SystemExit(main())
