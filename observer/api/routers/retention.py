"""``/v1/retention``: the retention policy and what is held (``GET``, admin), and a purge
(``POST /v1/retention/purge``, admin; a dry run unless ``dry_run`` is false), as ``observer
purge`` does it (``observer.store.purge``)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, status
from pydantic import BaseModel, ConfigDict, Field, StrictBool
from sqlalchemy import func, select

from observer.api.access import note
from observer.api.auth import Principal, require
from observer.api.errors import APIError
from observer.api.routers import StoreDep, actor_of
from observer.api.schemas import PurgeOut, RetentionOut
from observer.errors import ObserverError
from observer.shape import rfc3339
from observer.store.holds import held, list_holds
from observer.store.models import ExchangeRow
from observer.store.purge import cutoff_for, purge

router = APIRouter(prefix="/retention", tags=["retention"], dependencies=[Depends(require("retention"))])


class PurgeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dry_run: StrictBool = Field(default=True, description="Count only (the default); false removes the records")


@router.get("", response_model=RetentionOut, summary="The retention policy and what it holds back")
def get_retention(request: Request, store: StoreDep) -> dict[str, Any]:
    """``due``: records past the cutoff that a purge would remove now; ``held``: past the cutoff
    but kept for a legal hold."""
    options = request.app.state.options
    now = datetime.now(timezone.utc)
    cutoff = cutoff_for(now, options.retention_days)
    ex = ExchangeRow.__table__
    with store.engine.connect() as conn:
        holds = list_holds(conn)
        past = conn.scalar(select(func.count()).select_from(ex).where(ex.c.started_at < cutoff)) or 0
        kept = (
            conn.scalar(select(func.count()).select_from(ex).where(ex.c.started_at < cutoff, held(holds))) or 0
            if holds
            else 0
        )
        oldest = conn.scalar(select(func.min(ex.c.started_at)))
    note(request, rows=1)
    return {
        "retention_days": options.retention_days,
        "retention_override": options.retention_override,
        "cutoff": rfc3339(cutoff),
        "oldest_record": None if oldest is None else rfc3339(oldest),
        "due": past - kept,
        "held": kept,
        "active_holds": len(holds),
    }


@router.post("/purge", response_model=PurgeOut, summary="Purge what is past retention (dry run by default)")
def run_purge(
    request: Request,
    store: StoreDep,
    principal: Annotated[Principal, Depends(require("retention"))],
    body: PurgeRequest | None = None,
) -> dict[str, Any]:
    """The chain up to the cutoff is verified first (a break refuses the purge: 409); the
    purge is a signed store event."""
    body = body or PurgeRequest()
    note(request, body=body.model_dump())
    options = request.app.state.options
    key = request.app.state.key
    if not body.dry_run and key is None:
        raise APIError(503, "no_signing_key", "this API has no checkpoint key: it cannot sign a purge")
    try:
        result = purge(
            store,
            None if body.dry_run else key,
            now=datetime.now(timezone.utc),
            retention_days=options.retention_days,
            retention_override=options.retention_override,
            actor=actor_of(principal),
            dry_run=body.dry_run,
            trusted=options.trusted,
        )
    except ObserverError as exc:
        raise APIError(status.HTTP_409_CONFLICT, getattr(exc, "code", "conflict"), str(exc)) from None
    note(request, rows=result.total)
    return {
        "dry_run": body.dry_run,
        "cutoff": rfc3339(result.cutoff),
        "records": result.total,
        "held": result.held,
        "by_writer": result.records,
        "unchained": result.unchained,
        "event_seq": None if result.event is None else result.event["seq"],
    }
