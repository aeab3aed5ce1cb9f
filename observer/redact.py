"""Redaction of credentials from what the record keeps (API keys never stored).

Vendors accept keys in the query string (e.g. Gemini ``?key=``, Azure SAS ``sig=``); headers
are never recorded at all.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode

SECRET_QUERY_PARAMS = frozenset({"key", "api_key", "api-key", "apikey", "access_token", "token", "sig", "signature"})
REDACTED = "REDACTED"


def redact_path(path: str) -> str:
    """Returns ``path`` (with query) with the values of credential-like query parameters
    (``SECRET_QUERY_PARAMS``, case-insensitive) replaced by ``REDACTED``; other parameters and
    their order are kept. A path without a query is returned unchanged."""
    base, sep, query = path.partition("?")
    if not sep:
        return path
    pairs = parse_qsl(query, keep_blank_values=True)
    if not any(k.lower() in SECRET_QUERY_PARAMS for k, _ in pairs):
        return path
    return base + "?" + urlencode([(k, REDACTED if k.lower() in SECRET_QUERY_PARAMS else v) for k, v in pairs])
