"""Store ingest through the durable pipeline: ``Journal.record`` -> journal thread (segment
files, one ``fdatasync`` per round: group commit) -> ``Drainer`` -> ``AuditStore.write_many``.

Builds realistic ``observer.records.Exchange`` records (what a ~300-event chat stream produces:
a 2-8 KB request with several messages and a declared tool, a few KB of generated text in one
text block, one tool call, usage, a violation in one record out of five; ~12 KB as a journal
entry), then measures, every figure against a baseline run in the same process:

1. **Journal, durable** (no database): one producer (the bench's main thread, as the proxy's
   event loop) calls ``Journal.record`` for ``--records`` records as fast as it can; records/s
   from the first call until ``Journal.journaled`` says all are fsynced. Baseline: the same
   entries (``format.record_entry`` of ``to_dict()``, encoded beforehand) written with
   ``os.write`` + ``os.fdatasync`` per record, i.e. durability without group commit. Each call
   is timed (``perf_counter_ns``): submit p50 / p99 / max against ``SimpleQueue.put_nowait`` of
   the same objects timed the same way (what ``record`` is built on).
2. **Journal, paced**: ``--paced-rate`` records/s (5,000) for ``--paced-seconds`` (2), the
   journal thread writing meanwhile; each ``record`` call timed, and a ``SimpleQueue.put_nowait``
   of the same object just before it in the same thread (baseline: the same GIL and cache
   conditions). Also how late the producer woke against its schedule (the journal thread holding
   the GIL delays the proxy's loop; baseline: the same paced loop without a journal).
3. **Inserts through the journal**, SQLite (a file, WAL, ``synchronous=FULL``) and PostgreSQL
   (schemas ``bench_<random>_*`` created in the database of ``--pg-url`` and dropped at the end,
   as ``tests/conftest.py`` isolates its tests): records/s end to end, from the first
   ``Journal.record`` until ``Drainer.close`` returned with every record committed. Baseline
   (``direct``): ``AuditStore.write_many`` in batches of 500 (the drainer's ``batch_max``) on
   the same records. Rounds alternate the order; rows, duplicates, gaps and drops are checked.
4. **Idle pipeline**: a started journal and drainer with nothing to do for ``--idle-seconds``
   (10): CPU seconds of both threads (``pthread_getcpuclockid``) and their wake-ups (voluntary
   context switches, ``/proc/self/task/<tid>/status``), then how long ``close()`` takes. They
   run inside the proxy process: any polling there is proxy CPU.

The journal and SQLite files live in a temporary folder under ``--dir`` (default: the system's
temporary folder); it must be a real disk (a tmpfs makes ``fdatasync`` free: a warning is printed).

    .venv/bin/python bench/store.py              # full size (~40 s)
    .venv/bin/python bench/store.py --smoke      # a few seconds
    .venv/bin/python bench/store.py --json out.json --records 10000 --no-pg
"""

from __future__ import annotations

import argparse
import os
import queue
import random
import resource
import shutil
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import sqlalchemy as sa  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from bench._common import Report, percentile  # noqa: E402
from observer.journal import format as fmt  # noqa: E402
from observer.journal.journal import SEGMENT_BYTES, Journal  # noqa: E402
from observer.records import (  # noqa: E402
    Block,
    Exchange,
    RequestFacts,
    ToolCall,
    Usage,
    Violation,
)
from observer.store.drain import Drainer  # noqa: E402
from observer.store.migrate import upgrade  # noqa: E402
from observer.store.store import AuditStore  # noqa: E402

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
TARGET_JOURNAL_RPS = 5000.0
TARGET_SQLITE_RPS = 1000.0
TARGET_PG_RPS = 2000.0
TARGET_SUBMIT_P99_US = 5.0
TARGET_SUBMIT_MAX_US = 1000.0
BATCH = 500  # the Drainer's default batch_max
QUEUE_MAX = 10000  # the journal's default queue_max (observer_queue_max)
NO_SPOOL_BOUND = 1 << 40  # journal runs without a drainer keep every segment


_WORDS = (
    "the",
    "model",
    "stream",
    "token",
    "weather",
    "Vienna",
    "sunny",
    "audit",
    "proxy",
    "record",
    "compliance",
    "event",
    "delta",
    "request",
    "usage",
    "response",
    "tool",
    "call",
    "and",
    "of",
)


_POOL: list[str] = []


def _prose(rng: random.Random, n_bytes: int) -> str:
    """``n_bytes`` of word salad: a random slice of a 256 KB pool (building it word by word
    for every record made the set-up slower than the measurement)."""
    if not _POOL:
        r = random.Random(0)
        _POOL.append(" ".join(r.choice(_WORDS) for _ in range(40000)))
    pool = _POOL[0]
    start = rng.randrange(0, len(pool) - n_bytes)
    return pool[start : start + n_bytes]


def make_records(n: int, seed: int = 1) -> list[Exchange]:
    """``n`` realistic exchanges as a ~300-event chat stream leaves them (sizes in the module
    docstring); ids are fresh UUIDs, times aware UTC."""
    rng = random.Random(seed)
    t0 = datetime.now(timezone.utc)
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
    records = []
    for i in range(n):
        req_bytes = rng.randint(2000, 8000)
        n_msgs = rng.randint(2, 6)
        msgs: list[dict[str, Any]] = [{"role": "system", "content": _prose(rng, 300)}]
        for k in range(n_msgs):
            msgs.append({"role": "user" if k % 2 == 0 else "assistant", "content": _prose(rng, req_bytes // n_msgs)})
        text = _prose(rng, rng.randint(1500, 4000))
        started = t0 + timedelta(milliseconds=i)
        violations = (
            [Violation(kind="seq_gap", seq=rng.randint(1, 300), detail="expected 41, got 43")] if i % 5 == 0 else []
        )
        records.append(
            Exchange(
                id=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                dialect="openai-chat",
                host="api.openai.com",
                port=443,
                scheme="https",
                path="/v1/chat/completions",
                method="POST",
                http_version="HTTP/1.1",
                status_code=200,
                started_at=started,
                ended_at=started + timedelta(seconds=6),
                ttft_s=0.35,
                request_id=f"chatcmpl-{i:08d}",
                request=RequestFacts(
                    version=None,
                    stream=True,
                    model="gpt-4o-mini",
                    messages=msgs,
                    tools=[tool],
                    parameters={"temperature": 0.7, "max_tokens": 1024},
                    metadata={"session_id": f"s{i % 97}"},
                    body_bytes=req_bytes + 600,
                    tool_names=["get_weather"],
                    end_user=f"user-{i % 50}",
                ),
                model="gpt-4o-mini-2024-07-18",
                blocks=[Block(index=0, type="text", text=text, stop_reason="tool_use")],
                tool_calls=[
                    ToolCall(
                        index=0, id=f"call_{i:012d}", name="get_weather", arguments='{"city":"Vienna"}', declared=True
                    )
                ],
                usage=Usage(input_tokens=req_bytes // 4, output_tokens=len(text) // 4 + 12, reported=True),
                stop_reason="tool_use",
                stop_reason_raw="tool_calls",
                outcome="completed",
                violations=violations,
                response_bytes=300 * 310,
                events=304,
            )
        )
    return records


# --------------------------------------------------------------------------------------------
# helpers


def _us(ns: list[int]) -> dict[str, float]:
    """p50 / p99 / p99.9 / max in µs of nanosecond timings, and how many exceeded 1 ms."""
    us = [x / 1000 for x in ns]
    return {
        "p50_us": percentile(us, 50),
        "p99_us": percentile(us, 99),
        "p999_us": percentile(us, 99.9),
        "max_us": max(us),
        "over_1ms": sum(1 for x in us if x > 1000),
        "n": len(us),
    }


def _rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _fs_type(path: Path) -> str:
    """The file system type of the mount holding ``path`` (``/proc/mounts``, longest prefix)."""
    best, kind = "", "?"
    real = str(path.resolve())
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 3 and (real == parts[1] or real.startswith(parts[1].rstrip("/") + "/")):
            if len(parts[1]) > len(best):
                best, kind = parts[1], parts[2]
    return kind


def _thread_switches(tid: int) -> int:
    for line in Path(f"/proc/self/task/{tid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    return 0


def _wait_journaled(journal: Journal, n: int, timeout_s: float) -> bool:
    """Blocks (no polling: the journal's condition) until ``n`` records are durable."""
    deadline = time.monotonic() + timeout_s
    while True:
        pos = journal.durable()  # read before the counter: the commit counts, then publishes
        if journal.journaled >= n:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        journal.wait_durable(pos, min(left, 1.0))


def _entries(records: list[Exchange]) -> tuple[list[bytes], float]:
    """The journal's ``RECORD`` entries of ``records`` (the bytes ``Journal`` writes) and the
    encode cost in µs per record (``to_dict`` + JSON + frame: the journal thread's CPU)."""
    t = time.perf_counter()
    out = [fmt.record_entry(i + 1, fmt.dumps(r.to_dict())) for i, r in enumerate(records)]
    return out, (time.perf_counter() - t) / len(records) * 1e6


def _decode_us(entries: list[bytes]) -> float:
    """What the drainer does per entry before the database: frame read, JSON, ``from_dict``."""
    t = time.perf_counter()
    for e in fmt.read_run(fmt.SEGMENT_MAGIC + b"".join(entries), 0, len(fmt.SEGMENT_MAGIC)).entries:
        Exchange.from_dict(e.json)
    return (time.perf_counter() - t) / len(entries) * 1e6


# --------------------------------------------------------------------------------------------
# databases


class PgSchemas:
    """Throw-away schemas ``bench_<random>_<name>`` in the database of ``url`` (as
    ``tests/conftest.py`` isolates its tests), selected through ``search_path``; ``drop()``
    drops them all (``CASCADE``, after a ``lock_timeout``)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.prefix = f"bench_{uuid.uuid4().hex[:12]}"
        self.made: list[str] = []
        self._admin = sa.create_engine(url, poolclass=sa.NullPool, connect_args={"connect_timeout": 3})
        with self._admin.connect() as conn:
            conn.execute(sa.text("SELECT 1"))

    def schema_url(self, name: str) -> str:
        schema = f"{self.prefix}_{name}"
        with self._admin.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        self.made.append(schema)
        return (
            make_url(self.url)
            .update_query_dict({"options": f"-csearch_path={schema}"})
            .render_as_string(hide_password=False)
        )

    def drop(self) -> None:
        with self._admin.begin() as conn:
            conn.execute(sa.text("SET LOCAL lock_timeout = '10s'"))
            for schema in self.made:
                conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        self.made = []
        self._admin.dispose()


def store_bytes(kind: str, url: str) -> int:
    """Bytes the store takes on disk: the SQLite file and its WAL, or on PostgreSQL every table of
    the schema with its indexes and TOAST (``pg_total_relation_size``; partitions included)."""
    if kind == "sqlite":
        path = Path(make_url(url).database or "")
        return sum(p.stat().st_size for p in (path, path.with_name(path.name + "-wal")) if p.exists())
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    sa.text(
                        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
                        " JOIN pg_namespace n ON n.oid = c.relnamespace"
                        " WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'm')"
                    )
                ).scalar_one()
            )
    finally:
        engine.dispose()


def _count(store: AuditStore) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM exchanges")).scalar_one())


# --------------------------------------------------------------------------------------------
# 1, 2: the journal alone


def run_raw_fsync(entries: list[bytes], directory: Path) -> dict[str, Any]:
    """Baseline: each entry ``os.write`` + ``os.fdatasync`` in turn (durable per record, no
    group commit); also the I/O ceiling of the journal's pattern: the same bytes 8 MB (a
    segment) per write with one ``fdatasync`` each."""
    path = directory / "raw.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, fmt.SEGMENT_MAGIC)
        os.fsync(fd)
        t = time.perf_counter()
        for e in entries:
            os.write(fd, e)
            os.fdatasync(fd)
        per_record_s = time.perf_counter() - t
        blob = b"".join(entries)
        reps = max(1, (64 << 20) // len(blob))  # ~64 MB in all
        t = time.perf_counter()
        for _ in range(reps):
            for i in range(0, len(blob), SEGMENT_BYTES):
                os.write(fd, blob[i : i + SEGMENT_BYTES])
                os.fdatasync(fd)
        grouped_s = time.perf_counter() - t
    finally:
        os.close(fd)
        path.unlink()
    n = len(entries)
    return {
        "n": n,
        "per_record_rps": n / per_record_s,
        "fdatasync_us": per_record_s / n * 1e6,
        "grouped_rps": n * reps / grouped_s,
        "grouped_mb_s": len(blob) * reps / grouped_s / 1e6,
    }


def run_put_burst(records: list[Exchange]) -> dict[str, Any]:
    """Baseline of the submit time: ``SimpleQueue.put_nowait`` of the same objects, as fast as possible."""
    q: queue.SimpleQueue[Any] = queue.SimpleQueue()
    pc = time.perf_counter_ns
    put = q.put_nowait
    lat: list[int] = []
    append = lat.append
    for r in records:
        a = pc()
        put(r)
        append(pc() - a)
    return _us(lat)


def run_journal_burst(records: list[Exchange], directory: Path) -> dict[str, Any]:
    """``Journal.record`` for every record as fast as possible; timed until all are durable.
    The queue bound is raised to the burst size: this measures the disk path, not the bound."""
    journal = Journal(directory, max_bytes=NO_SPOOL_BOUND, queue_max=max(QUEUE_MAX, len(records)))
    journal.open()
    journal.start(1)
    pc = time.perf_counter_ns
    record = journal.record
    lat: list[int] = []
    append = lat.append
    try:
        t0 = time.perf_counter()
        for r in records:
            a = pc()
            record(r)
            append(pc() - a)
        submitted_s = time.perf_counter() - t0
        ok = _wait_journaled(journal, len(records), 120)
        dt = time.perf_counter() - t0
        rss = _rss_mb()
    finally:
        journal.close(timeout_s=60)
    stats = journal.stats()
    return {
        "n": len(records),
        "seconds": dt,
        "rps": len(records) / dt,
        "submit_seconds": submitted_s,
        "durable": ok and journal.journaled == len(records),
        "rounds": journal.rounds,
        "segments": len(journal.segment_list()),
        "stats": stats,
        "rss_mb": rss,
        **{f"submit_{k}": v for k, v in _us(lat).items()},
    }


def run_paced(records: list[Exchange], rate: float, seconds: float, directory: Path | None) -> dict[str, Any]:
    """``rate`` records/s for ``seconds`` (records reused in turn). Each iteration times a
    ``SimpleQueue.put_nowait`` of the record into a queue nobody reads (``put``, the baseline),
    then, with ``directory``, ``Journal.record`` (default ``queue_max``); without it, a put into
    a queue a consumer thread waits on (``handoff``: what waking another thread costs, the
    journal thread's share of a submit). ``late``: how late the producer woke from its sleep
    against the schedule (iterations that slept; a thread holding the GIL delays that)."""
    n = max(1, int(rate * seconds))
    journal: Journal | None = None
    consumer: threading.Thread | None = None
    handoff: queue.SimpleQueue[Any] = queue.SimpleQueue()
    if directory is not None:
        journal = Journal(directory, max_bytes=NO_SPOOL_BOUND, queue_max=QUEUE_MAX)
        journal.open()
        journal.start(1)
    else:

        def consume() -> None:
            while handoff.get() is not None:
                pass

        consumer = threading.Thread(target=consume, name="bench-consumer", daemon=True)
        consumer.start()
    dummy: queue.SimpleQueue[Any] = queue.SimpleQueue()
    put_ns: list[int] = []
    sub_ns: list[int] = []
    late_ns: list[int] = []
    depth = 0
    pc = time.perf_counter_ns
    period_ns = 1e9 / rate
    try:
        t0 = pc()
        for i in range(n):
            r = records[i % len(records)]
            due = t0 + int(i * period_ns)
            slept = False
            while (now := pc()) < due:
                time.sleep((due - now) / 1e9)
                slept = True
            if slept:
                late_ns.append(now - due)
            a = pc()
            dummy.put_nowait(r)
            b = pc()
            if journal is not None:
                journal.record(r)
            else:
                handoff.put_nowait(r)
            c = pc()
            put_ns.append(b - a)
            sub_ns.append(c - b)
            if journal is not None:
                depth = max(depth, journal._queue.qsize())  # noqa: SLF001 - the backlog the bench watches
        submitted = pc()
        ok = journal is None or _wait_journaled(journal, n, 60)
        lag_ms = (pc() - submitted) / 1e6
        elapsed_s = (pc() - t0) / 1e9
    finally:
        if journal is not None:
            journal.close(timeout_s=30)
        if consumer is not None:
            handoff.put(None)
            consumer.join(5)
    out: dict[str, Any] = {
        "rate": rate,
        "n": n,
        "late": _us(late_ns),
        "put": _us(put_ns),
    }
    if journal is None:
        out["handoff"] = _us(sub_ns)
    else:
        out.update(
            record=_us(sub_ns),
            durable=ok and journal.journaled == n,
            durable_rps=n / elapsed_s,
            lag_after_last_ms=lag_ms,
            max_queue_depth=depth,
            rounds=journal.rounds,
            stats=journal.stats(),
        )
    return out


# --------------------------------------------------------------------------------------------
# 3: into the database


def run_direct(url: str, records: list[Exchange]) -> dict[str, Any]:
    """``AuditStore.write_many`` in batches of ``BATCH``; records/s over the whole run."""
    upgrade(url)
    store = AuditStore(url)
    try:
        store.write_many(records[:1])  # connect, warm caches (counted in rows, not in the time)
        rest = records[1:]
        t0 = time.perf_counter()
        for i in range(0, len(rest), BATCH):
            store.write_many(rest[i : i + BATCH])
        dt = time.perf_counter() - t0
        rows = _count(store)
    finally:
        store.dispose()
    return {"seconds": dt, "rps": len(rest) / dt, "rows": rows, "expected_rows": len(records)}


def run_via_journal(url: str, records: list[Exchange], directory: Path) -> dict[str, Any]:
    """Journal + drainer as the addon starts them; one record through first (connect, bind,
    caches: untimed, as for direct), then every other record submitted as fast as possible;
    timed until ``Journal.close`` and ``Drainer.close`` returned (every record committed)."""
    upgrade(url)
    store = AuditStore(url)
    journal = Journal(directory, max_bytes=NO_SPOOL_BOUND, queue_max=max(QUEUE_MAX, len(records)))
    journal.open()
    journal.start(1)
    drainer = Drainer(store, journal, batch_max=BATCH)
    drainer.start()
    lat: list[int] = []
    try:
        journal.record(records[0])
        deadline = time.monotonic() + 30
        while drainer.written < 1 and time.monotonic() < deadline:  # warm-up only: a 5 ms poll
            time.sleep(0.005)
        if drainer.written < 1:
            raise RuntimeError(f"the drainer stored nothing within 30 s: {drainer.stats()}")
        rest = records[1:]
        pc = time.perf_counter_ns
        record = journal.record
        append = lat.append
        t0 = time.perf_counter()
        for r in rest:
            a = pc()
            record(r)
            append(pc() - a)
        submitted_s = time.perf_counter() - t0
        journal.close(timeout_s=60)
        journaled_s = time.perf_counter() - t0
        drainer.close(timeout_s=120)
        dt = time.perf_counter() - t0
        rows = _count(store)
    finally:
        journal.close(timeout_s=5)
        drainer.close(timeout_s=5)
        store.dispose()
    return {
        "seconds": dt,
        "rps": len(rest) / dt,
        "submit_seconds": submitted_s,
        "journaled_seconds": journaled_s,
        "rows": rows,
        "expected_rows": len(records),
        "journal": journal.stats(),
        "journal_rounds": journal.rounds,
        "drainer": drainer.stats(),
        **{f"submit_{k}": v for k, v in _us(lat).items()},
    }


# --------------------------------------------------------------------------------------------
# 4: idle


def run_idle(url: str, record: Exchange, directory: Path, seconds: float) -> dict[str, Any]:
    """A started journal + drainer, one record stored, then nothing for ``seconds``: each
    thread's CPU seconds and wake-ups, then each ``close()``'s time."""
    upgrade(url)
    store = AuditStore(url)
    journal = Journal(directory)
    journal.open()
    journal.start(1)
    drainer = Drainer(store, journal)
    drainer.start()
    out: dict[str, Any] = {"seconds": seconds}
    try:
        journal.record(record)
        deadline = time.monotonic() + 30
        while drainer.written < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # let both reach their idle waits
        threads = {"journal": journal._thread, "drainer": drainer._thread}  # noqa: SLF001 - the very threads
        clocks = {}
        for name, th in threads.items():
            assert th is not None and th.ident is not None and th.native_id is not None
            clocks[name] = (time.pthread_getcpuclockid(th.ident), th.native_id)
        before = {k: (time.clock_gettime(c), _thread_switches(tid)) for k, (c, tid) in clocks.items()}
        time.sleep(seconds)
        after = {k: (time.clock_gettime(c), _thread_switches(tid)) for k, (c, tid) in clocks.items()}
        for k in clocks:
            out[f"{k}_cpu_s"] = after[k][0] - before[k][0]
            out[f"{k}_wakeups"] = after[k][1] - before[k][1]
    finally:
        t = time.perf_counter()
        journal.close(timeout_s=5)
        out["journal_close_s"] = time.perf_counter() - t
        t = time.perf_counter()
        drainer.close(timeout_s=5)
        out["drainer_close_s"] = time.perf_counter() - t
        out["written"] = drainer.written
        store.dispose()
    return out


# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Store ingest through the journal and drainer vs direct write_many.")
    ap.add_argument("--records", type=int, default=5000, help="records per run (journal burst, direct, via journal)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds per measurement, order alternating")
    ap.add_argument("--raw-records", type=int, default=1000, help="records of the per-record fdatasync baseline")
    ap.add_argument("--paced-rate", type=float, default=TARGET_JOURNAL_RPS, help="records/s of the paced run")
    ap.add_argument("--paced-seconds", type=float, default=2.0, help="length of the paced run")
    ap.add_argument("--idle-seconds", type=float, default=10.0, help="idle journal+drainer measurement length")
    ap.add_argument(
        "--pg-url",
        default=os.environ.get("OBSERVER_TEST_PG_URL", DEFAULT_PG_URL),
        help="PostgreSQL database (schemas bench_<random>_* are created there and dropped)",
    )
    ap.add_argument("--no-pg", action="store_true", help="SQLite only")
    ap.add_argument("--dir", default=None, help="folder for the journals and SQLite files (default: system temp)")
    ap.add_argument("--smoke", action="store_true", help="seconds: 600 records, 1 round, short paced and idle runs")
    ap.add_argument("--json", dest="json_out", help="write the report here")
    args = ap.parse_args(argv)
    if args.smoke:
        args.records, args.rounds, args.raw_records = 600, 1, 200
        args.paced_seconds, args.idle_seconds = 0.4, 1.0

    t_start = time.monotonic()
    report = Report("store", smoke=args.smoke)
    ok = True
    tmp = Path(tempfile.mkdtemp(prefix="bench-store-", dir=args.dir))
    pg: PgSchemas | None = None
    try:
        fs = _fs_type(tmp)
        report.details["folder"] = {"path": str(tmp), "fs": fs}
        if fs in ("tmpfs", "ramfs"):
            print(f"WARNING: {tmp} is on {fs}: fdatasync costs nothing there; use --dir on a real disk", flush=True)
        t = time.perf_counter()
        records = make_records(args.records)
        build_s = time.perf_counter() - t
        rss_records = _rss_mb()
        raw_entries, encode_us = _entries(records[: min(args.raw_records, len(records))])
        decode_us = _decode_us(raw_entries)
        entry_bytes = sum(map(len, raw_entries)) // len(raw_entries)
        report.details["records"] = {
            "n": len(records),
            "build_seconds": round(build_s, 2),
            "journal_entry_bytes_mean": entry_bytes,
            "encode_us_per_record": encode_us,
            "decode_us_per_record": decode_us,
            "rss_mb_after_build": rss_records,
        }
        print(
            f"# {len(records)} records, {entry_bytes:,} bytes each as a journal entry; {fs} at {tmp}\n"
            f"# journal thread encode (to_dict + orjson + frame) {encode_us:.1f} µs/record;"
            f" drainer decode (frame + orjson + from_dict) {decode_us:.1f} µs/record",
            flush=True,
        )

        # ---- 1. the journal alone, as fast as possible
        raw = run_raw_fsync(raw_entries, tmp)
        del raw_entries
        puts: list[dict[str, Any]] = []
        bursts: list[dict[str, Any]] = []
        for r in range(args.rounds):
            order = ("put", "journal") if r % 2 == 0 else ("journal", "put")
            for kind in order:
                if kind == "put":
                    puts.append(run_put_burst(records))
                else:
                    bursts.append(run_journal_burst(records, tmp / f"journal-burst{r}"))
                    shutil.rmtree(tmp / f"journal-burst{r}", ignore_errors=True)
        journal_rps = sum(b["n"] for b in bursts) / sum(b["seconds"] for b in bursts)
        dropped = sum(b["stats"]["dropped"] for b in bursts)
        if not all(b["durable"] for b in bursts):
            ok = False
            print(f"ERROR journal burst: not every record became durable: {[b['stats'] for b in bursts]}")
        sub = {k: max(b[f"submit_{k}"] for b in bursts) for k in ("p50_us", "p99_us", "max_us")}
        put = {k: max(p[k] for p in puts) for k in ("p50_us", "p99_us", "max_us")}
        report.details["journal_burst"] = {"rps": journal_rps, "rounds": bursts, "put_baseline": puts, "raw": raw}
        print(
            f"  journal: {journal_rps:,.0f} rec/s durable (rounds {[round(b['rps']) for b in bursts]};"
            f" journal thread rounds {[b['rounds'] for b in bursts]}, segments {[b['segments'] for b in bursts]});"
            f" raw per-record fdatasync {raw['per_record_rps']:,.0f}"
            f" rec/s ({raw['fdatasync_us']:.0f} µs each); raw 8 MB writes {raw['grouped_rps']:,.0f} rec/s"
            f" ({raw['grouped_mb_s']:,.0f} MB/s)",
            flush=True,
        )
        report.add(
            "journal durable records/s",
            journal_rps,
            "rec/s",
            baseline=raw["per_record_rps"],
            target=f">= {TARGET_JOURNAL_RPS:,.0f}/s",
            met=journal_rps >= TARGET_JOURNAL_RPS,
            note="baseline: the same entries, os.write + fdatasync per record (no group commit)",
        )
        report.add(
            "journal submit p50", sub["p50_us"], "µs", baseline=put["p50_us"], note="baseline: SimpleQueue.put_nowait"
        )
        report.add(
            "journal submit p99",
            sub["p99_us"],
            "µs",
            baseline=put["p99_us"],
            target=f"<= {TARGET_SUBMIT_P99_US:g} µs",
            met=sub["p99_us"] <= TARGET_SUBMIT_P99_US,
        )
        report.add(
            "journal submit max",
            sub["max_us"],
            "µs",
            baseline=put["max_us"],
            target="< 1000 µs",
            met=sub["max_us"] < TARGET_SUBMIT_MAX_US,
            note=f"{sum(b['submit_over_1ms'] for b in bursts)} submits over 1 ms",
        )
        report.add("journal records dropped", dropped, "records", target="= 0", met=dropped == 0)

        # ---- 2. the journal, paced (default queue bound)
        pr = f"{args.paced_rate:g}/s"
        paced_base = run_paced(records, args.paced_rate, args.paced_seconds, None)
        paced = run_paced(records, args.paced_rate, args.paced_seconds, tmp / "journal-paced")
        shutil.rmtree(tmp / "journal-paced", ignore_errors=True)
        report.details["journal_paced"] = {"journal": paced, "no_journal": paced_base}
        if not paced["durable"]:
            ok = False
            print(f"ERROR paced journal: not every record became durable: {paced['stats']}")
        print(
            f"  paced {pr}: record p50/p99/max {paced['record']['p50_us']:.2f}/{paced['record']['p99_us']:.2f}/"
            f"{paced['record']['max_us']:.0f} µs (put {paced['put']['p50_us']:.2f}/{paced['put']['p99_us']:.2f}/"
            f"{paced['put']['max_us']:.0f}; put waking a waiting thread {paced_base['handoff']['p50_us']:.2f}/"
            f"{paced_base['handoff']['p99_us']:.2f}/{paced_base['handoff']['max_us']:.0f});"
            f" queue depth max {paced['max_queue_depth']}, {paced['rounds']} rounds,"
            f" durable {paced['lag_after_last_ms']:.1f} ms after the last; wake-up lateness p99"
            f" {paced['late']['p99_us']:.0f} µs (no journal {paced_base['late']['p99_us']:.0f})",
            flush=True,
        )
        report.add(
            f"journal paced {pr} submit p99",
            paced["record"]["p99_us"],
            "µs",
            baseline=paced["put"]["p99_us"],
            target=f"<= {TARGET_SUBMIT_P99_US:g} µs",
            met=paced["record"]["p99_us"] <= TARGET_SUBMIT_P99_US,
            note="baseline: SimpleQueue.put_nowait of the same record just before, same thread; a put that"
            f" wakes a waiting thread: p99 {paced_base['handoff']['p99_us']:.1f} µs",
        )
        report.add(
            f"journal paced {pr} submit max",
            paced["record"]["max_us"],
            "µs",
            baseline=paced["put"]["max_us"],
            target="< 1000 µs",
            met=paced["record"]["max_us"] < TARGET_SUBMIT_MAX_US,
            note=f"{paced['record']['over_1ms']} over 1 ms",
        )
        report.add(
            f"journal paced {pr} records dropped",
            paced["stats"]["dropped"],
            "records",
            target="= 0",
            met=paced["stats"]["dropped"] == 0,
            note=f"default queue_max {QUEUE_MAX}; max depth {paced['max_queue_depth']}",
        )
        report.add(
            f"paced {pr} loop wake-up lateness p99",
            paced["late"]["p99_us"],
            "µs",
            baseline=paced_base["late"]["p99_us"],
            note="the producer's lateness against its schedule (GIL held by the journal thread);"
            " baseline: the same loop without a journal",
        )

        # ---- 3. through the journal into the databases
        backends: list[tuple[str, float]] = [("sqlite", TARGET_SQLITE_RPS)]
        if not args.no_pg:
            try:
                pg = PgSchemas(args.pg_url)
                backends.append(("postgres", TARGET_PG_RPS))
            except sa.exc.OperationalError as exc:
                print(f"PostgreSQL unreachable ({exc.orig}); measuring SQLite only", flush=True)
                report.details["postgres"] = "unreachable"
                ok = False

        def url(kind: str, name: str) -> str:
            if kind == "sqlite":
                return f"sqlite:///{tmp / f'{name}.db'}"
            assert pg is not None
            return pg.schema_url(name)

        for name, target in backends:
            directs: list[dict[str, Any]] = []
            vias: list[dict[str, Any]] = []
            for r in range(args.rounds):
                order = ("direct", "journal") if r % 2 == 0 else ("journal", "direct")
                for kind in order:
                    if kind == "direct":
                        directs.append(run_direct(url(name, f"direct{r}"), records))
                    else:
                        via_url = url(name, f"journal{r}")
                        vias.append(run_via_journal(via_url, records, tmp / f"journal-{name}{r}"))
                        shutil.rmtree(tmp / f"journal-{name}{r}", ignore_errors=True)
            n_timed = len(records) - 1
            direct_rps = n_timed * len(directs) / sum(d["seconds"] for d in directs)
            via_rps = n_timed * len(vias) / sum(v["seconds"] for v in vias)
            problems = []
            for res in (*directs, *vias):
                if res["rows"] != res["expected_rows"]:
                    problems.append(f"{res['rows']} rows stored, expected {res['expected_rows']}")
            for v in vias:
                if v["drainer"]["written"] != len(records) or v["drainer"]["duplicates"] or v["drainer"]["gaps"]:
                    problems.append(f"drainer {v['drainer']}")
            v_dropped = sum(v["journal"]["dropped"] for v in vias)
            for p in problems:
                ok = False
                print(f"ERROR {name}: {p}")
            report.details[name] = {
                "direct_rps": direct_rps,
                "journal_rps": via_rps,
                "rounds": {"direct": directs, "journal": vias},
            }
            print(
                f"  {name}: direct {direct_rps:,.0f} rec/s {[round(d['rps']) for d in directs]}, via journal"
                f" {via_rps:,.0f} rec/s {[round(v['rps']) for v in vias]}; all durable in the journal after"
                f" {[round(v['journaled_seconds'], 2) for v in vias]} s, stored after"
                f" {[round(v['seconds'], 2) for v in vias]} s; submit p99/max"
                f" {max(v['submit_p99_us'] for v in vias):.2f}/{max(v['submit_max_us'] for v in vias):.0f} µs",
                flush=True,
            )
            report.add(
                f"{name} records/s via journal",
                via_rps,
                "rec/s",
                baseline=direct_rps,
                target=f">= {target:,.0f}/s",
                met=via_rps >= target,
                note="journal -> drainer -> DB, until all committed; baseline: write_many batches of 500",
            )
            size = store_bytes(name, via_url)  # the last store filled through the journal and drainer
            report.add(
                f"{name} store bytes per record",
                size / len(records),
                "bytes",
                target="reported",
                note=f"{size / 1e6:.1f} MB for {len(records):,} records (bench sizes), indexes and chain included",
            )
            report.add(
                f"{name} records dropped or lost",
                v_dropped + sum(len(records) - v["rows"] for v in vias),
                "records",
                target="= 0",
                met=v_dropped == 0 and not problems,
            )

        # ---- 4. idle
        idle = run_idle(url("sqlite", "idle"), records[0], tmp / "journal-idle", args.idle_seconds)
        report.details["idle"] = idle
        cpu_s = idle["journal_cpu_s"] + idle["drainer_cpu_s"]
        wakeups = idle["journal_wakeups"] + idle["drainer_wakeups"]
        close_s = idle["journal_close_s"] + idle["drainer_close_s"]
        print(
            f"  idle {args.idle_seconds:g} s: CPU journal {idle['journal_cpu_s'] * 1e3:.3f} ms, drainer"
            f" {idle['drainer_cpu_s'] * 1e3:.3f} ms; wake-ups {idle['journal_wakeups']} / {idle['drainer_wakeups']};"
            f" close {idle['journal_close_s'] * 1e3:.2f} / {idle['drainer_close_s'] * 1e3:.2f} ms",
            flush=True,
        )
        report.add(
            "idle journal+drainer CPU",
            cpu_s * 1000,
            f"ms/{args.idle_seconds:g} s",
            target="~0",
            met=cpu_s < 0.001 * args.idle_seconds,
            note=f"journal {idle['journal_cpu_s'] * 1e3:.3f}, drainer {idle['drainer_cpu_s'] * 1e3:.3f} ms",
        )
        report.add(
            "idle journal+drainer wake-ups",
            wakeups,
            f"per {args.idle_seconds:g} s",
            target="<= 2",
            met=wakeups <= 2,
            note="voluntary context switches of both threads",
        )
        report.add("journal+drainer close() when idle", close_s * 1000, "ms", target="< 100 ms", met=close_s < 0.1)
        if idle["written"] != 1:
            ok = False
            print(f"ERROR idle: the drainer stored {idle['written']} records, expected 1")

        peak = _peak_rss_mb()
        report.details["rss"] = {"after_build_mb": rss_records, "peak_mb": peak}
        report.add(
            "bench process peak RSS",
            peak,
            "MB",
            baseline=rss_records,
            note="ru_maxrss; baseline: RSS once the records were built (the bench's own data)",
        )
    except Exception as exc:  # noqa: BLE001 - a bench that cannot measure exits 1 with the reason
        import traceback

        traceback.print_exc()
        print(f"ERROR: could not measure: {exc!r}")
        ok = False
    finally:
        if pg is not None:
            try:
                pg.drop()
            except Exception as exc:  # noqa: BLE001
                print(f"WARNING: could not drop the schemas {pg.prefix}_*: {exc!r}")
        shutil.rmtree(tmp, ignore_errors=True)

    return report.finish(t_start, args.json_out, ok and bool(report.figures))


if __name__ == "__main__":
    sys.exit(main())
