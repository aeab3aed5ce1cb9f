"""Who sent a request, without keeping a secret: the API credential's keyed fingerprint, the
client's address (as sent, as a keyed pseudonym, or not at all) and the name of the
proxy-authenticated user.

**The credential** is found in the request as LLM APIs send it (``credential``): the
``Authorization`` header (the token of ``Bearer <token>``; for AWS Signature V4, the access key
id of its ``Credential=<key id>/…`` scope; any other scheme, the whole value), else the first
of ``x-api-key`` (Anthropic), ``api-key`` (Azure OpenAI), ``x-goog-api-key`` (Gemini), else a
``key`` / ``api_key`` / ``api-key`` query parameter (Gemini's ``?key=``). Body-borne credentials
(Windsurf's metadata) are never read, so such requests have none.

**The fingerprint** (``FingerprintKey.fingerprint``) is ``"hmac-sha256:"`` and the first 32 hex
digits (128 bits) of HMAC-SHA256 under a key derived from a 32-byte secret kept in a file
outside the database (setting ``fingerprint_key``, made on first start with mode 0600, like the
checkpoint key): K_f = HMAC-SHA256(secret, ``FINGERPRINT_DOMAIN``); the client-address
pseudonyms use K_a = HMAC-SHA256(secret, ``ADDRESS_DOMAIN``), so that neither can be made to
equal the other. The
credential itself is never stored or logged; without the key file, a fingerprint does not let
anyone test a guessed credential (unlike a plain hash), and with it ``observer key-owner add``
answers "which key" by computing the same fingerprint of a key an administrator holds. Rotating
the key file makes later fingerprints differ from earlier ones (keep the old file to look them
up).

**The client address** (setting ``client_address``): ``address`` (the TCP peer's IP as the
proxy saw it, the default: an organisation's proxy sees internal addresses an incident review
needs), ``pseudonym`` (``"hmac-sha256:"`` + 32 hex digits of the address under K_a: the same
client gives the same pseudonym, the address is not kept) or ``off``.

Pure but for the key file: no mitmproxy, no clock.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from observer.errors import ConfigError

__all__ = [
    "CLIENT_ADDRESS_MODES",
    "FINGERPRINT_PREFIX",
    "FingerprintKey",
    "credential",
    "credential_of_authorization",
]

FINGERPRINT_PREFIX = "hmac-sha256:"
FINGERPRINT_HEX = 32  # hex digits kept: 128 bits, no collision among any organisation's keys
KEY_BYTES = 32
#: The two uses of the secret, each with a key of its own derived from it (domain separation).
FINGERPRINT_DOMAIN = b"llm-stream-observer:key-fingerprint"
ADDRESS_DOMAIN = b"llm-stream-observer:client-address"
#: Headers that carry an API key as their whole value, in the order they are looked at.
KEY_HEADERS = ("x-api-key", "api-key", "x-goog-api-key")
#: Query parameters that carry an API key (Gemini ``?key=``).
KEY_QUERY = ("key", "api_key", "api-key")
CLIENT_ADDRESS_MODES = ("address", "pseudonym", "off")
MAX_CREDENTIAL = 16 << 10  # characters of a credential fingerprinted; a longer value is cut (bounded work)


def credential_of_authorization(value: str) -> str | None:
    """The credential in an ``Authorization`` header value (module docstring); ``None`` when empty."""
    value = value.strip()
    scheme, _, rest = value.partition(" ")
    rest = rest.strip()
    if scheme.lower() == "bearer":
        return rest or None
    if scheme.upper().startswith("AWS4-HMAC-"):
        for part in rest.split(","):
            name, _, scope = part.strip().partition("=")
            if name == "Credential" and scope:
                return scope.split("/", 1)[0] or None
        return None
    return value or None


def credential(headers: Iterable[tuple[str, str]], path: str) -> str | None:
    """The request's API credential (module docstring), or ``None``. ``headers``: (name, value)
    pairs as sent (names in any case); ``path``: the request target with its query, before
    redaction."""
    by_name: dict[str, str] = {}
    for name, value in headers:
        by_name.setdefault(name.lower(), value)
    auth = by_name.get("authorization")
    if auth is not None:
        found = credential_of_authorization(auth)
        if found is not None:
            return found[:MAX_CREDENTIAL]
    for name in KEY_HEADERS:
        value = by_name.get(name, "").strip()
        if value:
            return value[:MAX_CREDENTIAL]
    query = urlsplit(path).query if "?" in path else ""
    if query:
        for name, value in parse_qsl(query[:MAX_CREDENTIAL], keep_blank_values=False):
            if name.lower() in KEY_QUERY and value:
                return value[:MAX_CREDENTIAL]
    return None


class FingerprintKey:
    """The secret of the fingerprints and pseudonyms (module docstring)."""

    def __init__(self, secret: bytes, path: Path | None = None) -> None:
        if len(secret) != KEY_BYTES:
            raise ValueError(f"a fingerprint key is {KEY_BYTES} bytes, not {len(secret)}")
        # One key per use (domain separation): a credential crafted as an address's text must
        # not fingerprint to that address's pseudonym (trial finding: it did, with one key).
        self._fingerprints = hmac.new(secret, FINGERPRINT_DOMAIN, hashlib.sha256).digest()
        self._addresses = hmac.new(secret, ADDRESS_DOMAIN, hashlib.sha256).digest()
        self.path = path

    @classmethod
    def load_or_create(cls, path: Path) -> FingerprintKey:
        """Reads the key file (64 hex digits and a newline), or makes one (mode 0600, its folder
        0700 when made). Raises ``ConfigError`` when the file is not such a key or cannot be made."""
        try:
            data = path.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            secret = secrets.token_bytes(KEY_BYTES)
            try:
                path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    os.write(fd, secret.hex().encode() + b"\n")
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except FileExistsError:  # another process made it first: read theirs
                return cls.load_or_create(path)
            except OSError as exc:
                raise ConfigError(f"cannot make the fingerprint key {path}: {exc.strerror}") from exc
            return cls(secret, path)
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not text"
            raise ConfigError(f"cannot read the fingerprint key {path}: {reason}") from exc
        try:
            secret = bytes.fromhex(data)
        except ValueError:
            secret = b""
        if len(secret) != KEY_BYTES:
            raise ConfigError(f"{path} is not a fingerprint key ({KEY_BYTES * 2} hex digits)")
        return cls(secret, path)

    @classmethod
    def load_if_present(cls, path: Path) -> FingerprintKey | None:
        """The key file's key, ``None`` when there is no such file (``ConfigError`` as
        ``load_or_create`` for a file that is not a key): for readers that must not make a
        new secret, whose fingerprints would match no one's (``observer ingest``)."""
        if not path.exists():
            return None
        return cls.load_or_create(path)

    def fingerprint(self, value: str) -> str:
        """``"hmac-sha256:"`` + the first 32 hex digits of HMAC-SHA256(K_f, UTF-8 of ``value``),
        K_f = HMAC-SHA256(secret, ``FINGERPRINT_DOMAIN``)."""
        return _mac(self._fingerprints, value)

    def client_address(self, address: str | None, mode: str) -> str | None:
        """The client address to record under ``mode`` (``CLIENT_ADDRESS_MODES``): for
        ``pseudonym``, ``"hmac-sha256:"`` + 32 hex digits of HMAC-SHA256(K_a, the address),
        K_a = HMAC-SHA256(secret, ``ADDRESS_DOMAIN``)."""
        if address is None or mode == "off":
            return None
        if mode == "pseudonym":
            return _mac(self._addresses, address)
        return address


def _mac(key: bytes, value: str) -> str:
    mac = hmac.new(key, value.encode("utf-8", "surrogatepass"), hashlib.sha256)
    return FINGERPRINT_PREFIX + mac.hexdigest()[:FINGERPRINT_HEX]


def fingerprint_of_headers(
    key: FingerprintKey, headers: Mapping[str, str] | Iterable[tuple[str, str]], path: str
) -> str | None:
    """The fingerprint of the request's credential (``credential``), or ``None`` without one."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    found = credential(pairs, path)
    return None if found is None else key.fingerprint(found)
