"""``RecordWriter``: hands finished ``Exchange`` records from the proxy's event loop to the store.

The event loop never waits on the database: ``submit`` is a non-blocking append to a
``queue.SimpleQueue`` (C code that takes no lock the writer thread can hold, so the loop never
blocks on a lock and then queues behind the writer thread for the GIL, a 5 ms switch interval;
``queue.Queue`` did, measured up to 8 ms), bounded by ``queue_max`` in ``submit``, and ONE daemon
thread owns every database call. That thread takes up to
``batch_max`` records (waiting at most ``flush_interval_s`` for more after the first) and writes
them with ``AuditStore.write_many`` in one transaction. With nothing to write it blocks on the
queue without a timeout (no polling: it runs inside the proxy process); ``close()`` wakes it
with a marker put on the queue.

Failure policy (DESIGN.md "Nothing lost", compliance notes §4):

- **Queue full**: ``submit`` returns ``False`` and counts the record in ``dropped``; a warning
  is logged at most once per ``DROP_WARNING_INTERVAL_S``. The record is NOT spooled: appending
  to a file is blocking I/O, which the event loop must not do. Size ``queue_max`` for the
  longest database stall you want to absorb in memory.
- **Database unavailable** (connection refused, timeout, missing table, ...): the batch is
  retried with exponential backoff (``retry_min_s`` doubling up to ``retry_max_s``). With a
  ``spool_path``, the batch is appended to the spool (JSON lines of ``Exchange.to_dict()``,
  fsynced) after the first failure, and so are later batches until the database answers again;
  then the spool is replayed in order, before any newer batch, and truncated. A spool left by a
  previous run is replayed at start. Without a spool the batch is held (the queue fills, then
  ``submit`` drops).
- **A record the database refuses** (a value it cannot store: integer beyond 64 bits, NUL in
  PostgreSQL text, lone UTF-16 surrogate, ...): the batch is retried record by record; each
  refused record is counted in ``rejected``, logged by id (never its content), and appended to
  ``<spool_path>.rejected`` with the error when a spool is configured. One bad record never
  blocks the others.
- **close(timeout_s)**: flushes what is queued and joins. If the thread is still stuck at the
  deadline (a hung database), the queued and in-flight records go to the spool (a later replay
  absorbs any that did commit: inserts are idempotent on the id) or, without a spool, are
  counted in ``lost``.

Counters are plain attributes: ``written`` (records the database holds after a successful write,
a replayed duplicate included), ``dropped`` (refused by ``submit``), ``failed_batches`` (failed
write attempts), ``spooled`` (records appended to the spool), ``rejected`` (refused by the
database or unreadable in the spool), ``lost`` (given up at close). ``stats()`` adds the queue
depth, the spool size and whether the thread is alive.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import exc as sa_exc

from observer.records import Exchange
from observer.store.store import AuditStore, exchange_from_dict

log = logging.getLogger(__name__)

#: Put on the queue by ``close()`` to wake a writer blocked on an empty queue; never written.
_WAKE: Any = object()

#: Minimum seconds between two "queue full" warnings.
DROP_WARNING_INTERVAL_S = 10.0

#: Errors that say "the database is not available" (connection refused or lost, timeout,
#: missing table, server-side failure): the batch is held and retried. Every other error says
#: "these records cannot be stored" (DataError, IntegrityError, OverflowError, UnicodeError,
#: RecursionError on a pathological record, a bug in row building, ...): isolated record by
#: record and rejected, so one poison record can never stop the audit trail.
_UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.InternalError,
    sa_exc.ProgrammingError,
    sa_exc.DisconnectionError,
    sa_exc.TimeoutError,
    ConnectionError,
    TimeoutError,
)


def _is_poison(exc: BaseException) -> bool:
    return not isinstance(exc, _UNAVAILABLE_ERRORS)


class _Unavailable(Exception):
    """The database did not take a write for a reason unrelated to the records."""


class RecordWriter:
    """Queue -> one thread -> batched ``AuditStore.write_many``; see the module docstring.

    ``queue_max``: records held in memory before ``submit`` drops. ``batch_max``: records per
    transaction. ``flush_interval_s``: longest wait for more records after the first of a
    batch. ``spool_path``: JSON-lines file used while the database is unavailable (created
    with mode 0600: it holds prompts and completions). ``retry_min_s``/``retry_max_s``: backoff
    bounds between attempts.
    """

    def __init__(
        self,
        store: AuditStore,
        *,
        queue_max: int = 10000,
        batch_max: int = 500,
        flush_interval_s: float = 0.2,
        spool_path: Path | None = None,
        retry_min_s: float = 0.1,
        retry_max_s: float = 5.0,
    ) -> None:
        if queue_max < 1 or batch_max < 1:
            raise ValueError("queue_max and batch_max must be at least 1")
        if flush_interval_s < 0 or not 0 < retry_min_s <= retry_max_s:
            raise ValueError("need flush_interval_s >= 0 and 0 < retry_min_s <= retry_max_s")
        self._store = store
        self._queue: queue.SimpleQueue[Exchange] = queue.SimpleQueue()  # + _WAKE at close
        self._wake_queued = False  # _WAKE is in the queue
        self._queue_max = queue_max
        self._batch_max = batch_max
        self._flush_interval_s = flush_interval_s
        self._retry_min_s = retry_min_s
        self._retry_max_s = retry_max_s
        self._spool_path = Path(spool_path) if spool_path is not None else None
        self._rejected_path = (
            self._spool_path.with_name(self._spool_path.name + ".rejected") if self._spool_path else None
        )
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._wake = threading.Event()  # set by close() to cut a backoff wait short
        self._submit_lock = threading.Lock()
        self._spool_lock = threading.Lock()
        self._abandoned = False
        self._last_drop_warning = -DROP_WARNING_INTERVAL_S
        # Writer-thread state (read by close() only once the thread is abandoned).
        self._held: list[Exchange] = []
        self._replayed_bytes = 0

        self.written = 0
        self.dropped = 0
        self.failed_batches = 0
        self.spooled = 0
        self.rejected = 0
        self.lost = 0

    # -- event-loop side ---------------------------------------------------------------------

    def submit(self, record: Exchange) -> bool:
        """Queues ``record`` without blocking; ``False`` (counted in ``dropped``) when the queue
        is full or the writer is closing."""
        # Check-then-put: exact with one producer (the proxy loop); several producers may
        # overshoot queue_max by at most one record each.
        if not self._closing.is_set() and self._queue.qsize() < self._queue_max:
            self._queue.put_nowait(record)
            return True
        with self._submit_lock:
            self.dropped += 1
            dropped = self.dropped
            now = time.monotonic()
            warn = now - self._last_drop_warning >= DROP_WARNING_INTERVAL_S
            if warn:
                self._last_drop_warning = now
        if warn:
            log.warning(
                "audit writer: record dropped (queue of %d full or writer closing); %d dropped so far",
                self._queue_max,
                dropped,
            )
        return False

    def start(self) -> None:
        """Starts the writer thread (once)."""
        if self._thread is not None:
            raise RuntimeError("RecordWriter already started")
        self._thread = threading.Thread(target=self._run, name="observer-record-writer", daemon=True)
        self._thread.start()

    def close(self, timeout_s: float = 10.0) -> None:
        """Writes what is queued, then stops the thread; returns within about ``timeout_s``.

        Records still unwritten at the deadline are spooled (or counted in ``lost``)."""
        if self._thread is None:
            self.start()
        assert self._thread is not None
        self._closing.set()
        self._wake.set()
        self._wake_queued = True
        self._queue.put_nowait(_WAKE)  # ends an idle thread's blocking get()
        self._thread.join(timeout_s)
        if self._thread.is_alive() or self._queued() > 0:  # stuck, or a submit raced close()
            self._abandon()

    def stats(self) -> dict[str, Any]:
        """Counters plus ``queued`` (records waiting), ``spool_bytes`` and ``alive``."""
        return {
            "written": self.written,
            "dropped": self.dropped,
            "failed_batches": self.failed_batches,
            "spooled": self.spooled,
            "rejected": self.rejected,
            "lost": self.lost,
            "queued": self._queued(),
            "spool_bytes": self._spool_size(),
            "alive": self._thread is not None and self._thread.is_alive(),
        }

    def _queued(self) -> int:
        """Records waiting in the queue (the close marker not counted)."""
        return max(0, self._queue.qsize() - (1 if self._wake_queued else 0))

    def __enter__(self) -> RecordWriter:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- writer thread -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException:
            log.critical("audit writer thread died; records are no longer written", exc_info=True)
            raise

    def _loop(self) -> None:
        spool_pending = self._spool_size() > 0
        delay_s = 0.0  # current backoff; 0 while the database answers
        retry_at = 0.0  # monotonic time of the next attempt while backing off
        while not self._abandoned:
            closing = self._closing.is_set()
            if not self._held:
                wait_s: float | None
                if closing:
                    wait_s = 0.0
                elif spool_pending:  # replay soon, or at the retry time while backing off
                    wait_s = self._flush_interval_s
                    if delay_s:
                        wait_s = min(wait_s, max(0.0, retry_at - time.monotonic()))
                else:
                    wait_s = None  # idle: block until a record or close() (no polling)
                self._held = self._take_batch(wait_s)
            backing_off = delay_s > 0 and time.monotonic() < retry_at
            if backing_off and self._held and self._spool(self._held):
                # Keep order: while the spool is non-empty, newer records go behind it.
                spool_pending, self._held = True, []
                continue
            if not self._held and not spool_pending:
                if closing:
                    return
                continue
            if backing_off:
                if not self._held:
                    if closing:
                        return  # the spool waits for the next start
                    continue  # _take_batch waits for a record or the retry time
                # No spool (or it failed): hold the batch; close() wakes us for one more attempt.
                if self._wake.wait(max(0.0, retry_at - time.monotonic())):
                    self._wake.clear()
                    retry_at = 0.0
                continue
            try:
                if spool_pending:
                    self._replay_spool()
                    spool_pending = False
                if self._held:
                    self._write(self._held)
                    self._held = []
                if delay_s:
                    log.warning("audit writer: database available again; %d records written so far", self.written)
                delay_s = retry_at = 0.0
            except Exception as exc:  # _Unavailable, or a bug here: keep the thread alive either way
                self.failed_batches += 1
                delay_s = min(self._retry_max_s, delay_s * 2 if delay_s else self._retry_min_s)
                retry_at = time.monotonic() + delay_s
                if isinstance(exc, _Unavailable):
                    log.warning(
                        "audit writer: database unavailable (%s: %s); next attempt in %.1f s",
                        type(exc.__cause__).__name__,
                        _cause_line(exc.__cause__),
                        delay_s,
                    )
                else:
                    log.error("audit writer: unexpected error; next attempt in %.1f s", delay_s, exc_info=True)
                if self._held and self._spool(self._held):
                    spool_pending, self._held = True, []

    def _take_batch(self, wait_s: float | None) -> list[Exchange]:
        """Up to ``batch_max`` records: waits ``wait_s`` seconds for the first (``None``: until
        one or the close marker arrives), then at most ``flush_interval_s`` for more (no waiting
        while closing). The close marker is dropped, never returned."""
        while True:
            try:
                if wait_s is None:
                    first = self._queue.get()
                elif wait_s > 0:
                    first = self._queue.get(timeout=wait_s)
                else:
                    first = self._queue.get_nowait()
            except queue.Empty:
                return []
            if first is not _WAKE:
                break
            self._wake_queued = False
            wait_s = 0.0  # closing: take what is queued without waiting
        batch = [first]
        until = time.monotonic() + self._flush_interval_s
        while len(batch) < self._batch_max:
            remaining_s = until - time.monotonic()
            try:
                if remaining_s <= 0 or self._closing.is_set():
                    item = self._queue.get_nowait()
                else:
                    item = self._queue.get(timeout=remaining_s)
            except queue.Empty:
                break
            if item is not _WAKE:
                batch.append(item)
            else:
                self._wake_queued = False
        return batch

    def _write(self, batch: list[Exchange]) -> None:
        """Writes ``batch``; refused records are rejected one by one. Raises ``_Unavailable``
        (``batch`` trimmed to what is still unwritten) when the database is not available."""
        try:
            self._store.write_many(batch)
        except Exception as exc:
            if not _is_poison(exc):
                raise _Unavailable() from exc
            if len(batch) == 1:
                self._reject(batch[0].id, batch[0].to_dict(), exc)
                del batch[0]
                return
        else:
            self.written += len(batch)
            return
        while batch:
            record = batch[0]
            try:
                self._store.write_many([record])
            except Exception as exc:
                if not _is_poison(exc):
                    raise _Unavailable() from exc
                self._reject(record.id, record.to_dict(), exc)
            else:
                self.written += 1
            del batch[0]

    def _replay_spool(self) -> None:
        """Writes the spooled records in file order, then truncates the spool. Raises
        ``_Unavailable`` (progress kept in ``_replayed_bytes``) when the database goes away."""
        assert self._spool_path is not None
        try:
            for records, end_offset in self._read_spool():
                self._write(records)
                self._replayed_bytes = end_offset
        except FileNotFoundError:
            log.error("audit writer: spool %s disappeared before its replay", self._spool_path)
            self._replayed_bytes = 0
            return
        with self._spool_lock:
            if self._abandoned:
                return
            # Only this thread appends to the spool, so everything in it has been replayed.
            with open(self._spool_path, "r+b") as f:
                f.truncate(0)
                os.fsync(f.fileno())
            self._replayed_bytes = 0
        log.info("audit writer: spool replayed")

    def _read_spool(self) -> Iterator[tuple[list[Exchange], int]]:
        """Batches of spooled records after ``_replayed_bytes``, with the file offset after each."""
        assert self._spool_path is not None
        batch: list[Exchange] = []
        with open(self._spool_path, "rb") as f:
            f.seek(self._replayed_bytes)
            offset = self._replayed_bytes
            for line in f:
                offset += len(line)
                try:
                    batch.append(exchange_from_dict(json.loads(line)))
                except (ValueError, KeyError, TypeError) as exc:  # a torn or edited line
                    self._reject(None, {"spool_line": line.decode("utf-8", "replace")}, exc)
                if len(batch) >= self._batch_max:
                    yield batch, offset
                    batch = []
            if batch or offset > self._replayed_bytes:
                yield batch, offset

    def _spool(self, records: list[Exchange]) -> bool:
        """Appends ``records`` to the spool (fsynced); ``False`` when there is no usable spool."""
        if self._spool_path is None:
            return False
        lines = []
        for r in records:
            try:
                lines.append(_json_line(r.to_dict()))
            except (TypeError, ValueError) as exc:
                self._reject(r.id, None, exc)
        try:
            with self._spool_lock:
                if self._abandoned and threading.current_thread() is self._thread:
                    return True  # close() gave up on this thread and saved its records
                _append(self._spool_path, b"".join(lines))
        except OSError as exc:
            log.error("audit writer: cannot append to the spool %s (%s); holding the batch", self._spool_path, exc)
            return False
        self.spooled += len(lines)
        return True

    def _reject(self, record_id: str | None, payload: dict[str, Any] | None, exc: BaseException) -> None:
        self.rejected += 1
        kept = False
        if self._rejected_path is not None and payload is not None:
            try:
                entry = {"error": type(exc).__name__, "message": str(exc)[:2000], "record": payload}
                _append(self._rejected_path, _json_line(entry))
                kept = True
            except (OSError, TypeError, ValueError, RecursionError):
                pass
        log.error(
            "audit writer: record %s cannot be written (%s); %s",
            record_id or "<unreadable spool line>",
            type(exc).__name__,
            f"kept in {self._rejected_path}" if kept else "NOT kept",
        )

    def _spool_size(self) -> int:
        try:
            return self._spool_path.stat().st_size if self._spool_path else 0
        except FileNotFoundError:
            return 0

    # -- close() after a timeout -----------------------------------------------------------------

    def _abandon(self) -> None:
        """Called by ``close`` when the thread is stuck: saves what it still holds and what is
        queued to the spool (or counts it lost); the thread exits when it wakes up."""
        if not self._spool_lock.acquire(timeout=0.5):
            self._abandoned = True
            self.lost += len(self._held) + self._queued()
            log.error("audit writer: stuck on the spool at close; %d records lost", self.lost)
            return
        try:
            self._abandoned = True
            leftover = list(self._held)
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not _WAKE:
                    leftover.append(item)
                else:
                    self._wake_queued = False
            if self._spool_path is not None and leftover:
                try:
                    _append(self._spool_path, b"".join(_json_line(r.to_dict()) for r in leftover))
                    self.spooled += len(leftover)
                    log.error("audit writer: database stuck at close; %d records spooled", len(leftover))
                    return
                except (OSError, TypeError, ValueError) as exc:
                    log.error("audit writer: cannot spool at close (%s)", exc)
            self.lost += len(leftover)
            if leftover:
                log.error("audit writer: database stuck at close; %d records lost", len(leftover))
        finally:
            self._spool_lock.release()


def _json_line(obj: dict[str, Any]) -> bytes:
    # ensure_ascii: lone surrogates and NUL survive as escapes; ints of any size stay exact.
    return (json.dumps(obj, ensure_ascii=True, separators=(",", ":")) + "\n").encode("ascii")


def _append(path: Path, data: bytes) -> None:
    """Appends and fsyncs (the directory too when the file is new); mode 0600."""
    created = not path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _cause_line(exc: BaseException | None) -> str:
    """The first line of the driver's own message (the engine hides statement parameters, so
    no record content can appear here)."""
    if exc is None:
        return ""
    orig = getattr(exc, "orig", None) or exc
    lines = str(orig).strip().splitlines()
    return lines[0][:200] if lines else ""
