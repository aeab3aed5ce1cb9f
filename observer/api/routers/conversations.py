"""``/v1/conversations/{id}``: the exchanges of one conversation, oldest first
(``observer.store.linking``: the store links each turn to the one it continues)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, status

from observer.api.access import note
from observer.api.errors import APIError
from observer.api.routers import StoreDep
from observer.api.schemas import ConversationOut, ErrorResponse
from observer.store import query

router = APIRouter(prefix="/conversations", tags=["exchanges"])


@router.get(
    "/{conversation_id}",
    response_model=ConversationOut,
    summary="The exchanges of a conversation, oldest first",
    responses={status.HTTP_404_NOT_FOUND: {"model": ErrorResponse, "description": "No such conversation"}},
)
def get_conversation(
    request: Request, store: StoreDep, conversation_id: Annotated[str, Path(description="Its first exchange's id")]
) -> dict[str, Any]:
    """Summaries as ``GET /v1/exchanges`` gives them (at most 500 turns)."""
    items = (
        []
        if len(conversation_id) > 36 or "\x00" in conversation_id
        else query.conversation(store.engine, conversation_id)
    )
    if not items:
        raise APIError(status.HTTP_404_NOT_FOUND, "not_found", "no conversation with this id")
    note(request, rows=len(items), ids=[i["id"] for i in items])
    return {"id": conversation_id, "exchanges": items}
