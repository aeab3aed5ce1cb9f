"""``/v1/incidents``: incidents under review, their report deadlines, notes and linked exchanges
(``observer.store.incidents``). Reading needs ``metadata`` plus ``incidents`` or ``export``
(auditors see them); opening and changing them needs ``incidents`` (responder, admin)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request, status
from pydantic import BaseModel, ConfigDict, Field

from observer.api.access import note
from observer.api.auth import Principal, require
from observer.api.errors import APIError
from observer.api.filters import text_value, time_value
from observer.api.routers import KeyDep, StoreDep, actor_of
from observer.api.schemas import ErrorResponse, IncidentOut, IncidentSummary
from observer.store import incidents
from observer.store.incidents import IncidentClosed, IncidentError, IncidentNotFound

router = APIRouter(prefix="/incidents", tags=["incidents"])

Category = Literal[
    "widespread_infringement",
    "critical_infrastructure",
    "death",
    "serious_harm_to_health",
    "fundamental_rights",
    "property_or_environment",
    "other",
]
_NOT_FOUND = {status.HTTP_404_NOT_FOUND: {"model": ErrorResponse, "description": "No incident with this id"}}


class IncidentCreate(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "title": "Assistant disclosed another customer's invoices",
                    "category": "fundamental_rights",
                    "aware_at": "2026-11-30T10:00:00Z",
                    "note": "Reported by the customer by phone.",
                    "exchange_ids": ["a0000000-0000-4000-8000-000000000001"],
                }
            ]
        },
    )
    title: str = Field(min_length=1, max_length=incidents.TITLE_MAX)
    category: Category = Field(description="Decides the report deadline (2, 10 or 15 days; other: none)")
    aware_at: str = Field(description="When the deployer became aware (RFC 3339)", examples=["2026-11-30T14:00:00Z"])
    note: str | None = Field(default=None, max_length=incidents.NOTE_MAX, description="A first note")
    exchange_ids: list[str] = Field(
        default_factory=list, max_length=incidents.LINK_MAX, description="Exchanges to link (each put under a hold)"
    )


class IncidentPatch(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"status": "reported", "note": "Report sent to the authority, ref. 2026-117."}]
        },
    )
    title: str | None = Field(default=None, min_length=1, max_length=incidents.TITLE_MAX)
    category: Category | None = None
    aware_at: str | None = Field(default=None, description="RFC 3339")
    status: Literal["open", "reported", "closed"] | None = Field(
        default=None, description="open -> reported -> closed, or open -> closed"
    )
    note: str | None = Field(default=None, max_length=incidents.NOTE_MAX, description="Appended (notes never change)")
    link_exchanges: list[str] = Field(default_factory=list, max_length=incidents.LINK_MAX)


def _reader(request: Request, principal: Annotated[Principal, Depends(require("metadata"))]) -> Principal:
    if not (principal.can("incidents") or principal.can("export")):
        raise APIError(status.HTTP_403_FORBIDDEN, "forbidden", f"the role {principal.role} may not read incidents")
    return principal


@router.get("", response_model=list[IncidentSummary], summary="List incidents with their deadlines")
def list_incidents(
    request: Request,
    store: StoreDep,
    _principal: Annotated[Principal, Depends(_reader)],
    status_: Annotated[Literal["open", "reported", "closed"] | None, Query(alias="status")] = None,
    exchange_id: Annotated[str | None, Query(max_length=36, description="Incidents linking this exchange")] = None,
) -> list[dict[str, Any]]:
    """Newest ``aware_at`` first; ``deadline`` is null for category ``other``."""
    items = incidents.list_incidents(store.engine, status=status_, exchange_id=text_value("exchange_id", exchange_id))
    note(request, rows=len(items), ids=[i["id"] for i in items])
    return items


@router.post(
    "",
    response_model=IncidentOut,
    status_code=status.HTTP_201_CREATED,
    summary="Open an incident",
    responses={status.HTTP_400_BAD_REQUEST: {"model": ErrorResponse}},
)
def create_incident(
    request: Request,
    store: StoreDep,
    key: KeyDep,
    principal: Annotated[Principal, Depends(require("incidents"))],
    body: IncidentCreate,
) -> dict[str, Any]:
    """Opens it; the exchanges given are linked and put under one legal hold."""
    note(request, body=body.model_dump())
    aware_at = time_value("aware_at", body.aware_at)
    assert aware_at is not None
    try:
        out = incidents.create_incident(
            store.engine,
            key,
            store.store_id(),
            title=body.title,
            category=body.category,
            aware_at=aware_at,
            actor=actor_of(principal),
            at=datetime.now(timezone.utc),
            note=body.note,
            exchange_ids=body.exchange_ids,
        )
    except IncidentError as exc:
        raise APIError(status.HTTP_400_BAD_REQUEST, exc.code, str(exc)) from None
    note(request, rows=1, ids=[out["id"], *body.exchange_ids])
    return out


@router.get("/{incident_id}", response_model=IncidentOut, summary="Read an incident", responses=_NOT_FOUND)
def get_incident(
    request: Request,
    store: StoreDep,
    _principal: Annotated[Principal, Depends(_reader)],
    incident_id: Annotated[str, Path()],
) -> dict[str, Any]:
    """With its notes (oldest first) and linked exchanges (each with the hold it is under)."""
    try:
        out = incidents.get_incident(store.engine, incident_id)
    except IncidentNotFound as exc:
        raise APIError(status.HTTP_404_NOT_FOUND, "not_found", str(exc)) from None
    note(request, rows=1, ids=[out["id"]])
    return out


@router.patch(
    "/{incident_id}",
    response_model=IncidentOut,
    summary="Change an incident, append a note, link exchanges",
    responses={**_NOT_FOUND, status.HTTP_409_CONFLICT: {"model": ErrorResponse, "description": "Closed"}},
)
def patch_incident(
    request: Request,
    store: StoreDep,
    key: KeyDep,
    principal: Annotated[Principal, Depends(require("incidents"))],
    incident_id: Annotated[str, Path()],
    body: IncidentPatch,
) -> dict[str, Any]:
    """Only what is given changes; ``note`` is appended; ``link_exchanges`` are linked and held."""
    note(request, body=body.model_dump(exclude_none=True))
    try:
        out = incidents.update_incident(
            store.engine,
            key,
            store.store_id(),
            incident_id,
            actor=actor_of(principal),
            at=datetime.now(timezone.utc),
            title=body.title,
            category=body.category,
            aware_at=time_value("aware_at", body.aware_at),
            status=body.status,
            note=body.note,
            link=body.link_exchanges,
        )
    except IncidentNotFound as exc:
        raise APIError(status.HTTP_404_NOT_FOUND, "not_found", str(exc)) from None
    except IncidentClosed as exc:
        raise APIError(status.HTTP_409_CONFLICT, exc.code, str(exc)) from None
    except IncidentError as exc:
        raise APIError(status.HTTP_400_BAD_REQUEST, exc.code, str(exc)) from None
    note(request, rows=1, ids=[out["id"], *body.link_exchanges])
    return out
