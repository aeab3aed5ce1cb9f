"""Owners of API credentials (``key_owners``): which person or team holds the credential behind a
record's ``key_fingerprint`` (``observer.identity``), set by ``observer key-owner add`` and read by
the API (``key_owner`` filter, the record's ``key_owner``).

The table maps fingerprints to owners; it never holds a credential. A fingerprint has one owner
at a time: ``set_owner`` refuses a fingerprint that has one unless ``replace`` (then the row is
updated and the previous owner is in the event). Every change is an event of the store's chain
(``key_owner_set``, ``observer.store.events``), so who attributed a key to whom, and when, is
tamper-evident; the mapping itself is not part of the records' chain (it may change after a
record was stored: a record's key is a fact, its owner an attribution).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, insert, select, update

from observer.errors import ObserverError
from observer.identity import FINGERPRINT_HEX, FINGERPRINT_PREFIX
from observer.store.checkpoint import CheckpointKey
from observer.store.events import append_event, lock
from observer.store.models import KeyOwnerRow

__all__ = ["COLUMNS", "KeyOwnerError", "fingerprints_of", "list_owners", "owners_of", "set_owner"]

COLUMNS = ("fingerprint", "owner", "team", "note", "created_at", "created_by", "updated_at", "updated_by")
TEXT_MAX = 200
_HEX = frozenset("0123456789abcdef")


class KeyOwnerError(ObserverError, ValueError):
    """A key-owner command that cannot be done (a malformed fingerprint, an owner already set)."""

    code = "key_owner_error"


def check_fingerprint(fingerprint: str) -> str:
    """``fingerprint`` when it is ``hmac-sha256:`` and 32 lower-case hex digits; ``KeyOwnerError`` else."""
    digits = fingerprint.removeprefix(FINGERPRINT_PREFIX)
    if not fingerprint.startswith(FINGERPRINT_PREFIX) or len(digits) != FINGERPRINT_HEX or not set(digits) <= _HEX:
        raise KeyOwnerError(f"not a fingerprint (want {FINGERPRINT_PREFIX} and {FINGERPRINT_HEX} hex digits)")
    return fingerprint


def _text(name: str, value: str | None, *, required: bool = False) -> str | None:
    if value is None:
        if required:
            raise KeyOwnerError(f"{name} is required")
        return None
    value = value.strip()
    # isprintable: no control (C0, DEL, C1), format (bidi overrides, zero-width) or surrogate
    # characters (an argument that was not UTF-8): trial finding, they passed a C0-only check.
    if (required and not value) or len(value) > TEXT_MAX or not value.isprintable():
        raise KeyOwnerError(f"{name}: 1..{TEXT_MAX} printable characters")
    return value or None


def set_owner(
    engine: Engine,
    key: CheckpointKey,
    store_id: str,
    *,
    fingerprint: str,
    owner: str,
    team: str | None,
    note: str | None,
    actor: str,
    at: datetime,
    replace: bool = False,
) -> dict[str, Any]:
    """Sets the owner of ``fingerprint``; returns its row. Raises ``KeyOwnerError`` for a bad
    fingerprint or text, or a fingerprint that has an owner (without ``replace``)."""
    fingerprint = check_fingerprint(fingerprint)
    owner_text = _text("owner", owner, required=True)
    team, note = _text("team", team), _text("note", note)
    table = KeyOwnerRow.__table__
    with engine.begin() as conn:
        lock(conn)
        found = conn.execute(select(*(table.c[c] for c in COLUMNS)).where(table.c.fingerprint == fingerprint)).first()
        if found is not None and not replace:
            raise KeyOwnerError(
                f"{fingerprint} is {found.owner}'s"
                + (f" ({found.team})" if found.team else "")
                + "; --replace to change it"
            )
        if found is None:
            row = dict(zip(COLUMNS, (fingerprint, owner_text, team, note, at, actor, None, None), strict=True))
            conn.execute(insert(table), [row])
            replaced = None
        else:
            row = {**dict(found._mapping), "owner": owner_text, "team": team, "note": note}
            row.update(updated_at=at, updated_by=actor)
            conn.execute(
                update(table)
                .where(table.c.fingerprint == fingerprint)
                .values(owner=owner_text, team=team, note=note, updated_at=at, updated_by=actor)
            )
            replaced = {"owner": found.owner, "team": found.team}
        detail = {"fingerprint": fingerprint, "owner": owner_text, "team": team, "note": note, "replaced": replaced}
        append_event(conn, key, store_id, "key_owner_set", actor, detail, at)
    return row


def list_owners(engine: Engine, *, owner: str | None = None) -> list[dict[str, Any]]:
    """The rows (of ``owner`` only, when given), by owner then fingerprint."""
    table = KeyOwnerRow.__table__
    stmt = select(*(table.c[c] for c in COLUMNS)).order_by(table.c.owner, table.c.fingerprint)
    if owner is not None:
        stmt = stmt.where(table.c.owner == owner)
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(stmt)]


def fingerprints_of(conn: Connection, owner: str) -> list[str]:
    """The fingerprints whose owner or team is ``owner`` (the API's ``key_owner`` filter)."""
    table = KeyOwnerRow.__table__
    stmt = select(table.c.fingerprint).where((table.c.owner == owner) | (table.c.team == owner))
    return list(conn.scalars(stmt.order_by(table.c.fingerprint)))


def owners_of(conn: Connection, fingerprints: Iterable[str | None]) -> dict[str, dict[str, Any]]:
    """``{fingerprint: {"owner", "team"}}`` of those of ``fingerprints`` that have an owner."""
    wanted = sorted({f for f in fingerprints if f is not None})
    if not wanted:
        return {}
    table = KeyOwnerRow.__table__
    rows = conn.execute(select(table.c.fingerprint, table.c.owner, table.c.team).where(table.c.fingerprint.in_(wanted)))
    return {r.fingerprint: {"owner": r.owner, "team": r.team} for r in rows}
