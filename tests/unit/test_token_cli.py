"""``observer token create|list|revoke``: the printed token works with its role, is never listed
again (nor its hash), and a revoked one is refused and logged as revoked."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from observer.api import create_app
from observer.cli import app
from observer.store import access
from observer.store.checkpoint import CheckpointKey
from observer.store.store import AuditStore
from observer.store.tokens import token_sha256
from observer.store.verify import verify

BOOTSTRAP = "bootstrap-token-for-cli-tests"


@pytest.fixture
def key(tmp_path: Path) -> CheckpointKey:
    return CheckpointKey.load_or_create(tmp_path / "keys" / "checkpoint-key.pem")


def _cli(args: list[str], db_url: str, key: CheckpointKey | None = None) -> Any:
    extra = ["--db", db_url] + (["--key", str(key.path)] if key is not None else [])
    return CliRunner().invoke(app, [*args, *extra], catch_exceptions=False)


def _create(db_url: str, key: CheckpointKey, role: str, name: str) -> str:
    made = _cli(["token", "create", "--role", role, "--name", name, "--by", "ops"], db_url, key)
    assert made.exit_code == 0, made.output
    token = made.stdout.strip()
    assert re.fullmatch(r"obs_[A-Za-z0-9_-]{43}", token), made.stdout
    assert f"observer: token {name!r} ({role}, id " in made.stderr and "it is shown only now" in made.stderr
    return token


def test_a_created_token_works_with_its_role(store: AuditStore, migrated_url: str, key: CheckpointKey) -> None:
    tokens = {role: _create(migrated_url, key, role, f"{role}-cli") for role in ("viewer", "auditor", "responder")}
    with TestClient(create_app(store, BOOTSTRAP, key)) as c:
        status = {
            role: c.get("/v1/access-log", headers={"Authorization": f"Bearer {token}"}).status_code
            for role, token in tokens.items()
        }
        assert status == {"viewer": 403, "auditor": 200, "responder": 403}
        assert c.get("/v1/exchanges", headers={"Authorization": f"Bearer {tokens['viewer']}"}).status_code == 200
        assert c.get("/v1/exchanges?q=x", headers={"Authorization": f"Bearer {tokens['viewer']}"}).status_code == 403
    with store.engine.connect() as conn:
        logged = [(e["principal"], e["role"], e["status"]) for e in access.entries(conn)]
    assert logged[:3] == [
        ("viewer-cli", "viewer", 403),
        ("auditor-cli", "auditor", 200),
        ("responder-cli", "responder", 403),
    ]


def test_list_never_shows_the_token_or_its_hash(store: AuditStore, migrated_url: str, key: CheckpointKey) -> None:
    assert (
        CliRunner().invoke(app, ["token", "list", "--db", migrated_url]).stderr.strip() == "observer: no active tokens"
    )
    first = _create(migrated_url, key, "auditor", "ann")
    second = _create(migrated_url, key, "viewer", "bob")
    listed = CliRunner().invoke(app, ["token", "list", "--db", migrated_url])
    assert listed.exit_code == 0, listed.output
    lines = listed.stdout.splitlines()
    assert len(lines) == 2
    assert re.fullmatch(r"[0-9a-f-]{36}  ann  auditor  made \S+Z by ops", lines[0]), lines[0]
    assert re.fullmatch(r"[0-9a-f-]{36}  bob  viewer  made \S+Z by ops", lines[1]), lines[1]
    everything = _cli(["token", "revoke", "bob", "--by", "sec"], migrated_url, key)
    assert everything.exit_code == 0 and everything.stdout.strip() == "observer: token 'bob' revoked"
    active = CliRunner().invoke(app, ["token", "list", "--db", migrated_url])
    assert [line.split("  ")[1] for line in active.stdout.splitlines()] == ["ann"]
    full = CliRunner().invoke(app, ["token", "list", "--all", "--db", migrated_url])
    assert re.search(r"  bob  viewer  made \S+Z by ops  revoked \S+Z by sec$", full.stdout, re.MULTILINE), full.stdout
    for out in (listed, active, full):
        text = out.stdout + out.stderr
        for token in (first, second):
            assert token not in text and token[4:] not in text
            assert token_sha256(token) not in text
    with store.engine.connect() as conn:  # the store keeps the hash only
        stored = conn.execute(sa.text("SELECT * FROM api_tokens")).all()
    assert all(first not in str(tuple(row)) for row in stored)
    assert token_sha256(first) in {row._mapping["token_sha256"] for row in stored}


def test_revoke_refuses_the_token_and_the_log_says_so(store: AuditStore, migrated_url: str, key: CheckpointKey) -> None:
    token = _create(migrated_url, key, "admin", "carol")
    headers = {"Authorization": f"Bearer {token}"}
    with TestClient(create_app(store, BOOTSTRAP, key)) as c:
        assert c.get("/v1/exchanges", headers=headers).status_code == 200
        revoked = _cli(["token", "revoke", "carol"], migrated_url, key)
        assert revoked.exit_code == 0, revoked.output
        response = c.get("/v1/exchanges?limit=2", headers=headers)
        assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
        assert response.json() == {"error": {"code": "unauthorized", "message": "missing or invalid bearer token"}}
    with store.engine.connect() as conn:
        entries = list(access.entries(conn))
    assert [(e["principal"], e["role"], e["status"], e["params"]) for e in entries] == [
        ("carol", "admin", 200, {}),
        ("carol", None, 401, {"query": {"limit": "2"}, "authorization": "revoked"}),
    ]
    assert verify(store, [key.public]).ok


def test_revoke_by_id_and_its_refusals(store: AuditStore, migrated_url: str, key: CheckpointKey) -> None:
    _create(migrated_url, key, "viewer", "dave")
    token_id = CliRunner().invoke(app, ["token", "list", "--db", migrated_url]).stdout.split()[0]
    assert _cli(["token", "revoke", token_id], migrated_url, key).exit_code == 0
    again = _cli(["token", "revoke", "dave"], migrated_url, key)
    assert again.exit_code == 2 and "token 'dave' was revoked already" in again.stderr
    unknown = _cli(["token", "revoke", "nobody"], migrated_url, key)
    assert unknown.exit_code == 2 and "no token with id or name 'nobody'" in unknown.stderr


def test_create_refusals_are_exit_2(store: AuditStore, migrated_url: str, key: CheckpointKey) -> None:
    bad_role = _cli(["token", "create", "--role", "root", "--name", "x"], migrated_url, key)
    assert bad_role.exit_code == 2
    assert "unknown role 'root'; one of viewer, auditor, responder, admin" in bad_role.stderr
    assert bad_role.stdout == ""
    _create(migrated_url, key, "viewer", "erin")
    duplicate = _cli(["token", "create", "--role", "admin", "--name", "erin"], migrated_url, key)
    assert duplicate.exit_code == 2 and "a token named 'erin' exists" in duplicate.stderr
    assert duplicate.stdout == ""
    padded = _cli(["token", "create", "--role", "admin", "--name", " erin "], migrated_url, key)
    assert padded.exit_code == 2 and "a token named 'erin' exists" in padded.stderr
    assert _cli(["token", "revoke", "erin"], migrated_url, key).exit_code == 0
    reused = _cli(["token", "create", "--role", "viewer", "--name", "erin"], migrated_url, key)
    assert reused.exit_code == 2 and "names are never reused" in reused.stderr
    for name in (
        "",
        "   ",
        "x" * 101,
        "tab\there",
        "del\x7fhere",
        "rlo\u202ehere",
        "c1\x9bhere",
    ):  # DEL, bidi, C1: trial
        blank = _cli(["token", "create", "--role", "viewer", "--name", name], migrated_url, key)
        assert blank.exit_code == 2 and "a token name is 1..100 printable characters" in blank.stderr, name
    assert len(CliRunner().invoke(app, ["token", "list", "--all", "--db", migrated_url]).stdout.splitlines()) == 1


def test_tokens_are_events_of_the_store_chain(store: AuditStore, migrated_url: str, key: CheckpointKey) -> None:
    _create(migrated_url, key, "auditor", "fay")
    assert _cli(["token", "revoke", "fay", "--by", "sec"], migrated_url, key).exit_code == 0
    with store.engine.connect() as conn:
        events = conn.execute(sa.text("SELECT kind, actor FROM store_events ORDER BY seq")).all()
    assert [tuple(e) for e in events] == [("token_created", "ops"), ("token_revoked", "sec")]
    verified = CliRunner().invoke(app, ["verify", "--db", migrated_url, "--key", str(key.path)])
    assert verified.exit_code == 0, verified.output


TOKEN_TAMPERS = {
    "role-raised": ("UPDATE api_tokens SET role = 'admin' WHERE name = 'gus'", "role differs from its chained events"),
    "renamed": ("UPDATE api_tokens SET name = 'hal' WHERE name = 'gus'", "name differs from its chained events"),
    "hash-swapped": (
        "UPDATE api_tokens SET token_sha256 = '" + "0" * 64 + "' WHERE name = 'gus'",
        "token_sha256 differs from its chained events",
    ),
    "unrevoked": ("UPDATE api_tokens SET revoked_at = NULL, revoked_by = NULL WHERE name = 'ivy'", "revoked differs"),
    "deleted": ("DELETE FROM api_tokens WHERE name = 'gus'", "deleted from api_tokens"),
    "inserted": (
        "INSERT INTO api_tokens (id, name, role, token_sha256, created_at, created_by)"
        " SELECT 'forged-id', 'mallory', 'admin', '"
        + "1" * 64
        + "', created_at, 'x' FROM api_tokens WHERE name = 'gus'",
        "token forged-id has no chained event (inserted)",
    ),
}


@pytest.mark.parametrize("tamper", list(TOKEN_TAMPERS))
def test_a_token_changed_behind_the_chain_is_a_break(
    store: AuditStore, migrated_url: str, key: CheckpointKey, tamper: str
) -> None:
    """A row of api_tokens must match the events that made and revoked it (bug found: a role
    raised in the table passed verify)."""
    _create(migrated_url, key, "viewer", "gus")
    _create(migrated_url, key, "viewer", "ivy")
    assert _cli(["token", "revoke", "ivy"], migrated_url, key).exit_code == 0
    assert verify(store, [key.public]).ok
    statement, reason = TOKEN_TAMPERS[tamper]
    with store.engine.begin() as conn:
        conn.execute(sa.text(statement))
    report = verify(store, [key.public])
    assert [b.writer_id for b in report.breaks] == [store.store_id()], [b.line() for b in report.breaks]
    assert reason in report.breaks[0].reason, report.breaks[0].reason
