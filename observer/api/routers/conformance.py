"""``/v1/conformance``: how the observed streams kept their dialect's rules, per endpoint,
dialect or day (``observer.store.conformance``; issue 16 item 6).

A provider adopting ``application/llm-request+json`` reads its endpoint's group as a validator's
verdict; a vendor dialect's group counts the violations of that dialect's own rules. Any role
may read it, as the statistics: counts only, no record content. Its parameters are checked as
the other read endpoints' (``observer.api.filters``): a bad time, ``until`` not after
``since``, a NUL or an over-long value, an unknown ``group_by`` are 400 ``invalid_parameter``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request

from observer.api.access import note
from observer.api.filters import filters
from observer.api.routers import StoreDep
from observer.api.schemas import ConformanceOut
from observer.store import conformance

router = APIRouter(prefix="/conformance", tags=["conformance"])

_TIME = "RFC 3339 with an offset, e.g. 2025-06-01T00:00:00Z"


@router.get("", response_model=ConformanceOut, summary="Conformance to each dialect's rules, grouped")
def get_conformance(
    request: Request,
    store: StoreDep,
    group_by: Annotated[
        Literal["host", "dialect", "day"],
        Query(description="host: per endpoint (scheme, host, port) and dialect; dialect; day (UTC)"),
    ],
    since: Annotated[str | None, Query(description=f"Started at or after ({_TIME})")] = None,
    until: Annotated[str | None, Query(description=f"Started before ({_TIME})")] = None,
    host: Annotated[str | None, Query(description="server.address, exactly")] = None,
    dialect: Annotated[str | None, Query(description="Wire dialect, e.g. llm-stream-1.0")] = None,
) -> dict[str, Any]:
    """Per group: exchanges, how many completed (``stream.end`` or the dialect's equivalent),
    reported usage, had no violation, and (dialects with a sequence number) kept ``seq``
    monotonic, each with its share; violations per kind (count, exchanges). ``day`` is the UTC
    date of ``started_at``."""
    chosen = filters(request, since=since, until=until, host=host, dialect=dialect)
    body = conformance.report(store.engine, group_by, chosen)
    note(request, rows=len(body["groups"]))
    return body
