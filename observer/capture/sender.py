"""Who sent a flow (``observer.identity``): the client address, the proxy-authenticated user and
the API credential's fingerprint, read from the mitmproxy flow at ``requestheaders``.

- ``client_address``: the client connection's ``peername`` host, kept per the
  ``client_address`` setting (``address``, ``pseudonym``: needs the fingerprint key, else
  nothing is kept; ``off``).
- ``proxy_user``: the user name mitmproxy's ``proxyauth`` addon put in
  ``flow.metadata["proxyauth"]`` (``(user, password)``, set before any script addon sees the
  request; the password is never read). ``None`` when the proxy does not require
  authentication (mitmproxy option ``proxyauth``, e.g. ``observer run --set
  proxyauth=@/etc/observer/htpasswd``).
- ``key_fingerprint``: the keyed fingerprint of the request's credential header or query
  parameter (``observer.identity.credential``); ``None`` without a key (the addon outside
  ``observer run`` and without ``observer_fingerprint_key``) or without a credential.
"""

from __future__ import annotations

from typing import Any

from observer.identity import FingerprintKey, fingerprint_of_headers
from observer.limits import MAX_NAME_CHARS, clip
from observer.records import Exchange

__all__ = ["stamp_sender", "sender_of"]

MAX_USER = 256  # characters of a proxy user name kept


def sender_of(flow: Any, key: FingerprintKey | None, address_mode: str) -> dict[str, str | None]:
    """``{"client_address", "proxy_user", "key_fingerprint"}`` of the mitmproxy ``flow``."""
    peer = getattr(flow.client_conn, "peername", None)
    address = str(peer[0]) if peer else None
    if address_mode == "pseudonym":
        client_address = key.client_address(address, "pseudonym") if key is not None else None
    else:
        client_address = address if address_mode == "address" else None
    auth = flow.metadata.get("proxyauth")
    user = auth[0] if isinstance(auth, tuple) and auth and isinstance(auth[0], str) and auth[0] else None
    fingerprint = None
    if key is not None:
        fingerprint = fingerprint_of_headers(key, flow.request.headers.items(multi=True), flow.request.path)
    resumed = _text(flow.request.headers.get("last-event-id"))
    return {
        "client_address": client_address,
        "proxy_user": user[:MAX_USER] if user else None,
        "key_fingerprint": fingerprint,
        "last_event_id": clip(resumed, MAX_NAME_CHARS) or None,
    }


def _text(value: str | None) -> str | None:
    """A header value as text: mitmproxy keeps bytes that are not UTF-8 as lone surrogates
    (``surrogateescape``), which no store can hold (trial finding: such a ``Last-Event-ID`` got
    the whole record refused); they become U+FFFD."""
    if value is None:
        return None
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def stamp_sender(exchange: Exchange, sender: dict[str, str | None]) -> None:
    """Writes ``sender`` (``sender_of``) into the record skeleton."""
    exchange.client_address = sender["client_address"]
    exchange.proxy_user = sender["proxy_user"]
    exchange.key_fingerprint = sender["key_fingerprint"]
    exchange.request_last_event_id = sender.get("last_event_id")
