"""The ``alerts`` table (``observer.alerting``): an alert is inserted once, then its
``deliveries`` are updated as its webhooks answer; listed newest first for the API.

Alerts are operational notes, not audit records: they are not chained (the records they name
are), and a purge leaves them (they hold counts and ids, no content)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Engine, insert, select, update

from observer.shape import rfc3339
from observer.store.models import AlertRow

LIST_MAX = 500


def add_alert(engine: Engine, alert: dict[str, Any]) -> None:
    """Inserts one alert (``Alert.to_dict()`` with ``fired_at`` a datetime); an alert already
    stored (same id: a retry after a lost answer) is left as it is."""
    with engine.begin() as conn:
        if conn.execute(select(AlertRow.id).where(AlertRow.id == alert["id"])).first() is not None:
            return
        conn.execute(insert(AlertRow).values(**alert))


def set_deliveries(engine: Engine, alert_id: str, deliveries: dict[str, str]) -> None:
    with engine.begin() as conn:
        conn.execute(update(AlertRow).where(AlertRow.id == alert_id).values(deliveries=deliveries))


def list_alerts(
    engine: Engine,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    rule: str | None = None,
    kind: str | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Alerts fired in ``[since, until)``, newest first, at most ``limit`` (1-``LIST_MAX``)."""
    table = AlertRow.__table__
    stmt = select(*table.c).order_by(AlertRow.fired_at.desc(), AlertRow.id.desc()).limit(max(1, min(limit, LIST_MAX)))
    if since is not None:
        stmt = stmt.where(AlertRow.fired_at >= since)
    if until is not None:
        stmt = stmt.where(AlertRow.fired_at < until)
    if rule is not None:
        stmt = stmt.where(AlertRow.rule == rule)
    if kind is not None:
        stmt = stmt.where(AlertRow.kind == kind)
    with engine.connect() as conn:
        rows = conn.execute(stmt).mappings().all()
    return [{**row, "fired_at": rfc3339(row["fired_at"])} for row in rows]


__all__ = ["LIST_MAX", "add_alert", "list_alerts", "set_deliveries"]
