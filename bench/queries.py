"""The audit query API over a large store: first-page latency per filter, stats, the access log's cost.

Per engine (SQLite, then PostgreSQL), in a store made for the run:

1. **Generation**: ``--records`` (1,000,000) realistic exchanges (``make_record``: 11 response
   models over 7 dialects and 8 hosts, skewed; 5,000 end users, Zipf; outcome 93 % completed,
   4 % error, 3 % client_aborted; stop reasons; tool calls on ~10 % with 20 tool names;
   violations on ~2 % with 5 kinds; a unique request id; a system and a user prompt and a
   completion of 150-900 characters of Zipf-distributed words from a 30,000-word vocabulary;
   usage with the cache and reasoning counts each vendor reports (``_usage``);
   ``started_at`` spread over 13 months, in storing order give or take a minute). Stored the
   fast way (``build``), to the state ``AuditStore.write_many`` leaves: rows from
   ``observer.store.rows.rows_from_records`` (what ``write_many`` inserts) bulk-inserted with
   the secondary indexes dropped and made again after (SQLite: ``executemany`` in transactions
   of 20,000, ``stored_seq`` 1..N and its counter, the FTS5 table filled by the migration's
   statement; PostgreSQL: ``COPY`` in transactions of 10,000, ``stored_seq`` the transaction
   id by the column's default, monthly partitions made by the store's ``Partitions``, then
   ``VACUUM ANALYZE`` as autovacuum would); the last 20 records through ``write_many`` itself.
   SQLite gets its ``ANALYZE`` from that ``write_many``, as the writer does at each doubling of
   the store (``observer.store.analyze``). Freshly built indexes are denser than
   ones grown by inserts: a lower bound of production latency on a warm cache.
2. **First page** (``limit=50``) of ``GET /v1/exchanges`` through the real API: ``observer api``
   as a subprocess (uvicorn, ``--db``, bootstrap token in ``OBSERVER_API_TOKEN``) on a free
   127.0.0.1 port, httpx as the client, one call at a time; per filter p50/p95 over ``--rounds``
   calls, the filter's value varied from call to call (every model, user, tool...), the figures
   interleaved round by round. Baseline: the same ``observer.store.query`` call in this process
   (no HTTP, auth or access log), in the same rounds. Targets: p95 <= 50 ms for the indexed
   filters, <= 300 ms for ``q``; ``GET /v1/stats`` over the whole store <= 1 s.
3. **Access log**: ``?request_id=`` (a cheap indexed call) through two API servers of this
   file's ``--serve`` mode, the same app, one with ``AccessLog._append`` a no-op, called in
   alternation: p50 and mean difference (target <= +2 ms). And ``observer.store.access.append``
   in a loop on the same store (with a checkpoint key, so its checkpoints every 100 entries
   are included) against a one-row write transaction (the floor of any durable append).

4. **The stats indexes' width** (``--covering``, or alone ``--covering-only``; always in
   ``--smoke``): migration 0011 made the indexes stats reads hold the cache and reasoning
   token counts too. On the same store the indexes as migrated and as before 0011
   (``SUMMED_0010``), alternated three times, then as migrated again; per phase every stats
   grouping in process (the new query; on the old indexes also the old query, the "before",
   and the new one, which there reads the table), ``write_many`` of new records in batches
   (wall and CPU ms per record: the insert cost of the wider indexes), the indexes' size and
   the time to make them again (what the migration does to a stored store).

Plans: the SQL of every figure (captured from the baseline's engine) is explained (``EXPLAIN
QUERY PLAN`` / ``EXPLAIN (ANALYZE, BUFFERS)``) for each figure that misses its target, or all
with ``--explain``.

    .venv/bin/python bench/queries.py                      # 1,000,000 records per engine (~30-40 min)
    .venv/bin/python bench/queries.py --smoke              # 20,000 records (~45 s; no VACUUM ANALYZE)
    .venv/bin/python bench/queries.py --records 200000 --engines sqlite --explain
    .venv/bin/python bench/queries.py --keep --dir build/q   # keep both stores (URLs printed) ...
    .venv/bin/python bench/queries.py --reuse sqlite:///build/q/queries.db   # ... and measure one again
    .venv/bin/python bench/queries.py --covering           # ... and the stats indexes' width (~10 min more)
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import hashlib
import itertools
import os
import random
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402
import orjson  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from bench._common import Report, cpu_seconds, percentile  # noqa: E402
from bench._pg import PgDatabase  # noqa: E402
from observer.records import Block, ErrorInfo, Exchange, RequestFacts, ToolCall, Usage, Violation  # noqa: E402
from observer.shape import parse_rfc3339  # noqa: E402
from observer.store import access, query, search  # noqa: E402
from observer.store.checkpoint import CheckpointKey  # noqa: E402
from observer.store.migrate import upgrade  # noqa: E402
from observer.store.models import (  # noqa: E402
    SQLITE_DAY,
    STATS_GROUPED,
    STATS_SUMMED,
    BlockRow,
    ExchangeRow,
    StoreMetaRow,
    ToolCallRow,
    UTCDateTime,
    ViolationRow,
)
from observer.store.partitions import Partitions  # noqa: E402
from observer.store.rows import rows_from_records  # noqa: E402
from observer.store.store import AuditStore  # noqa: E402
from observer.store.stored import COUNTER_KEY  # noqa: E402

PG_URL = os.environ.get("OBSERVER_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
TOKEN = "bench-queries-bootstrap-token-0123456789"
PAGE_TARGET_MS = 50.0
SEARCH_TARGET_MS = 300.0
STATS_TARGET_MS = 1000.0
ACCESS_TARGET_MS = 2.0
WRITER = "00000000-0000-4000-8000-00000000beef"
STORE_ADDED = ("conversation_id", "resumes_id", "key_owner")  # what the store adds to a record (not generated)
TAIL = 20  # records stored by write_many itself, after the bulk
SLOW_MS = 20_000.0  # a figure whose first call takes longer is not measured further

# --------------------------------------------------------------------------------------------
# the records

#: The store's span: 13 months (395 days) of traffic ending here.
T_END = datetime(2026, 12, 1, tzinfo=timezone.utc)
SPAN = timedelta(days=395)
T_START = T_END - SPAN

#: (response model, request model, dialect, host, weight): 11 deployments of 10 models, skewed.
MODELS = (
    ("gpt-4o-mini-2024-07-18", "gpt-4o-mini", "openai.chat", "api.openai.com", 30),
    ("gpt-4o-2024-08-06", "gpt-4o", "openai.chat", "api.openai.com", 16),
    ("o3-mini-2025-01-31", "o3-mini", "openai.responses", "api.openai.com", 6),
    ("claude-sonnet-4-20250514", "claude-sonnet-4-0", "anthropic.messages", "api.anthropic.com", 14),
    ("claude-3-5-haiku-20241022", "claude-3-5-haiku-latest", "anthropic.messages", "api.anthropic.com", 8),
    ("gemini-2.0-flash", "gemini-2.0-flash", "gemini", "generativelanguage.googleapis.com", 9),
    ("gemini-1.5-pro-002", "gemini-1.5-pro", "gemini", "europe-west4-aiplatform.googleapis.com", 3),
    ("llama3.1:8b", "llama3.1:8b", "ollama", "ollama.internal", 6),
    ("gpt-4o-mini-2024-07-18", "gpt-4o-mini", "vercel.ui", "chat.example.com", 5),
    ("mistral-large-2411", "mistral-large-latest", "openai.chat", "api.mistral.ai", 2),
    ("qwen2.5-72b-instruct", "qwen2.5-72b", "llm-stream-1.0", "llm-gateway.internal", 1),
)
USERS = 5_000
TOOLS = (
    "get_weather search_web lookup_order create_ticket send_email query_database read_file write_file"
    " run_python get_stock_price translate_text book_meeting list_calendar get_customer refund_payment"
    " fetch_url summarize_document classify_intent get_exchange_rate schedule_reminder"
).split()
VIOLATIONS = (
    ("seq_gap", 50),
    ("missing_stream_end", 20),
    ("undeclared_tool", 15),
    ("invalid_json", 10),
    ("oversize_event", 5),
)
#: Planted in the user prompt of 1 record in ``RARE_EVERY``: the rare search word.
RARE_WORD = "quetzalcoatlus"
RARE_EVERY = 20_000
#: Words of the two-word queries: ordinary vocabulary (Zipf ranks 150 and 300, ~9 % and ~5 % of records).
TWO_WORDS = ("invoice", "refund")
COMMON_WORDS = ("the", "of", "and", "to")

_COMMON = (
    "the of and to a in is that for it as with on be by this are or from at an which not have can you"
    " your we will if but all has was their they more one about its there when what so been also use"
    " into these may other some any each how only than then such our them should would could like"
).split()
_SYLLABLES = (
    "ba be bi bo bu ca ce ci co da de di do fa fe fi ga ge go ka ke ki ko la le li lo lu ma me mi mo"
    " na ne ni no pa pe pi po ra re ri ro sa se si so ta te ti to va ve vi za ze zo"
).split()


class Corpus:
    """The vocabulary (30,000 terms, Zipf-distributed: the usual English words first, then
    pseudo-words; a long stream of them that records take slices of), the 20 system prompts
    and the weights of the varied fields. Deterministic."""

    def __init__(self, n: int, seed: int = 7) -> None:
        rng = random.Random(seed)
        self.n = n
        words = list(_COMMON)
        seen = set(words)
        while len(words) < 30_000:
            w = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4)))
            if w not in seen:
                seen.add(w)
                words.append(w)
        for rank, w in zip((150, 300), TWO_WORDS, strict=True):
            words.insert(rank, w)
        self.words = words
        cum = list(itertools.accumulate(1.0 / (r + 1) ** 1.02 for r in range(len(words))))
        self.stream = " ".join(rng.choices(words, cum_weights=cum, k=3_000_000))
        self.systems = [self.prose(rng, rng.randint(120, 300)) for _ in range(20)]
        self.model_cum = list(itertools.accumulate(m[4] for m in MODELS))
        self.user_cum = list(itertools.accumulate(1.0 / (u + 1) ** 0.8 for u in range(USERS)))
        self.tool_cum = list(itertools.accumulate(1.0 / (t + 1) for t in range(len(TOOLS))))
        self.violation_cum = list(itertools.accumulate(v[1] for v in VIOLATIONS))

    def prose(self, rng: random.Random, chars: int) -> str:
        """About ``chars`` characters of the word stream from a random place, as a sentence."""
        start = self.stream.find(" ", rng.randrange(len(self.stream) - chars - 100)) + 1
        end = self.stream.find(" ", start + chars)
        out = self.stream[start:end]
        return out[:1].upper() + out[1:] + "."

    def started_at(self, i: int, rng: random.Random) -> datetime:
        """Record ``i``'s start: spread evenly over ``SPAN`` in storing order, give or take a minute."""
        return T_START + SPAN * ((i + 0.5) / self.n) + timedelta(seconds=rng.uniform(-60, 60))


def _pick(rng: random.Random, cum: list[float]) -> int:
    return bisect.bisect_right(cum, rng.random() * cum[-1])


def request_id(i: int) -> str:
    """Record ``i``'s request id (unique)."""
    return "req_" + hashlib.blake2b(i.to_bytes(8, "big"), digest_size=12).hexdigest()


def user_name(rank: int) -> str:
    return f"user-{rank:04d}"


def make_record(c: Corpus, i: int, rng: random.Random) -> Exchange:
    """Record ``i`` of the store."""
    model, req_model, dialect, host, _ = MODELS[_pick(rng, c.model_cum)]
    started = c.started_at(i, rng)
    prompt = c.prose(rng, rng.randint(80, 500))
    if i % RARE_EVERY == RARE_EVERY // 2:
        prompt += f" {RARE_WORD}"
    system = c.systems[rng.randrange(len(c.systems))]
    messages = [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
    roll = rng.random()
    outcome = "completed" if roll < 0.93 else "error" if roll < 0.97 else "client_aborted"
    text = "" if outcome == "error" else c.prose(rng, rng.randint(150, 900))
    tool_calls = []
    stop_reason = stop_raw = None
    if outcome == "completed":
        if rng.random() < 0.10:
            for k in range(1 + (rng.random() < 0.2)):
                name = TOOLS[_pick(rng, c.tool_cum)]
                tool_calls.append(ToolCall(index=k, id=f"call_{i:09d}_{k}", name=name, arguments='{"q": 1}'))
            stop_reason, stop_raw = "tool_use", "tool_calls"
        else:
            stop_reason, stop_raw = ("max_tokens", "length") if rng.random() < 0.08 else ("end_turn", "stop")
    violations = []
    if rng.random() < 0.02:
        kind = VIOLATIONS[_pick(rng, c.violation_cum)][0]
        violations.append(Violation(kind=kind, seq=rng.randint(1, 400), detail="expected 41, got 43"))
    return Exchange(
        id=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        dialect=dialect,
        scheme="https",
        host=host,
        port=443,
        path="/v1/chat/completions",
        method="POST",
        http_version="HTTP/2.0",
        status_code=529 if outcome == "error" else 200,
        started_at=started,
        ended_at=started + timedelta(seconds=rng.uniform(0.5, 30)),
        ttft_s=round(rng.uniform(0.15, 2.0), 3),
        request_id=request_id(i),
        request=RequestFacts(
            stream=True,
            model=req_model,
            messages=messages,
            parameters={"temperature": 0.7, "max_tokens": 1024},
            body_bytes=len(prompt) + len(system) + 200,
            tool_names=sorted({t.name for t in tool_calls if t.name}),
            end_user=user_name(_pick(rng, c.user_cum)),
        ),
        model=None if outcome == "error" else model,
        blocks=[Block(index=0, type="text", text=text, stop_reason=stop_reason)] if text else [],
        tool_calls=tool_calls,
        usage=_usage(i, dialect, model, (len(prompt) + len(system)) // 4, len(text) // 4 + 3, outcome == "completed"),
        stop_reason=stop_reason,
        stop_reason_raw=stop_raw,
        error=ErrorInfo(code="overloaded_error", message="Overloaded") if outcome == "error" else None,
        outcome=outcome,
        violations=violations,
        response_bytes=len(text) * 3 + 500,
        events=len(text) // 4 + 4,
    )


def _usage(i: int, dialect: str, model: str, input_tokens: int, output_tokens: int, reported: bool) -> Usage:
    """Record ``i``'s usage, with the cost classes as each vendor reports them (from ``i``, not
    the random stream, so the other fields stay as they were): OpenAI always sends its cached
    tokens (a third of its requests read half their input from the cache) and its reasoning
    tokens (o3-mini: half the output, else 0); Anthropic always both cache counts (a quarter
    read, an eighth write); Gemini a cached count only when there was one, thoughts from
    gemini-2.0-flash; Ollama and the draft none (null: not reported)."""
    if not reported:  # counts with reported false, as this bench always made them
        return Usage(input_tokens=input_tokens, output_tokens=output_tokens, reported=False)
    cache_read = cache_creation = reasoning = None
    if dialect in ("openai.chat", "openai.responses", "vercel.ui"):
        cache_read = input_tokens // 2 if i % 3 == 0 else 0
        reasoning = output_tokens // 2 if model.startswith("o3") else 0
    elif dialect == "anthropic.messages":
        cache_read = input_tokens // 2 if i % 4 == 0 else 0
        cache_creation = input_tokens // 3 if i % 8 == 1 else 0
    elif dialect == "gemini":
        cache_read = input_tokens // 2 if i % 5 == 0 else None
        reasoning = output_tokens // 3 if model == "gemini-2.0-flash" else None
    return Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cache_read_input_tokens=cache_read,
        cache_creation_input_tokens=cache_creation,
        reasoning_output_tokens=reasoning,
        reported=True,
    )


def make_batch(c: Corpus, start: int, stop: int) -> list[Exchange]:
    """Records ``start..stop-1`` (deterministic in ``start``)."""
    rng = random.Random(start * 7919 + 13)
    return [make_record(c, i, rng) for i in range(start, stop)]


# --------------------------------------------------------------------------------------------
# the store

EXCHANGE_TABLES = ("exchanges", "exchange_blocks", "exchange_tool_calls", "exchange_violations")
SQLITE_TX = 20_000
PG_TX = 10_000


def _converters(table: sa.Table, sqlite: bool) -> dict[str, Callable[[Any], Any]]:
    out: dict[str, Callable[[Any], Any]] = {}
    for col in table.columns:
        if isinstance(col.type, UTCDateTime) and sqlite:
            out[col.name] = lambda v: None if v is None else v.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
        elif isinstance(col.type, sa.JSON):
            out[col.name] = lambda v: None if v is None else orjson.dumps(v).decode()
        elif isinstance(col.type, sa.Boolean) and sqlite:
            out[col.name] = lambda v: None if v is None else int(v)
    return out


def _row_batches(c: Corpus, stop: int, tx: int, sqlite: bool):
    """Per transaction: {table name: (columns, tuples)} and the records' start times."""
    tables = {
        t.name: t for t in (ExchangeRow.__table__, BlockRow.__table__, ToolCallRow.__table__, ViolationRow.__table__)
    }
    skip = {"created_at"} | (set() if sqlite else {"stored_seq"})
    columns = {name: [col.name for col in t.columns if col.name not in skip] for name, t in tables.items()}
    conv = {name: _converters(t, sqlite) for name, t in tables.items()}
    for start in range(0, stop, tx):
        records = make_batch(c, start, min(stop, start + tx))
        exchanges, children = rows_from_records(records)
        for n, row in enumerate(exchanges):
            i = start + n
            row.update(
                writer_id=WRITER,
                seq=i + 1,
                record_hash=hashlib.sha256(row["id"].encode()).hexdigest(),
                stored_seq=i + 1,
                conversation_id=None,
                continuation_hash=None,
                resumes_id=None,
                search_vector=None,  # PostgreSQL: made by the server after the load (below)
            )
        by_table = {"exchanges": exchanges, **{t.name: rows for t, rows in children.items()}}
        out = {}
        for name, rows in by_table.items():
            cols, cv = columns[name], conv[name]
            out[name] = (cols, [tuple(cv[k](r[k]) if k in cv else r[k] for k in cols) for r in rows])
        yield out, [r.started_at for r in records]


def build(url: str, c: Corpus, n: int, *, analyze: bool = True) -> dict[str, float]:
    """``n`` records in the migrated, empty store at ``url`` (module docstring); returns the
    seconds of each step. ``analyze=False`` (smoke): no ``VACUUM ANALYZE`` on PostgreSQL."""
    sqlite = url.startswith("sqlite")
    bulk = n - TAIL
    steps: dict[str, float] = {}
    t = time.perf_counter()
    if sqlite:
        raw = sqlite3.connect(make_url(url).database, isolation_level=None)
        raw.execute("PRAGMA journal_mode=WAL")
        raw.execute("PRAGMA synchronous=OFF")
        raw.execute("PRAGMA cache_size=-1000000")
        marks = ",".join("?" * len(EXCHANGE_TABLES))
        indexes = raw.execute(
            f"SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL AND tbl_name IN ({marks})",
            EXCHANGE_TABLES,
        ).fetchall()
        for name, _ in indexes:
            raw.execute(f'DROP INDEX "{name}"')
        for batch, _times in _row_batches(c, bulk, SQLITE_TX, True):
            raw.execute("BEGIN")
            for table, (cols, rows) in batch.items():
                if rows:
                    names, qs = ", ".join(f'"{x}"' for x in cols), ", ".join("?" * len(cols))
                    raw.executemany(f"INSERT INTO {table} ({names}) VALUES ({qs})", rows)
            raw.execute("COMMIT")
        steps["insert"] = time.perf_counter() - t
        t = time.perf_counter()
        for _, ddl in indexes:
            raw.execute(ddl)
        steps["indexes"] = time.perf_counter() - t
        t = time.perf_counter()
        raw.execute("BEGIN")
        raw.execute(
            f"INSERT INTO {search.FTS_TABLE} (rowid, prompt, completion) "
            f"SELECT stored_seq, {search.PROMPT_SQLITE}, text FROM exchanges"
        )
        raw.execute("UPDATE store_meta SET value = ? WHERE key = ?", (str(bulk), COUNTER_KEY))
        raw.execute("COMMIT")
        raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        raw.close()
        steps["fts"] = time.perf_counter() - t
    else:
        import psycopg

        months = [T_START + timedelta(days=d) for d in range(-2, SPAN.days + 3, 10)]
        Partitions().ensure(sa.create_engine(url, poolclass=sa.NullPool), months)
        dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(dsn, autocommit=True) as conn:
            found = conn.execute(
                "SELECT i.relname, pg_get_indexdef(i.oid) FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
                "JOIN pg_class t ON t.oid = x.indrelid WHERE t.relname = ANY(%s) AND t.relkind = 'p' "
                "AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.oid)",
                (list(EXCHANGE_TABLES),),
            ).fetchall()
            for name, _ in found:
                conn.execute(f'DROP INDEX "{name}"')
            conn.execute("SET session_replication_role = replica")  # no foreign-key triggers while loading
            for batch, _times in _row_batches(c, bulk, PG_TX, False):
                with conn.transaction(), conn.cursor() as cur:
                    for table, (cols, rows) in batch.items():
                        if rows:
                            names = ", ".join(f'"{x}"' for x in cols)
                            with cur.copy(f"COPY {table} ({names}) FROM STDIN") as cp:
                                for row in rows:
                                    cp.write_row(row)
            conn.execute("SET session_replication_role = DEFAULT")
            steps["insert"] = time.perf_counter() - t
            t = time.perf_counter()
            # The search words, as the migration makes them for stored rows (the corpus is ASCII:
            # the writer's folding is only the lower-casing the simple configuration does too).
            conn.execute(f"UPDATE exchanges SET search_vector = {search.BACKFILL_VECTOR_PG}")
            steps["search_vector"] = time.perf_counter() - t
            t = time.perf_counter()
            conn.execute("SET maintenance_work_mem = '1GB'")
            for _, ddl in found:
                conn.execute(ddl.replace(" ON ONLY ", " ON "))
            steps["indexes"] = time.perf_counter() - t
            t = time.perf_counter()
            for table in EXCHANGE_TABLES if analyze else ():
                conn.execute(f"VACUUM (ANALYZE) {table}")
            steps["vacuum_analyze"] = time.perf_counter() - t
    t = time.perf_counter()
    store = AuditStore(url)
    try:
        store.write_many(make_batch(c, bulk, n))
        with store.engine.connect() as conn:
            count = conn.scalar(sa.select(sa.func.count()).select_from(ExchangeRow.__table__))
            if sqlite:
                fts = conn.scalar(sa.text(f"SELECT count(*) FROM {search.FTS_TABLE}"))
                if fts != n:
                    raise RuntimeError(f"FTS rows {fts} != {n}")
        if count != n:
            raise RuntimeError(f"stored {count} records, not {n}")
        for i in (0, bulk // 2, bulk - 1, n - 1):  # read back as the API does: what was generated
            (want,) = make_batch(c, i - i % (SQLITE_TX if sqlite else PG_TX) if i < bulk else bulk, i + 1)[-1:]
            got = store.get(want.id)
            if got is None or {k: v for k, v in got.items() if k not in STORE_ADDED} != want.to_dict():
                raise RuntimeError(f"record {i} does not read back as generated")
    finally:
        store.dispose()
    steps["write_many_tail"] = time.perf_counter() - t
    return steps


# --------------------------------------------------------------------------------------------
# what is measured


@dataclass
class Spec:
    """One figure: ``params(round)`` are the HTTP query parameters of that round's call."""

    label: str
    path: str
    params: Callable[[int], dict[str, str]]
    target_ms: float
    samples: list[float] = field(default_factory=list)
    direct: list[float] = field(default_factory=list)
    items: list[int] = field(default_factory=list)
    sql: tuple[str, Any] | None = None
    failed: str | None = None


def _month(k: int) -> dict[str, str]:
    """The ``k``-th whole calendar month of the span (cycling): since, until."""
    months = [(2025 + (10 + m) // 12, (10 + m) % 12 + 1) for m in range(13)]  # 2025-11 .. 2026-11
    y, mo = months[k % len(months)]
    ny, nmo = (y + 1, 1) if mo == 12 else (y, mo + 1)
    return {"since": f"{y}-{mo:02d}-01T00:00:00Z", "until": f"{ny}-{nmo:02d}-01T00:00:00Z"}


def specs(c: Corpus, n: int, mid_position: str) -> list[Spec]:
    models = sorted({m[0] for m in MODELS})
    request_models = sorted({m[1] for m in MODELS})
    dialects = sorted({m[2] for m in MODELS})
    hosts = sorted({m[3] for m in MODELS})
    users = [user_name(r) for r in (0, 1, 3, 7, 15, 40, 100, 250, 600, 1200, 2500, 4999)]
    outcomes = ["completed", "error", "client_aborted"]
    stops = ["end_turn", "max_tokens", "tool_use"]
    kinds = [v[0] for v in VIOLATIONS]
    rid_rng = random.Random(99)
    rids = [request_id(rid_rng.randrange(n)) for _ in range(1000)]
    pairs = [" ".join(TWO_WORDS), f"{c.words[120]} {c.words[260]}", f"{c.words[200]} {c.words[180]}"]

    def cyc(values: list[str]) -> Callable[[int], str]:
        return lambda k: values[k % len(values)]

    def one(name: str, values: list[str]) -> Callable[[int], dict[str, str]]:
        pick = cyc(values)
        return lambda k: {name: pick(k)}

    ex, st, P, Q, S = "/v1/exchanges", "/v1/stats", PAGE_TARGET_MS, SEARCH_TARGET_MS, STATS_TARGET_MS
    return [
        Spec("no filter", ex, lambda k: {}, P),
        Spec("model", ex, one("model", models), P),
        Spec("request_model", ex, one("request_model", request_models), P),
        Spec("dialect", ex, one("dialect", dialects), P),
        Spec("host", ex, one("host", hosts), P),
        Spec("user", ex, one("user", users), P),
        Spec("outcome", ex, one("outcome", outcomes), P),
        Spec("stop_reason", ex, one("stop_reason", stops), P),
        Spec("tool", ex, one("tool", TOOLS), P),
        Spec("violation", ex, one("violation", kinds), P),
        Spec("request_id", ex, one("request_id", rids), P),
        Spec("since+until (a month)", ex, _month, P),
        Spec("model+outcome", ex, lambda k: {"model": models[k % 10], "outcome": outcomes[k % 3]}, P),
        Spec("host+user", ex, lambda k: {"host": hosts[k % 8], "user": users[k % len(users)]}, P),
        Spec("model+since/until", ex, lambda k: {"model": models[k % 10], **_month(k // 10)}, P),
        Spec("tool+model", ex, lambda k: {"tool": TOOLS[k % 20], "model": models[k % 10]}, P),
        Spec("recorded_after=0", ex, lambda k: {"recorded_after": query.START}, P),
        Spec("recorded_after=mid-store", ex, lambda k: {"recorded_after": mid_position}, P),
        Spec(f"q rare word ({RARE_WORD})", ex, lambda k: {"q": RARE_WORD}, Q),
        Spec("q common word (the, of, ...)", ex, one("q", list(COMMON_WORDS)), Q),
        Spec("q two words", ex, one("q", pairs), Q),
        Spec("stats group_by=day", st, lambda k: {"group_by": "day"}, S),
        Spec("stats group_by=model", st, lambda k: {"group_by": "model"}, S),
    ]


def direct_call(engine: sa.Engine, path: str, params: dict[str, str]) -> int:
    """The baseline: ``observer.store.query`` as the route calls it; returns the items/groups."""
    p = dict(params)
    after, group_by = p.pop("recorded_after", None), p.pop("group_by", None)
    times = {k: parse_rfc3339(p.pop(k)) for k in ("since", "until") if k in p}
    filters = query.Filters(**times, **p)
    if path == "/v1/stats":
        return len(query.stats(engine, group_by or "day", filters))
    if after is not None:
        return len(query.feed(engine, filters, after, 50)[0])
    return len(query.page(engine, filters, 50)[0])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """An API server subprocess in its own process group: ``observer api`` or this file's ``--serve``."""

    def __init__(self, url: str, data: Path, *, mode: str = "cli") -> None:
        self.port = _free_port()
        env = {**os.environ, "OBSERVER_API_TOKEN": TOKEN, "OBSERVER_DATA_DIR": str(data)}
        if mode == "cli":
            cmd = [str(Path(sys.executable).parent / "observer"), "api", "--db", url, "--host", "127.0.0.1"]
            cmd += ["--port", str(self.port)]
        else:
            cmd = [sys.executable, __file__, "--serve", url, "--port", str(self.port), "--data", str(data)]
            cmd += ["--no-append"] if mode == "no-append" else []
        self.log = data / f"server-{self.port}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"API server exited: {self.log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.base + "/readyz", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("API server did not become ready in 60 s")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


def serve(args: argparse.Namespace) -> int:
    """``--serve``: the API app as ``observer api`` builds it; ``--no-append``: the access log's
    append a no-op (everything else, authentication and the entry's thread hop included, as is)."""
    import uvicorn

    from observer.api.access import AccessLog
    from observer.api.app import create_app

    if args.no_append:
        AccessLog._append = lambda self, entry: None  # type: ignore[method-assign]
    data = Path(args.data)
    key = CheckpointKey.load_or_create(data / "checkpoint-key.pem")
    uvicorn.run(create_app(AuditStore(args.serve), TOKEN, key), host="127.0.0.1", port=args.port, log_level="warning")
    return 0


def _client(base: str) -> httpx.Client:
    return httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=SLOW_MS * 3 / 1000)


def _ms(values: list[float]) -> dict[str, float]:
    return {"p50": percentile(values, 50), "p95": percentile(values, 95), "n": len(values)}


def measure_http(engine: sa.Engine, client: httpx.Client, all_specs: list[Spec], rounds: int, budget_s: float) -> bool:
    """Every spec once per round (API, then the direct baseline), after one unmeasured call of
    each; a spec whose calls have taken ``budget_s`` stops early (with at least 5 samples)."""
    ok = True
    captured: dict[str, tuple[str, Any]] = {}

    def capture(conn, cursor, statement, parameters, context, executemany):  # noqa: ANN001
        captured["last"] = (statement, parameters)

    sa.event.listen(engine, "before_cursor_execute", capture)
    try:
        for k in range(-1, rounds):
            for s in all_specs:
                spent = sum(s.samples) / 1000 + sum(s.direct) / 1000
                if s.failed or (k >= 5 and spent > budget_s):
                    continue
                params = s.params(max(k, 0))
                t = time.perf_counter()
                try:
                    r = client.get(s.path, params=params)
                except httpx.HTTPError as exc:
                    s.failed = f"{type(exc).__name__} after {time.perf_counter() - t:.0f} s"
                    print(f"  {s.label}: {s.failed}", flush=True)
                    ok = False
                    continue
                api_ms = (time.perf_counter() - t) * 1000
                if r.status_code != 200:
                    print(f"  {s.label}: HTTP {r.status_code} {r.text[:300]}", flush=True)
                    ok = False
                    continue
                body = r.json()
                got = len(body["groups"] if "groups" in body else body["items"])
                t = time.perf_counter()
                direct = direct_call(engine, s.path, params)
                direct_ms = (time.perf_counter() - t) * 1000
                if direct != got:
                    print(f"  {s.label}: API gave {got} items, the direct call {direct}", flush=True)
                if k < 0:
                    s.sql = captured.get("last")
                    if api_ms > SLOW_MS:
                        s.failed = f"its first call took {api_ms / 1000:.0f} s: not measured"
                        print(f"  {s.label}: {s.failed}", flush=True)
                    continue
                s.samples.append(api_ms)
                s.direct.append(direct_ms)
                s.items.append(got)
    finally:
        sa.event.remove(engine, "before_cursor_execute", capture)
    return ok


def explain(engine: sa.Engine, sql: tuple[str, Any]) -> str:
    statement, parameters = sql
    sqlite = engine.dialect.name == "sqlite"
    prefix = "EXPLAIN QUERY PLAN " if sqlite else "EXPLAIN (ANALYZE, BUFFERS) "
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(prefix + statement, parameters).all()
    if sqlite:
        return "\n".join(f"{r[0]:>4} {r[1]:>4} {r[3]}" for r in rows)
    return "\n".join(r[0] for r in rows)


def measure_access(url: str, data: Path, pairs: int) -> dict[str, Any]:
    """``?request_id=`` through two ``--serve`` servers (access log appended / no-op), alternating."""
    servers = {"logged": Server(url, data, mode="serve"), "no-op": Server(url, data, mode="no-append")}
    rng = random.Random(5)
    out: dict[str, list[float]] = {name: [] for name in servers}
    try:
        clients = {name: _client(s.base) for name, s in servers.items()}
        for k in range(pairs + 10):
            rid = request_id(rng.randrange(1_000))
            order = list(servers) if k % 2 == 0 else list(reversed(list(servers)))
            for name in order:
                t = time.perf_counter()
                r = clients[name].get("/v1/exchanges", params={"request_id": rid})
                ms = (time.perf_counter() - t) * 1000
                if r.status_code != 200:
                    raise RuntimeError(f"{name}: HTTP {r.status_code} {r.text[:200]}")
                if k >= 10:
                    out[name].append(ms)
        for c in clients.values():
            c.close()
    finally:
        for s in servers.values():
            s.stop()
    return out


def measure_append(url: str, data: Path, n: int) -> dict[str, list[float]]:
    """``access.append`` ``n`` times (passing back the checkpoint it saw, as the API does)
    against a one-row write transaction, alternating."""
    store = AuditStore(url)
    key = CheckpointKey.load_or_create(data / "checkpoint-key.pem")
    meta = StoreMetaRow.__table__
    out: dict[str, list[float]] = {"append": [], "one-row tx": []}
    checkpointed = None  # passed back as the API does (observer.api.access)
    try:
        store_id = store.store_id()
        with store.engine.begin() as conn:  # a kept store (--reuse) has it from its first run
            conn.execute(sa.delete(meta).where(meta.c.key == "bench_queries"))
            conn.execute(sa.insert(meta), [{"key": "bench_queries", "value": "0"}])
        for k in range(n + 10):
            entry = access.Entry(
                at=datetime.now(timezone.utc),
                principal="bench",
                role="admin",
                client="127.0.0.1",
                method="GET",
                endpoint="/v1/exchanges",
                path="/v1/exchanges",
                params={"query": {"request_id": request_id(k), "limit": "50"}},
                status=200,
                rows=1,
                ids=[str(uuid.UUID(int=k, version=4))],
            )
            t = time.perf_counter()
            checkpointed = access.append(store.engine, store_id, entry, key, checkpointed=checkpointed).checkpointed
            a = (time.perf_counter() - t) * 1000
            t = time.perf_counter()
            with store.engine.begin() as conn:
                conn.execute(sa.update(meta).where(meta.c.key == "bench_queries").values(value=str(k)))
            b = (time.perf_counter() - t) * 1000
            if k >= 10:
                out["append"].append(a)
                out["one-row tx"].append(b)
    finally:
        store.dispose()
    return out


# --------------------------------------------------------------------------------------------
# the width of the stats indexes (migration 0011): stats time and insert cost, A/B/A

#: The indexes stats reads, by name, with their key columns (SQLite also ``ix_exchanges_day``).
STATS_INDEXES = {
    "ix_exchanges_started_at_id": ("started_at", "id"),
    **{f"ix_exchanges_{column}_started_at_id": (column, "started_at", "id") for column in STATS_GROUPED},
}
DAY_INDEX = "ix_exchanges_day"
#: What those indexes held after their keys before migration 0011: the baseline.
SUMMED_0010 = ("input_tokens", "output_tokens", "usage_reported")
STATS_GROUPS = ("day", "model", "user", "dialect", "host")


def stats_0010(engine: sa.Engine, group_by: str) -> int:
    """``query.stats`` without filters as it was before migration 0011 (sums of input and
    output tokens, ``usage_not_reported``): the baseline's statement. Returns the groups."""
    ex = ExchangeRow.__table__
    if group_by == "day" and engine.dialect.name == "sqlite":
        key = group = sa.literal_column(SQLITE_DAY)
    elif group_by == "day":
        group = sa.func.date_trunc("day", sa.func.timezone("UTC", ex.c.started_at))
        key = sa.func.to_char(group, "YYYY-MM-DD")
    else:
        key = group = ex.c[query.COLUMN_FILTERS[group_by]]
    key = key.label("key")
    stmt = (
        sa.select(
            key,
            sa.func.count().label("exchanges"),
            sa.func.coalesce(sa.func.sum(ex.c.input_tokens), 0),
            sa.func.coalesce(sa.func.sum(ex.c.output_tokens), 0),
            sa.func.coalesce(sa.func.sum(sa.case((ex.c.usage_reported, sa.literal(0)), else_=sa.literal(1))), 0),
        )
        .where(sa.and_(sa.literal(True)))
        .group_by(group)
        .order_by(key.asc().nulls_last())
    )
    with engine.connect() as conn:
        return len(conn.execute(stmt).all())


def set_stats_indexes(url: str, summed: tuple[str, ...]) -> float:
    """Makes the indexes stats reads again with ``summed`` after their keys, as migration 0011
    does (SQLite: each then analyzed, as the writer's statistics had it); returns the seconds."""
    sqlite = url.startswith("sqlite")
    wanted = {name: [*keys, *summed] for name, keys in STATS_INDEXES.items()}
    if sqlite:
        wanted[DAY_INDEX] = [SQLITE_DAY, *summed]
    t = time.perf_counter()
    if sqlite:
        raw = sqlite3.connect(make_url(url).database, isolation_level=None)
        try:
            for name, columns in wanted.items():
                raw.execute(f'DROP INDEX "{name}"')
                raw.execute(f'CREATE INDEX "{name}" ON exchanges ({", ".join(columns)})')
                raw.execute(f'ANALYZE "{name}"')
        finally:
            raw.close()
    else:
        engine = sa.create_engine(url, poolclass=sa.NullPool, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql("SET maintenance_work_mem = '1GB'")
                for name, columns in wanted.items():
                    conn.exec_driver_sql(f'DROP INDEX "{name}"')
                    conn.exec_driver_sql(f'CREATE INDEX "{name}" ON exchanges ({", ".join(columns)})')
        finally:
            engine.dispose()
    return time.perf_counter() - t


def stats_index_bytes(engine: sa.Engine) -> int | None:
    """Bytes of the indexes stats reads (PostgreSQL: every partition's); ``None`` where SQLite
    was built without the ``dbstat`` table."""
    names = [*STATS_INDEXES, *([DAY_INDEX] if engine.dialect.name == "sqlite" else [])]
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            try:
                found = conn.exec_driver_sql(
                    f"SELECT sum(pgsize) FROM dbstat WHERE name IN ({', '.join('?' * len(names))})", tuple(names)
                ).scalar()
            except sa.exc.OperationalError:
                return None
        else:
            found = conn.execute(
                sa.text(
                    "SELECT sum(pg_relation_size(i.inhrelid)) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhparent"
                    " WHERE c.relname = ANY(:names) AND c.relkind = 'I'"
                ),
                {"names": names},
            ).scalar()
    return int(found or 0)


def _timed_ms(call: Callable[[], object]) -> float:
    t = time.perf_counter()
    call()
    return (time.perf_counter() - t) * 1000


def _server_pids(store: AuditStore) -> list[int]:
    """The PostgreSQL server processes of the store's database (its pooled connections: their
    CPU is the server's share of a write); none on SQLite, which works in this process."""
    if store.engine.dialect.name == "sqlite":
        return []
    with store.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
        return [r[0] for r in rows]


def _cpu_s(pids: list[int]) -> float:
    """CPU seconds of this process and of ``pids`` (0 for one that cannot be read: a remote server)."""
    total = time.process_time()
    for pid in pids:
        with contextlib.suppress(OSError):
            total += cpu_seconds(pid)
    return total


def measure_inserts(store: AuditStore, c: Corpus, batches: int, size: int) -> dict[str, list[float]]:
    """Per ``write_many`` call of ``size`` new records (after the store's last one: new ids,
    start times past the corpus' end; made before the clocks start), ``batches`` times: wall
    ms per record and CPU ms per record, this process's plus, on PostgreSQL, its server
    processes' (the CPU figure moves less with the other work on a shared machine)."""
    with store.engine.connect() as conn:
        start = conn.scalar(sa.select(sa.func.count()).select_from(ExchangeRow.__table__)) or 0
    out: dict[str, list[float]] = {"wall": [], "cpu": []}
    for k in range(batches):
        records = make_batch(c, start + k * size, start + (k + 1) * size)
        pids = _server_pids(store)
        cpu = _cpu_s(pids)
        out["wall"].append(_timed_ms(lambda records=records: store.write_many(records)) / size)
        out["cpu"].append((_cpu_s(pids) - cpu) * 1000 / size)
    return out


def _phase(label: str, name: str, store: AuditStore, url: str, c: Corpus, args: argparse.Namespace) -> dict[str, Any]:
    """One phase of ``measure_covering``: the indexes made again with ``SUMMED_0010``
    (``"0010"``) or ``STATS_SUMMED`` (``"wide"``; also the first: a kept store may hold either),
    then measured."""
    old = name == "0010"
    rebuild_s = set_stats_indexes(url, SUMMED_0010 if old else STATS_SUMMED)
    after: dict[str, list[float]] = {g: [] for g in STATS_GROUPS}
    before: dict[str, list[float]] = {g: [] for g in STATS_GROUPS}
    for _ in range(args.covering_rounds):
        for g in STATS_GROUPS:
            after[g].append(_timed_ms(lambda g=g: query.stats(store.engine, g, query.Filters())))
            if old:
                before[g].append(_timed_ms(lambda g=g: stats_0010(store.engine, g)))
    inserts = measure_inserts(store, c, args.covering_batches, args.covering_batch)
    result = {
        "phase": name,
        "rebuild_s": rebuild_s,
        "index_bytes": stats_index_bytes(store.engine),
        "stats_ms": {g: statistics.median(v) for g, v in after.items()},
        "stats_0010_ms": {g: statistics.median(v) for g, v in before.items() if v},
        "insert_ms_per_record": statistics.median(inserts["wall"]),
        "insert_cpu_ms_per_record": statistics.median(inserts["cpu"]),
        "insert_samples": inserts,
    }
    size_mb = "-" if result["index_bytes"] is None else f"{result['index_bytes'] / 1e6:,.0f} MB"
    print(
        f"[{label}] stats indexes {name}: "
        + f"made again in {rebuild_s:.1f} s, "
        + f"{size_mb}; stats ms "
        + ", ".join(f"{g} {v:.0f}" for g, v in result["stats_ms"].items())
        + ("; the old query " if old else "")
        + ", ".join(f"{g} {v:.0f}" for g, v in result["stats_0010_ms"].items())
        + f"; write_many {result['insert_ms_per_record']:.3f} ms/record (CPU {result['insert_cpu_ms_per_record']:.3f})",
        flush=True,
    )
    return result


def measure_covering(
    label: str, engine_name: str, url: str, c: Corpus, args: argparse.Namespace, report: Report
) -> None:
    """Migration 0011's trade, on the store of the run: the stats indexes as migrated (wide:
    ``STATS_SUMMED``) and as before 0011 (``SUMMED_0010``), alternated ``--covering-cycles``
    times and wide once more (A/B/.../A: the insert cost moves by ±10 % from phase to phase on a
    shared machine, more than the difference measured). Per phase: each stats grouping
    (``--covering-rounds`` calls, interleaved: the new query, and on the 0010 indexes the old
    one, the before, and the new one, which there reads the table), ``write_many`` in
    ``--covering-batches`` batches of ``--covering-batch`` new records (wall and CPU ms per
    record), the indexes' size and the time to make them again (migration 0011's work). Each
    figure: the mean of the phases' medians, wide against 0010."""
    sqlite = engine_name == "sqlite"
    store = AuditStore(url)
    names = [*(["wide", "0010"] * args.covering_cycles), "wide"]
    try:
        phases = [_phase(label, name, store, url, c, args) for name in names]
    finally:
        store.dispose()
    report.details.setdefault("covering", {})[engine_name] = phases
    wide = [p for p in phases if p["phase"] == "wide"]
    old = [p for p in phases if p["phase"] == "0010"]

    def pick(ps: list[dict[str, Any]], key: str, group: str | None = None) -> list[float]:
        return [p[key] if group is None else p[key][group] for p in ps]

    def mean(ps: list[dict[str, Any]], key: str, group: str | None = None) -> float:
        return statistics.fmean(pick(ps, key, group))

    def spread(ps: list[dict[str, Any]], key: str, group: str | None = None) -> str:
        return " / ".join(f"{v:.3g}" for v in pick(ps, key, group))

    per = f"{len(wide)} wide and {len(old)} 0010 phases, {args.covering_rounds} calls each"
    for g in STATS_GROUPS:
        report.add(
            f"{label}: stats by {g} in process, after 0011 vs before (old query, 0010 indexes)",
            mean(wide, "stats_ms", g),
            "ms",
            baseline=mean(old, "stats_0010_ms", g),
            note=f"{per}; wide {spread(wide, 'stats_ms', g)}, before {spread(old, 'stats_0010_ms', g)}",
        )
    for g in STATS_GROUPS:
        report.add(
            f"{label}: stats by {g}, the new query on the 0010 indexes (not covered) vs after 0011",
            mean(old, "stats_ms", g),
            "ms",
            baseline=mean(wide, "stats_ms", g),
            note=f"{per}: {spread(old, 'stats_ms', g)}",
        )
    batches = f"median of {args.covering_batches} batches of {args.covering_batch} per phase"
    for what, key in (("wall", "insert_ms_per_record"), ("CPU", "insert_cpu_ms_per_record")):
        report.add(
            f"{label}: write_many {what} ms per record, wide stats indexes vs 0010's",
            mean(wide, key),
            "ms",
            baseline=mean(old, key),
            note=f"{batches}; wide {spread(wide, key)}, 0010 {spread(old, key)}"
            + ("; this process and its PostgreSQL server processes" if what == "CPU" and not sqlite else ""),
        )
    if wide[-1]["index_bytes"] is not None:
        report.add(
            f"{label}: stats indexes' size, wide vs 0010's",
            wide[-1]["index_bytes"] / 1e6,
            "MB",
            baseline=old[-1]["index_bytes"] / 1e6,
            note=", ".join(STATS_INDEXES) + (f", {DAY_INDEX}" if sqlite else ""),
        )
    report.add(
        f"{label}: making the stats indexes again (migration 0011's work), wide vs 0010's",
        mean(wide, "rebuild_s"),
        "s",
        baseline=mean(old, "rebuild_s"),
        note=f"wide {spread(wide, 'rebuild_s')}, 0010 {spread(old, 'rebuild_s')}",
    )


def _mid_position(url: str) -> str:
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    ex = ExchangeRow.__table__
    with engine.connect() as conn:
        total = conn.scalar(sa.select(sa.func.count()).select_from(ex))
        row = conn.execute(
            sa.select(ex.c.stored_seq, ex.c.id).order_by(ex.c.stored_seq, ex.c.id).offset(total // 2).limit(1)
        ).one()
    engine.dispose()
    return query.encode_position(row.stored_seq, row.id)


def _generate(label: str, engine_name: str, url: str, n: int, c: Corpus, report: Report) -> None:
    upgrade(url)
    print(f"[{label}] generating {n:,} records ...", flush=True)
    t = time.perf_counter()
    steps = build(url, c, n, analyze=not report.smoke)
    gen_s = time.perf_counter() - t
    size = ""
    if engine_name == "sqlite":
        size = f", file {Path(make_url(url).database).stat().st_size / 1e9:.2f} GB"
    print(
        f"[{label}] generated {n:,} records in {gen_s:.1f} s ({n / gen_s:,.0f}/s; "
        + ", ".join(f"{k} {v:.1f} s" for k, v in steps.items())
        + f"{size})",
        flush=True,
    )
    report.details.setdefault("generation", {})[engine_name] = {"records": n, "seconds": gen_s, **steps}
    report.add(
        f"{label}: generate {n:,} records",
        gen_s,
        "s",
        note="bulk path (module docstring): " + ", ".join(f"{k} {v:.0f} s" for k, v in steps.items()),
    )


def run_engine(
    engine_name: str, url: str, tmp: Path, args: argparse.Namespace, n: int, c: Corpus, report: Report
) -> bool:
    label = "SQLite" if engine_name == "sqlite" else "PostgreSQL"
    data = tmp / f"data-{engine_name}"
    data.mkdir()
    if args.reuse:
        print(f"[{label}] measuring the kept store {url} ({n:,} records; not generated by this run)", flush=True)
    else:
        _generate(label, engine_name, url, n, c, report)
    if args.covering_only:
        _covering(label, engine_name, url, c, args, report)
        return True
    ok = True
    all_specs = specs(c, n, _mid_position(url))
    server = Server(url, data)
    store = AuditStore(url)
    try:
        with _client(server.base) as client:
            t = time.perf_counter()
            ok = measure_http(store.engine, client, all_specs, args.rounds, args.budget) and ok
            print(
                f"[{label}] {len(all_specs)} figures x {args.rounds} rounds in {time.perf_counter() - t:.0f} s",
                flush=True,
            )
    finally:
        server.stop()
    rows = []
    print(f"\n[{label}] first page (limit 50) through the API vs. the direct query call, ms")
    print(f"  {'filter':<34} {'p50':>8} {'p95':>8} {'direct p50':>11} {'direct p95':>11} {'items':>6}  target")
    plans: dict[str, str] = {}
    for s in all_specs:
        api, base = _ms(s.samples), _ms(s.direct)
        met = api["p95"] <= s.target_ms and not s.failed
        items = statistics.median(s.items) if s.items else 0
        print(
            f"  {s.label:<34} {api['p50']:8.2f} {api['p95']:8.2f} {base['p50']:11.2f} {base['p95']:11.2f} {items:6.0f}"
            f"  <= {s.target_ms:.0f} {'ok' if met else 'MISS'}"
        )
        kind = "stats" if s.path == "/v1/stats" else "first page"
        report.add(
            f"{label}: {kind}, {s.label.replace('stats ', '')}, p95",
            api["p95"],
            "ms",
            baseline=base["p95"],
            target=f"<= {s.target_ms:.0f} ms",
            met=met,
            note=f"p50 {api['p50']:.1f} ms (direct {base['p50']:.1f}); {api['n']} calls; median items {items:.0f}"
            + (f"; FAILED: {s.failed}" if s.failed else ""),
        )
        rows.append({"label": s.label, "api": api, "direct": base, "items_median": items, "target_ms": s.target_ms})
        if (not met or args.explain) and s.sql is not None:
            with contextlib.suppress(Exception):
                plans[s.label] = explain(store.engine, s.sql)
    store.dispose()
    report.details.setdefault("http", {})[engine_name] = rows
    for name, plan in plans.items():
        print(f"\n[{label}] plan of {name!r} (first round's values):\n{plan}")
    report.details.setdefault("plans", {})[engine_name] = plans

    t = time.perf_counter()
    pairs = measure_access(url, data, args.pairs)
    logged, noop = _ms(pairs["logged"]), _ms(pairs["no-op"])
    mean_diff = statistics.fmean(pairs["logged"]) - statistics.fmean(pairs["no-op"])
    diff = logged["p50"] - noop["p50"]
    report.add(
        f"{label}: access log per call, ?request_id= p50 (logged vs no-op append)",
        logged["p50"],
        "ms",
        baseline=noop["p50"],
        target=f"<= +{ACCESS_TARGET_MS:.0f} ms",
        met=diff <= ACCESS_TARGET_MS,
        note=f"mean difference {mean_diff:+.2f} ms; p95 {logged['p95']:.1f} vs {noop['p95']:.1f}; {logged['n']} pairs",
    )
    appends = measure_append(url, data, args.appends)
    a_mean, b_mean = statistics.fmean(appends["append"]), statistics.fmean(appends["one-row tx"])
    a, b = _ms(appends["append"]), _ms(appends["one-row tx"])
    report.add(
        f"{label}: access.append, mean per call",
        a_mean,
        "ms",
        baseline=b_mean,
        target=f"<= {ACCESS_TARGET_MS:.0f} ms",
        met=a_mean <= ACCESS_TARGET_MS,
        note=f"p50 {a['p50']:.2f} / p95 {a['p95']:.2f} ms; baseline a one-row write transaction"
        f" (p50 {b['p50']:.2f}); {a['n']} calls",
    )
    print(
        f"\n[{label}] access log: API p50 {logged['p50']:.2f} ms logged vs {noop['p50']:.2f} ms no-op"
        f" ({diff:+.2f} ms; mean {mean_diff:+.2f} ms); append mean {a_mean:.2f} ms (p50 {a['p50']:.2f},"
        f" p95 {a['p95']:.2f}) vs one-row transaction {b_mean:.2f} ms  [{time.perf_counter() - t:.0f} s]",
        flush=True,
    )
    report.details.setdefault("access", {})[engine_name] = {
        "api": {"logged": logged, "no-op": noop},
        "append": a,
        "one_row_tx": b,
    }
    if args.covering:
        _covering(label, engine_name, url, c, args, report)
    return ok


def _covering(label: str, engine_name: str, url: str, c: Corpus, args: argparse.Namespace, report: Report) -> None:
    t = time.perf_counter()
    measure_covering(label, engine_name, url, c, args, report)
    print(f"[{label}] stats indexes' width measured in {time.perf_counter() - t:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--smoke", action="store_true", help="20,000 records, few rounds (< 1 min)")
    ap.add_argument("--engines", default="sqlite,pg", help="sqlite, pg or both (default)")
    ap.add_argument("--pg-url", default=PG_URL, help="server for the scratch database (default OBSERVER_TEST_PG_URL)")
    ap.add_argument(
        "--dir", default=None, help="where the SQLite store goes (default: the temp folder; with --keep, the kept file)"
    )
    ap.add_argument("--rounds", type=int, default=None, help="calls per figure (default 40; smoke 6)")
    ap.add_argument("--budget", type=float, default=None, help="seconds per figure at most (default 20; smoke 1)")
    ap.add_argument("--pairs", type=int, default=None, help="access-log call pairs (default 300; smoke 30)")
    ap.add_argument("--appends", type=int, default=None, help="access.append calls (default 500; smoke 50)")
    ap.add_argument("--explain", action="store_true", help="print every figure's query plan")
    ap.add_argument(
        "--covering",
        action="store_true",
        help="also measure the stats indexes' width (migration 0011): stats and write_many, A/B/A (smoke: always)",
    )
    ap.add_argument("--covering-only", action="store_true", help="only that (no first pages, no access log)")
    ap.add_argument("--covering-cycles", type=int, default=None, help="wide/0010 alternations (3; smoke 1)")
    ap.add_argument("--covering-rounds", type=int, default=None, help="stats calls per grouping and phase (3; smoke 2)")
    ap.add_argument("--covering-batches", type=int, default=None, help="write_many calls per phase (10; smoke 3)")
    ap.add_argument("--covering-batch", type=int, default=None, help="records per write_many call (500; smoke 100)")
    ap.add_argument("--keep", action="store_true", help="keep the stores (printed; yours to delete)")
    ap.add_argument("--reuse", default=None, help="measure a store kept by --keep (its URL) instead of generating one")
    ap.add_argument("--json", default=None)
    ap.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--data", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--no-append", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        return serve(args)
    smoke = args.smoke
    n = 20_000 if smoke else args.records
    args.rounds = args.rounds or (6 if smoke else 40)
    args.budget = args.budget or (1.0 if smoke else 20.0)
    args.pairs = args.pairs or (30 if smoke else 300)
    args.appends = args.appends or (50 if smoke else 500)
    args.covering = args.covering or args.covering_only or smoke
    args.covering_cycles = args.covering_cycles or (1 if smoke else 3)
    args.covering_rounds = args.covering_rounds or (2 if smoke else 3)
    args.covering_batches = args.covering_batches or (3 if smoke else 10)
    args.covering_batch = args.covering_batch or (100 if smoke else 500)
    engines = [e for e in args.engines.split(",") if e]
    if args.reuse:
        engines = ["sqlite" if args.reuse.startswith("sqlite") else "pg"]
        probe = sa.create_engine(args.reuse, poolclass=sa.NullPool)
        with probe.connect() as conn:
            n = conn.scalar(sa.select(sa.func.count()).select_from(ExchangeRow.__table__))
        probe.dispose()
    started = time.monotonic()
    report = Report("queries", smoke=smoke)
    report.details["records"] = n
    c = Corpus(n)
    ok = True
    with tempfile.TemporaryDirectory(prefix="bench-queries-", dir=args.dir) as tmp_name:
        tmp = Path(tmp_name)
        for name in engines:
            if args.reuse:
                ok = run_engine(name, args.reuse, tmp, args, n, c, report) and ok
            elif name == "sqlite":
                path = (Path(args.dir) if args.keep and args.dir else tmp) / "queries.db"
                ok = run_engine(name, f"sqlite:///{path}", tmp, args, n, c, report) and ok
                if args.keep:
                    print(f"kept sqlite:///{path}", flush=True)
                else:
                    path.unlink(missing_ok=True)
            elif name == "pg":
                try:
                    db = PgDatabase(args.pg_url)
                except sa.exc.OperationalError as exc:
                    print(f"PostgreSQL unreachable ({args.pg_url}): {exc.orig}", flush=True)
                    ok = False
                    continue
                try:
                    ok = run_engine(name, db.url, tmp, args, n, c, report) and ok
                finally:
                    if args.keep:
                        print(f"kept {db.url}", flush=True)
                    else:
                        db.drop()
            else:
                ap.error(f"unknown engine {name!r}")
    return report.finish(started, args.json, ok)


if __name__ == "__main__":
    raise SystemExit(main())
