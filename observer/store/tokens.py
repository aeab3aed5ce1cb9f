"""Tokens of the query API (``api_tokens``): made, listed, revoked, and looked up per call.

A token is ``obs_`` and 43 characters of URL-safe base64 (32 random bytes, ``secrets``); the
store keeps its SHA-256 only (the token has 256 bits of entropy, so a fast hash is enough: no
password-hashing work factor is needed, RFC 6750 §5.2), shown once when it is made. Roles:

- ``viewer``: metadata and usage of records, not their content (prompts, completions,
  reasoning, tool arguments);
- ``auditor``: everything a viewer sees, the content, exports and the access log;
- ``responder``: what an auditor reads, and manages incidents and legal holds;
- ``admin``: everything, tokens and retention included.

Making and revoking a token are events of the store's chain (``token_created``,
``token_revoked``: ``observer.store.events``), so who granted what is tamper-evident; the
created event holds the token's SHA-256 too, so ``observer verify`` finds a row of
``api_tokens`` given another role, name or hash behind the chain's back.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, insert, select, update
from sqlalchemy import exc as sa_exc

from observer.errors import ObserverError
from observer.store.checkpoint import CheckpointKey
from observer.store.events import append_event, lock
from observer.store.models import ApiTokenRow

ROLES = ("viewer", "auditor", "responder", "admin")
PREFIX = "obs_"
NAME_MAX = 100
TOKEN_COLUMNS = ("id", "name", "role", "created_at", "created_by", "revoked_at", "revoked_by")


class TokenError(ObserverError, ValueError):
    """A token command that cannot be done (unknown role, name taken, no such token)."""

    code = "token_error"


def token_sha256(token: str) -> str:
    """Hex SHA-256 of the token's UTF-8 bytes (what ``api_tokens.token_sha256`` holds)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_token() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def create_token(
    engine: Engine, key: CheckpointKey, store_id: str, *, name: str, role: str, actor: str, at: datetime
) -> tuple[str, dict[str, Any]]:
    """Makes a token; returns it (the only time it is seen) and its row (without the hash).
    Raises ``TokenError`` for an unknown role, an empty or over-long name, a name with a
    character that is not printable (``str.isprintable``: a control character such as DEL or ESC,
    a format character such as a bidi override; the name is the actor the store's chained events
    and ``token list`` show, held to the rule of ``--by``), or a name in use (revoked tokens keep
    theirs)."""
    if role not in ROLES:
        raise TokenError(f"unknown role {role!r}; one of {', '.join(ROLES)}")
    name = name.strip()
    if not name or len(name) > NAME_MAX or not name.isprintable():
        raise TokenError(f"a token name is 1..{NAME_MAX} printable characters")
    token = new_token()
    row = {
        "id": str(uuid.uuid4()),
        "name": name,
        "role": role,
        "token_sha256": token_sha256(token),
        "created_at": at,
        "created_by": actor,
        "revoked_at": None,
        "revoked_by": None,
    }
    table = ApiTokenRow.__table__
    try:
        with engine.begin() as conn:
            lock(conn)
            if conn.scalar(select(table.c.id).where(table.c.name == name)) is not None:
                raise TokenError(f"a token named {name!r} exists (names are never reused)")
            conn.execute(insert(table), [row])
            detail = {"token_id": row["id"], "name": name, "role": role, "token_sha256": row["token_sha256"]}
            append_event(conn, key, store_id, "token_created", actor, detail, at)
    except sa_exc.IntegrityError as exc:
        raise TokenError(f"a token named {name!r} exists (names are never reused)") from exc
    return token, {k: row[k] for k in TOKEN_COLUMNS}


def revoke_token(
    engine: Engine, key: CheckpointKey, store_id: str, *, ref: str, actor: str, at: datetime
) -> dict[str, Any]:
    """Revokes the token whose id or name is ``ref``; returns its row. Raises ``TokenError``
    when there is none or it is revoked already."""
    table = ApiTokenRow.__table__
    with engine.begin() as conn:
        lock(conn)
        found = conn.execute(
            select(*(table.c[c] for c in TOKEN_COLUMNS)).where((table.c.id == ref) | (table.c.name == ref))
        ).first()
        if found is None:
            raise TokenError(f"no token with id or name {ref!r}")
        if found.revoked_at is not None:
            raise TokenError(f"token {found.name!r} was revoked already")
        conn.execute(update(table).where(table.c.id == found.id).values(revoked_at=at, revoked_by=actor))
        append_event(conn, key, store_id, "token_revoked", actor, {"token_id": found.id, "name": found.name}, at)
    return {**dict(found._mapping), "revoked_at": at, "revoked_by": actor}


def list_tokens(engine: Engine, *, include_revoked: bool = False) -> list[dict[str, Any]]:
    """The tokens (never their hashes), oldest first."""
    table = ApiTokenRow.__table__
    stmt = select(*(table.c[c] for c in TOKEN_COLUMNS)).order_by(table.c.created_at, table.c.name)
    if not include_revoked:
        stmt = stmt.where(table.c.revoked_at.is_(None))
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(stmt)]


def lookup_any(engine: Engine, token: str) -> dict[str, Any] | None:
    """The row (``id``, ``name``, ``role``, ``revoked_at``) of the token ``token``, revoked or
    not, or ``None`` when no token has its hash."""
    table = ApiTokenRow.__table__
    stmt = select(table.c.id, table.c.name, table.c.role, table.c.revoked_at).where(
        table.c.token_sha256 == token_sha256(token)
    )
    with engine.connect() as conn:
        row = conn.execute(stmt).first()
    return None if row is None else dict(row._mapping)
