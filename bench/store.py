"""Store ingest through the real writer: ``RecordWriter.submit`` -> writer thread -> SQL.

Builds realistic ``observer.records.Exchange`` records (what a ~300-event chat stream produces:
a 2-8 KB request with several messages and a declared tool, a few KB of generated text in one
text block, one tool call, usage, a violation in one record out of five), then for SQLite (a
file in a temporary directory, WAL, ``synchronous=FULL``) and PostgreSQL (a database
``bench_<random>`` created for the run and dropped at its end):

- **direct** (the baseline): ``AuditStore.write_many`` in batches of ``batch_max`` (500, the
  writer's default), timed from the first call to the last commit;
- **writer**: one producer thread calls ``RecordWriter.submit`` (what the proxy loop calls) for
  every record as fast as it can, then ``close()``; timed from the first submit until ``close``
  returned (every record committed). Each submit is timed on the producer thread
  (``time.perf_counter_ns``) for p50 / p99 / max in µs. Drops are ``RecordWriter.dropped``.

The figure is records/s via the writer with the direct rate as its baseline (ratio
writer/direct), the submit latency, and drops (0 with the default queue of 10,000 at these sizes).

Then the **idle writer**: a started ``RecordWriter`` with an empty queue, for ``--idle-seconds``
(10): CPU seconds of the writer thread (its own ``pthread_getcpuclockid`` clock, ns resolution)
and its wake-ups (voluntary context switches from ``/proc/self/task/<tid>/status``). It runs
inside the proxy process, so any polling there is proxy CPU. Target: no periodic wake-up.

    .venv/bin/python bench/store.py              # full size (~15-25 s)
    .venv/bin/python bench/store.py --smoke      # a few seconds
    .venv/bin/python bench/store.py --json out.json --records 5000
"""

from __future__ import annotations

import argparse
import os
import random
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
from observer.store.writer import RecordWriter  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from bench._common import Report, percentile  # noqa: E402
from observer.records import (  # noqa: E402
    Block,
    Exchange,
    RequestFacts,
    ToolCall,
    Usage,
    Violation,
)
from observer.store.migrate import upgrade  # noqa: E402
from observer.store.store import AuditStore  # noqa: E402

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
TARGET_SQLITE_RPS = 1000.0
TARGET_PG_RPS = 2000.0
TARGET_SUBMIT_MAX_US = 1000.0
BATCH = 500  # RecordWriter's default batch_max

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
# databases


class PgDatabase:
    """A throw-away PostgreSQL database ``bench_<random>`` on the server of ``admin_url``,
    dropped by ``drop()`` (connections to it are terminated first)."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.name = f"bench_{uuid.uuid4().hex[:12]}"
        self._admin = sa.create_engine(
            admin_url, poolclass=sa.NullPool, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3}
        )
        with self._admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{self.name}"'))
        self.url = make_url(admin_url).set(database=self.name).render_as_string(hide_password=False)

    def schema_url(self, schema: str) -> str:
        """The database URL with ``search_path`` set to a new schema ``schema``."""
        eng = sa.create_engine(self.url, poolclass=sa.NullPool)
        with eng.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        eng.dispose()
        return (
            make_url(self.url)
            .update_query_dict({"options": f"-csearch_path={schema}"})
            .render_as_string(hide_password=False)
        )

    def drop(self) -> None:
        with self._admin.connect() as conn:
            conn.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :d AND pid <> pg_backend_pid()"
                ),
                {"d": self.name},
            )
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{self.name}"'))
        self._admin.dispose()


def _count(store: AuditStore) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM exchanges")).scalar_one())


# --------------------------------------------------------------------------------------------
# measurements


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


def run_writer(url: str, records: list[Exchange], queue_max: int = 10000) -> dict[str, Any]:
    """One producer thread submits every record as fast as it can; timed until ``close()``
    returned (all committed). Submit latencies in µs."""
    upgrade(url)
    store = AuditStore(url)
    store.write_many(records[:1])  # warm-up as for direct
    rest = records[1:]
    writer = RecordWriter(store, queue_max=queue_max)
    writer.start()
    lat_ns: list[int] = []
    result: dict[str, Any] = {}

    def produce() -> None:
        pc = time.perf_counter_ns
        submit = writer.submit
        append = lat_ns.append
        for r in rest:
            a = pc()
            submit(r)
            append(pc() - a)

    try:
        t0 = time.perf_counter()
        prod = threading.Thread(target=produce, name="bench-producer")
        prod.start()
        prod.join()
        t_submitted = time.perf_counter() - t0
        writer.close(timeout_s=120)
        dt = time.perf_counter() - t0
        rows = _count(store)
        lat_us = [x / 1000 for x in lat_ns]
        result = {
            "seconds": dt,
            "rps": len(rest) / dt,
            "submit_seconds": t_submitted,
            "rows": rows,
            "expected_rows": len(records),
            "stats": writer.stats(),
            "submit_p50_us": percentile(lat_us, 50),
            "submit_p99_us": percentile(lat_us, 99),
            "submit_p999_us": percentile(lat_us, 99.9),
            "submit_max_us": max(lat_us),
            "submits_over_1ms": sum(1 for x in lat_us if x > 1000),
        }
    finally:
        store.dispose()
    return result


def _noop(record: Exchange) -> bool:
    return True


def run_paced(url: str, records: list[Exchange], rate: float) -> dict[str, Any]:
    """Submits ``records`` at ``rate`` per second (a proxy finishing that many streams/s) while
    the writer writes them; times every ``submit`` and, as the baseline, a no-op call of the
    same shape in the same producer thread just before it. Both include waits for the GIL held
    by the writer thread (the switch interval is 5 ms), which any code on the proxy loop has."""
    store = AuditStore(url)
    writer = RecordWriter(store)
    writer.start()
    sub_ns: list[int] = []
    noop_ns: list[int] = []
    try:
        pc = time.perf_counter_ns
        period_ns = int(1e9 / rate)
        t0 = pc()
        for i, r in enumerate(records):
            due = t0 + i * period_ns
            while (now := pc()) < due:
                time.sleep(max(0.0, (due - now) / 1e9))
            a = pc()
            _noop(r)
            b = pc()
            writer.submit(r)
            c = pc()
            noop_ns.append(b - a)
            sub_ns.append(c - b)
        writer.close(timeout_s=120)
        rows = _count(store)
    finally:
        store.dispose()
    sub = [x / 1000 for x in sub_ns]
    noop = [x / 1000 for x in noop_ns]
    return {
        "rate": rate,
        "n": len(records),
        "rows": rows,
        "stats": writer.stats(),
        "submit_p50_us": percentile(sub, 50),
        "submit_p99_us": percentile(sub, 99),
        "submit_max_us": max(sub),
        "noop_p50_us": percentile(noop, 50),
        "noop_p99_us": percentile(noop, 99),
        "noop_max_us": max(noop),
        "submits_over_1ms": sum(1 for x in sub if x > 1000),
        "noops_over_1ms": sum(1 for x in noop if x > 1000),
    }


def _thread_switches(tid: int) -> int:
    for line in Path(f"/proc/self/task/{tid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    return 0


def run_idle(url: str, seconds: float) -> dict[str, Any]:
    """A started writer with nothing to write for ``seconds``: its thread's CPU seconds and
    wake-ups (voluntary context switches)."""
    store = AuditStore(url)
    writer = RecordWriter(store)
    writer.start()
    try:
        time.sleep(0.3)  # let it reach its idle wait
        th = writer._thread  # noqa: SLF001 - the bench measures that very thread
        assert th is not None and th.ident is not None and th.native_id is not None
        clock = time.pthread_getcpuclockid(th.ident)
        cpu0, sw0 = time.clock_gettime(clock), _thread_switches(th.native_id)
        time.sleep(seconds)
        cpu1, sw1 = time.clock_gettime(clock), _thread_switches(th.native_id)
    finally:
        t = time.perf_counter()
        writer.close(timeout_s=5)
        close_s = time.perf_counter() - t
        store.dispose()
    return {"cpu_s": cpu1 - cpu0, "wakeups": sw1 - sw0, "seconds": seconds, "close_s": close_s}


# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Store ingest through RecordWriter vs direct write_many.")
    ap.add_argument("--records", type=int, default=3000, help="records per run (each backend: direct and writer)")
    ap.add_argument("--rounds", type=int, default=2, help="direct+writer rounds per backend, order alternating")
    ap.add_argument("--paced-rate", type=float, default=2000.0, help="records/s of the paced submit-latency run")
    ap.add_argument("--paced-seconds", type=float, default=1.5, help="length of the paced run")
    ap.add_argument("--idle-seconds", type=float, default=10.0, help="idle writer measurement length")
    ap.add_argument(
        "--pg-url",
        default=os.environ.get("OBSERVER_TEST_PG_URL", DEFAULT_PG_URL),
        help="PostgreSQL server (a bench_<random> database is created there and dropped)",
    )
    ap.add_argument("--no-pg", action="store_true", help="SQLite only")
    ap.add_argument("--smoke", action="store_true", help="seconds: 600 records, 1 s idle")
    ap.add_argument("--json", dest="json_out", help="write the report here")
    args = ap.parse_args(argv)
    if args.smoke:
        args.records, args.idle_seconds, args.paced_seconds, args.rounds = 600, 1.0, 0.5, 1

    t_start = time.monotonic()
    report = Report("store", smoke=args.smoke)
    ok = True
    tmp = Path(tempfile.mkdtemp(prefix="bench-store-"))
    pg: PgDatabase | None = None
    try:
        t = time.perf_counter()
        n_paced = int(args.paced_rate * args.paced_seconds)
        all_records = make_records(args.records + n_paced)
        records, paced_records = all_records[: args.records], all_records[args.records :]
        sizes = [len(str(r.request.messages)) + len(r.text) for r in records[:200]]
        report.details["records"] = {
            "n": len(records),
            "build_seconds": round(time.perf_counter() - t, 2),
            "approx_payload_bytes_mean": sum(sizes) // len(sizes),
        }
        print(f"# {len(records)} records, ~{sum(sizes) // len(sizes)} bytes of request+text each", flush=True)

        def urls(kind: str) -> list[str]:
            if kind == "sqlite":
                return [f"sqlite:///{tmp / f'{m}{r}.db'}" for r in range(args.rounds) for m in ("direct", "writer")]
            assert pg is not None
            return [pg.schema_url(f"{m}{r}") for r in range(args.rounds) for m in ("direct", "writer")]

        backends: list[tuple[str, list[str], float]] = [("sqlite", urls("sqlite"), TARGET_SQLITE_RPS)]
        if not args.no_pg:
            try:
                pg = PgDatabase(args.pg_url)
                backends.append(("postgres", urls("postgres"), TARGET_PG_RPS))
            except sa.exc.OperationalError as exc:
                print(f"PostgreSQL unreachable ({exc.orig}); measuring SQLite only", flush=True)
                report.details["postgres"] = "unreachable"
                ok = False

        idle_url = ""
        for name, url_list, target in backends:
            # Rounds alternate the order (direct first, then writer first): a shared machine's
            # load drifts; each figure is records over the summed seconds of its rounds.
            directs: list[dict[str, Any]] = []
            vias: list[dict[str, Any]] = []
            for r in range(args.rounds):
                url_direct, url_writer = url_list[2 * r], url_list[2 * r + 1]
                if r % 2 == 0:
                    directs.append(run_direct(url_direct, records))
                    vias.append(run_writer(url_writer, records))
                else:
                    vias.append(run_writer(url_writer, records))
                    directs.append(run_direct(url_direct, records))
            direct = {
                "rps": sum(len(records) - 1 for _ in directs) / sum(d["seconds"] for d in directs),
                "rounds_rps": [round(d["rps"]) for d in directs],
                "rows": sum(d["rows"] for d in directs),
                "expected_rows": sum(d["expected_rows"] for d in directs),
            }
            via = dict(vias[-1])
            via.update(
                rps=sum(len(records) - 1 for _ in vias) / sum(v["seconds"] for v in vias),
                rounds_rps=[round(v["rps"]) for v in vias],
                rows=sum(v["rows"] for v in vias),
                expected_rows=sum(v["expected_rows"] for v in vias),
                submit_p50_us=max(v["submit_p50_us"] for v in vias),
                submit_p99_us=max(v["submit_p99_us"] for v in vias),
                submit_max_us=max(v["submit_max_us"] for v in vias),
                submits_over_1ms=sum(v["submits_over_1ms"] for v in vias),
            )
            via["stats"] = dict(via["stats"], dropped=sum(v["stats"]["dropped"] for v in vias))
            url_writer = url_list[-1]
            paced = run_paced(url_writer, paced_records, args.paced_rate)
            report.details[name] = {
                "direct": direct,
                "writer": via,
                "paced": paced,
                "rounds": {"direct": directs, "writer": vias},
            }
            if paced["rows"] != len(records) + len(paced_records) or paced["stats"]["dropped"]:
                ok = False
                print(f"ERROR {name}: paced run stored {paced['rows']} rows in all, stats {paced['stats']}")
            print(
                f"  {name}: direct {direct['rps']:,.0f} rec/s, writer {via['rps']:,.0f} rec/s, stats {via['stats']}",
                flush=True,
            )
            for res in (direct, via):
                if res["rows"] != res["expected_rows"]:
                    ok = False
                    print(f"ERROR {name}: {res['rows']} rows stored, expected {res['expected_rows']}")
            report.add(
                f"{name} records/s via writer",
                via["rps"],
                "rec/s",
                baseline=direct["rps"],
                target=f">= {target:,.0f}/s",
                met=via["rps"] >= target,
                note="baseline: AuditStore.write_many batches of 500 on the same records",
            )
            report.add(f"{name} submit p50", via["submit_p50_us"], "µs")
            report.add(
                f"{name} submit p99",
                via["submit_p99_us"],
                "µs",
                target="< 1000 µs",
                met=via["submit_p99_us"] < TARGET_SUBMIT_MAX_US,
            )
            report.add(
                f"{name} submit max",
                via["submit_max_us"],
                "µs",
                target="< 1000 µs",
                met=via["submit_max_us"] < TARGET_SUBMIT_MAX_US,
                note=f"{via['submits_over_1ms']} submits over 1 ms",
            )
            report.add(
                f"{name} records dropped",
                via["stats"]["dropped"],
                "records",
                target="= 0",
                met=via["stats"]["dropped"] == 0,
            )
            pr = f"{args.paced_rate:g}/s"
            report.add(
                f"{name} paced {pr} submit p99",
                paced["submit_p99_us"],
                "µs",
                baseline=paced["noop_p99_us"],
                target="< 1000 µs",
                met=paced["submit_p99_us"] < TARGET_SUBMIT_MAX_US,
                note="baseline: a no-op call timed the same way in the same thread",
            )
            report.add(
                f"{name} paced {pr} submit max",
                paced["submit_max_us"],
                "µs",
                baseline=paced["noop_max_us"],
                target="< 1000 µs",
                met=paced["submit_max_us"] < TARGET_SUBMIT_MAX_US,
                note=f"{paced['submits_over_1ms']} submits / {paced['noops_over_1ms']} no-ops over 1 ms "
                "(GIL waits behind the writer thread)",
            )
            report.add(
                f"{name} paced records dropped",
                paced["stats"]["dropped"],
                "records",
                target="= 0",
                met=paced["stats"]["dropped"] == 0,
            )
            idle_url = url_writer
            print(f"  {name}: rounds direct {direct['rounds_rps']} rec/s, writer {via['rounds_rps']} rec/s", flush=True)

        idle = run_idle(idle_url, args.idle_seconds)
        report.details["idle_writer"] = idle
        report.add(
            "idle writer CPU",
            idle["cpu_s"] * 1000,
            f"ms/{args.idle_seconds:g} s",
            target="~0",
            met=idle["cpu_s"] < 0.001 * args.idle_seconds,
        )
        report.add(
            "idle writer wake-ups",
            idle["wakeups"],
            f"per {args.idle_seconds:g} s",
            target="<= 1",
            met=idle["wakeups"] <= 1,
            note="voluntary context switches of the writer thread",
        )
        report.add(
            "writer close() when idle", idle["close_s"] * 1000, "ms", target="< 100 ms", met=idle["close_s"] < 0.1
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
                print(f"WARNING: could not drop {pg.name}: {exc!r}")
        shutil.rmtree(tmp, ignore_errors=True)

    return report.finish(t_start, args.json_out, ok and bool(report.figures))


if __name__ == "__main__":
    sys.exit(main())
