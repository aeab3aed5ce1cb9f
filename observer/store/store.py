"""``AuditStore``: writes ``Exchange`` records to SQL (SQLite or PostgreSQL) and reads them back.

Reads return exactly the JSON shape of ``Exchange.to_dict()`` (``GET /v1/exchanges/{id}``).
Writes are idempotent on the record id (ids already stored are skipped), so a batch replayed
after an ambiguous failure (commit done, acknowledgement lost) or after a crash in the middle of a
journal replay is absorbed instead of failing forever on a duplicate key.

The schema is created by the Alembic migrations (``observer.store.migrate.upgrade``); this module
never calls ``create_all``.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, bindparam, create_engine, event, func, insert, select, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, selectinload

from observer.errors import ObserverError
from observer.jsontext import loads
from observer.records import Exchange
from observer.shape import parse_rfc3339, rfc3339
from observer.store import analyze, search
from observer.store.chain import GENESIS, canonical_gap, canonical_record, chain_hash
from observer.store.events import event_head
from observer.store.keyowners import owners_of
from observer.store.linking import link
from observer.store.models import CheckpointRow, ExchangeRow, GapRow, PurgedRunRow, StoreMetaRow
from observer.store.partitions import Partitions
from observer.store.portable import make_portable
from observer.store.resumption import link_resumptions
from observer.store.rows import exchange_from_row, rows_from_records
from observer.store.stored import reserve as reserve_stored_seq

log = logging.getLogger(__name__)

#: Longest record id (``models.RecordId``: a UUID's 36 characters).
RECORD_ID_MAX = 36
#: Largest page ``AuditStore.list`` serves.
LIST_LIMIT_MAX = 500
#: Longest cursor accepted (a real one is under 100 characters).
CURSOR_MAX_CHARS = 512
#: Ids per ``IN (...)`` when looking for records already stored (SQLite allows 32766 parameters).
_IN_CHUNK = 1000
#: Seconds psycopg waits for a TCP connection unless the URL says otherwise.
PG_CONNECT_TIMEOUT_S = 10

Item = dict[str, Any]
Page = tuple[list[Item], str | None]


class InvalidCursor(ObserverError, ValueError):
    """A pagination cursor that this store did not issue (or that was altered)."""

    code = "invalid_cursor"


class ChainOrderError(ObserverError):
    """A chained entry would not come after its writer's stored chain head."""

    code = "chain_order"


class AuditStore:
    """The SQL audit store: ``write_many`` from the writer thread, ``get``/``list`` for the API.

    Thread-safe (one engine and connection pool; a session per call). Build it from a URL
    (``sqlite:///observer.db``, ``postgresql+psycopg://...``) or from an existing engine.
    On SQLite every connection gets ``journal_mode=WAL``, ``foreign_keys=ON`` and
    ``synchronous=FULL`` (a committed batch survives power loss).
    """

    def __init__(self, url: str) -> None:
        self._engine = _create_engine(url)
        self._partitions = Partitions()
        self._analyzed_at: int | None = None  # SQLite: observer.store.analyze, read on first use

    @classmethod
    def from_engine(cls, engine: Engine) -> AuditStore:
        """Wraps an existing engine (its SQLite connections made after this get the pragmas)."""
        store = cls.__new__(cls)
        if engine.dialect.name == "sqlite" and not event.contains(engine, "connect", _sqlite_on_connect):
            event.listen(engine, "connect", _sqlite_on_connect)
        store._engine = engine
        store._partitions = Partitions()
        store._analyzed_at = None
        return store

    @property
    def engine(self) -> Engine:
        """The underlying engine (for migrations and tests)."""
        return self._engine

    def write_many(
        self,
        records: Sequence[Exchange],
        *,
        writer_id: str | None = None,
        seqs: Sequence[int] | None = None,
        gaps: Sequence[Mapping[str, Any]] = (),
        append: bool = False,
    ) -> int:
        """Inserts the records and their blocks, tool calls and violations, and ``gaps`` (rows
        of ``gaps``: ``seq``, ``seq_end``, ``first_at``, ``last_at``, ``dropped``, ``reason``,
        ``detail``), in one transaction; returns how many records were already stored.

        ``writer_id``/``seqs``: the journal's numbering of the records (``seqs[i]`` is
        ``records[i]``'s), also the gaps' writer. ``append`` (with ``writer_id``, without
        ``seqs`` or gaps): the records not stored yet are numbered here, in the given order,
        after the writer's chain head, in the same transaction (``observer ingest``: a record
        already stored takes no seq, so the writer's chain has no hole). Each record is linked to the conversation it
        continues (``observer.store.linking``) and, on SQLite, numbered in storing order and
        indexed for search (``observer.store.stored``, ``observer.store.search``). Bulk ``INSERT``s: one multi-row statement per
        table. A record whose id is already stored is skipped whole, as is a repeat of an id
        within ``records``, and a gap whose (writer, seq) is stored. Nothing is written when it
        raises: ``sqlalchemy.exc.SQLAlchemyError`` when the database refuses (``DataError`` for a
        value it cannot store), ``OverflowError``/``UnicodeEncodeError`` when the driver cannot
        encode one (SQLite integer beyond 64 bits, lone surrogate).
        """
        portable = [make_portable(r) for r in records]
        exchanges, children = rows_from_records(portable)
        if append and (writer_id is None or seqs is not None or gaps):
            raise ValueError("append numbers the records of a writer: a writer_id, no seqs, no gaps")
        if writer_id is not None and seqs is None and records and not append:
            raise ValueError("records of a writer need their seqs")
        chained = writer_id is not None  # (gaps always have a writer and seqs)
        numbering = dict(zip((r.id for r in records), seqs, strict=True)) if seqs is not None else {}
        by_id: dict[str, Exchange] = {}
        for r in portable:
            by_id.setdefault(r.id, r)  # the first of a repeated id is the one stored
        for row in exchanges:
            row["writer_id"] = writer_id if seqs is not None or append else None
            row["seq"] = numbering.get(row["id"])
            row["record_hash"] = None
        ids = [r["id"] for r in exchanges]
        id_column = ExchangeRow.__table__.c.id
        stored: set[str] = set()
        last_stored: int | None = None  # SQLite: the stored-order number of the batch's last record
        times = [r["started_at"] for r in exchanges]
        self._partitions.ensure(self._engine, times)  # PostgreSQL: the months' partitions
        for attempt in (1, 2):
            try:
                with Session(self._engine) as session, session.begin():
                    for start in range(0, len(ids), _IN_CHUNK):
                        chunk = ids[start : start + _IN_CHUNK]
                        stored.update(session.scalars(select(id_column).where(id_column.in_(chunk))))
                    if stored:
                        exchanges = [r for r in exchanges if r["id"] not in stored]
                        children = {
                            t: [r for r in rows if r["exchange_id"] not in stored] for t, rows in children.items()
                        }
                    if append and exchanges:
                        head_seq, _head = self.chain_head(writer_id, session)  # type: ignore[arg-type]
                        for n, row in enumerate(exchanges, head_seq + 1):
                            row["seq"] = n
                    gap_rows = self._new_gaps(session, writer_id, gaps)
                    sqlite = self._engine.dialect.name == "sqlite"
                    # Each record's dict once, for the chain and PostgreSQL's search words.
                    dicts = (
                        {row["id"]: by_id[row["id"]].to_dict() for row in exchanges} if chained or not sqlite else {}
                    )
                    if chained:
                        self._chain(session, writer_id, exchanges, dicts, gap_rows)  # type: ignore[arg-type]
                    link(session.connection(), exchanges, by_id)
                    link_resumptions(session.connection(), exchanges, by_id)
                    if sqlite and exchanges:
                        first = reserve_stored_seq(session.connection(), len(exchanges))
                        for n, row in enumerate(exchanges):
                            row["stored_seq"] = first + n
                            row["search_vector"] = None
                    elif exchanges:
                        for row in exchanges:
                            row["search_text"] = search.lexemes(dicts[row["id"]])
                    # Core inserts on the tables (the ORM's bulk insert would split the batch into one
                    # statement per run of rows with the same NULL columns).
                    tables = ((ExchangeRow.__table__, exchanges), *children.items(), (GapRow.__table__, gap_rows))
                    for table, rows in tables:
                        if rows:
                            session.execute(self._insert(table, sqlite), rows)
                    if sqlite and exchanges:
                        last_stored = first + len(exchanges) - 1
                        search.index_sqlite(session.connection(), first, last_stored)
                break
            except sa_exc.IntegrityError as exc:
                # A month's partition dropped by a purge since this store made it (a record
                # that old arriving late): forget what is known, make it again, once.
                if attempt == 2 or "no partition of relation" not in str(exc):
                    raise
                self._partitions.forget()
                self._partitions.ensure(self._engine, times)
        if stored:
            log.info("audit store: %d of %d records were already stored", len(stored), len(ids))
        if last_stored is not None:
            self._refresh_statistics(last_stored)
        return len(stored)

    def _refresh_statistics(self, stored: int) -> None:
        """SQLite: ``ANALYZE`` when ``stored`` records make it due (``observer.store.analyze``).
        The batch is committed already: a failure here is logged, never raised."""
        if self._analyzed_at is not None and not analyze.due(self._analyzed_at, stored):
            return
        try:
            with self._engine.begin() as conn:
                at = analyze.analyzed_at(conn)
                if analyze.due(at, stored):
                    analyze.analyze(conn, stored)
                    at = stored
        except sa_exc.SQLAlchemyError as exc:
            log.warning("audit store: SQLite statistics not refreshed (%s); plans may be slower", type(exc).__name__)
            return
        self._analyzed_at = at

    @staticmethod
    def _insert(table: Any, sqlite: bool) -> Any:
        """The INSERT of ``table``'s rows; on PostgreSQL the exchanges' ``search_vector`` is made
        from each row's ``search_text`` (``observer.store.search.VECTOR_PG``)."""
        if sqlite or table is not ExchangeRow.__table__:
            return insert(table)
        # stored_seq: the transaction's id, the column's default on PostgreSQL (observer.store.stored)
        skip = {"stored_seq", "search_vector"}
        values: dict[str, Any] = {
            c.name: bindparam(c.name) for c in table.columns if c.server_default is None and c.name not in skip
        }
        values["search_vector"] = text(search.VECTOR_PG)
        return insert(table).values(values)

    @staticmethod
    def _new_gaps(session: Session, writer_id: str | None, gaps: Sequence[Mapping[str, Any]]) -> list[Item]:
        """The gap rows not stored yet (by writer and seq)."""
        if not gaps:
            return []
        table = GapRow.__table__
        rows = [{**g, "writer_id": writer_id, "record_hash": ""} for g in gaps]
        seqs = [r["seq"] for r in rows]
        stored = set(session.scalars(select(table.c.seq).where(table.c.writer_id == writer_id, table.c.seq.in_(seqs))))
        return [r for r in rows if r["seq"] not in stored]

    def _chain(
        self,
        session: Session,
        writer_id: str,
        exchanges: list[Item],
        records: Mapping[str, Mapping[str, Any]],
        gaps: list[Item],
    ) -> None:
        """Sets ``record_hash`` on the new rows, in seq order, continuing the writer's chain from
        its stored head (``observer.store.chain``). Raises ``ChainOrderError`` when a new entry's
        seq is not after the stored head (the journal is read in order, so this is a bug or a
        second process on one journal)."""
        entries: list[tuple[int, bytes, Item]] = []
        for row in exchanges:
            entries.append((row["seq"], canonical_record(records[row["id"]], writer_id, row["seq"]), row))
        for row in gaps:
            entries.append((row["seq"], canonical_gap(row, writer_id), row))
        if not entries:
            return
        entries.sort(key=lambda e: e[0])
        head_seq, head = self.chain_head(writer_id, session)
        if entries[0][0] <= head_seq:
            raise ChainOrderError(f"writer {writer_id}: seq {entries[0][0]} is not after the stored head {head_seq}")
        for _seq, canonical, row in entries:
            head = chain_hash(head, canonical)
            row["record_hash"] = head.hex()

    def chain_head(self, writer_id: str, session: Session | None = None) -> tuple[int, bytes]:
        """(last seq, its ``record_hash``) of ``writer_id``'s chain (records, gaps and purged runs);
        (0, ``GENESIS``) when empty."""
        ex, gap = ExchangeRow.__table__, GapRow.__table__
        q_ex = (
            select(ex.c.seq, ex.c.record_hash)
            .where(ex.c.writer_id == writer_id, ex.c.record_hash.is_not(None))
            .order_by(ex.c.seq.desc())
            .limit(1)
        )
        q_gap = (
            select(gap.c.seq_end, gap.c.record_hash)
            .where(gap.c.writer_id == writer_id)
            .order_by(gap.c.seq_end.desc())
            .limit(1)
        )
        run = PurgedRunRow.__table__
        q_run = (
            select(run.c.last_seq, run.c.last_hash)
            .where(run.c.writer_id == writer_id)
            .order_by(run.c.first_seq.desc())
            .limit(1)
        )
        if session is not None:
            found = [session.execute(q).first() for q in (q_ex, q_gap, q_run)]
        else:
            with self._engine.connect() as conn:
                found = [conn.execute(q).first() for q in (q_ex, q_gap, q_run)]
        best = max((r for r in found if r is not None), key=lambda r: r[0], default=None)
        return (0, GENESIS) if best is None else (best[0], bytes.fromhex(best[1]))

    def events_head(self) -> tuple[int, str] | None:
        """(seq, hex hash) of the store chain's last event (``observer.store.events``); ``None``
        when it has none."""
        with self._engine.connect() as conn:
            seq, head = event_head(conn)
        return None if seq == 0 else (seq, head.hex())

    def gaps(self, writer_id: str | None = None) -> list[Item]:
        """The recorded gaps (all writers, or one), oldest seq first, as dicts of their columns."""
        table = GapRow.__table__
        stmt = select(table).order_by(table.c.writer_id, table.c.seq)
        if writer_id is not None:
            stmt = stmt.where(table.c.writer_id == writer_id)
        with self._engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(stmt)]

    def add_checkpoint(self, row: Mapping[str, Any]) -> None:
        """Inserts a signed checkpoint row (``observer.store.checkpoint.make_checkpoint``)."""
        with self._engine.begin() as conn:
            conn.execute(insert(CheckpointRow.__table__), [dict(row)])

    def checkpoints(self, writer_id: str | None = None) -> list[Item]:
        """Checkpoint rows (all writers, or one), by writer and number."""
        table = CheckpointRow.__table__
        stmt = select(table).order_by(table.c.writer_id, table.c.number)
        if writer_id is not None:
            stmt = stmt.where(table.c.writer_id == writer_id)
        with self._engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(stmt)]

    def last_checkpoint(self, writer_id: str) -> Item | None:
        table = CheckpointRow.__table__
        stmt = select(table).where(table.c.writer_id == writer_id).order_by(table.c.number.desc()).limit(1)
        with self._engine.connect() as conn:
            row = conn.execute(stmt).first()
        return None if row is None else dict(row._mapping)

    def writers(self) -> list[str]:
        """Every writer id with a chained record, gap, purged run or checkpoint (the store's own
        chain, ``store_id``, too once it has a checkpoint)."""
        ex, gap, cp, run = ExchangeRow.__table__, GapRow.__table__, CheckpointRow.__table__, PurgedRunRow.__table__
        stmt = (
            select(ex.c.writer_id)
            .where(ex.c.writer_id.is_not(None))
            .union(select(gap.c.writer_id), select(cp.c.writer_id), select(run.c.writer_id))
        )
        with self._engine.connect() as conn:
            return sorted(conn.scalars(stmt))

    def max_seq(self, writer_id: str) -> int:
        """The highest seq of ``writer_id`` among stored records, gaps and purged runs (0: none)."""
        ex, gap, run = ExchangeRow.__table__, GapRow.__table__, PurgedRunRow.__table__
        with self._engine.connect() as conn:
            a = conn.scalar(select(func.max(ex.c.seq)).where(ex.c.writer_id == writer_id)) or 0
            b = conn.scalar(select(func.max(gap.c.seq_end)).where(gap.c.writer_id == writer_id)) or 0
            c = conn.scalar(select(func.max(run.c.last_seq)).where(run.c.writer_id == writer_id)) or 0
        return max(a, b, c)

    def store_id(self) -> str:
        """This database's identity (``store_meta.store_id``), made on first use (several
        writers racing to make it agree on the first one committed)."""
        table = StoreMetaRow.__table__
        query = select(table.c.value).where(table.c.key == "store_id")
        with self._engine.connect() as conn:
            found = conn.scalar(query)
        if found is not None:
            return found
        try:
            with self._engine.begin() as conn:
                conn.execute(insert(table), [{"key": "store_id", "value": str(uuid.uuid4())}])
        except sa_exc.IntegrityError:
            pass  # another writer made it first
        with self._engine.connect() as conn:
            return conn.scalar(query)

    def get(self, id: str, *, store_fields: bool = False) -> Item | None:  # noqa: A002 - the record's field name
        """The record with this id as ``Exchange.to_dict()`` returns it (with ``store_fields``,
        followed by what the store adds: ``conversation_id``, ``observer.conversation``,
        ``resumes_id``, ``observer.store.resumption``, and
        ``key_owner``, ``{owner, team}`` of its key fingerprint or null, ``observer.store.keyowners``), or
        ``None`` (also for an
        id no record can have: longer than a record id, or with a NUL, which PostgreSQL refuses
        in a query with an error, not an empty result)."""
        if len(id) > RECORD_ID_MAX or "\x00" in id:
            return None
        stmt = (
            select(ExchangeRow)
            .where(ExchangeRow.id == id)
            .options(
                selectinload(ExchangeRow.blocks),
                selectinload(ExchangeRow.tool_calls),
                selectinload(ExchangeRow.violations),
            )
        )
        with Session(self._engine) as session:
            row = session.scalars(stmt).first()
            if row is None:
                return None
            record = exchange_from_row(row).to_dict()
            if store_fields:
                record["conversation_id"] = row.conversation_id
                record["resumes_id"] = row.resumes_id
                fingerprint = row.key_fingerprint
                record["key_owner"] = owners_of(session.connection(), [fingerprint]).get(fingerprint or "")
            return record

    def ping(self) -> None:
        """Runs ``SELECT 1``; raises ``sqlalchemy.exc.SQLAlchemyError`` when unreachable."""
        with self._engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    def dispose(self) -> None:
        """Closes the pooled connections (the store can still be used; it reconnects)."""
        self._engine.dispose()

    def list(self, limit: int = 50, cursor: str | None = None) -> Page:
        """A page of record summaries, newest first by ``(started_at, id)``, and the cursor of the
        next page (``None`` on the last page).

        ``limit``: 1..``LIST_LIMIT_MAX`` (``ValueError`` outside). ``cursor``: ``None`` or a
        ``next_cursor`` from a previous page; anything else raises ``InvalidCursor``. Keyset
        pagination: rows inserted meanwhile never shift or repeat items across pages.
        """
        from observer.store.query import Filters, page

        return page(self._engine, Filters(), limit, cursor)


def encode_cursor(started_at: datetime, id: str) -> str:  # noqa: A002
    """Opaque cursor: unpadded urlsafe base64 of the JSON ``[started_at RFC 3339, id]``."""
    raw = json.dumps([rfc3339(started_at), id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """Inverse of ``encode_cursor``; raises ``InvalidCursor`` on anything it did not produce."""
    try:
        if len(cursor) > CURSOR_MAX_CHARS:
            raise ValueError("too long")
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        decoded = json.loads(raw)
        if not (isinstance(decoded, list) and len(decoded) == 2 and all(isinstance(x, str) for x in decoded)):
            raise TypeError("a cursor is a list of two strings")
        started_at, last_id = decoded
        if "\x00" in last_id:  # PostgreSQL refuses NUL in text: a 500 instead of a 400 (trial finding)
            raise ValueError("a record id holds no NUL")
        return parse_rfc3339(started_at), last_id  # ValueError: a time without offset
    except (ValueError, TypeError, OverflowError, binascii.Error) as exc:
        raise InvalidCursor(f"invalid cursor: {cursor[:40]!r}") from exc


def exchange_from_dict(d: Mapping[str, Any]) -> Exchange:
    """Rebuilds an ``Exchange`` from its ``to_dict()`` form (derived keys ``text`` and
    ``request_model`` are ignored): ``exchange_from_dict(r.to_dict()).to_dict() == r.to_dict()``.

    Used to read the journal's records and an old spool (``Exchange.from_dict``). Raises ``KeyError``,
    ``TypeError`` or ``ValueError`` on a malformed dict.
    """
    return Exchange.from_dict(d)


def _create_engine(url: str) -> Engine:
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    connect_args: dict[str, Any] = {}
    if backend == "postgresql" and "connect_timeout" not in parsed.query:
        connect_args["connect_timeout"] = PG_CONNECT_TIMEOUT_S
    # hide_parameters: driver errors must not carry prompt or completion text into the logs.
    engine = create_engine(
        parsed, hide_parameters=True, pool_pre_ping=True, connect_args=connect_args, json_deserializer=loads
    )
    if backend == "sqlite":
        from observer.store.migrate import prepare_sqlite_file

        prepare_sqlite_file(url, make_folder=False)
        event.listen(engine, "connect", _sqlite_on_connect)
    elif backend == "postgresql":
        event.listen(engine, "connect", _postgresql_on_connect)
    return engine


def _postgresql_on_connect(dbapi_connection: Any, connection_record: Any) -> None:
    """JIT compilation off for the store's sessions: a scan of the whole store (``stats``)
    spent 100-340 ms of ~900 compiling (PostgreSQL 15 defaults, 1,000,000 records:
    docs/performance.md), and no query of the store runs long enough to win it back. A ``SET``
    after connecting, not a startup ``options`` parameter, which poolers such as PgBouncer
    refuse."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("SET jit = off")
    finally:
        cursor.close()
    dbapi_connection.commit()


def _sqlite_on_connect(dbapi_connection: Any, connection_record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
    finally:
        cursor.close()
