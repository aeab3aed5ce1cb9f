"""The SQL audit store: table models, ``AuditStore``, the non-blocking ``RecordWriter``.

Migrations: ``observer.store.migrate.upgrade(url)`` (kept out of this namespace so that the proxy
does not import Alembic).
"""

from observer.store.store import AuditStore, InvalidCursor, exchange_from_dict

__all__ = ["AuditStore", "InvalidCursor", "exchange_from_dict"]
