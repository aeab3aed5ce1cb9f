"""The filter parameters ``GET /v1/exchanges`` and ``GET /v1/stats`` share (one dependency).

Each is a query parameter given at most once (``observer.api.params``); a bad value is 400
``invalid_parameter`` naming it: a time that is not RFC 3339 with an offset, text longer than
``VALUE_MAX`` characters or holding a NUL (PostgreSQL refuses NUL in text), a ``q`` without a
word, an ``outcome`` or ``violation`` that is none of the record's (``observer.records``). ``q``
(full-text search of content) needs the ``content`` permission: a viewer may not
search what it may not read.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import Depends, Query, Request, status

from observer.api.auth import principal_of
from observer.api.errors import APIError
from observer.records import Outcome, ViolationKind
from observer.shape import parse_rfc3339
from observer.store import search
from observer.store.query import Filters

VALUE_MAX = 500
#: The closed vocabularies (``observer.records``): another value is a typo, not an empty answer.
OUTCOMES = frozenset(o.value for o in Outcome)
VIOLATIONS = frozenset(v.value for v in ViolationKind)

_TIME = "RFC 3339 with an offset, e.g. 2025-06-01T00:00:00Z"


def time_value(name: str, value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        return parse_rfc3339(value)
    except ValueError as exc:
        raise APIError(
            status.HTTP_400_BAD_REQUEST, "invalid_parameter", f"{name}: not an RFC 3339 time ({exc})"
        ) from None


def text_value(name: str, value: str | None) -> str | None:
    if value is None:
        return None
    if len(value) > VALUE_MAX or "\x00" in value:
        raise APIError(
            status.HTTP_400_BAD_REQUEST, "invalid_parameter", f"{name}: at most {VALUE_MAX} characters, no NUL"
        )
    return value


Text = Annotated[str | None, Query()]


def filters(
    request: Request,
    since: Annotated[str | None, Query(description=f"Started at or after ({_TIME})")] = None,
    until: Annotated[str | None, Query(description=f"Started before ({_TIME})")] = None,
    model: Annotated[str | None, Query(description="gen_ai.response.model, exactly")] = None,
    request_model: Annotated[str | None, Query(description="gen_ai.request.model, exactly")] = None,
    dialect: Annotated[str | None, Query(description="Wire dialect, e.g. openai.chat")] = None,
    host: Annotated[str | None, Query(description="server.address")] = None,
    user: Annotated[str | None, Query(description="enduser.id the request carried")] = None,
    outcome: Annotated[str | None, Query(description="completed, error, client_aborted, ...")] = None,
    stop_reason: Annotated[str | None, Query(description="Normalised stop reason, e.g. end_turn")] = None,
    tool: Annotated[str | None, Query(description="A tool call with this name (gen_ai.tool.name)")] = None,
    violation: Annotated[str | None, Query(description="A violation of this kind, e.g. seq_gap")] = None,
    request_id: Annotated[str | None, Query(description="The client's or stream's request id")] = None,
    conversation_id: Annotated[str | None, Query(description="gen_ai.conversation.id")] = None,
    proxy_user: Annotated[str | None, Query(description="The user the proxy authenticated (proxyauth)")] = None,
    key_owner: Annotated[
        str | None, Query(description="Records sent with a credential of this owner or team (observer key-owner)")
    ] = None,
    key_fingerprint: Annotated[
        str | None, Query(description="Records sent with the credential of this fingerprint (hmac-sha256:…)")
    ] = None,
    q: Annotated[
        str | None,
        Query(description="Words that must all appear in the prompt or completion (not for viewers)"),
    ] = None,
) -> Filters:
    """The ``Filters`` of the call; raises 400 / 403 as the module says."""
    if q is not None:
        principal = principal_of(request)
        if principal is not None and not principal.can("content"):
            raise APIError(status.HTTP_403_FORBIDDEN, "forbidden", f"the role {principal.role} may not search content")
        try:
            search.words(q)
        except ValueError as exc:
            raise APIError(status.HTTP_400_BAD_REQUEST, "invalid_parameter", f"q: {exc}") from None
    values = {
        "model": model,
        "request_model": request_model,
        "dialect": dialect,
        "host": host,
        "user": user,
        "outcome": outcome,
        "stop_reason": stop_reason,
        "tool": tool,
        "violation": violation,
        "request_id": request_id,
        "conversation_id": conversation_id,
        "proxy_user": proxy_user,
        "key_owner": key_owner,
        "key_fingerprint": key_fingerprint,
        "q": q,
    }
    for name, value, vocabulary in (("outcome", outcome, OUTCOMES), ("violation", violation, VIOLATIONS)):
        if value is not None and value not in vocabulary:
            raise APIError(
                status.HTTP_400_BAD_REQUEST, "invalid_parameter", f"{name}: one of {', '.join(sorted(vocabulary))}"
            )
    since_at, until_at = time_value("since", since), time_value("until", until)
    if since_at is not None and until_at is not None and until_at <= since_at:
        raise APIError(status.HTTP_400_BAD_REQUEST, "invalid_parameter", "until must be after since")
    return Filters(since=since_at, until=until_at, **{k: text_value(k, v) for k, v in values.items()})


FiltersDep = Annotated[Filters, Depends(filters)]
