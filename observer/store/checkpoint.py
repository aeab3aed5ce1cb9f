"""Signed checkpoints of a writer's hash chain (``observer.store.chain``): after Certificate
Transparency's signed tree heads and the C2SP signed-note format, with Ed25519 (``cryptography``).

A checkpoint says "writer W's chain had ``seq`` entries, the last with hash H, at time T, after
checkpoint P". The drainer signs one every ``checkpoint_every`` entries or
``checkpoint_interval_s`` seconds, also while idle, so that a deleted tail (the newest rows and
the checkpoints naming them) shows: against a checkpoint kept elsewhere (``observer checkpoint
export``), or as a silence longer than the interval.

The note (``note_text``), signed as its UTF-8 bytes::

    llm-stream-observer checkpoint v1
    store <store_id>
    writer <writer_id>
    number <n>
    seq <seq>
    head <hex of record_hash>
    time <RFC 3339 UTC>
    prev <hex of SHA-256 of the previous checkpoint's note, or 64 zeros>
    events <seq> <hex of record_hash>      (only in a writer's checkpoint, once the store has events)

The ``events`` line is the head of the store's own chain (legal holds and purges,
``observer.store.events``) as the drainer saw it when signing: the writers' keys, which sign every
``checkpoint_interval_s``, so vouch for the holds and purges too, and a store event deleted from
the tail (with its own checkpoint) contradicts the next writer checkpoint.

The private key lives in a file outside the database (``checkpoint-key.pem`` in the data folder,
PKCS#8 PEM, mode 0600, made on first start); ``key_id`` is the first 8 bytes (hex) of SHA-256 of
the raw public key. Whoever holds the private key can re-sign a rewritten chain: keep exported
checkpoints where the database administrator cannot change them.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from observer.errors import ConfigError
from observer.shape import rfc3339

log = logging.getLogger(__name__)

NOTE_HEADER = "llm-stream-observer checkpoint v1"
ZERO_HASH = "0" * 64


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def public_pem(public: Ed25519PublicKey) -> str:
    return public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def load_public_key(data: bytes) -> Ed25519PublicKey:
    """An Ed25519 public key from PEM (a public key, or the private key file: its public half).
    Raises ``ConfigError`` for anything else."""
    try:
        if b"PRIVATE KEY" in data:
            private = serialization.load_pem_private_key(data, password=None)
            if isinstance(private, Ed25519PrivateKey):
                return private.public_key()
        else:
            public = serialization.load_pem_public_key(data)
            if isinstance(public, Ed25519PublicKey):
                return public
    except ValueError as exc:
        raise ConfigError(f"not an Ed25519 key in PEM: {exc}") from None
    raise ConfigError("not an Ed25519 key")


@dataclass(frozen=True)
class CheckpointKey:
    """The signing key: ``load_or_create(path)`` (``observer run``), ``load(path)`` (exports)."""

    private: Ed25519PrivateKey
    path: Path

    @classmethod
    def load(cls, path: Path) -> CheckpointKey:
        """Reads the key file, never making one (``observer export`` signs with an existing
        key). Raises ``ConfigError`` when it is missing, unreadable or not an Ed25519 private key."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ConfigError(f"no checkpoint key {path}") from None
        except OSError as exc:
            raise ConfigError(f"cannot read the checkpoint key {path}: {exc.strerror}") from exc
        return cls._from_pem(data, path)

    @classmethod
    def load_or_create(cls, path: Path) -> CheckpointKey:
        """Reads the key file, or makes one (mode 0600, its folder 0700 when made). Raises
        ``ConfigError`` when the file is not an Ed25519 private key or cannot be made."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            key = Ed25519PrivateKey.generate()
            pem = key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
            try:
                path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    os.write(fd, pem)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as exc:
                raise ConfigError(f"cannot make the checkpoint key {path}: {exc.strerror}") from exc
            return cls(key, path)
        except OSError as exc:
            raise ConfigError(f"cannot read the checkpoint key {path}: {exc.strerror}") from exc
        return cls._from_pem(data, path)

    @classmethod
    def _from_pem(cls, data: bytes, path: Path) -> CheckpointKey:
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{path} is not a checkpoint key: {exc}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigError(f"{path} is not an Ed25519 key")
        _warn_if_readable(path)  # (a key, so its mode matters)
        return cls(key, path)

    @property
    def public(self) -> Ed25519PublicKey:
        return self.private.public_key()

    @property
    def key_id(self) -> str:
        return key_id(self.public)


def _warn_if_readable(path: Path) -> None:
    """Logs a warning when others than the owner may read the key file (whoever reads it can
    sign a rewritten chain); not refused, as a key mounted from a secret store often is 0644."""
    try:
        mode = path.stat().st_mode & 0o777
    except OSError:
        return
    if mode & 0o077:
        log.warning(
            "the checkpoint key %s is readable by others than its owner (mode %04o): whoever reads it can sign a"
            " rewritten chain; chmod 600 it",
            path,
            mode,
        )


def note_text(
    store_id: str,
    writer_id: str,
    number: int,
    seq: int,
    head: str,
    at: datetime,
    prev: str,
    events: tuple[int, str] | None = None,
) -> str:
    tail = "" if events is None else f"events {events[0]} {events[1]}\n"
    return (
        f"{NOTE_HEADER}\nstore {store_id}\nwriter {writer_id}\nnumber {number}\nseq {seq}\n"
        f"head {head}\ntime {rfc3339(at)}\nprev {prev}\n{tail}"
    )


def note_hash(note: str) -> str:
    return hashlib.sha256(note.encode("utf-8")).hexdigest()


def make_checkpoint(
    key: CheckpointKey,
    store_id: str,
    writer_id: str,
    number: int,
    seq: int,
    head: str,
    at: datetime,
    prev: str,
    events: tuple[int, str] | None = None,
) -> dict[str, Any]:
    """A ``checkpoints`` row, signed; ``events``: the store chain's (seq, hex hash) head."""
    note = note_text(store_id, writer_id, number, seq, head, at, prev, events)
    signature = base64.b64encode(key.private.sign(note.encode("utf-8"))).decode("ascii")
    return {
        "writer_id": writer_id,
        "number": number,
        "seq": seq,
        "head_hash": head,
        "created_at": at,
        "prev_hash": prev,
        "events_seq": None if events is None else events[0],
        "events_hash": None if events is None else events[1],
        "key_id": key.key_id,
        "note": note,
        "signature": signature,
    }


def check_checkpoint(row: Any, public: Ed25519PublicKey, store_id: str) -> str | None:
    """Why the checkpoint row (mapping or row with the columns) is not valid under ``public``
    for ``store_id``, or ``None``: the key, the signature, and the note against the columns."""
    get = (lambda k: row.get(k)) if isinstance(row, dict) else lambda k: getattr(row, k, None)
    if get("key_id") != key_id(public):
        return f"signed by another key ({get('key_id')}, this writer's: {key_id(public)})"
    try:
        public.verify(base64.b64decode(get("signature"), validate=True), get("note").encode("utf-8"))
    except (InvalidSignature, ValueError):
        return "bad signature"
    expected = note_text(
        store_id,
        get("writer_id"),
        get("number"),
        get("seq"),
        get("head_hash"),
        get("created_at"),
        get("prev_hash"),
        None if get("events_seq") is None else (get("events_seq"), get("events_hash")),
    )
    if expected != get("note"):
        return "its columns differ from its signed note"
    return None


__all__ = [
    "ZERO_HASH",
    "CheckpointKey",
    "check_checkpoint",
    "key_id",
    "load_public_key",
    "make_checkpoint",
    "note_hash",
    "note_text",
    "public_pem",
]
