"""``/v1/access-log``: who called the API, when, with what, and what they got."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request

from observer.api.access import note
from observer.api.auth import require
from observer.api.filters import text_value, time_value
from observer.api.routers import StoreDep
from observer.api.schemas import AccessLogPage
from observer.store import access

router = APIRouter(prefix="/access-log", tags=["access log"], dependencies=[Depends(require("access_log"))])


@router.get("", response_model=AccessLogPage, summary="Read the access log, newest first")
def list_access_log(
    request: Request,
    store: StoreDep,
    since: Annotated[str | None, Query(description="At or after (RFC 3339)")] = None,
    until: Annotated[str | None, Query(description="Before (RFC 3339)")] = None,
    principal: Annotated[str | None, Query(description="Token name (bootstrap: the configured token)")] = None,
    endpoint: Annotated[str | None, Query(description="Route template, e.g. /v1/exchanges/{exchange_id}")] = None,
    status: Annotated[int | None, Query(ge=100, le=599, description="HTTP status answered")] = None,
    exchange_id: Annotated[str | None, Query(description="Calls that returned or changed this record")] = None,
    before_seq: Annotated[
        int | None, Query(ge=1, le=2**63 - 1, description="`next_before_seq` of the previous page")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> dict[str, Any]:
    """Entries matching every filter, by ``seq`` descending (this call's own entry is written
    after its answer is made, so it is not in it)."""
    filters = access.LogFilters(
        since=time_value("since", since),
        until=time_value("until", until),
        principal=text_value("principal", principal),
        endpoint=text_value("endpoint", endpoint),
        status=status,
        exchange_id=text_value("exchange_id", exchange_id),
    )
    items, next_before = access.page(store.engine, filters, limit, before_seq)
    note(request, rows=len(items))
    return {"items": items, "next_before_seq": next_before}
