"""``observer export`` throughput and memory: records/s and peak RSS per format, at N/10 and N.

Builds a SQLite store of ``--records`` chained records of one writer (``bench/store.py``'s
``make_records``: ~12 KB each as a JSONL line; a pool of 2,000 reused under new ids, seqs and
times ``T0 + i ms``), fast: the rows are inserted with the driver's ``executemany`` in
transactions of 5,000, their JSON written once per pool record, each record's chain hash
computed as ``write_many`` does (``observer.store.chain``). Then, each in a fresh process (so
that its peak RSS, ``ru_maxrss``, is its own), ``observer.store.export.export`` of:

1. the first N/10 records (``until``) and all N, as ``jsonl``: records/s, peak RSS at each size
   (flat: the ratio near 1). Target: >= 20,000 records/s (issue 12). Baseline: ``AuditStore.get``
   per record (the ORM path) on 2,000 of them, in the same run. And all N with ``jobs=2`` (two
   processes, a part each): records/s;
2. the same for ``csv`` and ``parquet`` (records/s; no target);
3. ``observer.store.manifest.verify_export`` of the N/10 jsonl export (recomputing the chain):
   records/s.

The store and the exports live in a temporary folder under ``--dir``; each export is deleted
once measured (the full size needs ~13 GB for the store and as much for the largest export).

    .venv/bin/python bench/export.py                    # 100,000 records (~1 min)
    .venv/bin/python bench/export.py --records 1000000  # the issue's size (~10 min)
    .venv/bin/python bench/export.py --smoke
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._common import Report  # noqa: E402
from bench.store import make_records  # noqa: E402
from observer.shape import rfc3339  # noqa: E402
from observer.store.chain import GENESIS, canonical_record, chain_hash  # noqa: E402
from observer.store.checkpoint import CheckpointKey  # noqa: E402
from observer.store.migrate import upgrade  # noqa: E402
from observer.store.rows import rows_from_records  # noqa: E402
from observer.store.store import AuditStore  # noqa: E402

TARGET_RPS = 20_000.0
WRITER = "bench-writer"
T0 = datetime(2026, 6, 1, tzinfo=timezone.utc)
POOL = 2_000
TX_ROWS = 5_000


def _sqlite_time(when: datetime) -> str:
    return when.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")


def build(url: str, n: int) -> None:
    """``n`` chained records of ``WRITER`` in the (migrated, empty) SQLite store at ``url``."""
    pool = make_records(min(n, POOL))
    templates = []
    for record in pool:
        (row,), children = rows_from_records([record])
        row = {**row, "request": json.dumps(row["request"]), "text": record.to_dict()["text"]}
        kids = {table.name: rows for table, rows in children.items()}
        templates.append((row, kids, record.to_dict()))
    store = AuditStore(url)
    columns: dict[str, list[str]] = {}  # per table, from its first row
    prev = GENESIS
    with store.engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        assert raw is not None
        for start in range(0, n, TX_ROWS):
            rows: dict[str, list[tuple]] = {}
            for i in range(start, min(n, start + TX_ROWS)):
                row, kids, as_dict = templates[i % len(templates)]
                rid, seq = f"x-{i:08d}", i + 1
                started = T0 + timedelta(milliseconds=i)
                ended = started + timedelta(seconds=6)
                record = {**as_dict, "id": rid, "started_at": rfc3339(started), "ended_at": rfc3339(ended)}
                prev = chain_hash(prev, canonical_record(record, WRITER, seq))
                exchange = {
                    **row,
                    "id": rid,
                    "started_at": _sqlite_time(started),
                    "ended_at": _sqlite_time(ended),
                    "writer_id": WRITER,
                    "seq": seq,
                    "record_hash": prev.hex(),
                }
                for table, table_rows in (("exchanges", [exchange]), *kids.items()):
                    for r in table_rows:
                        names = columns.setdefault(table, list(r))
                        own = {"exchange_id": rid, "exchange_started_at": exchange["started_at"]}  # the record's key
                        rows.setdefault(table, []).append(tuple(own[c] if c in own else r[c] for c in names))
            raw.execute("BEGIN")
            for table, values in rows.items():
                names = columns[table]
                quoted, marks = ", ".join(f'"{c}"' for c in names), ", ".join("?" * len(names))
                raw.executemany(f"INSERT INTO {table} ({quoted}) VALUES ({marks})", values)
            raw.execute("COMMIT")
    store.dispose()


def child(args: argparse.Namespace) -> int:
    """One export (or verify) in this process; prints its figures as JSON."""
    from observer.store.export import export
    from observer.store.manifest import verify_export
    from observer.store.reader import RecordFilter

    t = time.perf_counter()
    if args.verify:
        check = verify_export(Path(args.out))
        done, ok = check.records, check.ok and check.hashes_checked == check.records
    else:
        store = AuditStore(args.url)
        until = None if args.until_ms is None else T0 + timedelta(milliseconds=args.until_ms)
        manifest = export(
            store,
            RecordFilter(until=until),
            args.format,
            Path(args.out),
            CheckpointKey.load(Path(args.key)),
            jobs=args.jobs,
            check=False,  # the writing alone; the check first is a verify of the range (bench/verify.py)
        )
        store.dispose()
        done, ok = manifest["totals"]["records"], True
    seconds = time.perf_counter() - t
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"records": done, "seconds": seconds, "peak_rss_mb": peak_mb, "ok": ok}))
    return 0


def _run(*args: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _get_rps(url: str, n: int) -> float:
    store = AuditStore(url)
    t = time.perf_counter()
    for i in range(n):
        store.get(f"x-{i:08d}")
    rps = n / (time.perf_counter() - t)
    store.dispose()
    return rps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--dir", default=None, help="where the store and the exports go (default: the temp folder)")
    ap.add_argument("--formats", default="jsonl,csv,parquet")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--format", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--key", help=argparse.SUPPRESS)
    ap.add_argument("--until-ms", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--verify", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--jobs", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    n = 2_000 if args.smoke else args.records
    tenth = max(n // 10, 1)
    formats = [f for f in args.formats.split(",") if f]
    started = time.monotonic()
    report = Report("export", smoke=args.smoke)
    ok = True
    with tempfile.TemporaryDirectory(prefix="bench-export-", dir=args.dir) as tmp:
        url = f"sqlite:///{Path(tmp) / 'export.db'}"
        upgrade(url)
        key = CheckpointKey.load_or_create(Path(tmp) / "key.pem")
        t = time.perf_counter()
        build(url, n)
        print(f"stored {n} chained records in {time.perf_counter() - t:.1f} s", flush=True)
        base_rps = _get_rps(url, min(n, 2_000))
        for file_format in formats:
            results = {}
            for size, until in ((tenth, tenth), (n, None)):
                out = Path(tmp) / f"{file_format}-{size}"
                extra = [] if until is None else ["--until-ms", str(until)]
                r = _run("--url", url, "--format", file_format, "--out", str(out), "--key", str(key.path), *extra)
                ok = ok and r["records"] == size
                results[size] = r
                print(
                    f"{file_format} {size}: {r['records'] / r['seconds']:,.0f} records/s, peak RSS {r['peak_rss_mb']:.0f} MB",
                    flush=True,
                )
                if file_format == "jsonl" and size == tenth:
                    v = _run("--verify", "--out", str(out))
                    ok = ok and v["ok"]
                    report.add(
                        "export verify records/s (jsonl, chain recomputed)",
                        v["records"] / v["seconds"],
                        "records/s",
                        note=f"{tenth} records, offline; peak RSS {v['peak_rss_mb']:.0f} MB",
                    )
                shutil.rmtree(out)
            if file_format == "jsonl":
                out = Path(tmp) / "jsonl-jobs"
                r = _run("--url", url, "--format", "jsonl", "--out", str(out), "--key", str(key.path), "--jobs", "2")
                ok = ok and r["records"] == n
                shutil.rmtree(out)
                parallel = r["records"] / r["seconds"]
                print(f"jsonl {n}, 2 processes: {parallel:,.0f} records/s", flush=True)
                report.add(
                    "export jsonl records/s, --jobs 2",
                    parallel,
                    "records/s",
                    target=f">= {TARGET_RPS:,.0f}/s",
                    met=parallel >= TARGET_RPS,
                    note=f"{n} records in 2 parts, each its own process",
                )
            full, small = results[n], results[tenth]
            rps = full["records"] / full["seconds"]
            report.add(
                f"export {file_format} records/s (SQLite)",
                rps,
                "records/s",
                baseline=base_rps if file_format == "jsonl" else None,
                target=f">= {TARGET_RPS:,.0f}/s" if file_format == "jsonl" else "",
                met=rps >= TARGET_RPS if file_format == "jsonl" else None,
                note=f"{n} records; at N/10: {small['records'] / small['seconds']:,.0f}/s"
                + ("; baseline: AuditStore.get per record" if file_format == "jsonl" else ""),
            )
            ratio = full["peak_rss_mb"] / small["peak_rss_mb"]
            report.add(
                f"export {file_format} peak RSS at N / at N/10",
                full["peak_rss_mb"],
                "MB",
                baseline=small["peak_rss_mb"],
                target="flat (ratio <= 1.1)",
                met=ratio <= 1.1,
                note=f"N = {n}, N/10 = {tenth}",
            )
    return report.finish(started, args.json, ok)


if __name__ == "__main__":
    raise SystemExit(main())
