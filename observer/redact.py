"""Redaction of credentials from what the record keeps (API keys are never stored).

Vendors and clouds accept credentials in the query string (Gemini ``?key=``, Azure SAS ``sig=``,
AWS SigV4 ``X-Amz-Signature``/``X-Amz-Credential``/``X-Amz-Security-Token``, GCS
``X-Goog-Signature``, OAuth ``access_token``/``code``/``client_secret``); headers are never
recorded at all. Parameter names are matched case-insensitively: exact names, and any name
containing one of the credential words.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode

REDACTED = "REDACTED"
SECRET_QUERY_NAMES = frozenset({"sig", "code", "pwd", "auth", "session", "sessionid", "jwt", "sas"})
SECRET_QUERY_WORDS = re.compile(r"key|token|secret|passw|signature|credential|authoriz", re.IGNORECASE)


def is_secret_param(name: str) -> bool:
    """True for query parameter names that carry credentials (see the module docstring)."""
    return name.lower() in SECRET_QUERY_NAMES or SECRET_QUERY_WORDS.search(name) is not None


def redact_path(path: str) -> str:
    """Returns ``path`` (with query) with the values of credential parameters replaced by
    ``REDACTED``; other parameters and their order are kept. A path without a query, or
    without credential parameters, is returned unchanged."""
    base, sep, query = path.partition("?")
    if not sep:
        return path
    pairs = parse_qsl(query, keep_blank_values=True)
    if not any(is_secret_param(k) for k, _ in pairs):
        return path
    return base + "?" + urlencode([(k, REDACTED if is_secret_param(k) else v) for k, v in pairs])
