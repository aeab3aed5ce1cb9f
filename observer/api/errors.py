"""The API's one error shape, ``{"error": {"code", "message"}}``, and the exception that
carries a specific code (``APIError``); the handlers are installed by ``create_app``."""

from __future__ import annotations

from fastapi import HTTPException
from fastapi.responses import JSONResponse

#: The default code of each status (an ``APIError`` may name a more specific one).
CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    422: "validation_error",
    500: "internal_error",
    503: "store_unavailable",
}


class APIError(HTTPException):
    """An HTTP error with a stable snake_case ``code`` (e.g. ``unknown_parameter``)."""

    def __init__(self, status_code: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(status_code=status_code, detail=message, headers=headers)
        self.code = code


def error_response(
    status_code: int, message: str, code: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The API's one error shape: ``{"error": {"code", "message"}}``."""
    body = {"error": {"code": code or CODES.get(status_code, f"http_{status_code}"), "message": message}}
    return JSONResponse(body, status_code=status_code, headers=headers)
