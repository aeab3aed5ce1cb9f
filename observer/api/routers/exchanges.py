"""``/v1/exchanges``: list, follow and read audit records.

Every role may list and read records; only roles with the ``content`` permission get their
content (``withhold_content``): a viewer's answer never holds prompts, completions, reasoning or
tool arguments, not even in the browser's memory.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, status

from observer.api.access import note
from observer.api.auth import Principal, require
from observer.api.errors import APIError
from observer.api.filters import FiltersDep
from observer.api.routers import StoreDep
from observer.api.schemas import ErrorResponse, ExchangeOut, ExchangePage
from observer.store import query
from observer.store.store import CURSOR_MAX_CHARS, LIST_LIMIT_MAX

router = APIRouter(prefix="/exchanges", tags=["exchanges"])


@router.get(
    "",
    response_model=ExchangePage,
    summary="List exchanges: newest first, or in the order stored (recorded_after)",
)
def list_exchanges(
    request: Request,
    store: StoreDep,
    filters: FiltersDep,
    limit: Annotated[int, Query(ge=1, le=LIST_LIMIT_MAX, description="Items per page")] = 50,
    cursor: Annotated[
        str | None, Query(max_length=CURSOR_MAX_CHARS, description="`next_cursor` of the previous page")
    ] = None,
    recorded_after: Annotated[
        str | None,
        Query(
            max_length=CURSOR_MAX_CHARS,
            description="Follow the store: records stored after this position (`0`: from the first), oldest"
            " stored first; pass the page's `recorded_position` next time",
        ),
    ] = None,
) -> dict[str, Any]:
    """Record summaries matching every filter given.

    Without ``recorded_after``: ordered by ``(started_at, id)`` descending, keyset-paginated by
    ``cursor``, so records written meanwhile never shift a page; but a record stored late with
    an older ``started_at`` (a long stream) lands behind a reader paging by time. With
    ``recorded_after``: ordered by when each record was stored, every record exactly once, and
    ``recorded_position`` to poll from. A cursor or position this API did not issue gives 400
    ``invalid_cursor``."""
    if recorded_after is not None and cursor is not None:
        raise APIError(status.HTTP_400_BAD_REQUEST, "invalid_parameter", "give cursor or recorded_after, not both")
    if recorded_after is not None:
        items, position = query.feed(store.engine, filters, recorded_after, limit)
        note(request, rows=len(items), ids=[i["id"] for i in items])
        return {"items": items, "next_cursor": None, "recorded_position": position}
    items, next_cursor = query.page(store.engine, filters, limit, cursor)
    note(request, rows=len(items), ids=[i["id"] for i in items])
    return {"items": items, "next_cursor": next_cursor, "recorded_position": None}


@router.get(
    "/{exchange_id}",
    response_model=ExchangeOut,
    summary="Read one exchange",
    responses={status.HTTP_404_NOT_FOUND: {"model": ErrorResponse, "description": "No record with this id"}},
)
def get_exchange(
    request: Request,
    store: StoreDep,
    principal: Annotated[Principal, Depends(require("metadata"))],
    exchange_id: Annotated[str, Path(description="Record id")],
) -> dict[str, Any]:
    """The full audit record: request facts, content blocks, tool calls, usage, violations (for
    a viewer without its content: ``content_withheld`` is then true)."""
    record = store.get(exchange_id, store_fields=True)
    if record is None:
        raise APIError(status.HTTP_404_NOT_FOUND, "not_found", f"no exchange with id {_shorten(exchange_id)!r}")
    note(request, rows=1, ids=[record["id"]])
    if not principal.can("content"):
        return withhold_content(record)
    return {**record, "content_withheld": False}


def withhold_content(record: dict[str, Any]) -> dict[str, Any]:
    """The record without its content (what a viewer gets): ``text``, ``reasoning``, each
    block's ``text``, each choice's ``text``, each tool call's ``arguments``, ``request.messages``, ``request.tools`` (declared tools'
    descriptions and schemas; their names stay in ``request.tool_names``), ``request.metadata``
    and ``response_body`` set to ``null``,
    ``content_withheld`` true. The caller's dict is not changed."""
    out = dict(record)
    out["text"] = None
    out["reasoning"] = None
    out["blocks"] = [{**b, "text": None} for b in record.get("blocks") or ()]
    if record.get("choices") is not None:
        out["choices"] = [{**c, "text": None} for c in record["choices"]]
    out["tool_calls"] = [{**t, "arguments": None} for t in record.get("tool_calls") or ()]
    request = dict(record.get("request") or {})
    request["messages"] = None
    request["tools"] = None  # descriptions and schemas: content (committed by digest, as messages)
    request["metadata"] = None  # whatever the client attached
    out["request"] = request
    out["response_body"] = None
    out["content_withheld"] = True
    return out


def _shorten(value: str, limit: int = 80) -> str:
    """Echoes at most ``limit`` characters of client input back in error messages."""
    return value if len(value) <= limit else value[:limit] + "..."
