"""API routers (one ``APIRouter`` per module) and the dependencies they share."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from observer.api.auth import Principal
from observer.api.errors import APIError
from observer.store.checkpoint import CheckpointKey
from observer.store.store import AuditStore


def get_store(request: Request) -> AuditStore:
    """The ``AuditStore`` the app was created with (``create_app(store, ...)``)."""
    store: AuditStore = request.app.state.store
    return store


StoreDep = Annotated[AuditStore, Depends(get_store)]


def get_key(request: Request) -> CheckpointKey:
    """The checkpoint key the app signs store events with; 503 ``no_signing_key`` when it was
    created without one (holds and incidents cannot be made then)."""
    key: CheckpointKey | None = request.app.state.key
    if key is None:
        raise APIError(503, "no_signing_key", "this API has no checkpoint key: it cannot sign holds or incidents")
    return key


KeyDep = Annotated[CheckpointKey, Depends(get_key)]


def actor_of(principal: Principal) -> str:
    """Who a store event names for a call: ``api:<principal name>`` (the CLI names OS users)."""
    return f"api:{principal.name}"
