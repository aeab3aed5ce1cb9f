"""``/v1/exchanges``: list and read audit records (bearer token required, set in ``create_app``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, status

from observer.api.routers import StoreDep
from observer.api.schemas import ErrorResponse, ExchangeOut, ExchangePage
from observer.store.store import CURSOR_MAX_CHARS, LIST_LIMIT_MAX

router = APIRouter(prefix="/exchanges", tags=["exchanges"])


@router.get("", response_model=ExchangePage, summary="List exchanges, newest first")
def list_exchanges(
    store: StoreDep,
    limit: Annotated[int, Query(ge=1, le=LIST_LIMIT_MAX, description="Items per page")] = 50,
    cursor: Annotated[
        str | None, Query(max_length=CURSOR_MAX_CHARS, description="`next_cursor` of the previous page")
    ] = None,
) -> dict[str, Any]:
    """Record summaries ordered by ``(started_at, id)`` descending; keyset-paginated, so records
    written meanwhile never shift a page. A cursor this API did not issue gives 400
    ``invalid_cursor``."""
    items, next_cursor = store.list(limit, cursor)
    return {"items": items, "next_cursor": next_cursor}


@router.get(
    "/{exchange_id}",
    response_model=ExchangeOut,
    summary="Read one exchange",
    responses={status.HTTP_404_NOT_FOUND: {"model": ErrorResponse, "description": "No record with this id"}},
)
def get_exchange(
    store: StoreDep,
    exchange_id: Annotated[str, Path(description="Record id")],
) -> dict[str, Any]:
    """The full audit record: request facts, content blocks, tool calls, usage, violations."""
    record = store.get(exchange_id)
    if record is None:
        raise HTTPException(
            status_code=status.HTTP_404_NOT_FOUND, detail=f"no exchange with id {_shorten(exchange_id)!r}"
        )
    return record


def _shorten(value: str, limit: int = 80) -> str:
    """Echoes at most ``limit`` characters of client input back in error messages."""
    return value if len(value) <= limit else value[:limit] + "..."
