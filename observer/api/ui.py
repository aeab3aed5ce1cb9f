"""The review page at ``/ui/``: server-rendered HTML (Jinja2, autoescaped), no JavaScript, no
asset from anywhere but this server.

Sign in with an API token (a form); the token is kept in an ``HttpOnly``, ``SameSite=Strict``
cookie scoped to ``/ui`` (``COOKIE``), read by the access-log middleware like a bearer header
(``observer.api.access``), so every page is authorised by role and logged like any API call.
Forms that change something carry a CSRF field derived from the token (``csrf_token``), checked
on POST besides the SameSite cookie. What a role may not read is not rendered: a viewer's
records go through ``withhold_content`` before the template sees them.

Pages: ``/ui/`` (filter and page through exchanges), ``/ui/exchanges/{id}`` (request messages,
the streamed answer, reasoning, tool calls with arguments, usage, timings, violations; a form
to open an incident from it), ``/ui/conversations/{id}``, ``/ui/incidents`` and
``/ui/incidents/{id}`` (deadlines, notes, linked exchanges).
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from observer.api.access import note
from observer.api.auth import COOKIE, Authentication, Principal, authenticate, principal_of
from observer.api.routers.exchanges import withhold_content
from observer.shape import parse_rfc3339
from observer.store import incidents, query, tokens
from observer.store.incidents import CATEGORIES, IncidentError, IncidentNotFound
from observer.store.query import Filters

FILTER_NAMES = (
    "since",
    "until",
    "model",
    "dialect",
    "host",
    "user",
    "outcome",
    "stop_reason",
    "tool",
    "violation",
    "q",
)
PAGE = 50

router = APIRouter(prefix="/ui", include_in_schema=False)


def templates() -> Environment:
    """The page templates (``observer/api/templates``), autoescaped."""
    return Environment(
        loader=FileSystemLoader(Path(__file__).parent / "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )


def csrf_token(token: str) -> str:
    """The CSRF field of the forms of a session with ``token``."""
    return hashlib.sha256(b"observer-ui-csrf\x00" + token.encode("utf-8", "surrogatepass")).hexdigest()


def _render(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    env: Environment = request.app.state.templates
    principal = principal_of(request)
    token = request.cookies.get(COOKIE, "")
    html = env.get_template(name).render(principal=principal, csrf=csrf_token(token) if token else "", **context)
    return HTMLResponse(
        html,
        status_code=status_code,
        headers={
            "Content-Security-Policy": "default-src 'none'; style-src 'self' 'unsafe-inline'; form-action 'self';"
            " frame-ancestors 'none'; base-uri 'none'",
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-store",
        },
    )


def _signed_in(request: Request) -> Principal | Response:
    principal = principal_of(request)
    if principal is None:
        return RedirectResponse("/ui/login", status_code=status.HTTP_303_SEE_OTHER)
    return principal


async def _form(request: Request) -> dict[str, str]:
    body = (await request.body())[:100_000].decode("utf-8", "replace")
    return {k: v[-1] for k, v in parse_qs(body, keep_blank_values=True).items()}


def _check_csrf(request: Request, form: dict[str, str]) -> bool:
    token = request.cookies.get(COOKIE, "")
    return bool(token) and hmac.compare_digest(form.get("csrf", ""), csrf_token(token))


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request) -> HTMLResponse:
    return _render(request, "login.html", error=None)


@router.post("/login")
async def login(request: Request) -> Response:
    """Checks the token; on success sets the cookie and goes to the list."""
    form = await _form(request)
    token = form.get("token", "").strip()
    store = request.app.state.store
    auth = authenticate(token or None, request.app.state.bootstrap, lambda t: tokens.lookup_any(store.engine, t))
    request.scope.setdefault("state", {})["authentication"] = auth  # the access log names who signed in
    if auth.principal is None:
        request.scope["state"]["authentication"] = Authentication(None, auth.problem, auth.name)
        return _render(request, "login.html", status.HTTP_401_UNAUTHORIZED, error="That token is not valid.")
    response = RedirectResponse("/ui/", status_code=status.HTTP_303_SEE_OTHER)
    response.set_cookie(
        COOKIE, token, httponly=True, samesite="strict", path="/ui", secure=request.url.scheme == "https"
    )
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    response = RedirectResponse("/ui/login", status_code=status.HTTP_303_SEE_OTHER)
    response.delete_cookie(COOKIE, path="/ui")
    return response


def _filters(params: dict[str, str]) -> tuple[Filters, str | None]:
    values: dict[str, Any] = {}
    for name in FILTER_NAMES:
        value = params.get(name, "").strip()
        if not value:
            continue
        if name in ("since", "until"):
            try:
                values[name] = parse_rfc3339(value if "T" in value else value + "T00:00:00Z")
            except ValueError:
                return Filters(), f"{name}: not a date or RFC 3339 time"
        else:
            if len(value) > 500 or "\x00" in value:
                return Filters(), f"{name}: too long"
            values[name] = value
    return Filters(**values), None


@router.get("/", response_class=HTMLResponse)
def list_page(request: Request) -> Response:
    principal = _signed_in(request)
    if isinstance(principal, Response):
        return principal
    params = {k: v for k, v in request.query_params.items()}
    filters, error = _filters(params)
    if filters.q is not None and not principal.can("content"):
        filters, error = Filters(), "Your role may not search content."
    items: list[dict[str, Any]] = []
    next_cursor = None
    if error is None:
        try:
            items, next_cursor = query.page(request.app.state.store.engine, filters, PAGE, params.get("cursor") or None)
        except ValueError as exc:
            error = str(exc)
    note(request, rows=len(items), ids=[i["id"] for i in items])
    shown = {k: params.get(k, "") for k in FILTER_NAMES}
    older = None
    if next_cursor is not None:
        older = "/ui/?" + urlencode({**{k: v for k, v in shown.items() if v}, "cursor": next_cursor})
    return _render(request, "list.html", items=items, filters=shown, error=error, older=older)


@router.get("/exchanges/{exchange_id}", response_class=HTMLResponse)
def exchange_page(request: Request, exchange_id: str) -> Response:
    principal = _signed_in(request)
    if isinstance(principal, Response):
        return principal
    record = request.app.state.store.get(exchange_id, store_fields=True)
    if record is None:
        return _render(request, "message.html", 404, title="Not found", message="No exchange with this id.")
    note(request, rows=1, ids=[record["id"]])
    if not principal.can("content"):
        record = withhold_content(record)
    return _render(request, "exchange.html", r=record, categories=list(CATEGORIES))


@router.get("/conversations/{conversation_id}", response_class=HTMLResponse)
def conversation_page(request: Request, conversation_id: str) -> Response:
    principal = _signed_in(request)
    if isinstance(principal, Response):
        return principal
    engine = request.app.state.store.engine
    items = query.conversation(engine, conversation_id) if len(conversation_id) <= 36 else []
    note(request, rows=len(items), ids=[i["id"] for i in items])
    return _render(request, "conversation.html", conversation_id=conversation_id, items=items)


@router.get("/incidents", response_class=HTMLResponse)
def incidents_page(request: Request) -> Response:
    principal = _signed_in(request)
    if isinstance(principal, Response):
        return principal
    if not (principal.can("incidents") or principal.can("export")):
        return _render(request, "message.html", 403, title="Forbidden", message="Your role may not read incidents.")
    items = incidents.list_incidents(request.app.state.store.engine)
    note(request, rows=len(items), ids=[i["id"] for i in items])
    return _render(request, "incidents.html", items=items, now=datetime.now(timezone.utc))


@router.get("/incidents/{incident_id}", response_class=HTMLResponse)
def incident_page(request: Request, incident_id: str) -> Response:
    principal = _signed_in(request)
    if isinstance(principal, Response):
        return principal
    if not (principal.can("incidents") or principal.can("export")):
        return _render(request, "message.html", 403, title="Forbidden", message="Your role may not read incidents.")
    try:
        item = incidents.get_incident(request.app.state.store.engine, incident_id)
    except IncidentNotFound:
        return _render(request, "message.html", 404, title="Not found", message="No incident with this id.")
    note(request, rows=1, ids=[item["id"]])
    return _render(request, "incident.html", i=item)


@router.post("/incidents")
async def create_incident(request: Request) -> Response:
    """From an exchange's page: opens an incident linking it (and so holding it)."""
    principal = _signed_in(request)
    if isinstance(principal, Response):
        return principal
    form = await _form(request)
    note(request, body={k: v for k, v in form.items() if k != "csrf"})
    if not _check_csrf(request, form):
        return _render(request, "message.html", 403, title="Forbidden", message="The form expired; reload the page.")
    if not principal.can("incidents"):
        return _render(request, "message.html", 403, title="Forbidden", message="Your role may not open incidents.")
    key = request.app.state.key
    if key is None:
        return _render(request, "message.html", 503, title="Unavailable", message="This API has no signing key.")
    try:
        aware = form.get("aware_at", "").strip()
        aware_at = parse_rfc3339(aware) if aware else datetime.now(timezone.utc)
        store = request.app.state.store
        ids = [form["exchange_id"]] if form.get("exchange_id") else []
        item = incidents.create_incident(
            store.engine,
            key,
            store.store_id(),
            title=form.get("title", ""),
            category=form.get("category", ""),
            aware_at=aware_at,
            actor=f"api:{principal.name}",
            at=datetime.now(timezone.utc),
            note=form.get("note") or None,
            exchange_ids=ids,
        )
    except (IncidentError, ValueError, KeyError) as exc:
        return _render(request, "message.html", 400, title="Not opened", message=str(exc))
    note(request, rows=1, ids=[item["id"], *ids])
    return RedirectResponse(f"/ui/incidents/{item['id']}", status_code=status.HTTP_303_SEE_OTHER)
