"""``Journal``: every observed exchange made durable on local disk before anything can drop it.

The proxy's event loop only appends to a ``queue.SimpleQueue`` (no lock, no I/O); ONE thread
writes the queued entries to the current segment file and fsyncs them, one fsync for everything
queued meanwhile (group commit), then publishes the durable end for the database drainer
(``observer.store.drain``), which reads the segments in order. The format is
``observer.journal.format``; the folder holds:

- ``seg-NNNNNNNNNN.log``: the segments, appended in order; a start begins a new one, and so does
  a segment reaching ``segment_bytes`` (at most a quarter of ``max_bytes``);
- ``identity.json``: this writer's id (``writer_id``, made on first use) and the id of the store
  its records belong to (``store_id``, set by the drainer);
- ``ack.json``: how far the drainer has stored (segment, offset); segments before it are deleted;
- ``rejected.jsonl``: records the database refused (with the error), for a person to look at;
- ``lock``: held (``flock``) while a process uses the journal: two processes never share one.

Everything is created readable by the owner only (folder 0700, files 0600): the journal holds
prompts and completions.

What is journaled, and when:

- ``open``: when a response's headers arrive, its record skeleton and parse spec;
- ``data``: its response bytes, each time the tap hands a batch over (``tap_batch_ms``); at most
  ``flow_data_max`` bytes per exchange (at most a sixteenth of ``max_bytes``; then a ``CUT``
  entry says the rest is missing);
- ``record``: the finished record, numbered ``seq`` (1, 2, ... per writer, no holes).

After ``kill -9`` of the proxy everything handed to the journal thread is on disk within one
round (written to the page cache before the next item is taken); after a power loss, what the
last fsync covered (one round: typically a few ms). ``observer.journal.recovery`` turns the
exchanges still open in the journal into ``interrupted`` records at the next start.

Bounds and failure policy (compliance notes §4, "bounded spool: drop_newest"):

- ``max_bytes`` (``spool_max_bytes``): segments not yet stored in the database. When they reach
  it, new opens, data and records are not journaled: records are dropped, counted, and one
  ``GAP`` entry per reason and window (at most one per ``gap_flush_s`` while it lasts) says how
  many and when. ``GAP``/``FORGET``/``CUT`` entries are written even then (a few dozen bytes).
- ``queue_max``: records waiting in memory for the thread. Beyond it ``record`` drops the record
  (reason ``queue_full``): the disk is slower than the traffic.
- A write or fsync that fails (``ENOSPC``, ``EIO``): the segment is cut back to its last durable
  size, the round's records are dropped into a ``disk_error`` gap, and the journal takes nothing
  for ``retry_s`` seconds, then tries again.
- ``accepting``: False while records would be dropped (full, disk error, thread dead); the
  addon's ``fail_closed`` answers new LLM requests 503 then.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from observer.errors import ConfigError
from observer.journal import format as fmt
from observer.records import Exchange
from observer.response import ResponseSpec

log = logging.getLogger("observer.journal")

SEGMENT_BYTES = 8 << 20
FLOW_DATA_MAX = 16 << 20
DATA_QUEUE_MAX = 64 << 20
ROUND_ITEMS_MAX = 4096
GAP_FLUSH_S = 10.0
GAP_SETTLE_S = 0.1  # seconds without new drops before a pending gap is written
DROP_WARNING_INTERVAL_S = 10.0

_STOP: Any = ("stop",)
_WAKE: Any = ("wake",)


def _now_rfc3339(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, timezone.utc).isoformat().replace("+00:00", "Z")


def segment_name(number: int) -> str:
    return f"seg-{number:010d}.log"


def segment_numbers(directory: Path) -> list[int]:
    """The numbers of the segment files in ``directory``, ascending."""
    out = []
    for p in directory.glob("seg-*.log"):
        stem = p.name[4:-4]
        if stem.isdigit():
            out.append(int(stem))
    return sorted(out)


def write_private(path: Path, data: bytes) -> None:
    """Replaces ``path`` atomically (temporary file, fsync, rename, folder fsync); mode 0600."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(slots=True)
class _Live:
    """An open exchange in the current segment: where its entries are (offset, size), the
    response bytes journaled, and whether the rest was cut."""

    locs: list[tuple[int, int]] = field(default_factory=list)
    data_bytes: int = 0
    cut: bool = False


@dataclass(slots=True)
class _Batch:
    """One write: its entries (``parts``), what each did (``effects``: kind, record id, what
    undoing needs), the segment size it started at and reaches, the next seq after it, and its
    record count."""

    start: int
    seq: int
    size: int = 0
    records: int = 0
    parts: list[bytes] = field(default_factory=list)
    effects: list[tuple] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.size = self.start


@dataclass(slots=True)
class _Gap:
    count: int
    first_s: float
    last_s: float


class Journal:
    """The journal in ``directory``; see the module docstring. ``open()`` locks and reads the
    folder (``ConfigError`` when another process holds it or it cannot be made); ``start(seq)``
    starts the thread, numbering records from ``seq``; ``close()`` writes what is queued and
    stops. ``on_durable`` is called on the thread after each fsync (the drainer's wake-up)."""

    def __init__(
        self,
        directory: Path,
        *,
        max_bytes: int = 1 << 30,
        queue_max: int = 10000,
        segment_bytes: int = SEGMENT_BYTES,
        flow_data_max: int = FLOW_DATA_MAX,
        data_queue_max: int = DATA_QUEUE_MAX,
        retry_s: float = 1.0,
        gap_flush_s: float = GAP_FLUSH_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._queue_max = queue_max
        # The current segment cannot be deleted and open exchanges are carried into each new
        # one: both must stay well inside the bound, or a small bound would be full for good.
        self._segment_bytes = min(segment_bytes, max(4096, max_bytes // 4))
        self._flow_data_max = min(flow_data_max, max(1024, max_bytes // 16))
        self._data_queue_max = data_queue_max
        self._retry_s = retry_s
        self._gap_flush_s = gap_flush_s
        self._clock = clock
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock_fd: int | None = None
        self._thread: threading.Thread | None = None
        self._cond = threading.Condition()  # guards _durable, _sizes, _current
        self._durable: tuple[int, int] = (0, 0)
        self._sizes: dict[int, int] = {}
        self._current = 0
        self.on_durable: Callable[[], None] | None = None
        self.writer_id = ""
        self.store_id: str | None = None
        self._seq_floor = 1
        self._identity_lock = threading.Lock()
        self.run_segment = 0  # the segment this run began with
        # loop side
        self._data_in = 0
        self._cut_sent: set[str] = set()
        self._drop_lock = threading.Lock()
        self._loop_drops: _Gap | None = None
        self._last_drop_warning = -DROP_WARNING_INTERVAL_S
        # thread side
        self._fd = -1
        self._size = 0
        self._next_seq = 1
        self._live: dict[str, _Live] = {}
        self._gaps: dict[str, _Gap] = {}
        self._cut_pending: set[str] = set()  # open exchanges whose CUT entry waits for the disk
        self._forget_pending: set[str] = set()
        self._last_gap_flush = 0.0
        self._blocked_until = 0.0
        self._data_out = 0
        self._full = False
        self.closed = False
        # counters (thread side unless noted)
        self.journaled = 0  # records made durable
        self.dropped = 0  # records dropped (thread side; loop-side drops are in ``queue_dropped``)
        self.queue_dropped = 0  # loop side
        self.gaps_written = 0
        self.rounds = 0
        self.disk_errors = 0

    # ----- setup -----
    def open(self) -> None:
        """Creates (0700) and locks the folder, reads or makes ``identity.json``."""
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.directory, 0o700)
            fd = os.open(self.directory / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise ConfigError(f"cannot use the journal folder {self.directory}: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise ConfigError(
                f"the journal folder {self.directory} is in use by another observer process;"
                " give each process its own (journal_dir, or data_dir)"
            ) from None
        self._lock_fd = fd
        identity = self.directory / "identity.json"
        try:
            data = fmt.loads(identity.read_bytes())
            self.writer_id = str(data["writer_id"])
            self.store_id = data.get("store_id")
            self._seq_floor = int(data.get("next_seq", 1))
        except FileNotFoundError:
            self.writer_id = str(uuid.uuid4())
            self._save_identity()
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{identity} is damaged ({exc}); move it away to start a new writer") from exc
        with self._cond:
            for n in segment_numbers(self.directory):
                self._sizes[n] = (self.directory / segment_name(n)).stat().st_size

    def _save_identity(self) -> None:
        """``identity.json``: writer and store ids, and ``next_seq``, a floor for the numbering
        (saved at start, at each new segment and at close: segments deleted behind the journal's
        back cannot make it number twice, at most the records since the last save are not
        known to have existed)."""
        with self._identity_lock:  # the journal's thread (rolls) and the drainer's (binding)
            self._seq_floor = max(self._seq_floor, self._next_seq)
            identity = {"writer_id": self.writer_id, "store_id": self.store_id, "next_seq": self._seq_floor}
            write_private(self.directory / "identity.json", fmt.dumps(identity))

    def bind_store(self, store_id: str) -> None:
        """Records the store these records belong to (the drainer, once the database answers)."""
        if store_id != self.store_id:
            self.store_id = store_id
            self._save_identity()

    def start(self, next_seq: int = 1, first: list[Exchange] = ()) -> None:  # type: ignore[assignment]
        """Starts the thread; the first record journaled gets ``next_seq``; ``first`` (records
        recovery rebuilt) are journaled before anything else, whatever ``queue_max``. A new
        segment is begun (the old ones are left as they are, for the drainer)."""
        if self._lock_fd is None:
            self.open()
        if self._thread is not None:
            raise RuntimeError("the journal is already started")
        # What this journal numbered before, even if its segments are gone since (deleted,
        # lost): never number twice.
        self._next_seq = max(next_seq, self._seq_floor)
        with self._cond:
            number = max(self._sizes, default=0) + 1
        self.run_segment = number
        self._begin_segment(number)
        self._save_identity()
        for record in first:
            self._queue.put_nowait(("R", record))
        self._thread = threading.Thread(target=self._run, name="observer-journal", daemon=True)
        self._thread.start()

    # ----- event-loop side (never blocks, never raises) -----
    def open_exchange(self, record_id: str, skeleton: Exchange, spec: ResponseSpec, violations: list) -> None:
        """An exchange whose response headers arrived: its record ``skeleton`` (not changed after
        this call: the caller passes a copy), the ``spec`` its parse needs, and the request
        side's ``violations``. Serialised on the journal's thread."""
        self._queue.put_nowait(("O", record_id, skeleton, spec, violations))

    def data(self, record_id: str, pending: list, nbytes: int) -> None:
        """Response bytes of an open exchange (``[chunk, arrival_s, ...]``, ``nbytes`` bytes)."""
        if self._data_in - self._data_out + nbytes > self._data_queue_max:
            if record_id not in self._cut_sent:  # once per exchange: tell recovery the rest is missing
                self._cut_sent.add(record_id)
                self._queue.put_nowait(("C", record_id))
            return
        self._data_in += nbytes
        self._queue.put_nowait(("D", record_id, pending, nbytes))

    def forget(self, record_id: str) -> None:
        """The open exchange ``record_id`` is done without a record of that id (a multi-turn
        stream's records have ids of their own: ``observer.capture.turns``): a ``FORGET``
        entry, so recovery does not rebuild it."""
        self._cut_sent.discard(record_id)
        self._queue.put_nowait(("F", record_id))

    def record(self, record: Exchange) -> bool:
        """Queues a finished record; False (dropped, counted in a ``queue_full`` gap) when
        ``queue_max`` records are waiting or the journal is closed."""
        self._cut_sent.discard(record.id)
        if not self.closed and self._queue.qsize() < self._queue_max:
            self._queue.put_nowait(("R", record))
            return True
        now = self._clock()
        with self._drop_lock:
            self.queue_dropped += 1
            if self._loop_drops is None:
                self._loop_drops = _Gap(1, now, now)
            else:
                self._loop_drops.count += 1
                self._loop_drops.last_s = now
        self._queue.put_nowait(("F", record.id))  # a few bytes: recovery must not revive it
        if now - self._last_drop_warning >= DROP_WARNING_INTERVAL_S:
            self._last_drop_warning = now
            log.warning(
                "journal: record dropped (%d waiting: the disk is behind); %d so far",
                self._queue_max,
                self.queue_dropped,
            )
        return False

    @property
    def accepting(self) -> bool:
        """Whether a record finished now would be journaled (not full, no disk error, thread alive)."""
        alive = self._thread is not None and self._thread.is_alive()
        return (
            alive and not self._full and self._clock() >= self._blocked_until and self._queue.qsize() < self._queue_max
        )

    # ----- the drainer's side -----
    def durable(self) -> tuple[int, int]:
        """(segment, offset) up to which everything is on disk."""
        with self._cond:
            return self._durable

    def current_segment(self) -> int:
        with self._cond:
            return self._current

    def wait_durable(self, after: tuple[int, int], timeout_s: float | None) -> tuple[int, int]:
        """Waits until the durable end passes ``after`` (or ``timeout_s``); returns it."""
        with self._cond:
            self._cond.wait_for(lambda: self._durable > after or self.closed, timeout_s)
            return self._durable

    def wake(self) -> None:
        """Wakes ``wait_durable`` waiters (the drainer closing)."""
        with self._cond:
            self._cond.notify_all()

    def release(self, before_segment: int) -> int:
        """Deletes the segments numbered below ``before_segment`` (never the current one);
        returns how many. Called by the drainer once their records are stored."""
        removed = 0
        with self._cond:
            numbers = [n for n in self._sizes if n < before_segment and n != self._current]
        for n in numbers:
            with contextlib.suppress(FileNotFoundError):
                (self.directory / segment_name(n)).unlink()
            with self._cond:
                self._sizes.pop(n, None)
            removed += 1
        if removed:
            fsync_dir(self.directory)
            self._queue.put_nowait(_WAKE)  # room again: the thread re-checks the bound
        return removed

    def segment_list(self) -> list[int]:
        """Numbers of the segments on disk, ascending."""
        with self._cond:
            return sorted(self._sizes)

    def segment_sizes(self) -> dict[int, int]:
        """Segment number -> bytes (durable or being written)."""
        with self._cond:
            return dict(self._sizes)

    def spool_bytes(self) -> int:
        """Bytes of the segments still on disk (not yet stored in the database, or current)."""
        with self._cond:
            return sum(self._sizes.values())

    def stats(self) -> dict[str, Any]:
        return {
            "journaled": self.journaled,
            "dropped": self.dropped + self.queue_dropped,
            "gaps": self.gaps_written,
            "disk_errors": self.disk_errors,
            "queued": self._queue.qsize(),
            "spool_bytes": self.spool_bytes(),
            "open_exchanges": len(self._live),
            "accepting": self.accepting,
        }

    def close(self, timeout_s: float = 10.0) -> None:
        """Journals what is queued (drops still pending become a gap), fsyncs, stops the thread
        and releases the folder's lock."""
        self.closed = True
        if self._thread is not None:
            self._queue.put_nowait(_STOP)
            self._thread.join(timeout_s)
            if not self._thread.is_alive():
                with contextlib.suppress(OSError):
                    self._save_identity()
            if self._thread.is_alive():
                log.error(
                    "journal: the writer thread did not stop within %.0f s (%d items queued)",
                    timeout_s,
                    self._queue.qsize(),
                )
        if self._gaps:
            lost = sum(g.count for g in self._gaps.values())
            log.error("journal: %d dropped records could not be recorded as a gap (the disk failed)", lost)
        with self._cond:
            self._cond.notify_all()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # ----- the thread -----
    def _run(self) -> None:
        try:
            while True:
                try:
                    items = [self._queue.get(timeout=self._gap_wait())]
                except queue.Empty:  # a pending gap is due
                    items = []
                while len(items) < ROUND_ITEMS_MAX:
                    try:
                        items.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                stop = any(item is _STOP for item in items)
                self._round(items, final=stop)
                if stop:
                    break
        except BaseException:
            log.critical("journal: the writer thread died; records are no longer journaled", exc_info=True)
            raise
        finally:
            if self._fd >= 0:
                with contextlib.suppress(OSError):
                    os.fsync(self._fd)
                os.close(self._fd)
                self._fd = -1

    def _round(self, items: list, *, final: bool) -> None:
        """Encodes, writes and fsyncs one round of queued items (rolling to a new segment when
        one is full). The open-exchange table follows each entry as it is encoded; a failed
        write undoes what it did (``_undo``) and the round's records become a gap."""
        now = self._clock()
        self.rounds += 1
        blocked = now < self._blocked_until
        batch = _Batch(self._size, self._next_seq)
        with self._cond:
            base = sum(self._sizes.values()) - self._size  # the other segments
        if not blocked or final:  # at close, one more try: a gap is small, the disk may take it
            for rid in sorted(self._forget_pending):
                self._add(batch, fmt.forget_entry(rid), "F", rid, None)
            self._forget_pending.clear()
            for rid in sorted(self._cut_pending):
                live = self._live.get(rid)
                if live is not None and not live.cut:
                    body = fmt.cut_entry(rid)
                    self._add(batch, body, "C", rid, self._live_effect("C", rid, body, ("C", rid), batch.size))
            self._cut_pending.clear()
            if self._gaps_due(now, final, base + batch.size >= self.max_bytes):
                self._add_gaps(batch)
        for item in items:
            if item[0] == "D":
                self._data_out += item[3]
            full = blocked or base + batch.size >= self.max_bytes
            encoded = self._encode(item, full, blocked, now, batch.seq)
            if encoded is None:
                continue
            body, kind, rid = encoded
            if batch.size + len(body) > self._segment_bytes and batch.size > len(fmt.SEGMENT_MAGIC):
                if not self._commit(batch, now):
                    blocked = True
                    batch = _Batch(self._size, self._next_seq)
                    self._undo_one(kind, rid, now)
                    continue
                self._roll()
                with self._cond:
                    base = sum(self._sizes.values()) - self._size
                batch = _Batch(self._size, self._next_seq)
            self._add(batch, body, kind, rid, self._live_effect(kind, rid, body, item, batch.size))
        # Records the loop dropped were submitted after those queued before them: their gap
        # follows this round's records.
        with self._drop_lock:
            loop_drops, self._loop_drops = self._loop_drops, None
        if loop_drops is not None:
            self._add_gap("queue_full", loop_drops.count, loop_drops.first_s, loop_drops.last_s)
        dropping = loop_drops is not None or base + batch.size >= self.max_bytes
        if (not blocked or final) and self._gaps_due(now, final, dropping):
            self._add_gaps(batch)
        if batch.parts and not self._commit(batch, now):
            blocked = True
        self._full = blocked or base + self._size >= self.max_bytes

    def _add(self, batch: _Batch, body: bytes, kind: str, rid: str | None, undo: Any) -> None:
        batch.effects.append((kind, rid, undo))
        batch.parts.append(body)
        batch.size += len(body)
        if kind in ("R", "G"):
            batch.seq += 1
            batch.records += kind == "R"

    def _add_gaps(self, batch: _Batch) -> None:
        for reason, gap in sorted(self._gaps.items()):
            body = fmt.gap_entry(
                batch.seq,
                {
                    "first_at": _now_rfc3339(gap.first_s),
                    "last_at": _now_rfc3339(gap.last_s),
                    "dropped": gap.count,
                    "reason": reason,
                },
            )
            self._add(batch, body, "G", None, (reason, gap))
            log.warning("journal: gap recorded: %d records dropped (%s)", gap.count, reason)
        self._gaps = {}
        self._last_gap_flush = self._clock()

    def _live_effect(self, kind: str, rid: str, body: bytes, item: tuple, offset: int) -> Any:
        """Applies one entry to the open-exchange table at once; returns what ``_undo`` needs."""
        loc = (offset, len(body))
        if kind == "O":
            self._live[rid] = _Live([loc])
            return None
        live = self._live.get(rid)
        if kind == "D":
            assert live is not None
            live.locs.append(loc)
            live.data_bytes += item[3]
            return item[3]
        if kind == "C":
            assert live is not None
            live.locs.append(loc)
            live.cut = True
            return None
        return self._live.pop(rid, None)  # R, F: no longer open

    def _encode(self, item: tuple, full: bool, blocked: bool, now: float, seq: int) -> tuple | None:
        """The entry of one queued item: ``(body, kind, record_id)``, or ``None`` when nothing
        is written for it (full: its record is counted in a gap)."""
        tag = item[0]
        if tag == "O":
            if full:
                return None
            body = fmt.open_entry(item[1], item[2].to_dict(), item[3].to_dict(), [v.to_dict() for v in item[4]])
            return body, "O", item[1]
        if tag in ("D", "C"):
            rid = item[1]
            live = self._live.get(rid)
            if live is None or live.cut or rid in self._cut_pending:
                return None
            if tag == "D" and not full and live.data_bytes + item[3] <= self._flow_data_max:
                return fmt.data_entry(rid, item[2]), "D", rid
            if blocked:
                self._cut_pending.add(rid)
                return None
            return fmt.cut_entry(rid), "C", rid
        if tag == "F":
            return (fmt.forget_entry(item[1]), "F", item[1]) if item[1] in self._live else None
        if tag == "R":
            record: Exchange = item[1]
            if full:
                return self._drop("disk_error" if blocked else "spool_full", now, record.id, blocked)
            return fmt.record_entry(seq, fmt.dumps(record.to_dict())), "R", record.id
        return None  # stop, wake

    def _drop(self, reason: str, now: float, record_id: str, blocked: bool) -> tuple | None:
        """Counts a record that cannot be journaled in the ``reason`` gap; the ``FORGET`` entry
        for its open exchange, if there is one (later, when the disk is ``blocked``)."""
        self.dropped += 1
        self._add_gap(reason, 1, now, now)
        if record_id not in self._live:
            return None
        self._cut_pending.discard(record_id)
        if blocked:
            del self._live[record_id]
            self._forget_pending.add(record_id)
            return None
        return fmt.forget_entry(record_id), "F", record_id

    def _undo_one(self, kind: str, rid: str, now: float) -> None:
        """An item encoded while the write before it failed (its entry is never written)."""
        if kind == "R":
            self._drop("disk_error", now, rid, True)
        elif kind == "D" and rid in self._live:
            self._cut_pending.add(rid)

    def _undo(self, batch: _Batch, now: float) -> None:
        """Takes back what a failed write's entries did to the tables, newest first: opens
        forgotten, data turned into a pending CUT, records into a ``disk_error`` gap (with a
        pending FORGET when their open entry is on disk), gaps put back."""
        for kind, rid, undo in reversed(batch.effects):
            if kind == "O":
                self._live.pop(rid, None)
            elif kind in ("D", "C"):
                live = self._live.get(rid)
                if live is not None:
                    live.locs.pop()
                    if kind == "D":
                        live.data_bytes -= undo
                    else:
                        live.cut = False
                    self._cut_pending.add(rid)
            elif kind in ("R", "F"):
                if kind == "R":
                    self.dropped += 1
                    self._add_gap("disk_error", 1, now, now)
                if undo is not None and undo.locs and undo.locs[0][0] < batch.start:
                    self._forget_pending.add(rid)  # its open entry was durable before this write
            else:  # G
                reason, gap = undo
                self._add_gap(reason, gap.count, gap.first_s, gap.last_s)

    def _commit(self, batch: _Batch, now: float) -> bool:
        """Writes and fsyncs ``batch``; on success publishes the durable end; on failure cuts
        the segment back, undoes the batch (``_undo``) and blocks the journal for ``retry_s``."""
        try:
            _write_all(self._fd, batch.parts)
            os.fdatasync(self._fd)
        except OSError as exc:
            self.disk_errors += 1
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)
                os.fdatasync(self._fd)
            self._blocked_until = now + self._retry_s
            self._undo(batch, now)
            log.error(
                "journal: cannot write %s (%s); %d records dropped, retrying in %.1f s",
                self._segment_path(self._current),
                errno.errorcode.get(exc.errno or 0, str(exc)),
                batch.records,
                self._retry_s,
            )
            return False
        self._size = batch.size
        self._next_seq = batch.seq
        self.journaled += batch.records
        self.gaps_written += sum(1 for e in batch.effects if e[0] == "G")
        with self._cond:
            self._sizes[self._current] = batch.size
            self._durable = (self._current, batch.size)
            self._cond.notify_all()
        if self.on_durable is not None:
            self.on_durable()
        return True

    def _add_gap(self, reason: str, count: int, first_s: float, last_s: float) -> None:
        gap = self._gaps.get(reason)
        if gap is None:
            if not self._gaps:
                self._last_gap_flush = first_s
            self._gaps[reason] = _Gap(count, first_s, last_s)
            log.warning("journal: recording is dropping records (%s)", reason)
        else:
            gap.count += count
            gap.first_s = min(gap.first_s, first_s)
            gap.last_s = max(gap.last_s, last_s)

    def _gap_wait(self) -> float | None:
        """How long the thread may wait for the next item: without end, unless a gap is
        pending (then until it is due: soon once dropping stopped, else at ``gap_flush_s``)."""
        if not self._gaps:
            return None
        if not self._full:
            return GAP_SETTLE_S
        return max(GAP_SETTLE_S, self._last_gap_flush + self._gap_flush_s - self._clock())

    def _gaps_due(self, now: float, final: bool, dropping: bool) -> bool:
        """Whether the pending gaps are written now: when dropping stopped, every
        ``gap_flush_s`` while it lasts, and at close."""
        return bool(self._gaps) and (final or not dropping or now - self._last_gap_flush >= self._gap_flush_s)

    def _segment_path(self, number: int) -> Path:
        return self.directory / segment_name(number)

    def _begin_segment(self, number: int) -> None:
        path = self._segment_path(number)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        os.write(fd, fmt.SEGMENT_MAGIC)
        os.fsync(fd)
        fsync_dir(self.directory)
        old = self._fd
        self._fd = fd
        self._size = len(fmt.SEGMENT_MAGIC)
        with self._cond:
            self._current = number
            self._sizes[number] = self._size
            self._durable = (number, self._size)
            self._cond.notify_all()
        if old >= 0:
            os.close(old)

    def _roll(self) -> None:
        """Starts the next segment and copies the entries of the exchanges still open into it,
        so that older segments hold nothing recovery needs once their records are stored; saves
        the numbering's floor (``_save_identity``)."""
        self._save_identity()
        old_fd = self._fd
        copies = []
        for rid, live in self._live.items():
            blobs = [os.pread(old_fd, n, off) for off, n in live.locs]
            copies.append((rid, blobs))
        os.fsync(old_fd)
        self._fd = -1
        number = self._current + 1
        self._begin_segment(number)
        os.close(old_fd)
        pos = self._size
        parts = []
        for rid, blobs in copies:
            locs = []
            for blob in blobs:
                locs.append((pos, len(blob)))
                parts.append(blob)
                pos += len(blob)
            self._live[rid].locs = locs
        if parts:
            data = b"".join(parts)
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            os.fdatasync(self._fd)
            self._size = pos
            with self._cond:
                self._sizes[number] = pos
                self._durable = (number, pos)
                self._cond.notify_all()


def _write_all(fd: int, parts: list[bytes]) -> None:
    """Writes ``parts`` in order with ``os.writev`` (no joined copy; at most ``IOV_MAX`` at a
    time, a short write resumed where it stopped)."""
    i = 0
    while i < len(parts):
        chunk = parts[i : i + _IOV_MAX]
        written = os.writev(fd, chunk)
        total = sum(map(len, chunk))
        if written == total:
            i += len(chunk)
            continue
        # a short write: finish the part it stopped in, then go on
        for part in chunk:
            if written >= len(part):
                written -= len(part)
                i += 1
                continue
            view = memoryview(part)[written:]
            while view:
                view = view[os.write(fd, view) :]
            i += 1
            break


_IOV_MAX = 1024

__all__ = ["FLOW_DATA_MAX", "SEGMENT_BYTES", "Journal", "segment_name", "segment_numbers", "write_private"]
