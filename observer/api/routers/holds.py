"""``/v1/holds``: legal holds (``observer.store.holds``): read by auditors, responders and
admins; made and released by responders and admins (each a signed store event)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, status
from pydantic import BaseModel, ConfigDict, Field

from observer.api.access import note
from observer.api.auth import Principal, require
from observer.api.errors import APIError
from observer.api.filters import time_value
from observer.api.routers import KeyDep, StoreDep, actor_of
from observer.api.schemas import ErrorResponse, HoldOut
from observer.shape import rfc3339
from observer.store import holds
from observer.store.holds import HoldError, HoldNotFound, HoldReleased, Scope

router = APIRouter(prefix="/holds", tags=["holds"])


class HoldCreate(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "reason": "Case 2026-17: preserve alice's November exchanges",
                    "user": "alice",
                    "since": "2026-11-01T00:00:00Z",
                    "until": "2026-11-30T23:59:59Z",
                }
            ]
        },
    )
    reason: str = Field(min_length=1, max_length=holds.MAX_TEXT, description="Why (case, request, order)")
    since: str | None = Field(default=None, description="Records started at or after (RFC 3339)")
    until: str | None = Field(default=None, description="Records started at or before (RFC 3339)")
    user: str | None = Field(default=None, description="Records of this enduser.id")
    host: str | None = Field(default=None, description="Records sent to this host")
    exchange_ids: list[str] | None = Field(default=None, max_length=holds.MAX_HOLD_IDS)


def _hold(row: dict[str, Any]) -> dict[str, Any]:
    def t(v: datetime | None) -> str | None:
        return None if v is None else rfc3339(v)

    return {
        "id": row["id"],
        "reason": row["reason"],
        "created_at": t(row["created_at"]),
        "created_by": row["created_by"],
        "scope": {
            "since": t(row["since"]),
            "until": t(row["until"]),
            "user": row["end_user"],
            "host": row["host"],
            "exchange_ids": row["exchange_ids"],
        },
        "released_at": t(row["released_at"]),
        "released_by": row["released_by"],
        "release_reason": row["release_reason"],
    }


@router.get("", response_model=list[HoldOut], summary="List legal holds")
def list_holds(
    request: Request,
    store: StoreDep,
    _principal: Annotated[Principal, Depends(require("export"))],
    include_released: Annotated[bool, Query(description="Released holds too")] = False,
) -> list[dict[str, Any]]:
    """Oldest first."""
    rows = [_hold(r) for r in holds.list_holds(store.engine, include_released=include_released)]
    note(request, rows=len(rows), ids=[r["id"] for r in rows])
    return rows


@router.post(
    "",
    response_model=HoldOut,
    status_code=status.HTTP_201_CREATED,
    summary="Put records under a legal hold",
    responses={status.HTTP_400_BAD_REQUEST: {"model": ErrorResponse}},
)
def create_hold(
    request: Request,
    store: StoreDep,
    key: KeyDep,
    principal: Annotated[Principal, Depends(require("holds"))],
    body: HoldCreate,
) -> dict[str, Any]:
    """Every condition given must match a record; at least one is needed."""
    note(request, body=body.model_dump(exclude_none=True))
    try:
        scope = Scope(
            since=time_value("since", body.since),
            until=time_value("until", body.until),
            end_user=body.user,
            host=body.host,
            exchange_ids=None if body.exchange_ids is None else tuple(body.exchange_ids),
        )
        row = holds.create_hold(
            store.engine, key, store.store_id(), scope, body.reason, actor_of(principal), datetime.now(timezone.utc)
        )
    except HoldError as exc:
        raise APIError(status.HTTP_400_BAD_REQUEST, exc.code, str(exc)) from None
    note(request, rows=1, ids=[row["id"]])
    return _hold(row)


@router.delete(
    "/{hold_id}",
    response_model=HoldOut,
    summary="Release a legal hold",
    responses={status.HTTP_404_NOT_FOUND: {"model": ErrorResponse}},
)
def release_hold(
    request: Request,
    store: StoreDep,
    key: KeyDep,
    principal: Annotated[Principal, Depends(require("holds"))],
    hold_id: Annotated[str, Path()],
    reason: Annotated[str, Query(min_length=1, max_length=holds.MAX_TEXT, description="Why it is released")],
) -> dict[str, Any]:
    """Its records are purged again once past retention."""
    if len(hold_id) > 36 or "\x00" in hold_id:
        raise APIError(status.HTTP_404_NOT_FOUND, "not_found", "no such hold")
    note(request, body={"reason": reason})
    try:
        row = holds.release_hold(
            store.engine, key, store.store_id(), hold_id, reason, actor_of(principal), datetime.now(timezone.utc)
        )
    except HoldNotFound as exc:
        raise APIError(status.HTTP_404_NOT_FOUND, exc.code, str(exc)) from None
    except HoldReleased as exc:
        raise APIError(status.HTTP_409_CONFLICT, exc.code, str(exc)) from None
    except HoldError as exc:
        raise APIError(status.HTTP_400_BAD_REQUEST, exc.code, str(exc)) from None
    note(request, rows=1, ids=[hold_id])
    return _hold(row)
