"""The access-log middleware: every call of the API is authenticated once and logged, chained,
before its response leaves (``observer.store.access``).

A pure ASGI middleware (so it sees every response, the router's 404/405 and the handlers'
401/403/400 included): it resolves the caller (``observer.api.auth.authenticate``) into
``scope["state"]["authentication"]``, runs the app, and when the app starts its response it
appends the entry (principal, role, client, method, route template, path, parameters, status,
rows or ids returned) and only then lets the response go. If the entry cannot be written the
caller gets 503 ``access_log_unavailable`` instead of the data (fail closed: no read without its
log line). An exception escaping the app is logged with status 500, then re-raised (Starlette
answers 500).

A call whose method may change something (not GET, HEAD, OPTIONS) is logged twice: before it
runs (status ``BEGUN``, 0; the path as requested, no route matched yet) and when answered; if
the first entry cannot be written the call is refused with 503 and nothing runs, so no change is
ever made unlogged (trial finding: a hold, an incident, an export and a purge were made while
their one entry, written with the answer, failed).

What a route returned is told by ``note(request, rows=, ids=, body=)``. Not logged: the probes
``/healthz`` and ``/readyz`` and the ``/metrics`` scrapes (they read no record and run every few
seconds; ``/metrics`` still needs a token).

Parameters are capped (``PARAM_KEYS`` names, ``PARAM_CHARS`` characters per value) so that a
caller cannot bloat the log; ``ids`` keeps at most ``IDS_MAX``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import datetime, timezone
from typing import Any

import anyio
import orjson
from fastapi import Request
from sqlalchemy import exc as sa_exc

from observer.api.auth import Authentication, authenticate, bearer, cookie_token
from observer.store import access, tokens
from observer.store.checkpoint import CheckpointKey
from observer.store.store import AuditStore

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

UNLOGGED = frozenset({"/healthz", "/readyz"})
#: Authenticated like every call, but not logged: Prometheus scrapes (no record content; one
#: every 15 s would be most of the log).
AUTHENTICATED_UNLOGGED = frozenset({"/metrics"})
#: Methods that change nothing: logged once, when answered. Any other is logged twice.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: The status of the entry a changing call gets before it runs.
BEGUN = 0
PARAM_KEYS = 50
PARAM_CHARS = 500
PATH_CHARS = 1000
IDS_MAX = 1000


def note(request: Request, *, rows: int | None = None, ids: list[str] | None = None, body: Any = None) -> None:
    """Tells the access log what this call returned or changed: ``rows`` (count), ``ids``
    (record, incident or hold ids) and ``body`` (the parameters a POST/PATCH body carried)."""
    state = request.scope.setdefault("state", {})
    if rows is not None:
        state["audit_rows"] = rows
    if ids is not None:
        state["audit_ids"] = ids
    if body is not None:
        state["audit_body"] = body


class AccessLog:
    """ASGI middleware: ``AccessLog(app, store=, bootstrap=, key=)``; ``key`` signs the access
    log's checkpoints (``None``: none are made; ``observer verify`` then warns)."""

    def __init__(self, app: ASGIApp, *, store: AuditStore, bootstrap: bytes, key: CheckpointKey | None) -> None:
        self.app = app
        self.store = store
        self.bootstrap = bootstrap
        self.key = key
        self._store_id: str | None = None
        #: The highest seq this process appended: a head below it means entries were deleted.
        self._last_seq = 0
        #: The newest access-log checkpoint this process knows of (``access.append``).
        self._checkpointed: access.Checkpointed | None = None
        self._lock = threading.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNLOGGED:
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        token = bearer(headers)
        if token is None and (scope["path"] == "/ui" or scope["path"].startswith("/ui/")):
            token = cookie_token(headers)  # the review page's session (observer.api.ui)
        try:
            auth = await anyio.to_thread.run_sync(
                authenticate, token, self.bootstrap, lambda t: tokens.lookup_any(self.store.engine, t)
            )
        except sa_exc.SQLAlchemyError:
            auth = None
        if auth is None:  # the store does not answer: nobody can be authorised or logged
            await _error(send, 503, "store_unavailable", "the audit store is unavailable")
            return
        state["authentication"] = auth
        if scope["path"] in AUTHENTICATED_UNLOGGED and scope.get("method") in SAFE_METHODS:
            await self.app(scope, receive, send)
            return
        if scope.get("method") not in SAFE_METHODS:
            # A call that may change the store is logged before it runs (status 0, the path as
            # requested: no route is matched yet), so no change is made unlogged; its answer
            # follows in a second entry. Not written: the call is refused and nothing runs.
            if not await self._log(scope, auth, BEGUN):
                await _error(send, 503, "access_log_unavailable", "the access log cannot be written; nothing was done")
                return
        dropping = False
        logged = False

        async def send_logged(message: Message) -> None:
            nonlocal dropping, logged
            if dropping:
                return
            if message["type"] == "http.response.start" and not logged:
                logged = True
                # A route may have replaced it (the review page's sign-in names who signed in).
                if not await self._log(scope, state.get("authentication", auth), int(message["status"])):
                    dropping = True
                    await _error(send, 503, "access_log_unavailable", "the access log cannot be written; no answer")
                    return
            await send(message)

        try:
            await self.app(scope, receive, send_logged)
        except Exception:
            if not logged:
                logged = True
                await self._log(scope, auth, 500)
            raise

    async def _log(self, scope: Scope, auth: Authentication, status: int) -> bool:
        try:
            entry = _entry(scope, auth, status)
            await anyio.to_thread.run_sync(self._append, entry)
        except sa_exc.SQLAlchemyError as exc:
            log.error("audit API: the access log cannot be written (%s); the call is refused", type(exc).__name__)
            return False
        return True

    def _append(self, entry: access.Entry) -> None:
        if self._store_id is None:
            self._store_id = self.store.store_id()
        done = access.append(
            self.store.engine, self._store_id, entry, self.key, after=self._last_seq, checkpointed=self._checkpointed
        )
        with self._lock:
            # After a deleted tail the log's new head is the reference (else every later call
            # would find the log "shorter" again and add a marker of its own).
            self._last_seq = done.row["seq"] if done.truncated else max(self._last_seq, done.row["seq"])
            # The last one seen, even if another thread saw a newer one: an older checkpoint is
            # still a safe bound (access.append), one found deleted must be forgotten.
            self._checkpointed = done.checkpointed


def _entry(scope: Scope, auth: Authentication, status: int) -> access.Entry:
    state = scope.get("state", {})
    route = scope.get("route")
    path = scope.get("path", "")
    params: dict[str, Any] = {}
    query = _query(scope.get("query_string", b""))
    if query:
        params["query"] = query
    path_params = scope.get("path_params")
    if route is not None and path_params:
        params["path"] = {k: _cap(str(v)) for k, v in list(path_params.items())[:PARAM_KEYS]}
    body = state.get("audit_body")
    if body is not None:
        params["body"] = _capped_json(body)
    if auth.problem is not None:
        params["authorization"] = auth.problem
    principal = auth.principal
    ids = state.get("audit_ids")
    client = scope.get("client")
    return access.Entry(
        at=datetime.now(timezone.utc),
        principal=principal.name if principal is not None else auth.name,
        role=principal.role if principal is not None else None,
        client=None if not client else str(client[0]),
        method=str(scope.get("method", ""))[:16],
        endpoint=_template(path, getattr(route, "path", None)),
        path=_cap(path, PATH_CHARS),
        params=params,
        status=status,
        rows=state.get("audit_rows"),
        ids=None if ids is None else [str(i) for i in ids[:IDS_MAX]],
    )


def _template(path: str, route_path: str | None) -> str:
    """The matched route's full template (``http.route``): a route of an included router knows
    its path below the prefixes only (``/exchanges/{exchange_id}``), so the prefix is taken
    from the request path, as many segments as the two differ by (path parameters hold no
    ``/``: no route uses the ``path`` converter). The capped path when no route matched."""
    if not route_path:
        return _cap(path, PATH_CHARS)
    parts = path.split("/")
    keep = len(parts) - route_path.count("/")
    return "/".join(parts[:keep]) + route_path if keep >= 1 else route_path


def _query(raw: bytes) -> dict[str, Any]:
    from urllib.parse import parse_qsl

    out: dict[str, Any] = {}
    try:
        pairs = parse_qsl(raw.decode("latin-1"), keep_blank_values=True)
    except ValueError:
        return {"(unparsed)": _cap(raw.decode("latin-1"))}
    for k, v in pairs:
        k, v = _cap(k, 100), _cap(v)
        if k in out:
            prev = out[k]
            out[k] = [*prev, v] if isinstance(prev, list) else [prev, v]
        elif len(out) < PARAM_KEYS:
            out[k] = v
    return out


def _cap(value: str, limit: int = PARAM_CHARS) -> str:
    # No lone surrogate reaches the chain, no NUL the database (PostgreSQL refuses it in text).
    value = value.encode("utf-8", "replace").decode("utf-8").replace("\x00", "\\x00")
    return value if len(value) <= limit else value[:limit] + "..."


def _capped_json(body: Any) -> Any:
    """``body`` as JSON types with every string capped (floats as text: their spelling could
    differ between engines)."""
    if isinstance(body, dict):
        return {_cap(str(k), 100): _capped_json(v) for k, v in list(body.items())[:PARAM_KEYS]}
    if isinstance(body, (list, tuple)):
        return [_capped_json(v) for v in body[:PARAM_KEYS]]
    if isinstance(body, bool) or body is None or isinstance(body, int):
        return body
    if isinstance(body, datetime):
        from observer.shape import rfc3339

        return rfc3339(body)
    return _cap(str(body))


async def _error(send: Send, status: int, code: str, message: str) -> None:
    body = orjson.dumps({"error": {"code": code, "message": message}})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
