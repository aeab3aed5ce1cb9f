"""Redaction of credentials from what the record keeps (API keys are never stored).

Vendors and clouds accept credentials in the query string (Gemini ``?key=``, Azure SAS ``sig=``,
AWS SigV4 ``X-Amz-Signature``/``X-Amz-Credential``/``X-Amz-Security-Token``, GCS
``X-Goog-Signature``, OAuth ``access_token``/``code``/``client_secret``); headers are never
recorded at all. A parameter name is split into words at ``-``, ``_`` and ``.`` and matched
case-insensitively: the whole name against ``SECRET_QUERY_NAMES``, each word against
``SECRET_QUERY_WORDS`` (so ``x-api-key`` and ``refresh_token`` match, ``keyboard`` and
``max_tokens`` do not).
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode

REDACTED = "REDACTED"
SECRET_QUERY_NAMES = frozenset(
    {"sig", "code", "pwd", "auth", "session", "sessionid", "jwt", "sas", "apikey", "passwd", "accesstoken", "authtoken"}
)
SECRET_QUERY_WORDS = frozenset(
    {"key", "token", "secret", "password", "passwd", "signature", "credential", "credentials", "authorization"}
)
_WORD_SPLIT = re.compile(r"[-_.]")


def is_secret_param(name: str) -> bool:
    """True for query parameter names that carry credentials (see the module docstring)."""
    lowered = name.lower()
    if lowered in SECRET_QUERY_NAMES:
        return True
    return any(word in SECRET_QUERY_WORDS for word in _WORD_SPLIT.split(lowered))


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
