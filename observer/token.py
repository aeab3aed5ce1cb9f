"""The query API's bearer token: from settings/env, else generated once and kept on disk."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from observer.config import Settings


def resolve_token(settings: Settings, *, announce=print) -> str:
    """Returns the API token.

    ``settings.api_token`` (env ``OBSERVER_API_TOKEN``) wins. Otherwise the token kept in
    ``settings.token_file`` is reused; when there is none, a new 256-bit token is generated,
    written there with mode 0600, and announced once through ``announce`` (its only display).
    Raises ``OSError`` when the data folder cannot be written.
    """
    if settings.api_token:
        return settings.api_token
    path: Path = settings.token_file
    if path.exists():
        token = path.read_text().strip()
        if token:
            return token
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    announce(f"observer: generated API token (shown once, kept in {path}): {token}")
    return token
