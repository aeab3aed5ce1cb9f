"""``verify``: recomputes every writer's hash chain (``observer.store.chain``) from the rows as
stored and checks its signed checkpoints (``observer.store.checkpoint``).

Per writer, its records and gaps in ``seq`` order must number 1, 2, 3, ... (a gap takes
``seq``..``seq_end``) and each stored ``record_hash`` must equal the hash recomputed from the row
and the previous entry's hash. What each kind of change looks like:

- a changed field (metadata or content): ``hash mismatch`` at that row;
- a row deleted in the middle: ``seq missing`` at the next row;
- rows reordered (seq values swapped) or a forged row inserted: ``hash mismatch`` (the seq is
  committed) or ``seq missing`` / ``seq repeated``;
- the newest rows deleted (the tail): ``tail deleted`` when a checkpoint names a seq beyond the
  last row (or one kept elsewhere does: ``exported``);
- a checkpoint changed or signed by another key: ``checkpoint`` breaks (signature, key, its
  note against its columns, its head hash against the chain, its link to the one before).

The first break of each writer is reported (writer, seq, record id, reason), and the rest of that
writer's chain is not trusted: reading it stops there. With ``since``/``until`` only the entries
from the first record started at or after ``since`` to the last started at or before ``until``
are recomputed, from the stored hash of the entry before them (trusted as the anchor).

Rows without ``writer_id`` (stored before the journal) are counted as ``unchained``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlalchemy import func, select

from observer.store.chain import GENESIS, canonical_gap, canonical_record, chain_hash
from observer.store.checkpoint import ZERO_HASH, check_checkpoint, key_id, note_hash
from observer.store.models import BlockRow, ExchangeRow, GapRow, ToolCallRow, ViolationRow
from observer.store.rows import exchange_from_row, rows_from_records
from observer.store.store import AuditStore

PAGE = 1000


@dataclass(frozen=True, slots=True)
class Break:
    """Where a writer's chain stops being trustworthy."""

    writer_id: str
    seq: int | None
    record_id: str | None
    reason: str

    def line(self) -> str:
        where = f"seq {self.seq}" if self.seq is not None else "its end"
        rid = f", record {self.record_id}" if self.record_id else ""
        return f"writer {self.writer_id}, {where}{rid}: {self.reason}"


@dataclass(slots=True)
class Report:
    """``verify``'s result: entries checked per writer, the time of each writer's last
    checkpoint (a deleted tail with its checkpoints shows as a silence since then), checkpoints
    checked, rows outside any chain, the breaks (first per writer) and warnings (not breaks)."""

    entries: dict[str, int] = field(default_factory=dict)
    last_checkpoint: dict[str, datetime] = field(default_factory=dict)
    checkpoints: int = 0
    unchained: int = 0
    breaks: list[Break] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.breaks


def verify(
    store: AuditStore,
    trusted: Sequence[Ed25519PublicKey] | Ed25519PublicKey | None,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    exported: list[dict[str, Any]] | None = None,
    progress: Callable[[int], None] | None = None,
    total: Callable[[int], None] | None = None,
) -> Report:
    """Checks every writer of ``store`` (see the module docstring). ``trusted``: the checkpoint
    keys trusted (each writer's checkpoints must all be signed by one of them, the same one;
    ``None`` or empty: checkpoints are not checked, a warning says so). ``exported``:
    checkpoint rows kept elsewhere (``observer checkpoint export``), compared with the store.
    ``progress(n)`` is called with the entries done since its last call; ``total(n)`` once
    with the number to do. Database errors propagate."""
    report = Report()
    store_id = store.store_id()
    ex = ExchangeRow.__table__
    with store.engine.connect() as conn:
        report.unchained = conn.scalar(select(func.count()).select_from(ex).where(ex.c.writer_id.is_(None))) or 0
        chain_began = conn.scalar(select(func.min(ex.c.started_at)).where(ex.c.writer_id.is_not(None)))
        late = None
        if report.unchained and chain_began is not None:
            late = conn.execute(
                select(ex.c.id, ex.c.started_at)
                .where(ex.c.writer_id.is_(None), ex.c.started_at >= chain_began)
                .order_by(ex.c.started_at)
                .limit(1)
            ).first()
    if late is not None:
        report.breaks.append(
            Break(
                "(none)",
                None,
                late.id,
                "a record outside any chain, started after the chains began (inserted?): only records stored"
                " before the journal existed may be unchained",
            )
        )
    writers = store.writers()
    plans = {w: _range(store, w, since, until) for w in writers}
    if total is not None:
        total(sum(stop - start + 1 for start, stop in plans.values() if stop >= start))
    if isinstance(trusted, Ed25519PublicKey):
        trusted = [trusted]
    keys = {key_id(k): k for k in trusted or ()}
    if not keys:
        report.warnings.append("no checkpoint key given: checkpoints were not checked")
    for writer in writers:
        start, stop = plans[writer]
        checkpoints = store.checkpoints(writer)
        if checkpoints:
            report.last_checkpoint[writer] = checkpoints[-1]["created_at"]
        wanted = {c["seq"] for c in checkpoints}
        heads: dict[int, str] = {}
        brk, count, last_seq = _walk(store, writer, start, stop, wanted, heads, progress)
        report.entries[writer] = count
        if brk is None and keys:
            brk = _check_checkpoints(writer, checkpoints, heads, keys, store_id, last_seq, since, until)
            report.checkpoints += len(checkpoints)
        if brk is None and exported:
            brk = _check_exported(writer, exported, checkpoints, last_seq)
        if brk is not None:
            report.breaks.append(brk)
        if not checkpoints and count:
            report.warnings.append(f"writer {writer} has no checkpoints (deleted, or it never made one)")
    for cp in exported or ():
        if cp.get("store_id") not in (None, store_id):
            report.breaks.append(
                Break(cp["writer_id"], None, None, f"the export is of the store {cp['store_id']}, this is {store_id}")
            )
            break
    for writer in sorted({cp["writer_id"] for cp in exported or ()} - set(writers)):
        last = max((cp for cp in exported or () if cp["writer_id"] == writer), key=lambda cp: cp["number"])
        report.breaks.append(
            Break(
                writer,
                1,
                None,
                f"every row of this writer deleted: exported checkpoint {last['number']} covers seq {last['seq']},"
                " the store has none",
            )
        )
    return report


def _range(store: AuditStore, writer: str, since: datetime | None, until: datetime | None) -> tuple[int, int]:
    """(first seq, last seq) to recompute: all, or those of records started in the range
    (gaps between them included)."""
    ex, gap = ExchangeRow.__table__, GapRow.__table__
    with store.engine.connect() as conn:
        last = max(
            conn.scalar(select(func.max(ex.c.seq)).where(ex.c.writer_id == writer)) or 0,
            conn.scalar(select(func.max(gap.c.seq_end)).where(gap.c.writer_id == writer)) or 0,
        )
        first = 1
        if since is not None:
            first = (
                conn.scalar(select(func.min(ex.c.seq)).where(ex.c.writer_id == writer, ex.c.started_at >= since))
                or last + 1
            )
        if until is not None:
            last = (
                conn.scalar(select(func.max(ex.c.seq)).where(ex.c.writer_id == writer, ex.c.started_at <= until)) or 0
            )
    return first, last


class _Loaded:
    """An ``exchanges`` row (Core) with its child rows, read as ``exchange_from_row`` reads an
    ORM row (attributes: the row's columns copied into ``__dict__``)."""

    def __init__(self, keys: list[str], row: Any) -> None:
        self.__dict__.update(zip(keys, row, strict=True))
        self.blocks: list[Any] = []
        self.tool_calls: list[Any] = []
        self.violations: list[Any] = []


_CHILD_TABLES = (
    ("blocks", BlockRow.__table__),
    ("tool_calls", ToolCallRow.__table__),
    ("violations", ViolationRow.__table__),
)


def _entries(store: AuditStore, writer: str, start: int, stop: int) -> Iterator[tuple[int, Any, bool]]:
    """(seq, row, is_gap) of the writer from ``start`` to ``stop``, in seq order (a record and
    a gap with one seq both come: the walk reports it). Pages of ``PAGE`` records, read with
    Core statements (one per table and page)."""
    gaps = [g for g in store.gaps(writer) if g["seq_end"] >= start and g["seq"] <= stop]
    gi = 0
    last = start - 1
    ex = ExchangeRow.__table__
    with store.engine.connect() as conn:
        while True:
            result = conn.execute(
                select(ex)
                .where(ex.c.writer_id == writer, ex.c.seq > last, ex.c.seq <= stop)
                .order_by(ex.c.seq)
                .limit(PAGE)
            )
            keys = list(result.keys())
            page = [_Loaded(keys, r) for r in result]
            by_id = {r.id: r for r in page}
            if page:
                ids = list(by_id)
                for name, table in _CHILD_TABLES:
                    for child in conn.execute(
                        select(table)
                        .where(table.c.exchange_id.in_(ids))
                        .order_by(table.c.exchange_id, table.c.position)
                    ):
                        getattr(by_id[child.exchange_id], name).append(child)
            for row in page:
                while gi < len(gaps) and gaps[gi]["seq"] <= row.seq:
                    yield gaps[gi]["seq"], gaps[gi], True
                    gi += 1
                yield row.seq, row, False
            if len(page) < PAGE:
                break
            last = page[-1].seq
    while gi < len(gaps):
        yield gaps[gi]["seq"], gaps[gi], True
        gi += 1


def _anchor(store: AuditStore, writer: str, start: int) -> bytes:
    """The stored hash of the entry before ``start`` (``GENESIS`` before seq 1)."""
    if start <= 1:
        return GENESIS
    ex, gap = ExchangeRow.__table__, GapRow.__table__
    with store.engine.connect() as conn:
        h = conn.scalar(select(ex.c.record_hash).where(ex.c.writer_id == writer, ex.c.seq == start - 1))
        if h is None:
            h = conn.scalar(select(gap.c.record_hash).where(gap.c.writer_id == writer, gap.c.seq_end == start - 1))
    return bytes.fromhex(h) if h else GENESIS


def _walk(
    store: AuditStore,
    writer: str,
    start: int,
    stop: int,
    wanted: set[int],
    heads: dict[int, str],
    progress: Callable[[int], None] | None,
) -> tuple[Break | None, int, int]:
    """Recomputes the chain; (first break, entries checked, last seq reached)."""
    prev = _anchor(store, writer, start)
    expected = start
    count = 0
    pending = 0
    for seq, row, is_gap in _entries(store, writer, start, stop):
        rid = None if is_gap else row.id
        if seq < expected:
            return Break(writer, seq, rid, "seq repeated (a row inserted, or rows reordered)"), count, expected - 1
        if seq > expected:
            missing = f"{expected}" if seq == expected + 1 else f"{expected}..{seq - 1}"
            after = f"; the next row is seq {seq}" + (f", record {rid}" if rid else " (a gap)")
            return Break(writer, expected, None, f"seq {missing} missing (a row deleted{after})"), count, expected - 1
        if is_gap:
            canonical = canonical_gap(row, writer)
            stored = row["record_hash"]
            end = row["seq_end"]
        else:
            record = exchange_from_row(row)
            canonical = canonical_record(record.to_dict(), writer, seq)
            stored = row.record_hash
            end = seq
        h = chain_hash(prev, canonical)
        if stored != h.hex():
            what = "gap" if is_gap else "record"
            return (
                Break(writer, seq, rid, f"hash mismatch: this {what}, or the order before it, was changed"),
                count,
                expected - 1,
            )
        copied = None if is_gap else _copied_column_changed(row, record)
        if copied is not None:
            reason = f"column {copied} differs from the record it is copied from (changed)"
            return Break(writer, seq, rid, reason), count, expected - 1
        if end in wanted:
            heads[end] = stored
        prev = h
        expected = end + 1
        count += 1
        pending += 1
        if progress is not None and pending >= PAGE:
            progress(pending)
            pending = 0
    if progress is not None and pending:
        progress(pending)
    return None, count, expected - 1


def _copied_column_changed(row: Any, record: Any) -> str | None:
    """The first ``exchanges`` column whose stored value is not what the record (as read back
    from its own columns and JSON) gives it: the denormalised copies (``text``,
    ``request_model``, ``end_user``, the flattened usage and error columns) are served by the
    list endpoint and queried directly, so a change to a copy must break too."""
    (expected,), _children = rows_from_records([record])
    for column, value in expected.items():
        if getattr(row, column) != value:
            return column
    return None


def _check_checkpoints(
    writer: str,
    checkpoints: list[dict[str, Any]],
    heads: dict[int, str],
    keys: dict[str, Ed25519PublicKey],
    store_id: str,
    last_seq: int,
    since: datetime | None,
    until: datetime | None,
) -> Break | None:
    prev = ZERO_HASH
    public = keys.get(checkpoints[0]["key_id"]) if checkpoints else None
    if checkpoints and public is None:
        trusted = ", ".join(sorted(keys))
        return Break(
            writer,
            checkpoints[0]["seq"],
            None,
            f"checkpoint 1: signed by an unknown key ({checkpoints[0]['key_id']}; trusted: {trusted})",
        )
    for i, cp in enumerate(checkpoints, 1):
        where = f"checkpoint {cp['number']}"
        if cp["number"] != i:
            return Break(writer, cp["seq"], None, f"{where}: checkpoint {i} missing (deleted)")
        problem = check_checkpoint(cp, public, store_id)  # type: ignore[arg-type]
        if problem is not None:
            return Break(writer, cp["seq"], None, f"{where}: {problem}")
        if cp["prev_hash"] != prev:
            return Break(writer, cp["seq"], None, f"{where}: does not follow checkpoint {i - 1}")
        prev = note_hash(cp["note"])
        if since is None and until is None and cp["seq"] > last_seq:
            return Break(
                writer,
                last_seq + 1,
                None,
                f"tail deleted: {where} covers seq {cp['seq']}, the store ends at seq {last_seq}",
            )
        head = heads.get(cp["seq"])
        if head is not None and head != cp["head_hash"]:
            return Break(writer, cp["seq"], None, f"{where}: names another head than the chain (rewritten)")
    return None


def _check_exported(
    writer: str, exported: list[dict[str, Any]], checkpoints: list[dict[str, Any]], last_seq: int
) -> Break | None:
    stored = {c["number"]: c for c in checkpoints}
    for cp in exported:
        if cp["writer_id"] != writer:
            continue
        mine = stored.get(cp["number"])
        if mine is None:
            if cp["seq"] > last_seq:
                return Break(
                    writer,
                    last_seq + 1,
                    None,
                    f"tail deleted: exported checkpoint {cp['number']} covers seq {cp['seq']},"
                    f" the store ends at seq {last_seq}",
                )
            return Break(writer, cp["seq"], None, f"exported checkpoint {cp['number']} is missing from the store")
        if mine["note"] != cp["note"] or mine["signature"] != cp["signature"]:
            return Break(writer, cp["seq"], None, f"checkpoint {cp['number']} differs from its exported copy")
    return None


__all__ = ["Break", "Report", "verify"]
