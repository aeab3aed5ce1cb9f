"""Bearer-token authentication of the query API (a dependency on every data route).

The token is compared in constant time (``hmac.compare_digest``). A missing, malformed or wrong
``Authorization`` header gives 401 with ``WWW-Authenticate: Bearer`` (RFC 6750 §3) and the API's
error shape; the response does not say which of the three it was.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

bearer_scheme = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description="The API token given to `observer api` (`Authorization: Bearer <token>`).",
)


def require_token(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> None:
    """Raises 401 unless the request carries the app's bearer token (``app.state.api_token``)."""
    expected: bytes = request.app.state.api_token
    given = credentials.credentials.encode("utf-8") if credentials is not None else b""
    if credentials is None or not hmac.compare_digest(given, expected):
        raise HTTPException(
            status_code=status.HTTP_401_UNAUTHORIZED,
            detail="missing or invalid bearer token",
            headers={"WWW-Authenticate": "Bearer"},
        )
