"""``GET /v1/exchanges/{id}/replay``: one recorded exchange in the draft standard's format.

Whatever dialect it was recorded from, the exchange comes back as the draft's request envelope
(``application/llm-request+json``, draft §4.2) and the ``text/event-stream`` of draft events
(draft §5) that ``observer.standard_replay`` makes of the record (its docstring says every
mapping). Feeding both to a draft reader (or the observer's own ``llm-stream-1.0`` dialect)
gives the same text, tool calls, usage, stop reason, error and outcome.

Why this shape: an exchange is two documents of two media types, and a client usually wants
both at once, so the default is one JSON object ``{"id", "dialect", "status_code", "request",
"stream"}`` with the envelope as an object and the stream as its SSE text (JSON strings carry
it exactly); ``?part=request`` answers the envelope alone as ``application/llm-request+json``
and ``?part=stream`` the stream alone as ``text/event-stream``, each ready to be sent or saved
as is (``curl .../replay?part=stream > replay.sse``). ``dialect`` is the recorded one and
``status_code`` the recorded HTTP status (an ``http_error`` record replays as an empty stream:
the status is not an event). ``?blocks=all`` also replays reasoning and refusal blocks, typed in
a namespaced extension field the draft does not define (default ``text``: the draft's text
blocks only, so that no draft reader takes reasoning for the answer).

Access: the replay is content (prompts, answers, tool arguments), so only roles with the
``content`` permission (auditor, responder, admin) read it; a viewer gets 403 (as for ``q``),
not a replay with holes. The record is read as ``GET /v1/exchanges/{id}`` reads it; an unknown
id is 404 ``not_found``. Each call names the record in the access log (``note``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends, Path, Query, Request, status
from fastapi.responses import Response

from observer.api.access import note
from observer.api.auth import require
from observer.api.errors import APIError
from observer.api.routers import StoreDep
from observer.api.routers.exchanges import _shorten
from observer.api.schemas import ErrorResponse, ReplayOut
from observer.dialects.standard import MEDIA_TYPE
from observer.records import Exchange
from observer.standard_replay import encode_sse, standard_replay

router = APIRouter(prefix="/exchanges", tags=["exchanges"])
SSE_MEDIA_TYPE = "text/event-stream"


@router.get(
    "/{exchange_id}/replay",
    response_model=ReplayOut,
    summary="Replay one exchange in the draft standard's format (request envelope and event stream)",
    responses={
        status.HTTP_200_OK: {
            "content": {MEDIA_TYPE: {}, SSE_MEDIA_TYPE: {}},
            "description": "JSON by default; the envelope alone with part=request, the stream alone with part=stream",
        },
        status.HTTP_404_NOT_FOUND: {"model": ErrorResponse, "description": "No record with this id"},
    },
    dependencies=[Depends(require("content"))],
)
def replay_exchange(
    request: Request,
    store: StoreDep,
    exchange_id: Annotated[str, Path(description="Record id")],
    part: Annotated[
        Literal["request", "stream"] | None,
        Query(description="request: the envelope alone (application/llm-request+json); stream: the events alone"),
    ] = None,
    blocks: Annotated[
        Literal["text", "all"],
        Query(
            description="text: the draft's text blocks only; all: reasoning and refusal blocks too, typed in an"
            " extension field"
        ),
    ] = "text",
) -> Any:
    """The replay of one record: ``ReplayOut``, or one part of it as its own media type."""
    record = store.get(exchange_id)
    if record is None:
        raise APIError(status.HTTP_404_NOT_FOUND, "not_found", f"no exchange with id {_shorten(exchange_id)!r}")
    note(request, rows=1, ids=[record["id"]])
    envelope, events = standard_replay(Exchange.from_dict(record), all_blocks=blocks == "all")
    if part == "request":
        return Response(orjson.dumps(envelope), media_type=MEDIA_TYPE)
    stream = encode_sse(events)
    if part == "stream":
        return Response(stream, media_type=SSE_MEDIA_TYPE)
    return {
        "id": record["id"],
        "dialect": record["dialect"],
        "status_code": record["status_code"],
        "request": envelope,
        "stream": stream.decode(),
    }
