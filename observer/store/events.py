"""The store's own chain: legal holds made and released, purges, API tokens (``store_events``).

Each event is an entry of the chain of the writer ``store_id`` (``observer.store.chain``:
``canonical_event``), appended with the next ``seq``, and a signed checkpoint of it is written in
the same transaction (``observer.store.checkpoint``), so an event cannot be added, changed or
removed without a break in ``observer verify``. Any trusted key may sign the store's chain
(administrators run these commands on several hosts); a writer's chain keeps to one key.

Event kinds and their ``detail``:

- ``hold_created``: ``hold_id``, ``reason``, ``scope`` (``since``, ``until``: RFC 3339 or null;
  ``end_user``, ``host``: text or null; ``exchange_ids``: list or null);
- ``hold_released``: ``hold_id``, ``reason``;
- ``purge``: ``cutoff`` (RFC 3339: records started before it were due), ``retention_days``,
  ``retention_override``, ``records`` (chained records removed), ``unchained`` (records from
  before the chain removed), ``held`` (due records kept for a hold), ``runs`` (count),
  ``runs_sha256`` (``chain.runs_digest`` of the ``purged_runs`` rows of this event);
- ``token_created``: ``token_id``, ``name``, ``role``, ``token_sha256``; ``token_revoked``: ``token_id``, ``name``
  (``observer.store.tokens``);
- ``key_owner_set``: ``fingerprint``, ``owner``, ``team``, ``note``, ``replaced`` (the previous
  ``{owner, team}`` or null) (``observer.store.keyowners``).

Commands that append take ``lock`` first, so they run one after the other; should two still
append at once they collide on ``seq`` (the primary key): the later one fails whole with
``ConcurrentChange`` and can be run again.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, insert, select, update
from sqlalchemy import exc as sa_exc

from observer.errors import ObserverError
from observer.store.chain import GENESIS, canonical_event, chain_hash
from observer.store.checkpoint import ZERO_HASH, CheckpointKey, make_checkpoint, note_hash
from observer.store.models import CheckpointRow, StoreEventRow, StoreMetaRow

KINDS = ("hold_created", "hold_released", "purge", "token_created", "token_revoked", "key_owner_set")


class ConcurrentChange(ObserverError):
    """Another command appended to the store's chain at the same time; nothing was written."""

    code = "concurrent_change"


def lock(conn: Connection) -> None:
    """Serialises the commands that change the store's chain: the first statement of their
    transaction (a no-op update of ``store_meta``'s ``store_id`` row: a row lock on PostgreSQL,
    the write lock on SQLite), so what one reads (the holds a purge keeps) cannot change
    under it before it commits. ``store_id`` must exist (``AuditStore.store_id``)."""
    table = StoreMetaRow.__table__
    conn.execute(update(table).where(table.c.key == "store_id").values(value=table.c.value))


def event_head(conn: Connection) -> tuple[int, bytes]:
    """(last seq, its hash) of the store's chain; (0, ``GENESIS``) when it has no event."""
    table = StoreEventRow.__table__
    row = conn.execute(select(table.c.seq, table.c.record_hash).order_by(table.c.seq.desc()).limit(1)).first()
    return (0, GENESIS) if row is None else (row.seq, bytes.fromhex(row.record_hash))


def append_event(
    conn: Connection,
    key: CheckpointKey,
    store_id: str,
    kind: str,
    actor: str,
    detail: Mapping[str, Any],
    at: datetime,
) -> dict[str, Any]:
    """Appends one event and its signed checkpoint inside the caller's transaction; returns the
    event row (``seq``, ``kind``, ``at``, ``actor``, ``detail``, ``record_hash``). ``detail``
    must be JSON (no floats: their text could differ between engines). Raises
    ``ConcurrentChange`` when another command took the seq (the caller's transaction is then
    unusable: roll it back)."""
    if kind not in KINDS:
        raise ValueError(f"unknown store event kind {kind!r}")
    seq, head = event_head(conn)
    row: dict[str, Any] = {"seq": seq + 1, "kind": kind, "at": at, "actor": actor, "detail": dict(detail)}
    row["record_hash"] = chain_hash(head, canonical_event(row, store_id)).hex()
    cps = CheckpointRow.__table__
    last = conn.execute(
        select(cps.c.number, cps.c.note).where(cps.c.writer_id == store_id).order_by(cps.c.number.desc()).limit(1)
    ).first()
    number, prev = (1, ZERO_HASH) if last is None else (last.number + 1, note_hash(last.note))
    checkpoint = make_checkpoint(key, store_id, store_id, number, row["seq"], row["record_hash"], at, prev)
    try:
        conn.execute(insert(StoreEventRow.__table__), [row])
        conn.execute(insert(cps), [checkpoint])
    except sa_exc.IntegrityError as exc:
        raise ConcurrentChange(
            "another hold or purge command changed the store at the same time; nothing was written: run it again"
        ) from exc
    return row


def events(conn: Connection) -> list[dict[str, Any]]:
    """Every store event, by seq, as dicts of the columns."""
    table = StoreEventRow.__table__
    return [dict(r._mapping) for r in conn.execute(select(table).order_by(table.c.seq))]


__all__ = ["KINDS", "ConcurrentChange", "append_event", "event_head", "events", "lock"]
