"""The query API's app factory: ``create_app(store, token)``.

No module-level engine or settings: the caller (``observer api``, tests) builds the store and
passes it in. Every route under ``/v1`` requires the bearer token; ``/healthz``, ``/readyz``, ``/docs`` and
``/openapi.json`` do not. Every error, including FastAPI's own 404/405/422, has the one shape
``{"error": {"code": ..., "message": ...}}``.
"""

from __future__ import annotations

import logging
from http import HTTPStatus

from fastapi import APIRouter, Depends, FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException as StarletteHTTPException

from observer import __version__
from observer.api.auth import require_token
from observer.api.routers import exchanges
from observer.api.schemas import ErrorResponse, Health, Readiness
from observer.errors import ConfigError
from observer.store.store import AuditStore, InvalidCursor

log = logging.getLogger(__name__)

_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    422: "validation_error",
    500: "internal_error",
    503: "store_unavailable",
}

_ERROR_RESPONSES: dict[int | str, dict[str, object]] = {
    code: {"model": ErrorResponse, "description": HTTPStatus(code).phrase} for code in (400, 401, 422, 503)
}


def error_response(
    status_code: int, message: str, code: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The API's one error shape: ``{"error": {"code", "message"}}``."""
    body = {"error": {"code": code or _CODES.get(status_code, f"http_{status_code}"), "message": message}}
    return JSONResponse(body, status_code=status_code, headers=headers)


def create_app(store: AuditStore, token: str) -> FastAPI:
    """The FastAPI app serving ``store``; ``token`` is the bearer token of every ``/v1`` route.

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
    app.state.api_token = token.encode("utf-8")

    @app.get("/healthz", response_model=Health, tags=["health"], summary="Liveness (no auth)")
    def healthz() -> dict[str, str]:
        """``{"status": "ok"}`` while the API process serves requests (no database check)."""
        return {"status": "ok"}

    @app.get(
        "/readyz",
        response_model=Readiness,
        tags=["health"],
        summary="Readiness (no auth): is the database answering?",
        responses={503: {"model": Readiness, "description": "The database does not answer"}},
    )
    def readyz() -> JSONResponse:
        """``{"status": "ready", "database": "ok"}`` when the store answers ``SELECT 1``; else
        503 with ``"status": "not_ready"``, ``"database": "unreachable"``: queries cannot be
        served, and the proxy keeps recording to its journal (stored when the database answers)."""
        try:
            store.ping()
        except sa_exc.SQLAlchemyError:
            body = {"status": "not_ready", "database": "unreachable"}
            return JSONResponse(body, status_code=503)
        return JSONResponse({"status": "ready", "database": "ok"})

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(require_token)], responses=_ERROR_RESPONSES)
    v1.include_router(exchanges.router)
    app.include_router(v1)

    _install_error_handlers(app)
    return app


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err.get('loc', ()))}: {err.get('msg', 'invalid')}" for err in exc.errors()
        )
        return error_response(status.HTTP_422_UNPROCESSABLE_CONTENT, problems or "invalid request")

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
