"""``--by`` (who runs a command, recorded in the store's chained events) is bounded and printable
as a key owner's name is: 1..200 printable characters, refused with exit 2 before anything is
read or changed; the OS user name standing in for it is checked alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import typer
from typer.testing import CliRunner

from observer.cli import app
from observer.store.checkpoint import CheckpointKey
from observer.store.store import AuditStore

FINGERPRINT = "hmac-sha256:" + "0123456789abcdef" * 2
#: Every command taking --by, with the least it needs besides (the test below fails for a new one).
COMMANDS: dict[str, list[str]] = {
    "purge": [],
    "hold create": ["--reason", "case 7", "--host", "api.openai.com"],
    "hold release": ["0f1e2d3c-0000-4000-8000-000000000000", "--reason", "closed"],
    "token create": ["--role", "viewer", "--name", "dana"],
    "token revoke": ["dana"],
    "key-owner add": ["--owner", "dana", "--fingerprint", FINGERPRINT],
}
#: (--by, the message's end), by hand: the first character str.isprintable refuses, or the length.
REFUSED = [
    ("x" * 201, "(not 201)"),
    ("ops\x1b[31m", "(U+001B is not printable)"),  # a terminal escape (C0)
    ("ops\x7f", "(U+007F is not printable)"),  # DEL
    ("\u009b31mops", "(U+009B is not printable)"),  # C1 CSI
    ("alice\u202eecila", "(U+202E is not printable)"),  # a bidi override: prints as "aliceecila" reversed
    ("a\u200bb", "(U+200B is not printable)"),  # zero-width space: prints as "ab"
    ("tab\there", "(U+0009 is not printable)"),
    ("a\udcffb", "(U+DCFF is not printable)"),  # a byte that was not UTF-8 (surrogateescape)
]


@pytest.fixture
def key(tmp_path: Path) -> CheckpointKey:
    return CheckpointKey.load_or_create(tmp_path / "keys" / "checkpoint-key.pem")


def _cli(args: list[str], db_url: str, key: CheckpointKey) -> Any:
    return CliRunner().invoke(app, [*args, "--db", db_url, "--key", str(key.path)], catch_exceptions=False)


def _events(store: AuditStore) -> list[tuple[str, str]]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text("SELECT kind, actor FROM store_events ORDER BY seq"))]


def _commands_with_by(command: Any, path: str = "") -> set[str]:
    """The paths of the commands under ``command`` (typer's own click) with a ``--by`` option."""
    if hasattr(command, "commands"):  # a group
        return {p for name, sub in command.commands.items() for p in _commands_with_by(sub, f"{path} {name}".strip())}
    return {path} if any("--by" in p.opts for p in command.params) else set()


def test_every_command_taking_by_is_listed() -> None:
    assert _commands_with_by(typer.main.get_command(app)) == set(COMMANDS)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_unprintable_or_overlong_by_is_refused_before_anything(
    command: str, store: AuditStore, migrated_url: str, tmp_path: Path
) -> None:
    """Exit 2 with one line naming --by, the bound and the offending code point (not the
    character), when the option is parsed: before the signing key is looked for (a missing one
    would be the error otherwise) or the store opened; nothing is recorded, whatever the command."""
    missing = CheckpointKey.load_or_create(tmp_path / "elsewhere.pem")
    missing.path.unlink()
    for by, reason in REFUSED:
        result = _cli([*command.split(), *COMMANDS[command], "--by", by], migrated_url, missing)
        assert result.exit_code == 2, (by, result.output)
        assert result.stderr == f"observer: --by: 1..200 printable characters {reason}\n", by
        assert result.stdout == ""
    blank = _cli([*command.split(), *COMMANDS[command], "--by", " \u3000 "], migrated_url, missing)
    assert blank.exit_code == 2 and blank.stderr == "observer: --by must not be blank\n"
    assert _events(store) == []


def test_a_printable_by_is_recorded_without_surrounding_space(
    store: AuditStore, migrated_url: str, key: CheckpointKey
) -> None:
    """200 characters, letters of any script and inner spaces are printable; the surrounding
    white space is dropped, as from a key owner's name."""
    for name, by in (("erin", " legal team "), ("fay", "Zoë 山田"), ("gus", "x" * 200)):
        made = _cli(["token", "create", "--role", "viewer", "--name", name, "--by", by], migrated_url, key)
        assert made.exit_code == 0, made.output
    assert _events(store) == [
        ("token_created", "legal team"),
        ("token_created", "Zoë 山田"),
        ("token_created", "x" * 200),
    ]


def test_the_os_user_name_standing_in_for_by_is_checked_too(
    store: AuditStore, migrated_url: str, key: CheckpointKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --by the OS user name is recorded (``getpass.getuser`` reads ``$LOGNAME`` first):
    one with a terminal escape is refused, and --by overrides it."""
    monkeypatch.setenv("LOGNAME", "ops\x1b]0;owned\x07")
    refused = _cli(["token", "create", "--role", "viewer", "--name", "hal"], migrated_url, key)
    assert refused.exit_code == 2
    assert refused.stderr == (
        "observer: the OS user name (give --by instead): 1..200 printable characters (U+001B is not printable)\n"
    )
    assert _events(store) == []
    monkeypatch.setenv("LOGNAME", "ops")
    assert _cli(["token", "create", "--role", "viewer", "--name", "hal"], migrated_url, key).exit_code == 0
    assert _events(store) == [("token_created", "ops")]
