"""The query API's app factory: ``create_app(store, token)``.

No module-level engine or settings: the caller (``observer api``, tests) builds the store and
passes it in. Every route under ``/v1`` requires a bearer token whose role may do it (``observer.api.auth``)
and refuses unknown query parameters (``observer.api.params``); ``/healthz``, ``/readyz``,
``/docs`` and ``/openapi.json`` need none. Every call but the probes is written to the access
log before its answer leaves (``observer.api.access``). Every error, FastAPI's own 404/405 and
validation errors (400 ``invalid_parameter``) included, has the one shape ``{"error": {"code":
..., "message": ...}}`` (``observer.api.errors``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from fastapi import APIRouter, Depends, FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException as StarletteHTTPException

from observer import __version__
from observer.api import ui
from observer.api.access import AccessLog
from observer.api.auth import require
from observer.api.errors import error_response
from observer.api.exportjobs import ExportJobs
from observer.api.metrics import exposition, proxy_health
from observer.api.params import strict_query
from observer.api.routers import (
    access_log,
    alerts,
    conformance,
    conversations,
    exchanges,
    exports,
    holds,
    incidents,
    replay,
    retention,
    stats,
)
from observer.api.schemas import ErrorResponse, Health, Readiness
from observer.config import MIN_RETENTION_DAYS
from observer.errors import ConfigError
from observer.store.checkpoint import CheckpointKey
from observer.store.store import AuditStore, InvalidCursor

log = logging.getLogger(__name__)

_ERROR_RESPONSES: dict[int | str, dict[str, object]] = {
    code: {"model": ErrorResponse, "description": HTTPStatus(code).phrase} for code in (400, 401, 403, 503)
}


@dataclass(frozen=True, slots=True)
class ApiOptions:
    """What the API needs besides the store: ``exports_dir`` (export jobs' folders; ``None``:
    no exports over the API), the retention policy (``retention_days``, ``retention_override``:
    as ``observer purge`` reads them) and the ``trusted`` public keys a purge verifies other
    writers' checkpoints with; ``metrics_dir``: where the proxies write their metrics
    (``GET /metrics``, and the proxies' part of ``/readyz``)."""

    exports_dir: Path | None = None
    metrics_dir: Path | None = None  # the proxies' metrics snapshots (observer.metrics)
    retention_days: int = MIN_RETENTION_DAYS
    retention_override: bool = False
    trusted: tuple[Ed25519PublicKey, ...] = ()


def create_app(
    store: AuditStore, token: str, key: CheckpointKey | None = None, options: ApiOptions | None = None
) -> FastAPI:
    """The FastAPI app serving ``store``. ``token``: the bootstrap token (role ``admin``; other
    principals are the store's tokens, ``observer.store.tokens``); ``key``: signs the access
    log's checkpoints and the store events the API appends (holds, incidents); ``None``: no
    checkpoints, and those routes answer 503.

    Raises ``ConfigError`` on an empty token.
    """
    if not token:
        raise ConfigError("the API token must not be empty")
    app = FastAPI(
        title="llm-stream-observer audit API",
        version=__version__,
        description="Read-only access to the audit records of observed LLM exchanges.",
    )
    app.state.store = store
    app.state.key = key
    app.state.bootstrap = token.encode("utf-8", "surrogatepass")
    app.state.templates = ui.templates()
    app.state.options = options = options or ApiOptions()
    app.state.exports = (
        None if key is None or options.exports_dir is None else ExportJobs(store, key, options.exports_dir)
    )
    app.add_middleware(AccessLog, store=store, bootstrap=token.encode("utf-8", "surrogatepass"), key=key)

    @app.get("/healthz", response_model=Health, tags=["health"], summary="Liveness (no auth)")
    def healthz() -> dict[str, str]:
        """``{"status": "ok"}`` while the API process serves requests (no database check)."""
        return {"status": "ok"}

    @app.get(
        "/readyz",
        response_model=Readiness,
        tags=["health"],
        summary="Readiness (no auth): database, and each proxy's writer, worker and journal",
        responses={503: {"model": ErrorResponse, "description": "Not ready: what is wrong"}},
    )
    def readyz() -> JSONResponse:
        """``{"status": "ready", "database": "ok", "proxies": {name: "ok"}}`` when the store
        answers ``SELECT 1`` and every proxy writing metrics to ``metrics_dir`` (in the last day)
        has its database writer and parser worker running and its journal under 90 % of its
        bound. Else 503 in the API's error shape (``error.code`` ``not_ready``, ``error.message``
        naming each problem) with the same fields beside it. No record content; no token."""
        try:
            store.ping()
            database = "ok"
        except sa_exc.SQLAlchemyError:
            database = "unreachable"
        proxies = proxy_health(options.metrics_dir)
        problems = [] if database == "ok" else ["the database does not answer"]
        problems += [f"proxy {name}: {state}" for name, state in proxies.items() if state != "ok"]
        body = {"status": "ready" if not problems else "not_ready", "database": database, "proxies": proxies}
        if not problems:
            return JSONResponse(body)
        error = error_response(status.HTTP_503_SERVICE_UNAVAILABLE, "; ".join(problems), "not_ready")
        return JSONResponse({**json.loads(error.body), **body}, status_code=503)

    @app.get(
        "/metrics",
        tags=["health"],
        summary="Prometheus metrics of the proxies (any token; not in the access log)",
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE_PLAIN_0_0_4: {}}, "description": "Text exposition format 0.0.4"}},
        dependencies=[Depends(require("metadata"))],
    )
    def metrics() -> Response:
        """The proxies' counters, gauges and histograms (``observer.metrics``): exchanges by
        dialect, model, host and outcome; tokens; time to first token; durations; violations;
        records journaled, stored and dropped; queue depth; journal bytes and age; database
        write latency; worker restarts; observer errors. Any valid token (Prometheus:
        ``authorization: {credentials_file: ...}``); scrapes are not access-logged (one every
        15 s would outgrow the log; they hold no record content)."""
        return Response(exposition(options.metrics_dir), media_type=CONTENT_TYPE_PLAIN_0_0_4)

    v1 = APIRouter(
        prefix="/v1",
        dependencies=[Depends(require("metadata")), Depends(strict_query)],
        responses=_ERROR_RESPONSES,
    )
    routers = (
        exchanges,
        replay,
        conversations,
        stats,
        conformance,
        incidents,
        holds,
        exports,
        retention,
        access_log,
        alerts,
    )
    for module in routers:
        v1.include_router(module.router)
    app.include_router(v1)
    app.include_router(ui.router)

    @app.get("/ui", include_in_schema=False)
    def ui_root() -> RedirectResponse:
        return RedirectResponse("/ui/", status_code=307)

    _install_error_handlers(app)
    return app


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), getattr(exc, "code", None), headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err.get('loc', ()))}: {err.get('msg', 'invalid')}" for err in exc.errors()
        )
        return error_response(status.HTTP_400_BAD_REQUEST, problems or "invalid request", "invalid_parameter")

    @app.exception_handler(InvalidCursor)
    async def invalid_cursor(request: Request, exc: InvalidCursor) -> JSONResponse:
        message = "invalid cursor; pass a next_cursor from a previous page"
        return error_response(status.HTTP_400_BAD_REQUEST, message, exc.code)

    @app.exception_handler(sa_exc.OperationalError)
    @app.exception_handler(sa_exc.InterfaceError)
    async def store_unavailable(request: Request, exc: Exception) -> JSONResponse:
        log.error("audit API: store unavailable (%s)", type(exc).__name__)
        return error_response(status.HTTP_503_SERVICE_UNAVAILABLE, "the audit store is unavailable")

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        # The server logs the traceback (Starlette re-raises after this response is sent).
        log.error("audit API: unhandled %s on %s %s", type(exc).__name__, request.method, request.url.path)
        return error_response(status.HTTP_500_INTERNAL_SERVER_ERROR, "internal error")
