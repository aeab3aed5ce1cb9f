"""``Drainer``: stores what the journal made durable, in journal order, exactly once.

ONE thread reads the journal's segments (``observer.journal.format``) from the last
acknowledged position up to the journal's durable end, and writes their ``RECORD`` and ``GAP``
entries to the database with ``AuditStore.write_many`` (records carry the writer's id and seq;
a record or gap already stored is skipped, so a replay after a crash never duplicates). After
each committed batch it saves the position (``ack.json``, fsynced) and deletes the segments
before it (``Journal.release``). It blocks while there is nothing new (no polling) and is woken
by the journal after each fsync.

Failure policy:

- **Database unavailable** (connection refused or lost, timeout, missing table): the batch is
  retried with capped exponential backoff, without end; nothing is dropped (the journal holds it,
  up to ``spool_max_bytes``). The first success logs how long it was down.
- **A record the database refuses** (a value it cannot store): the batch is retried record by
  record; a refused record is kept in ``rejected.jsonl`` (with the error) and a ``rejected``
  gap row takes its seq, so the store says a record is missing and why.
- **Seqs missing from the journal** (a segment damaged or deleted behind the observer's back):
  a ``journal_lost`` gap row takes the missing seqs (checked against the store's highest seq of
  this writer and the journal's acknowledged seq).
- **An empty journal pointed at another database** is bound to it; its earlier records are in
  the other store, and an ``other_store`` gap row takes their seqs here.
- **A journal that belongs to another store** (``identity.json``'s ``store_id`` is not this
  database's ``store_meta.store_id``) while it still holds records: nothing is written and the
  drainer stops (``refused``, a critical log line); the records stay in the journal. A journal
  with nothing left to store is bound to the new store.
- **close(timeout_s)**: stores what is durable while the database answers and the time lasts;
  the rest stays in the journal for the next start (logged with counts).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from observer.errors import ObserverError
from observer.journal import format as fmt
from observer.journal.journal import Journal, segment_name, segment_numbers, write_private
from observer.records import Exchange
from observer.shape import parse_rfc3339
from observer.store.checkpoint import ZERO_HASH, CheckpointKey, make_checkpoint, note_hash
from observer.store.models import StoreMetaRow
from observer.store.store import AuditStore, ChainOrderError

log = logging.getLogger("observer.store")

#: Errors that say "the database is not available": held and retried. Every other error says
#: "these records cannot be stored": isolated record by record and rejected.
UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.InternalError,
    sa_exc.ProgrammingError,
    sa_exc.DisconnectionError,
    sa_exc.TimeoutError,
    ConnectionError,
    TimeoutError,
)

#: Bytes read from a segment at a time (an entry bigger than that is read whole).
READ_BYTES = 1 << 20
#: Seconds between two "database unavailable" warnings while it stays down.
DOWN_WARNING_INTERVAL_S = 30.0

Position = tuple[int, int]


class Unavailable(Exception):
    """The database did not take a write for a reason unrelated to the records."""


class StoreMismatch(ObserverError):
    """The journal holds records of another store."""

    code = "journal_of_another_store"


def read_ack(directory: Path) -> tuple[Position, int]:
    """``ack.json``: ((segment, offset), seq) stored so far; ((0, 0), 0) when there is none."""
    try:
        d = fmt.loads((directory / "ack.json").read_bytes())
        return (int(d["segment"]), int(d["offset"])), int(d["seq"])
    except FileNotFoundError:
        return (0, 0), 0
    except (ValueError, KeyError, TypeError):
        log.error("journal: %s is damaged; reading the journal from its oldest segment", directory / "ack.json")
        return (0, 0), 0


def unstored_records(directory: Path) -> int:
    """``RECORD`` entries of the journal in ``directory`` after its ``ack.json`` position."""
    (seg, off), _seq = read_ack(directory)
    count = 0
    for n in segment_numbers(directory):
        if n < seg:
            continue
        try:
            buf = (directory / segment_name(n)).read_bytes()
            scan = fmt.read_entries(buf, off if n == seg else 0)
        except (OSError, ValueError):
            continue
        count += sum(1 for e in scan.entries if e.kind is fmt.Kind.RECORD)
    return count


def check_journal_store(directory: Path, store: AuditStore, url: str = "") -> None:
    """Raises ``StoreMismatch`` (an ``ObserverError``: one line) when the journal in
    ``directory`` holds records not yet stored and belongs to another store than ``store``
    (``url``: how to name it), a database not migrated yet included; database errors
    propagate. Reads only, both the journal (it may be in use) and the database."""
    try:
        identity = fmt.loads((directory / "identity.json").read_bytes())
        own = identity.get("store_id")
    except (FileNotFoundError, ValueError, AttributeError):
        return
    if own is None:
        return
    store_id = store.store_id() if sa.inspect(store.engine).has_table(StoreMetaRow.__tablename__) else None
    if own != store_id and unstored_records(directory):
        raise StoreMismatch(_mismatch(directory, own, store_id or f"new, not migrated yet: {url or 'this one'}"))


def _mismatch(directory: Path, own: str, store_id: str) -> str:
    return (
        f"the journal {directory} holds records of the store {own}, and this database is the store {store_id}:"
        " not writing them here. Point --db at the database they belong to, or move the journal folder away to"
        " start afresh (its records are then not stored)"
    )


class Drainer:
    """Journal -> one thread -> ``AuditStore.write_many``; see the module docstring.
    ``prepare``: called before the first write (and again after a failure of it), e.g. the
    schema migration; an ``UNAVAILABLE_ERRORS`` from it means "retry later"."""

    def __init__(
        self,
        store: AuditStore,
        journal: Journal,
        *,
        batch_max: int = 500,
        retry_min_s: float = 0.1,
        retry_max_s: float = 5.0,
        prepare: Callable[[], None] | None = None,
        checkpoint_key: CheckpointKey | None = None,
        checkpoint_every: int = 1000,
        checkpoint_interval_s: float = 60.0,
        clock: Callable[[], float] = time.time,
        on_write: Callable[[float], None] | None = None,
    ) -> None:
        if batch_max < 1 or not 0 < retry_min_s <= retry_max_s:
            raise ValueError("need batch_max >= 1 and 0 < retry_min_s <= retry_max_s")
        self._store = store
        self._journal = journal
        self._batch_max = batch_max
        self._retry_min_s = retry_min_s
        self._retry_max_s = retry_max_s
        self._prepare = prepare
        self._key = checkpoint_key
        self._checkpoint_every = checkpoint_every
        self._checkpoint_interval_s = checkpoint_interval_s
        self._clock = clock
        self._on_write = on_write  # seconds each stored batch took (metrics)
        self.behind_since: float | None = None  # monotonic time since records wait for the database
        self._store_id = ""
        self._last_checkpoint: dict[str, Any] | None = None
        self._last_checkpoint_at = 0.0
        self.checkpoints = 0
        self._closing = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._rejected_path = journal.directory / "rejected.jsonl"
        self._deadline = float("inf")
        ack, self._acked_seq = read_ack(journal.directory)
        self._pos: Position = ack
        self._ready = False
        self._expected = 1  # the next seq the store needs from this writer (set by _bind)
        self.written = 0
        self.duplicates = 0
        self.gaps = 0
        self.rejected = 0
        self.failed_batches = 0
        self.refused = False
        self.down_since: float | None = None
        self._last_warning = -DOWN_WARNING_INTERVAL_S

    @property
    def position(self) -> Position:
        return self._pos

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the drainer is already started")
        self._journal.on_durable = self._wake.set
        self._thread = threading.Thread(target=self._run, name="observer-drainer", daemon=True)
        self._thread.start()

    def close(self, timeout_s: float = 10.0) -> None:
        """Call after ``Journal.close``: stores what is durable within about ``timeout_s``."""
        self._deadline = time.monotonic() + timeout_s
        self._closing.set()
        self._wake.set()
        self._journal.wake()
        if self._thread is not None:
            self._thread.join(timeout_s + 1.0)
            if self._thread.is_alive():
                log.error("drainer: still writing at close; what it has not stored stays in the journal")

    def stats(self) -> dict[str, Any]:
        return {
            "written": self.written,
            "duplicates": self.duplicates,
            "gaps": self.gaps,
            "rejected": self.rejected,
            "failed_batches": self.failed_batches,
            "refused": self.refused,
            "checkpoints": self.checkpoints,
            "database_down": self.down_since is not None,
            "alive": self._thread is not None and self._thread.is_alive(),
            "behind_s": 0.0 if self.behind_since is None else time.monotonic() - self.behind_since,
        }

    def pending(self) -> bool:
        """Whether the journal holds durable entries not yet stored."""
        return self._pos < self._journal.durable() and self._has_entries(self._pos, self._journal.durable())

    # ----- the thread -----
    def _run(self) -> None:
        try:
            self._loop()
        except BaseException:
            log.critical("drainer: thread died; records stay in the journal until the next start", exc_info=True)
            raise

    def _loop(self) -> None:
        delay_s = 0.0
        while True:
            closing = self._closing.is_set()
            if closing and time.monotonic() >= self._deadline:
                return
            durable = self._journal.durable()
            if self._ready and not self._has_entries(self._pos, durable):
                self.behind_since = None
                self._pos = self._skip_to(durable)
                if closing:
                    self._checkpoint(force=True)
                    return
                self._wake.wait(self._checkpoint_wait())
                self._wake.clear()
                self._checkpoint()
                continue
            if self.behind_since is None:
                self.behind_since = time.monotonic()
            try:
                if not self._ready:
                    self._bind()
                self._drain_once(durable)
                self._checkpoint()
                if self.down_since is not None:
                    log.warning(
                        "drainer: database available again after %.1f s; %d records stored so far",
                        time.monotonic() - self.down_since,
                        self.written,
                    )
                    self.down_since = None
                delay_s = 0.0
            except (StoreMismatch, ChainOrderError) as exc:
                self.refused = True
                log.critical("drainer: %s; records stay in the journal", exc)
                return
            except Unavailable as exc:
                self.failed_batches += 1
                if self.down_since is None:
                    self.down_since = time.monotonic()
                delay_s = min(self._retry_max_s, delay_s * 2 if delay_s else self._retry_min_s)
                now = time.monotonic()
                if now - self._last_warning >= DOWN_WARNING_INTERVAL_S:
                    self._last_warning = now
                    log.warning(
                        "drainer: database unavailable (%s: %s); records wait in the journal (%d bytes);"
                        " retrying every %.1f s at most",
                        type(exc.__cause__).__name__,
                        _cause_line(exc.__cause__),
                        self._journal.spool_bytes(),
                        self._retry_max_s,
                    )
                if closing:
                    return
                self._wake.wait(delay_s)
                self._wake.clear()

    def _bind(self) -> None:
        """Prepares the database and checks that the journal belongs to it."""
        try:
            if self._prepare is not None:
                self._prepare()
            store_id = self._store.store_id()
            max_seq = self._store.max_seq(self._journal.writer_id)
        except UNAVAILABLE_ERRORS as exc:
            raise Unavailable() from exc
        own = self._journal.store_id
        rebound = own is not None and own != store_id
        if rebound:
            # Records of earlier runs belong to the store they were journaled for; this run's
            # belong to the database it was started with.
            earlier = min(self._journal.durable(), (self._journal.run_segment, 0))
            if self._pos < earlier and self._has_entries(self._pos, earlier):
                raise StoreMismatch(_mismatch(self._journal.directory, own, store_id))
            log.warning("drainer: the journal (empty) now belongs to the store %s (was %s)", store_id, own)
        if rebound and self._acked_seq > max_seq:
            # This writer's earlier records are in the other store: its numbering here starts
            # later, and a gap says where the rest is (verify would see them as deleted).
            gap = _gap_row(max_seq + 1, self._acked_seq, None, None, None, "other_store", f"stored in the store {own}")
            try:
                self._store.write_many([], writer_id=self._journal.writer_id, gaps=[gap])
            except UNAVAILABLE_ERRORS as exc:
                raise Unavailable() from exc
            max_seq = self._acked_seq
        self._journal.bind_store(store_id)
        # The next seq must follow what this store holds and what the journal says it stored
        # (a store behind the acknowledgement was rolled back: verify names the missing rows).
        self._expected = max(max_seq, self._acked_seq) + 1
        self._store_id = store_id
        if self._key is not None:
            try:
                self._last_checkpoint = self._store.last_checkpoint(self._journal.writer_id)
            except UNAVAILABLE_ERRORS as exc:
                raise Unavailable() from exc
        self._ready = True

    def _drain_once(self, durable: Position) -> None:
        """Reads one batch after the position and stores it; advances and acknowledges."""
        records, seqs, gaps, end = self._read_batch(durable)
        if records or gaps:
            began = time.perf_counter()
            self._write(records, seqs, gaps)
            if self._on_write is not None:
                self._on_write(time.perf_counter() - began)
        self._pos = end
        last_seq = max([*seqs, *(g["seq_end"] for g in gaps)], default=self._acked_seq)
        self._acked_seq = max(self._acked_seq, last_seq)
        write_private(
            self._journal.directory / "ack.json",
            fmt.dumps({"segment": end[0], "offset": end[1], "seq": self._acked_seq}),
        )
        self._journal.release(end[0])

    def _checkpoint_wait(self) -> float | None:
        """Seconds until the next idle checkpoint is due (``None``: no key, wait for records)."""
        if self._key is None:
            return None
        return max(0.0, self._last_checkpoint_at + self._checkpoint_interval_s - time.monotonic())

    def _checkpoint(self, *, force: bool = False) -> None:
        """Signs and stores a checkpoint of this writer's chain head when ``checkpoint_every``
        entries were added since the last one or ``checkpoint_interval_s`` passed (also while
        idle, the same head again), or ``force`` (at close). A database error is logged and
        retried at the next occasion; it never stops the drainer."""
        if self._key is None or not self._ready:
            return
        writer = self._journal.writer_id
        last = self._last_checkpoint
        due_time = time.monotonic() - self._last_checkpoint_at >= self._checkpoint_interval_s
        try:
            seq, head = self._store.chain_head(writer)
            if seq == 0:
                return
            grown = last is None or seq - last["seq"] >= self._checkpoint_every
            if not (force or grown or due_time):
                return
            if last is not None and force and last["seq"] == seq:
                return  # nothing new since the last one
            number = 1 if last is None else last["number"] + 1
            prev = ZERO_HASH if last is None else note_hash(last["note"])
            at = datetime.fromtimestamp(self._clock(), timezone.utc)
            events = self._store.events_head()
            row = make_checkpoint(self._key, self._store_id, writer, number, seq, head.hex(), at, prev, events)
            self._store.add_checkpoint(row)
        except UNAVAILABLE_ERRORS as exc:  # the database went away: the batch's retry says so
            log.info("drainer: cannot write a checkpoint now (%s); retried later", type(exc).__name__)
            self._last_checkpoint_at = time.monotonic()
            return
        except Exception:  # noqa: BLE001 - a checkpoint must never stop the records
            log.warning("drainer: cannot write a checkpoint now; retried later", exc_info=True)
            self._last_checkpoint_at = time.monotonic()
            return
        self._last_checkpoint = row
        self._last_checkpoint_at = time.monotonic()
        self.checkpoints += 1

    def _read_batch(self, durable: Position) -> tuple[list[Exchange], list[int], list[dict[str, Any]], Position]:
        """Up to ``batch_max`` records (and the gaps among them) after the position, and the
        position after the last entry read."""
        records: list[Exchange] = []
        seqs: list[int] = []
        gaps: list[dict[str, Any]] = []
        pos = self._pos
        while len(records) < self._batch_max and pos < durable:
            pos = self._skip_to(durable, pos)
            seg, off = pos
            if pos >= durable:
                break
            limit = durable[1] - off if seg == durable[0] else None  # the current segment: its durable part
            buf, final = self._read_segment(seg, off, limit, READ_BYTES)
            if buf is None:  # the segment is gone: go on with the next one
                pos = (seg + 1, 0)
                continue
            scan = fmt.read_run(buf, off, final=final)
            if not scan.entries and scan.damage is None and not final:  # an entry bigger than a read
                buf, final = self._read_segment(seg, off, limit, fmt.needed_bytes(buf))
                scan = fmt.read_run(buf or b"", off, final=final)
            for e in scan.entries:
                if e.kind is fmt.Kind.RECORD or e.kind is fmt.Kind.GAP:
                    self._take(e, records, seqs, gaps)
                pos = (seg, e.offset + e.size)
                if len(records) >= self._batch_max:
                    return records, seqs, gaps, pos
            if scan.damage is not None:
                # A torn end is the trace of a kill (recovery logged it); corruption is not.
                log.log(
                    logging.INFO if scan.damage is fmt.Damage.TORN else logging.ERROR,
                    "journal: %s has a %s entry at offset %d; the rest of it is not read",
                    segment_name(seg),
                    scan.damage,
                    scan.end,
                )
                pos = (seg + 1, 0)
            elif final and seg < durable[0]:
                pos = (seg + 1, 0)
            elif not scan.entries:
                break
        return records, seqs, gaps, pos

    def _take(self, e: fmt.Entry, records: list[Exchange], seqs: list[int], gaps: list[dict[str, Any]]) -> None:
        seq = e.seq
        if seq > self._expected:
            missing = seq - self._expected
            gaps.append(_gap_row(self._expected, seq - 1, None, None, missing, "journal_lost", None))
            log.error("drainer: %d records (seq %d..%d) are missing from the journal", missing, self._expected, seq - 1)
        if seq >= self._expected:
            self._expected = seq + 1
        try:
            d = e.json
            if e.kind is fmt.Kind.GAP:
                gaps.append(
                    _gap_row(
                        seq, seq, _time(d["first_at"]), _time(d["last_at"]), int(d["dropped"]), str(d["reason"]), None
                    )
                )
            else:
                records.append(Exchange.from_dict(d))
                seqs.append(seq)
        except (ValueError, KeyError, TypeError) as exc:
            self._reject(seq, None, {"journal_entry": e.body.decode("utf-8", "replace")}, exc, gaps, "unreadable")

    def _write(self, records: list[Exchange], seqs: list[int], gaps: list[dict[str, Any]]) -> None:
        writer = self._journal.writer_id
        try:
            duplicates = self._store.write_many(records, writer_id=writer, seqs=seqs, gaps=gaps)
            self.duplicates += duplicates
            self.written += len(records) - duplicates
            self.gaps += len(gaps)
            return
        except UNAVAILABLE_ERRORS as exc:
            raise Unavailable() from exc
        except ChainOrderError:
            raise
        except Exception as exc:  # noqa: BLE001 - one of them cannot be stored: find which
            if not records:
                raise Unavailable() from exc
        # One at a time, in seq order (the chain is), a refused record's gap in its place.
        items: list[tuple[int, Exchange | None, dict[str, Any] | None]] = [
            *((seq, record, None) for record, seq in zip(records, seqs, strict=True)),
            *((g["seq"], None, g) for g in gaps),
        ]
        for seq, record, gap in sorted(items, key=lambda item: item[0]):
            try:
                if record is None:
                    self._store.write_many([], writer_id=writer, gaps=[gap])  # type: ignore[list-item]
                    self.gaps += 1
                    continue
                try:
                    duplicates = self._store.write_many([record], writer_id=writer, seqs=[seq])
                    self.duplicates += duplicates
                    self.written += 1 - duplicates
                except (*UNAVAILABLE_ERRORS, ChainOrderError):
                    raise
                except Exception as exc:  # noqa: BLE001
                    refused: list[dict[str, Any]] = []
                    self._reject(seq, record.id, record.to_dict(), exc, refused, "rejected")
                    self._store.write_many([], writer_id=writer, gaps=refused)
                    self.gaps += 1
            except UNAVAILABLE_ERRORS as exc:
                raise Unavailable() from exc

    def _reject(
        self,
        seq: int,
        record_id: str | None,
        payload: dict[str, Any],
        exc: BaseException,
        gaps: list[dict[str, Any]],
        reason: str,
    ) -> None:
        self.rejected += 1
        detail = f"record {record_id}: {type(exc).__name__}" if record_id else f"{type(exc).__name__}"
        gaps.append(_gap_row(seq, seq, None, None, 1, reason, detail))
        kept = False
        try:
            entry = {"seq": seq, "error": type(exc).__name__, "message": str(exc)[:2000], "record": payload}
            _append_private(self._rejected_path, fmt.dumps(entry) + b"\n")
            kept = True
        except (OSError, TypeError, ValueError, RecursionError):
            pass
        log.error(
            "drainer: record %s (seq %d) cannot be stored (%s); %s",
            record_id or "<unreadable journal entry>",
            seq,
            type(exc).__name__,
            f"kept in {self._rejected_path}" if kept else "NOT kept",
        )

    # ----- reading the segments -----
    def _skip_to(self, durable: Position, pos: Position | None = None) -> Position:
        """``pos`` (default: the position) moved onto an existing segment: (n, 0) or one before
        the oldest segment goes to the first entry of the first segment at or after it."""
        seg, off = self._pos if pos is None else pos
        numbers = self._journal.segment_list()
        if seg not in numbers:
            later = [n for n in numbers if n > seg]
            if not later:
                return durable if seg < durable[0] else (seg, off)
            seg, off = later[0], 0
        return seg, max(off, len(fmt.SEGMENT_MAGIC))

    def _read_segment(self, seg: int, off: int, limit: int | None, want: int) -> tuple[bytes | None, bool]:
        """Up to ``want`` bytes of segment ``seg`` from ``off`` (never past ``limit`` bytes from
        it: the durable end), and whether they reach the end (of the file, or of ``limit``: then
        what ends there is whole, as the journal fsyncs whole entries); ``None`` when the file
        is gone."""
        path = self._journal.directory / segment_name(seg)
        if limit is not None:
            want = min(want, limit)
        try:
            with open(path, "rb") as f:
                f.seek(off)
                buf = f.read(want)
        except FileNotFoundError:
            return None, True
        reached = len(buf) < want or (limit is not None and len(buf) == limit)
        return buf, reached and limit is None

    def _has_entries(self, start: Position, durable: Position) -> bool:
        """Whether any entry lies between ``start`` and ``durable`` (cheap: sizes only)."""
        if start >= durable:
            return False
        sizes = self._journal.segment_sizes()
        for n, size in sizes.items():
            if n < start[0] or n > durable[0]:
                continue
            first = start[1] if n == start[0] else 0
            last = durable[1] if n == durable[0] else size
            if last > max(first, len(fmt.SEGMENT_MAGIC)):
                return True
        return False


def _gap_row(
    seq: int,
    seq_end: int,
    first_at: datetime | None,
    last_at: datetime | None,
    dropped: int | None,
    reason: str,
    detail: str | None,
) -> dict[str, Any]:
    return {
        "seq": seq,
        "seq_end": seq_end,
        "first_at": first_at,
        "last_at": last_at,
        "dropped": dropped,
        "reason": reason,
        "detail": detail,
    }


def _time(value: Any) -> datetime | None:
    return None if value is None else parse_rfc3339(str(value))


def _append_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _cause_line(exc: BaseException | None) -> str:
    """The first line of the driver's own message (the engine hides statement parameters)."""
    if exc is None:
        return ""
    orig = getattr(exc, "orig", None) or exc
    lines = str(orig).strip().splitlines()
    return lines[0][:200] if lines else ""


__all__ = ["UNAVAILABLE_ERRORS", "Drainer", "StoreMismatch", "read_ack", "unstored_records"]
