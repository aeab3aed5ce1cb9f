"""Who sent a request (issue 16, item 3): the credential found in a request, its keyed
fingerprint (checked against ``openssl dgst -mac HMAC``, not against our own HMAC call), the key
file, the client address modes, the flow's sender, the key-owner table and its chain events,
the API's filters and ``observer key-owner`` (the key read from standard input, never stored).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import pytest
from mitmproxy.test import tflow
from typer.testing import CliRunner

from observer.capture.sender import sender_of
from observer.cli import app
from observer.errors import ConfigError
from observer.identity import FingerprintKey, credential
from observer.records import Exchange
from observer.store.checkpoint import CheckpointKey
from observer.store.events import events
from observer.store.keyowners import KeyOwnerError, list_owners, set_owner
from observer.store.query import Filters, page
from observer.store.store import AuditStore
from observer.store.verify import verify

SECRET = bytes(range(32))
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("headers", "path", "expected"),
    [
        ([("Authorization", "Bearer sk-proj-abc")], "/v1/chat/completions", "sk-proj-abc"),
        ([("authorization", "bearer  sk-lower ")], "/v1", "sk-lower"),
        ([("x-api-key", "sk-ant-api03-x")], "/v1/messages", "sk-ant-api03-x"),
        ([("api-key", "azure-key-1")], "/openai/deployments/d/chat/completions", "azure-key-1"),
        ([("X-Goog-Api-Key", "AIzaSyHeader")], "/v1beta/models/m:generateContent", "AIzaSyHeader"),
        ([], "/v1beta/models/m:streamGenerateContent?alt=sse&key=AIzaSyQuery", "AIzaSyQuery"),
        (
            [
                (
                    "Authorization",
                    "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20260101/us-east-1/bedrock/aws4_request, SignedHeaders=host, Signature=abc",
                )
            ],
            "/model/m/converse-stream",
            "AKIAIOSFODNN7EXAMPLE",
        ),
        ([("Authorization", "Basic YWxpY2U6cHc=")], "/v1", "Basic YWxpY2U6cHc="),
        ([("Authorization", "Bearer sk-a"), ("x-api-key", "sk-b")], "/v1", "sk-a"),
        ([("Authorization", "Bearer "), ("x-api-key", "sk-b")], "/v1", "sk-b"),
        ([("Content-Type", "application/json")], "/v1?alt=sse", None),
    ],
)
def test_the_credential_a_request_carries(headers: list[tuple[str, str]], path: str, expected: str | None) -> None:
    assert credential(headers, path) == expected


def _openssl_hmac(key_hex: str, data: bytes) -> str:
    out = subprocess.run(
        ["openssl", "dgst", "-sha256", "-mac", "HMAC", "-macopt", f"hexkey:{key_hex}"],
        input=data,
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout.decode()
    return out.strip().rsplit(" ", 1)[-1]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_fingerprint_is_hmac_sha256_as_openssl_computes_it() -> None:
    """K_f = HMAC(secret, "llm-stream-observer:key-fingerprint"), then HMAC(K_f, the key);
    the address pseudonym under K_a = HMAC(secret, "llm-stream-observer:client-address")."""
    k_f = _openssl_hmac(SECRET.hex(), b"llm-stream-observer:key-fingerprint")
    assert FingerprintKey(SECRET).fingerprint("sk-test-123") == "hmac-sha256:" + _openssl_hmac(k_f, b"sk-test-123")[:32]
    k_a = _openssl_hmac(SECRET.hex(), b"llm-stream-observer:client-address")
    pseudonym = FingerprintKey(SECRET).client_address("10.1.2.3", "pseudonym")
    assert pseudonym == "hmac-sha256:" + _openssl_hmac(k_a, b"10.1.2.3")[:32]


def test_a_credential_cannot_be_made_to_fingerprint_as_an_address_pseudonym() -> None:
    """Trial finding: with one key for both, ``Authorization: Bearer client-address:127.0.0.1``
    fingerprinted to the pseudonym of 127.0.0.1, so any proxy user could test addresses."""
    key = FingerprintKey(SECRET)
    pseudonym = key.client_address("127.0.0.1", "pseudonym")
    for crafted in ("127.0.0.1", "client-address:127.0.0.1"):
        assert key.fingerprint(crafted) != pseudonym


def test_the_key_file_is_made_once_private_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "fingerprint-key"
    assert FingerprintKey.load_if_present(path) is None
    made = FingerprintKey.load_or_create(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    again = FingerprintKey.load_or_create(path)
    assert again.fingerprint("k") == made.fingerprint("k")
    present = FingerprintKey.load_if_present(path)
    assert present is not None and present.fingerprint("k") == made.fingerprint("k")
    assert len(path.read_text().strip()) == 64
    path.write_text("not hex\n")
    with pytest.raises(ConfigError, match="is not a fingerprint key"):
        FingerprintKey.load_or_create(path)
    path.write_text("ab" * 16 + "\n")  # 16 bytes: too short
    with pytest.raises(ConfigError, match="is not a fingerprint key"):
        FingerprintKey.load_or_create(path)


def test_client_address_modes() -> None:
    key = FingerprintKey(SECRET)
    assert key.client_address("10.1.2.3", "address") == "10.1.2.3"
    assert key.client_address("10.1.2.3", "off") is None
    pseudo = key.client_address("10.1.2.3", "pseudonym")
    assert pseudo is not None and pseudo.startswith("hmac-sha256:") and "10.1.2.3" not in pseudo
    assert pseudo == key.client_address("10.1.2.3", "pseudonym") != key.client_address("10.1.2.4", "pseudonym")
    assert pseudo != key.fingerprint("10.1.2.3")  # a pseudonym is not the fingerprint of the same text as a key


def test_the_sender_of_a_flow() -> None:
    flow = tflow.tflow()
    flow.client_conn.peername = ("192.0.2.7", 51234)
    flow.request.headers["Authorization"] = "Bearer sk-flow"
    flow.metadata["proxyauth"] = ("alice", "pw-secret")
    key = FingerprintKey(SECRET)
    got = sender_of(flow, key, "address")
    assert got == {
        "client_address": "192.0.2.7",
        "proxy_user": "alice",
        "key_fingerprint": key.fingerprint("sk-flow"),
        "last_event_id": None,
    }
    assert "pw-secret" not in repr(got)
    assert sender_of(flow, None, "address")["key_fingerprint"] is None
    assert sender_of(flow, None, "pseudonym")["client_address"] is None  # no key, no pseudonym: nothing kept
    assert sender_of(flow, key, "off")["client_address"] is None
    del flow.metadata["proxyauth"]
    assert sender_of(flow, key, "address")["proxy_user"] is None
    flow.request.headers["Last-Event-ID"] = "evt-41"  # a client resuming an event stream
    assert sender_of(flow, key, "address")["last_event_id"] == "evt-41"
    # Trial finding: a byte that is not UTF-8 (mitmproxy keeps it as a lone surrogate) got the
    # whole record refused by the store; it is U+FFFD.
    flow.request.headers[b"Last-Event-ID"] = b"caf\xe9"
    assert sender_of(flow, key, "address")["last_event_id"] == "caf\ufffd"


# ----- the key-owner table -----


@pytest.fixture
def signer(tmp_path: Path) -> CheckpointKey:
    return CheckpointKey.load_or_create(tmp_path / "checkpoint-key.pem")


FP = "hmac-sha256:" + "0123456789abcdef" * 2


def test_owners_are_set_refused_twice_replaced_and_chained(store: AuditStore, signer: CheckpointKey) -> None:
    sid = store.store_id()
    row = set_owner(
        store.engine, signer, sid, fingerprint=FP, owner="alice", team="ml", note=None, actor="admin", at=T0
    )
    assert (row["fingerprint"], row["owner"], row["team"], row["created_by"]) == (FP, "alice", "ml", "admin")
    with pytest.raises(KeyOwnerError, match="is alice's \\(ml\\); --replace"):
        set_owner(store.engine, signer, sid, fingerprint=FP, owner="bob", team=None, note=None, actor="admin", at=T0)
    set_owner(
        store.engine,
        signer,
        sid,
        fingerprint=FP,
        owner="bob",
        team="sec",
        note="rotated",
        actor="root",
        at=T0,
        replace=True,
    )
    (only,) = list_owners(store.engine)
    assert (only["owner"], only["team"], only["note"], only["updated_by"]) == ("bob", "sec", "rotated", "root")
    with store.engine.connect() as conn:
        kinds = [(e["kind"], e["detail"]["owner"], e["detail"]["replaced"]) for e in events(conn)]
    assert kinds == [("key_owner_set", "alice", None), ("key_owner_set", "bob", {"owner": "alice", "team": "ml"})]
    assert verify(store, signer.public).ok
    for bad in ("sk-not-a-fingerprint", "hmac-sha256:XYZ", FP + "0"):
        with pytest.raises(KeyOwnerError, match="not a fingerprint"):
            set_owner(store.engine, signer, sid, fingerprint=bad, owner="x", team=None, note=None, actor="a", at=T0)
    for bad_owner in (" ", "x\x7fy", "\u009b31m", "alice\u202eecila", "\u200b", "a\udcffb"):
        with pytest.raises(KeyOwnerError, match="owner"):
            set_owner(
                store.engine, signer, sid, fingerprint=FP, owner=bad_owner, team=None, note=None, actor="a", at=T0
            )


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ("UPDATE key_owners SET owner = 'mallory'", "owner differs from its chained events"),
        ("DELETE FROM key_owners", "deleted from key_owners"),
        (
            "INSERT INTO key_owners (fingerprint, owner, created_at, created_by) VALUES"
            " ('hmac-sha256:" + "e" * 32 + "', 'eve', '2026-12-01 09:00:00', 'x')",
            "has no chained event (inserted)",
        ),
    ],
)
def test_verify_finds_a_key_owner_changed_behind_the_chain(
    store: AuditStore, signer: CheckpointKey, change: str, said: str
) -> None:
    """Trial finding: ``observer verify`` did not compare ``key_owners`` with its events."""
    import sqlalchemy as sa

    set_owner(
        store.engine, signer, store.store_id(), fingerprint=FP, owner="bob", team=None, note=None, actor="a", at=T0
    )
    assert verify(store, signer.public).ok
    with store.engine.begin() as conn:
        conn.execute(sa.text(change))
    report = verify(store, signer.public)
    assert not report.ok and any(said in b.reason for b in report.breaks), report.breaks


def test_filters_by_proxy_user_key_fingerprint_and_key_owner(
    store: AuditStore, signer: CheckpointKey, make_exchange: Callable[..., Exchange]
) -> None:
    a = make_exchange("00000000-0000-5000-8000-00000000000a", T0, proxy_user="alice", key_fingerprint=FP)
    b = make_exchange("00000000-0000-5000-8000-00000000000b", T0, proxy_user="bob", key_fingerprint=None)
    store.write_many([a, b])
    ids = lambda f: [i["id"] for i in page(store.engine, f)[0]]  # noqa: E731
    assert ids(Filters(proxy_user="alice")) == [a.id]
    assert ids(Filters(key_fingerprint=FP)) == [a.id]
    assert ids(Filters(key_owner="ml")) == []  # no owner set yet: no record
    set_owner(
        store.engine, signer, store.store_id(), fingerprint=FP, owner="alice", team="ml", note=None, actor="x", at=T0
    )
    assert ids(Filters(key_owner="ml")) == [a.id]
    assert ids(Filters(key_owner="alice")) == [a.id]
    got = store.get(a.id, store_fields=True)
    assert got is not None and got["key_owner"] == {"owner": "alice", "team": "ml"}
    other = store.get(b.id, store_fields=True)
    assert other is not None and other["key_owner"] is None


def test_cli_key_owner_reads_the_key_from_stdin_and_never_stores_it(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'o.db'}"
    env = {"OBSERVER_DATA_DIR": str(tmp_path / "data")}
    runner = CliRunner()
    assert runner.invoke(app, ["db", "upgrade", "--db", db], env=env).exit_code == 0
    CheckpointKey.load_or_create(tmp_path / "data" / "checkpoint-key.pem")  # as observer run made it
    # No fingerprint key yet: refused, none made (a new secret would match no record; trial finding).
    missing = runner.invoke(app, ["key-owner", "fingerprint", "--db", db], input="sk-cli-key-999\n", env=env)
    assert missing.exit_code == 2 and "no fingerprint key" in missing.output
    assert not (tmp_path / "data" / "fingerprint-key").exists()
    key = FingerprintKey.load_or_create(tmp_path / "data" / "fingerprint-key")  # as observer run makes it
    printed = runner.invoke(app, ["key-owner", "fingerprint", "--db", db], input="sk-cli-key-999\n", env=env)
    assert printed.exit_code == 0, printed.output
    fingerprint = printed.stdout.strip()
    assert fingerprint == key.fingerprint("sk-cli-key-999")
    added = runner.invoke(
        app,
        ["key-owner", "add", "--owner", "carol", "--team", "fin", "--db", db],
        input="Bearer sk-cli-key-999\n",
        env=env,
    )
    assert added.exit_code == 0, added.output
    listed = runner.invoke(app, ["key-owner", "list", "--db", db], env=env)
    assert fingerprint in listed.stdout and "carol" in listed.stdout and "fin" in listed.stdout
    twice = runner.invoke(
        app, ["key-owner", "add", "--owner", "dave", "--db", db, "--fingerprint", fingerprint], env=env
    )
    assert twice.exit_code == 2 and "--replace" in twice.output
    empty = runner.invoke(app, ["key-owner", "add", "--owner", "eve", "--db", db], input="\n", env=env)
    assert empty.exit_code == 2 and "no API key" in empty.output
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("o.db*"))
    assert b"sk-cli-key-999" not in raw
