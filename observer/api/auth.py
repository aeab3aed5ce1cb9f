"""Who is calling (bearer tokens) and what their role may do.

``authenticate`` resolves the ``Authorization: Bearer`` header (RFC 6750 §2.1) once per call, in
the access-log middleware (``observer.api.access``), so that every call's entry names its
principal, whatever the route answers. The bootstrap token (``OBSERVER_API_TOKEN`` or the data
folder's ``api-token``) is the principal ``bootstrap`` with the role ``admin``, compared in
constant time (``hmac.compare_digest``); other tokens are looked up by their SHA-256
(``observer.store.tokens``).

Routes declare what they need with ``require(permission)``: 401 (with ``WWW-Authenticate:
Bearer``, RFC 6750 §3; the response does not say whether the token was missing, malformed,
unknown or revoked: the access log does) when there is no valid principal, 403 when its role
lacks the permission (``PERMISSIONS``).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from observer.store.tokens import ROLES

#: Permission -> the roles that have it (compliance-requirements item 8: reading the logs and
#: managing them are separate).
PERMISSIONS: dict[str, frozenset[str]] = {
    "metadata": frozenset(ROLES),
    "content": frozenset({"auditor", "responder", "admin"}),
    "export": frozenset({"auditor", "responder", "admin"}),
    "access_log": frozenset({"auditor", "admin"}),
    "incidents": frozenset({"responder", "admin"}),
    "holds": frozenset({"responder", "admin"}),
    "retention": frozenset({"admin"}),
    "tokens": frozenset({"admin"}),
}
BOOTSTRAP = "bootstrap"
#: The review page's session cookie (``observer.api.ui``): the token, ``HttpOnly``, for ``/ui``.
COOKIE = "observer_token"

bearer_scheme = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description="An API token (`observer token create`, or the bootstrap token): `Authorization: Bearer <token>`.",
)


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller: its name (a token's, or ``bootstrap``), role and token id (``None``: the
    bootstrap token)."""

    name: str
    role: str
    token_id: str | None = None

    def can(self, permission: str) -> bool:
        return self.role in PERMISSIONS[permission]


@dataclass(frozen=True, slots=True)
class Authentication:
    """What ``authenticate`` found: a principal, or why not (``missing``, ``malformed``,
    ``unknown``, ``revoked``; with ``name`` for a revoked token)."""

    principal: Principal | None
    problem: str | None = None
    name: str | None = None


def bearer(headers: Mapping[str, str]) -> str | None:
    """The token of an ``Authorization: Bearer`` header; ``""`` when the header is there but
    not a bearer token, ``None`` when absent."""
    value = headers.get("authorization")
    if value is None:
        return None
    scheme, _, token = value.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token and " " not in token else ""


def cookie_token(headers: Mapping[str, str]) -> str | None:
    """The review page's token from the ``Cookie`` header (``COOKIE``), or ``None``."""
    from http.cookies import CookieError, SimpleCookie

    raw = headers.get("cookie")
    if not raw:
        return None
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(raw)
    except CookieError:
        return None
    morsel = jar.get(COOKIE)
    return morsel.value if morsel is not None and morsel.value else None


def authenticate(token: str | None, bootstrap: bytes, find: Callable[[str], dict[str, Any] | None]) -> Authentication:
    """The principal of ``token`` (``bearer``'s result); ``find``: token -> its row
    (``observer.store.tokens.lookup_any``), called only for a token other than the bootstrap."""
    if token is None:
        return Authentication(None, "missing")
    if not token:
        return Authentication(None, "malformed")
    if hmac.compare_digest(token.encode("utf-8", "surrogatepass"), bootstrap):
        return Authentication(Principal(BOOTSTRAP, "admin"))
    row = find(token)
    if row is None:
        return Authentication(None, "unknown")
    if row.get("revoked_at") is not None:
        return Authentication(None, "revoked", row["name"])
    return Authentication(Principal(row["name"], row["role"], row["id"]))


def principal_of(request: Request) -> Principal | None:
    auth: Authentication | None = request.scope.get("state", {}).get("authentication")
    return None if auth is None else auth.principal


def require(permission: str) -> Callable[[Request], Principal]:
    """A dependency: the caller's ``Principal`` when its role has ``permission``; else 401 / 403."""
    if permission not in PERMISSIONS:
        raise ValueError(f"unknown permission {permission!r}")

    def dependency(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
    ) -> Principal:
        # credentials: read by the middleware (observer.api.access); declared so that OpenAPI
        # documents the scheme on every route.
        principal = principal_of(request)
        if principal is None:
            raise HTTPException(
                status_code=status.HTTP_401_UNAUTHORIZED,
                detail="missing or invalid bearer token",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not principal.can(permission):
            raise HTTPException(
                status_code=status.HTTP_403_FORBIDDEN,
                detail=f"the role {principal.role} may not do this (needs {permission})",
            )
        return principal

    dependency.__name__ = f"require_{permission}"
    return dependency
