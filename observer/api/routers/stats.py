"""``/v1/stats``: exchange counts and token usage (each token class: sum and exchanges reporting it) per model,
day, user, dialect or host."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request

from observer.api.access import note
from observer.api.filters import FiltersDep
from observer.api.routers import StoreDep
from observer.api.schemas import StatsOut
from observer.store import query

router = APIRouter(prefix="/stats", tags=["stats"])


@router.get("", response_model=StatsOut, summary="Counts and token usage, grouped")
def get_stats(
    request: Request,
    store: StoreDep,
    filters: FiltersDep,
    group_by: Annotated[Literal["model", "day", "user", "dialect", "host"], Query(description="What to group by")],
) -> dict[str, Any]:
    """Per group, over the records matching the filters: exchanges; per token class (input,
    output, cache read, cache creation, reasoning output: ``input_tokens``,
    ``cache_read_input_tokens``... as in a record's usage) the sum of what was reported and, as
    ``<class>_reported``, how many exchanges reported it (a count not reported is unknown, not
    0: 0 reported is no report, a sum of 0 over reports is zero tokens); how many exchanges
    reported no usage at all. ``day`` is the UTC date of ``started_at``."""
    groups = query.stats(store.engine, group_by, filters)
    note(request, rows=len(groups))
    return {"group_by": group_by, "filters": filters.given(), "groups": groups}
