"""The ``observer`` command and its settings: sources in order (CLI > env > observer.toml >
default), one-line errors before anything starts, the generated API token kept and shown once
(each setting's declaration and every way of giving it: test_settings.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect
from typer.testing import CliRunner

from observer.cli import app
from observer.config import load_settings
from observer.token import resolve_token


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for name in list(__import__("os").environ):
        if name.startswith("OBSERVER_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def test_default_db():
    assert load_settings().db == "sqlite:///observer.db"


def test_sources_in_order(monkeypatch, tmp_path):
    (tmp_path / "observer.toml").write_text('db = "sqlite:///from-toml.db"\napi_port = 9001\n')
    assert load_settings().db == "sqlite:///from-toml.db"
    monkeypatch.setenv("OBSERVER_DB", "sqlite:///from-env.db")
    assert load_settings().db == "sqlite:///from-env.db"
    assert load_settings().api_port == 9001
    assert load_settings(db="sqlite:///from-cli.db").db == "sqlite:///from-cli.db"


def test_config_file_from_env(monkeypatch, tmp_path):
    other = tmp_path / "elsewhere.toml"
    other.write_text("proxy_port = 3128\n")
    monkeypatch.setenv("OBSERVER_CONFIG", str(other))
    assert load_settings().proxy_port == 3128


def test_unknown_setting_in_file_is_an_error(tmp_path):
    (tmp_path / "observer.toml").write_text('dbb = "typo"\n')
    with pytest.raises(Exception, match="dbb"):
        load_settings()


def test_token_generated_once_then_reused(tmp_path):
    shown: list[str] = []
    s = load_settings(data_dir=tmp_path / "data")
    token = resolve_token(s, announce=shown.append)
    assert len(token) >= 43 and len(shown) == 1 and token in shown[0]
    assert (tmp_path / "data" / "api-token").stat().st_mode & 0o777 == 0o600
    assert resolve_token(s, announce=shown.append) == token
    assert len(shown) == 1  # printed once only


def test_token_from_env_wins(monkeypatch, tmp_path):
    monkeypatch.setenv("OBSERVER_API_TOKEN", "t0ken")
    assert resolve_token(load_settings(data_dir=tmp_path), announce=pytest.fail) == "t0ken"
    assert not (tmp_path / "api-token").exists()


def test_db_upgrade_command(tmp_path):
    url = f"sqlite:///{tmp_path / 'a.db'}"
    result = CliRunner().invoke(app, ["db", "upgrade", "--db", url])
    assert result.exit_code == 0, result.output
    tables = set(inspect(create_engine(url)).get_table_names())
    assert {"exchanges", "exchange_blocks", "exchange_tool_calls", "exchange_violations"} <= tables


def test_db_upgrade_uses_env(monkeypatch, tmp_path):
    monkeypatch.setenv("OBSERVER_DB", f"sqlite:///{tmp_path / 'env.db'}")
    assert CliRunner().invoke(app, ["db", "upgrade"]).exit_code == 0
    assert (tmp_path / "env.db").exists()


def test_help_lists_commands():
    out = CliRunner().invoke(app, ["--help"]).output
    for cmd in ("run", "api", "db"):
        assert cmd in out


def test_bad_config_file_is_one_line_error(tmp_path):
    """Trial finding: an unknown key gave a 55-line traceback."""
    (tmp_path / "observer.toml").write_text('dbb = "typo"\n')
    result = CliRunner().invoke(app, ["db", "upgrade"])
    assert result.exit_code == 2
    assert "invalid settings: dbb in observer.toml is not a setting (did you mean db?)" in result.output
    assert "Traceback" not in result.output


def test_busy_proxy_port_is_a_clear_error(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result = CliRunner().invoke(
            app, ["run", "--proxy-port", str(port), "--api-port", "0", "--data-dir", str(tmp_path)]
        )
    assert result.exit_code == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.output and "--proxy-port" in result.output


def test_the_journal_defaults_into_the_data_folder(tmp_path):
    assert load_settings(data_dir=tmp_path).journal_path == tmp_path / "journal"
    assert load_settings(data_dir=tmp_path, journal_dir=tmp_path / "j").journal_path == tmp_path / "j"


@pytest.mark.parametrize(
    ("args", "toml", "message"),
    [
        (["db", "upgrade"], 'db = "sqlite:///x.db\n', "cannot read the config file"),
        (["db", "upgrade", "--db", "nosuch://x"], None, "cannot open the audit store nosuch://x: Can't load plugin"),
        (["db", "upgrade", "--db", "not a url"], None, "cannot open the audit store <unparseable URL>"),
        (["db", "upgrade", "--db", "postgresql+psycopg://nobody@127.0.0.1:1/x"], None, "cannot open the audit store"),
    ],
)
def test_setup_errors_are_one_line(tmp_path, args, toml, message):
    """Trial finding: a TOML syntax error and unusable --db URLs printed 150+ line tracebacks."""
    if toml is not None:
        (tmp_path / "observer.toml").write_text(toml)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output and len(result.output.splitlines()) <= 2


def test_run_set_observer_db_is_the_store_of_proxy_and_api(tmp_path):
    """Regression (trial): ``observer run --set observer_db=URL`` sent records to a database that
    was never migrated while the API read the default one; a traceback for a bad URL. Now it is
    the ``db`` setting, as ``--db``: migrated first (a bad URL: one line, exit 2, nothing started),
    then used by proxy and API alike."""
    result = CliRunner().invoke(
        app,
        [
            "run",
            "--proxy-port",
            "0",
            "--api-port",
            "0",
            "--data-dir",
            str(tmp_path / "data"),
            "--set",
            "observer_db=nosuch://x",
        ],
    )
    assert result.exit_code == 2
    assert "cannot open the audit store nosuch://x" in result.output
    assert "observer: proxy" not in result.output and not (tmp_path / "data").exists()


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("observer_worker_buffer_mb=0", "invalid settings: --set observer_worker_buffer_mb must be 1-4096 (MiB), got"),
        ("observer_worker_buffer_mb=abc", "--set observer_worker_buffer_mb must be 1-4096 (MiB), got 'abc'"),
        ("ssl_insecure=maybe", "invalid --set option: Failed to parse option ssl_insecure"),
        ("no_such_option=1", "invalid --set option: Unknown option(s): no_such_option"),
    ],
)
def test_run_refuses_a_bad_set_before_the_banner_and_the_api(tmp_path, option, message):
    """Trial finding: a bad ``--set`` value was refused only after the ready banner was printed
    and the API token created; now nothing is started and nothing claims to be ready."""
    result = CliRunner().invoke(
        app,
        [
            "run",
            "--proxy-port",
            "0",
            "--api-port",
            "0",
            "--data-dir",
            str(tmp_path / "data"),
            "--db",
            f"sqlite:///{tmp_path / 'x.db'}",
            "--set",
            option,
        ],
    )
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "observer: proxy" not in result.output
    assert not list((tmp_path / "data").glob("*token*"))


def test_a_sqlite_file_in_a_folder_that_does_not_exist_is_an_error(tmp_path):
    """Issue 14 item 9: a mistyped ``--db`` must not become a new, empty store somewhere."""
    db = tmp_path / "new" / "deeper" / "x.db"
    result = CliRunner().invoke(app, ["db", "upgrade", "--db", f"sqlite:///{db}"])
    assert result.exit_code == 2
    assert f"the folder {db.parent} does not exist" in result.output
    assert not (tmp_path / "new").exists()


def test_observer_run_makes_the_data_folder_of_a_sqlite_file_inside_it(tmp_path, monkeypatch):
    """Trial finding: ``observer run --data-dir D --db sqlite:///D/x.db`` with D not yet there
    failed with "unable to open database file". The data folder is the one observer run makes."""
    import observer.runner

    async def fake_run_proxy(settings, mitm_sets, start_api=None):
        start_api()
        return 0

    monkeypatch.setattr(observer.runner, "run_proxy", fake_run_proxy)
    monkeypatch.setattr(observer.runner, "start_api_process", lambda *a: None)
    monkeypatch.setattr(observer.runner, "stop_process", lambda *a: None)
    data = tmp_path / "data"
    args = ["run", "--proxy-port", "0", "--api-port", "0", "--data-dir", str(data), "--db", f"sqlite:///{data}/x.db"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (data / "x.db").exists()


# ----- trial findings on the store commands: one line, exit 2, nothing made -----


def _run(tmp_path, *args: str):
    return CliRunner().invoke(
        app, ["run", "--proxy-port", "0", "--api-port", "0", "--data-dir", str(tmp_path / "data"), *args]
    )


@pytest.mark.parametrize("command", [["verify"], ["checkpoint", "export", "--out", "-"]])
def test_read_only_commands_refuse_bad_urls_and_missing_files_in_one_line(tmp_path, command):
    for url, message in (
        ("notaurl", "cannot open the audit store <unparseable URL>: Could not parse SQLAlchemy URL"),
        ("mysql://x@y/z", "cannot open the audit store mysql://x@y/z: No module named 'MySQLdb'"),
        (f"sqlite:///{tmp_path / 'missing.db'}", "no such file"),
    ):
        result = CliRunner().invoke(app, [*command, "--db", url])
        assert result.exit_code == 2, result.output
        assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "missing.db").exists()


def test_verify_refuses_a_range_that_ends_before_it_starts(tmp_path):
    result = CliRunner().invoke(
        app, ["verify", "--db", "sqlite:///x.db", "--since", "2026-02-01T00:00:00Z", "--until", "2026-01-01T00:00:00Z"]
    )
    assert result.exit_code == 2 and "--since is after --until" in result.output


def test_run_refuses_a_journal_of_another_store_before_touching_the_database(tmp_path, make_exchange):
    """Trial finding: the refusal came after the other database was migrated (with the schema
    created in PostgreSQL's maintenance database once)."""
    from datetime import datetime, timezone

    from observer.journal import format as fmt
    from observer.journal.journal import Journal

    journal = Journal(tmp_path / "data" / "journal")
    journal.open()
    journal.bind_store("the-first-store")
    journal.start(1)
    journal.record(make_exchange("waiting", datetime(2026, 1, 1, tzinfo=timezone.utc)))
    journal.close()
    assert fmt.loads((tmp_path / "data" / "journal" / "identity.json").read_bytes())["store_id"] == "the-first-store"
    other = tmp_path / "other.db"
    result = _run(tmp_path, "--db", f"sqlite:///{other}")
    assert result.exit_code == 2, result.output
    assert (
        "holds records of the store the-first-store, and this database is the store new, not migrated yet"
        in result.output
    )
    assert inspect(create_engine(f"sqlite:///{other}")).get_table_names() == []


def test_run_refuses_a_bad_checkpoint_key_and_a_journal_in_use(tmp_path):
    from observer.journal.journal import Journal

    bad = tmp_path / "bad.pem"
    bad.write_text("not a key\n")
    result = _run(tmp_path, "--db", f"sqlite:///{tmp_path / 'a.db'}", "--checkpoint-key", str(bad))
    assert (
        result.exit_code == 2 and "is not a checkpoint key" in result.output and "observer: proxy" not in result.output
    )
    holder = Journal(tmp_path / "data" / "journal")
    holder.open()
    try:
        result = _run(tmp_path, "--db", f"sqlite:///{tmp_path / 'a.db'}")
    finally:
        holder.close()
    assert result.exit_code == 2 and "is in use by another observer process" in result.output


def test_a_data_dir_made_by_the_run_is_the_owners_alone(tmp_path):
    """Trial finding: mitmproxy made DATA_DIR/mitmproxy first, so the data folder was 0755."""
    from observer.cli import _open_store

    made = tmp_path / "made"
    (made / "mitmproxy").mkdir(parents=True, mode=0o755)
    made.chmod(0o755)
    _open_store(load_settings(data_dir=made, db=f"sqlite:///{tmp_path / 'a.db'}"), new_data_dir=True)
    assert made.stat().st_mode & 0o777 == 0o700
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o750)
    theirs.chmod(0o750)
    _open_store(load_settings(data_dir=theirs, db=f"sqlite:///{tmp_path / 'b.db'}"))
    assert theirs.stat().st_mode & 0o777 == 0o750  # the operator's own choice is left alone


def test_an_api_tls_pair_that_is_not_a_certificate_and_its_key_stops_the_run(tmp_path):
    """Trial finding: ``--api-tls-cert /etc/hostname --api-tls-key /etc/hostname`` started the
    proxy and an API that died at every restart. Now one line, exit 2, nothing started."""
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    args = ["--api-tls-cert", str(junk), "--api-tls-key", str(junk)]
    result = _run(tmp_path, *args)
    assert result.exit_code == 2
    assert "are not a PEM certificate and its key" in result.output
    assert not (tmp_path / "data" / "mitmproxy").exists()


def test_a_bad_alerts_file_stops_the_run_before_anything_is_made(tmp_path):
    """Trial finding: a bad ``--alerts-file`` was reported as "invalid --set option:
    observer_alerts_file ..." after the CA folder had been made. Now ``observer run`` names the
    file's problem as a setting's and makes nothing."""
    bad = tmp_path / "alerts.toml"
    bad.write_text('[[rule]]\nname = "x"\nwhen = "no_such_condition"\n')
    result = _run(tmp_path, "--alerts-file", str(bad))
    assert result.exit_code == 2
    assert result.output.startswith("observer: invalid settings: ")
    assert "rule.0.when: Input should be" in result.output and "--set" not in result.output
    assert not (tmp_path / "data").exists()


def test_observer_config_prints_each_setting_with_its_source(monkeypatch, tmp_path):
    """The dry run: every setting once, ``name = value  # source``; secrets never shown, the
    store URL without its password; nothing made (no data folder, no store file)."""
    (tmp_path / "observer.toml").write_text("api_port = 9001\n")
    monkeypatch.setenv("OBSERVER_LLM_HOSTS_EXTRA", "llm.corp.example,10.0.0.5:8000")
    monkeypatch.setenv("OBSERVER_API_TOKEN", "s3cret-token-value")
    monkeypatch.setenv("OBSERVER_DB", "postgresql+psycopg://observer:hunter2@db.example/audit")
    result = CliRunner().invoke(app, ["config", "--retention-days", "200", "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    lines = dict(line.split(" = ", 1) for line in result.output.splitlines())
    assert lines["api_port"] == "9001  # observer.toml"
    assert lines["retention_days"] == "200  # --retention-days"
    assert lines["llm_hosts_extra"] == "llm.corp.example,10.0.0.5:8000  # OBSERVER_LLM_HOSTS_EXTRA"
    assert lines["api_token"] == "<set>  # OBSERVER_API_TOKEN"
    assert lines["db"] == "postgresql+psycopg://observer:***@db.example/audit  # OBSERVER_DB"
    assert lines["proxy_port"] == "8080  # default"
    assert lines["alerts_file"] == "<unset>  # default"
    assert "s3cret" not in result.output and "hunter2" not in result.output
    assert not (tmp_path / "d").exists() and not list(tmp_path.glob("*.db"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--alerts-file", "missing.toml"], "invalid settings: cannot read the alerts file missing.toml"),
        (["--db", "sqlite:///nowhere/x.db"], "the folder nowhere does not exist"),
        (["--db", "mysql+nodriver://x/y"], "cannot open the audit store"),
        (["--dialect-registry", "no.such.module:reg"], "invalid settings: dialect_registry"),
        (["--api-tls-cert", "cert.pem"], "invalid settings: "),
        (["--retention-days", "30"], "under the 183 (six months)"),
    ],
)
def test_observer_config_refuses_what_observer_run_refuses(tmp_path, args, message):
    result = CliRunner().invoke(app, ["config", *args])
    assert result.exit_code == 2
    assert message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_sqlite_store_this_user_cannot_write_is_refused_before_start(tmp_path, monkeypatch):
    """Trial finding: in the container, the default store lay in root's WORKDIR; ``observer
    config`` passed it and ``observer run`` died on "Permission denied" after making its CA
    folder. (The tests run as root, who may write anywhere: ``os.access`` answers as for
    another user.)"""
    import observer.cli as cli

    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(cli.os, "access", lambda p, mode: False if Path(p) == locked else real(p, mode))
    url = f"sqlite:///{locked / 'observer.db'}"
    for command in (["config", "--db", url], ["run", "--db", url, "--data-dir", str(tmp_path / "data")]):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 2, result.output
        assert f"the folder {locked} is not writable by this user" in result.output
    assert not (tmp_path / "data").exists()
    (locked / "observer.db").write_bytes(b"")
    monkeypatch.setattr(cli.os, "access", lambda p, mode: False if Path(p).parent == locked else real(p, mode))
    result = CliRunner().invoke(app, ["db", "upgrade", "--db", url])
    assert result.exit_code == 2 and f"the file {locked / 'observer.db'} is not writable" in result.output
    result = CliRunner().invoke(app, ["verify", "--db", url])  # reading needs no write access
    assert "not writable" not in result.output
