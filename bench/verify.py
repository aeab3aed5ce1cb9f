"""``observer verify`` throughput: recomputing a writer's hash chain over a stored SQLite store.

Builds ``--records`` realistic records (``bench/store.py``'s ``make_records``: ~12 KB each as a
journal entry), stores them chained (``AuditStore.write_many`` with a writer id and seqs, in
batches of 500, as the drainer does) in a SQLite file, then measures:

1. **verify**: ``observer.store.verify.verify`` over the whole store (no checkpoint key):
   records/s. Target: >= 50,000/s (issue "trustworthy store").
2. **baseline**: reading the same records in the same pages with the same reader
   (``observer.store.reader``, as verify does) and their copied columns, without the
   canonical bytes or hashing (what verify cannot do with less): records/s, in the same run;
   the ratio says how much of verify is the read.

    .venv/bin/python bench/verify.py                    # 100,000 records (~1-2 min)
    .venv/bin/python bench/verify.py --records 1000000  # the issue's size (~15 min)
    .venv/bin/python bench/verify.py --smoke
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sqlalchemy import select  # noqa: E402

from bench._common import Report  # noqa: E402
from bench.store import make_records  # noqa: E402
from observer.store.migrate import upgrade  # noqa: E402
from observer.store.models import ExchangeRow  # noqa: E402
from observer.store.reader import RecordFilter, RecordReader  # noqa: E402
from observer.store.store import AuditStore  # noqa: E402
from observer.store.verify import COPIED, PAGE, verify  # noqa: E402

TARGET_RPS = 50_000.0
WRITER = "bench-writer"


def _read_only(store: AuditStore) -> int:
    """The baseline: every chained record, page by page, as verify reads them."""
    ex = ExchangeRow.__table__
    n = 0
    with store.engine.connect() as conn:
        for page in RecordReader(conn, PAGE).chained(RecordFilter(), WRITER, 1, 1 << 62):
            conn.execute(
                select(ex.c.seq, *(ex.c[c] for c in COPIED)).where(
                    ex.c.writer_id == WRITER, ex.c.seq >= page[0]["seq"], ex.c.seq <= page[-1]["seq"]
                )
            ).all()
            n += len(page)
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    n = 2_000 if args.smoke else args.records
    started = time.monotonic()
    report = Report("verify", smoke=args.smoke)
    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'verify.db'}"
        upgrade(url)
        store = AuditStore(url)
        try:
            t = time.perf_counter()
            seq = 1
            pool = make_records(min(n, 5_000))
            for start in range(0, n, 500):
                batch = []
                for i in range(start, min(n, start + 500)):
                    r = pool[i % len(pool)]
                    r.id = f"v-{i:08d}"
                    batch.append(r)
                store.write_many(batch, writer_id=WRITER, seqs=list(range(seq, seq + len(batch))))
                seq += len(batch)  # (the pool's objects are reused under new ids, batch by batch)
            print(f"stored {n} chained records in {time.perf_counter() - t:.1f} s")
            t = time.perf_counter()
            base = _read_only(store)
            base_s = time.perf_counter() - t
            t = time.perf_counter()
            result = verify(store, None)
            verify_s = time.perf_counter() - t
        finally:
            store.dispose()
    ok = result.ok and base == n and result.entries.get(WRITER) == n
    rps, base_rps = n / verify_s, n / base_s
    report.add(
        "verify records/s (SQLite)",
        rps,
        "records/s",
        baseline=base_rps,
        target=f">= {TARGET_RPS:,.0f}/s",
        met=rps >= TARGET_RPS,
        note=f"baseline: the same reads without rebuilding or hashing; {n} records",
    )
    return report.finish(started, args.json, ok)


if __name__ == "__main__":
    raise SystemExit(main())
