"""The SQL audit store: table models, ``AuditStore``, the non-blocking ``RecordWriter``.

Migrations: ``observer.store.migrate.upgrade(url)`` (kept out of this namespace so that the proxy
does not import Alembic). ``AuditStore`` and its neighbours are imported on first use (PEP 562),
so that the modules here that need no database (``chain``, ``checkpoint``, ``manifest``: ``observer
export verify`` runs offline) do not import SQLAlchemy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from observer.store.store import AuditStore, InvalidCursor, exchange_from_dict

__all__ = ["AuditStore", "InvalidCursor", "exchange_from_dict"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from observer.store import store

        return getattr(store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
