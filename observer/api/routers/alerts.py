"""``/v1/alerts``: the alerts the proxies' rules fired (``observer.alerting``), and where each
was delivered."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from observer.api.access import note
from observer.api.filters import text_value, time_value
from observer.api.routers import StoreDep
from observer.api.schemas import AlertPage
from observer.store import alerts

router = APIRouter(prefix="/alerts", tags=["alerts"])


@router.get("", response_model=AlertPage, summary="Alerts fired, newest first")
def list_alerts(
    request: Request,
    store: StoreDep,
    since: Annotated[str | None, Query(description="Fired at or after (RFC 3339)")] = None,
    until: Annotated[str | None, Query(description="Fired before (RFC 3339)")] = None,
    rule: Annotated[str | None, Query(description="The rule's name in the alerts file")] = None,
    kind: Annotated[str | None, Query(description="undeclared_tool, content_filter, error_rate, ...")] = None,
    limit: Annotated[int, Query(ge=1, le=alerts.LIST_MAX)] = 100,
) -> dict[str, Any]:
    """Alerts matching every filter (counts and record ids, no record content: any role)."""
    items = alerts.list_alerts(
        store.engine,
        since=time_value("since", since),
        until=time_value("until", until),
        rule=text_value("rule", rule),
        kind=text_value("kind", kind),
        limit=limit,
    )
    note(request, rows=len(items), ids=[i["exchange_id"] for i in items if i["exchange_id"]])
    return {"items": items}
