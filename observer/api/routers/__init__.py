"""API routers (one ``APIRouter`` per module) and the dependencies they share."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from observer.store.store import AuditStore


def get_store(request: Request) -> AuditStore:
    """The ``AuditStore`` the app was created with (``create_app(store, ...)``)."""
    store: AuditStore = request.app.state.store
    return store


StoreDep = Annotated[AuditStore, Depends(get_store)]
