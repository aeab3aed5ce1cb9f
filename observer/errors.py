"""One base error for the observer, with machine-readable codes."""

from __future__ import annotations


class ObserverError(Exception):
    """Base of every error the observer raises on purpose; ``code`` is a stable snake_case id."""

    code: str = "observer_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class UnsupportedEncoding(ObserverError):
    """A ``Content-Encoding`` the observer cannot decode (the bytes still pass through)."""

    code = "unsupported_encoding"


class ContentDecodingError(ObserverError):
    """Corrupt compressed input (the bytes still pass through unchanged)."""

    code = "content_decoding_error"


class ConfigError(ObserverError):
    """Invalid configuration (bad option value, unusable database URL, ...)."""

    code = "config_error"
