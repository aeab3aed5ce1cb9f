"""The ``observer`` command (typer): ``run`` (proxy + API), ``api``, ``db upgrade``, ``verify``,
``checkpoint export``, ``export`` (and ``export verify``, offline), ``ingest`` (saved captures),
``config`` (the settings checked and shown, a dry run), ``conformance`` (the conformance report).

Every command that touches the store takes ``--db URL`` (default: the config file or env
``OBSERVER_DB``, else ``sqlite:///observer.db``). ``run`` takes every setting of
``observer.config`` as a flag ``--<name>`` (and a proxy setting also as ``--set
observer_<name>=VALUE``, as mitmdump does); a bad value of any source exits 2 with one line
naming it, before anything starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from observer.config import (
    MIN_RETENTION_DAYS,
    OPTION_PREFIX,
    PROXY_SPECS,
    SPECS,
    Settings,
    config_file,
    did_you_mean,
    load_settings,
    option_setting,
)
from observer.dialects.registry import load_registry
from observer.errors import ConfigError, ObserverError

app = typer.Typer(help="Passive observer and compliance logger for LLM inference streams.", no_args_is_help=True)
db_app = typer.Typer(help="Audit store maintenance.", no_args_is_help=True)
app.add_typer(db_app, name="db")
checkpoint_app = typer.Typer(help="The hash chain's signed checkpoints.", no_args_is_help=True)
app.add_typer(checkpoint_app, name="checkpoint")
hold_app = typer.Typer(help="Legal holds: records no purge removes while a hold covers them.", no_args_is_help=True)
app.add_typer(hold_app, name="hold")

token_app = typer.Typer(help="Tokens of the query API and their roles.", no_args_is_help=True)
app.add_typer(token_app, name="token")
key_owner_app = typer.Typer(
    help="Who holds which API credential: fingerprints (never keys) and their owners.", no_args_is_help=True
)
app.add_typer(key_owner_app, name="key-owner")


export_app = typer.Typer(help="Signed exports of the records (jsonl, csv, parquet), and their offline check.")
app.add_typer(export_app, name="export")

DbOpt = Annotated[
    str | None,
    typer.Option("--db", help="SQLAlchemy URL of the audit store (env OBSERVER_DB; default sqlite:///observer.db)."),
]


def _logging() -> None:
    """Log to stderr for the commands that have no mitmproxy termlog (``run`` logs through it)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)  # its per-plugin INFO lines say nothing to an operator
    # A connection the server closed fails again when the pool resets it: a traceback after the
    # command's own one-line error, saying nothing more (trial finding).
    logging.getLogger("sqlalchemy.pool").setLevel(logging.CRITICAL)


def _with_setting_flags(command: Callable[..., None]) -> Callable[..., None]:
    """``command`` with one option ``--<name>`` per setting but the secret ones (type, help,
    default and range from ``observer.config``); it receives them as ``flags``
    (``{name: value}``, ``None``: not given)."""
    own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "flags"]
    extra = [
        inspect.Parameter(
            spec.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[
                spec.kind | None,
                typer.Option(
                    spec.flag + (f"/--no-{spec.flag[2:]}" if spec.kind is bool else ""),
                    help=f"{spec.help} [{spec.env}; default {spec.default_text()}"
                    f"{'; ' + spec.range_text() if spec.kind is int else ''}]",
                    show_default=False,
                    rich_help_panel="Settings (also OBSERVER_<NAME>, observer.toml)",
                ),
            ],
        )
        for spec in SPECS.values()
        if spec.flag is not None
    ]

    def wrapper(**kwargs: Any) -> None:
        flags = {name: kwargs.pop(name) for name in list(kwargs) if name in SPECS}
        command(**kwargs, flags=flags)

    wrapper.__name__, wrapper.__doc__ = command.__name__, command.__doc__
    wrapper.__signature__ = inspect.Signature([*own, *extra])  # type: ignore[attr-defined]
    return wrapper


@app.command()
@_with_setting_flags
def run(
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="A mitmproxy option NAME=VALUE (repeatable); observer_<name>=VALUE: that setting."),
    ] = None,
    *,
    flags: dict[str, Any],
) -> None:
    """Run the forward proxy with the audit addon and the query API, until Ctrl-C."""
    from observer.runner import check_port_free, run_proxy, start_api_process, stop_process
    from observer.token import resolve_token

    from_sets, given_as, mitm_sets = _split_sets(set_ or [], flags)
    settings = _settings(given_as, **(flags | from_sets))
    _check_settings(settings)  # before the store, the CA or the proxy: nothing started yet
    try:
        check_port_free(settings.proxy_host, settings.proxy_port, "--proxy-port")
        check_port_free(settings.api_host, settings.api_port, "--api-port")
    except ObserverError as exc:
        _fail(str(exc))
    new_data_dir = not settings.data_dir.exists()
    started: list[subprocess.Popen] = []

    def start_api() -> subprocess.Popen:
        """Called once the proxy accepted every option: the data folder, the store, the token,
        the API, the banner (nothing is made or migrated for a run that a bad option stops).
        Called again when the API died: the API only."""
        if started:
            started.append(start_api_process(settings, resolve_token(settings)))
            return started[-1]
        _open_store(settings, new_data_dir=new_data_dir)
        started.append(start_api_process(settings, resolve_token(settings)))
        ca = settings.mitmproxy_confdir / "mitmproxy-ca-cert.pem"
        typer.echo(
            f"observer: proxy http://{settings.proxy_host}:{settings.proxy_port} "
            f"(clients trust {ca}), API {settings.api_scheme}://{settings.api_host}:{settings.api_port}/docs, "
            f"store {_safe(settings.db)}"
        )
        return started[0]

    from mitmproxy.exceptions import OptionsError

    try:
        code = asyncio.run(run_proxy(settings, mitm_sets, start_api))
    except OptionsError as exc:
        _fail(f"invalid --set option: {exc}")
    finally:
        for proc in started:
            stop_process(proc)
    raise typer.Exit(code)


def _check_settings(settings: Settings) -> None:
    """What ``observer run`` checks of its settings before it makes or starts anything (exit 2,
    one line, for the first problem): the dialect registry imports, the store URL parses and its
    driver is installed (a SQLite file's folder exists, or is the data folder), the API's TLS
    certificate and key are a readable PEM pair or both unset, the alerts file reads and checks
    (``load_alert_config``), and the fingerprint key, when its file exists, is one
    (``observer.identity``). Nothing is connected, made or written."""
    from observer.alerting.rules import load_alert_config
    from observer.identity import FingerprintKey

    try:
        load_registry(settings.dialect_registry)
    except (ImportError, AttributeError, ValueError, TypeError) as exc:
        _fail(f"invalid settings: dialect_registry {settings.dialect_registry!r}: {type(exc).__name__}: {exc}")
    _check_url(settings.db, creatable=settings.data_dir, writable=True)
    try:
        settings.api_tls_files()
        if settings.alerts_file is not None:
            load_alert_config(settings.alerts_file)
        FingerprintKey.load_if_present(settings.fingerprint_key_path)
    except (ObserverError, ConfigError) as exc:
        _fail(f"invalid settings: {exc}")


@app.command("config")
@_with_setting_flags
def config_check(*, flags: dict[str, Any]) -> None:
    """Check the settings as ``observer run`` would, and print them, changing nothing.

    Reads every source (flags > ``OBSERVER_<NAME>`` > ``observer.toml`` > defaults) and runs
    ``observer run``'s checks before start (``_check_settings``); does not bind ports or connect
    to the store. Prints one line per setting, ``name = value  # source`` (source: the flag,
    the variable, the file or ``default``), secrets as ``<set>`` / ``<unset>`` and the store
    URL without its password. Exit 0, or 2 with one line naming the first problem: a dry run
    for a deployment's environment (a unit's EnvironmentFile, a ConfigMap, a compose file)."""

    given = {name: value for name, value in flags.items() if value is not None}
    settings = _settings(None, **flags)
    _check_settings(settings)
    for name, spec in SPECS.items():
        value = getattr(settings, name)
        if spec.secret:
            shown = "<set>" if value else "<unset>"
        elif name == "db":
            shown = _safe(str(value))
        else:
            shown = _show(value)
        if name in given:
            source = spec.flag or name
        elif any(k.upper() == spec.env for k in os.environ):
            source = spec.env
        elif name in settings.model_fields_set:
            source = f"{config_file()}"
        else:
            source = "default"
        typer.echo(f"{name} = {shown}  # {source}")


def _show(value: Any) -> str:
    """A setting's value as one line: lists joined with commas, paths and others as text."""
    if value is None:
        return "<unset>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def _split_sets(sets: list[str], flags: dict[str, Any]) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """``observer run``'s ``--set`` items as (setting values by name, how each was spelled,
    plain mitmproxy ``NAME=VALUE`` items). ``--set observer_<name>=V`` is that setting, as its
    flag; exits 2 with one line for an ``observer_*`` name that is no setting, a setting given
    twice, or one without a value (a bare ``--set observer_<flag>`` means true, as in mitmproxy)."""
    values: dict[str, str] = {}
    given_as = {name: SPECS[name].flag or name for name, v in flags.items() if v is not None}
    mitm: list[str] = []
    for item in sets:
        option, has_value, value = (part.strip() for part in item.partition("="))
        name = option_setting(option)
        if name is None and option.startswith(OPTION_PREFIX):
            spec = SPECS.get(option.removeprefix(OPTION_PREFIX))
            if spec is not None:
                _fail(f"--set {option}: {spec.name} is not a proxy option; use {spec.flag or spec.env}")
            _fail(f"--set {option} is not a setting{did_you_mean(option, [s.option for s in PROXY_SPECS])}")
        if name is None:
            mitm.append(item)
            continue
        if name in given_as:
            _fail(f"--set {option} and {given_as[name]} name the same setting: give it once")
        if not has_value and SPECS[name].kind is not bool:
            _fail(f"--set {option} needs a value: --set {option}=VALUE")
        values[name], given_as[name] = value if has_value else "true", f"--set {option}"
    return values, given_as, mitm


@app.command()
def api(
    host: Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 8081).")] = None,
    db: DbOpt = None,
) -> None:
    """Serve the query API only (token from env OBSERVER_API_TOKEN or the data folder)."""
    import uvicorn

    from observer.api.app import ApiOptions, create_app
    from observer.store.store import AuditStore
    from observer.token import resolve_token

    _logging()
    settings = _settings({"api_host": "--host", "api_port": "--port"}, db=db, api_host=host, api_port=port)
    _check_url(settings.db, writable=True)  # (the access log is written to the store)
    token = resolve_token(settings)
    key = _api_key(settings)
    options = ApiOptions(
        exports_dir=settings.data_dir / "exports",
        metrics_dir=settings.metrics_path,
        retention_days=settings.retention_days,
        retention_override=settings.retention_override,
    )
    try:
        tls = settings.api_tls_files()
    except ObserverError as exc:
        _fail(f"invalid settings: {exc}")
    uvicorn.run(
        create_app(AuditStore(settings.db), token, key, options),
        host=settings.api_host,
        port=settings.api_port,
        log_level="warning",
        ssl_certfile=str(tls[0]) if tls else None,
        ssl_keyfile=str(tls[1]) if tls else None,
    )


def _api_key(settings: Settings) -> Any:
    """The checkpoint key the API signs its access log with: the data folder's, made when
    missing (as ``observer run`` does); exit 2 when it cannot be read or made."""
    from observer.store.checkpoint import CheckpointKey

    try:
        return CheckpointKey.load_or_create(settings.checkpoint_key_path)
    except ObserverError as exc:
        _fail(str(exc))


@db_app.command("upgrade")
def db_upgrade(db: DbOpt = None) -> None:
    """Create or migrate the audit store schema to the newest version (alembic upgrade head)."""
    _logging()
    settings = _settings(db=db)
    _upgrade(settings.db)
    typer.echo(f"observer: store {_safe(settings.db)} is at the newest schema")


KeyOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--key",
        help="A trusted checkpoint key: a public key PEM, or a private key file; repeat it for several writers"
        " (default: the checkpoint_key setting, else DATA_DIR/checkpoint-key.pem).",
    ),
]
TimeOpt = Annotated[str | None, typer.Option(help="RFC 3339 time, e.g. 2026-06-01T00:00:00Z.")]


@app.command()
def verify(
    db: DbOpt = None,
    since: TimeOpt = None,
    until: TimeOpt = None,
    key: KeyOpt = None,
    checkpoints: Annotated[
        str | None,
        typer.Option(help="Checkpoints kept elsewhere (observer checkpoint export): also compared with the store."),
    ] = None,
) -> None:
    """Recompute every writer's hash chain and check its signed checkpoints.

    Exit 0: everything verifies; 1: a break (each writer's first: writer, seq, record id,
    reason); 2: bad arguments or the store cannot be read."""
    from observer.shape import rfc3339
    from observer.store.access import access_writer
    from observer.store.verify import verify as run_verify

    _logging()
    settings = _settings(db=db)
    public = _public_keys(settings, key)
    exported = _read_exported(checkpoints) if checkpoints else None
    since_t, until_t = _time_opt("--since", since), _time_opt("--until", until)
    if since_t is not None and until_t is not None and since_t > until_t:
        _fail("--since is after --until")
    with _reading_store(settings) as store, _Progress("verifying") as bar:
        report = run_verify(
            store, public, since=since_t, until=until_t, exported=exported, progress=bar.update, total=bar.total
        )
    for warning in report.warnings:
        typer.echo(f"observer: warning: {warning}", err=True)
    for writer, at in sorted(report.last_checkpoint.items()):
        if writer == report.store_id:
            what = "the store's chain (holds, purges, tokens)"
        elif report.store_id is not None and writer == access_writer(report.store_id):
            what = "the access log"
        else:
            what = f"writer {writer}"
        typer.echo(f"observer: {what}: last checkpoint {rfc3339(at)}")
    entries = sum(report.entries.values())
    summary = (
        f"{entries} entries of {len(report.entries)} writers, {report.checkpoints} checkpoints checked"
        + (f", {report.purged} entries purged" if report.purged else "")
        + (f", {report.store_events} store events (holds, purges, tokens)" if report.store_events else "")
        + (f", {report.access_entries} access log entries" if report.access_entries else "")
        + (f"; {report.unchained} records stored before the chain (not chained)" if report.unchained else "")
    )
    if report.ok:
        typer.echo(f"observer: verified: {summary}")
        return
    for brk in report.breaks:
        typer.echo(f"observer: BROKEN: {brk.line()}", err=True)
    typer.echo(f"observer: {len(report.breaks)} writers with a break; {summary}", err=True)
    raise typer.Exit(1)


@checkpoint_app.command("export")
def checkpoint_export(
    out: Annotated[str, typer.Option("--out", help="File to write (JSON lines); '-' for standard output.")],
    db: DbOpt = None,
) -> None:
    """Write every checkpoint (and the store's id) as JSON lines, for keeping off this host
    (``observer verify --checkpoints FILE`` compares them with the store later)."""
    from observer.jsontext import dumps
    from observer.shape import rfc3339

    _logging()
    settings = _settings(db=db)
    with _reading_store(settings) as store:
        rows = store.checkpoints()
        store_id = store.store_id()
    lines = [dumps({"store_id": store_id, **r, "created_at": rfc3339(r["created_at"])}) + b"\n" for r in rows]
    if out == "-":
        sys.stdout.buffer.write(b"".join(lines))
    else:
        try:
            with open(out, "wb") as f:
                f.write(b"".join(lines))
        except OSError as exc:
            _fail(f"cannot write {out}: {exc.strerror}")
        typer.echo(f"observer: {len(rows)} checkpoints written to {out}", err=True)


@checkpoint_app.command("public-key")
def checkpoint_public_key(
    key: Annotated[
        str | None, typer.Option("--key", help="The key file (default: the checkpoint_key setting).")
    ] = None,
) -> None:
    """Print the checkpoint key's public half (PEM) and its key id: what ``observer verify
    --key`` needs on a host that must not hold the private key."""
    from observer.store.checkpoint import key_id, load_public_key, public_pem

    settings = _settings()
    path = Path(key) if key else settings.checkpoint_key_path
    try:
        public = load_public_key(path.read_bytes())
    except OSError as exc:
        _fail(f"cannot read the key {path}: {exc.strerror}")
    except ConfigError as exc:
        _fail(f"cannot use the key {path}: {exc}")
    typer.echo(public_pem(public), nl=False)
    typer.echo(f"observer: key id {key_id(public)}", err=True)


SignKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--key",
        help="The checkpoint signing key (default: the checkpoint_key setting, else DATA_DIR/checkpoint-key.pem);"
        " it must exist: holds and purges are signed with the key observer run made.",
    ),
]


def _by_checked(value: str | None) -> str | None:
    """``--by`` checked as soon as it is parsed, before any key, store or input is read
    (``_checked_actor``)."""
    return None if value is None else _checked_actor(value, "--by")


ByOpt = Annotated[
    str | None,
    typer.Option(
        "--by",
        help="Who runs this, as recorded (default: the OS user name): 1..200 printable characters.",
        callback=_by_checked,
    ),
]


@app.command()
def purge(
    db: DbOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count what is due; remove nothing.")] = False,
    retention_days: Annotated[
        int | None, typer.Option(help="Override the retention_days setting (days; under 183 needs the override).")
    ] = None,
    retention_override: Annotated[
        bool | None,
        typer.Option("--retention-override/--no-retention-override", help="Allow retention_days under 183."),
    ] = None,
    key: SignKeyOpt = None,
    trust: Annotated[
        list[str] | None,
        typer.Option(
            "--trust", help="Another writer's checkpoint key (public PEM) the chain is verified with (repeatable)."
        ),
    ] = None,
    by: ByOpt = None,
) -> None:
    """Remove the records started more than retention_days ago, except those under a legal hold.

    The chain up to the cutoff is verified first, with the signing key and the --trust keys (a
    break refuses the purge: exit 1); then, in one transaction, the due records are removed and
    a signed, chained purge event records what (so observer verify still passes). Exit 0 done;
    1 refused; 2 bad arguments, the store cannot be used, or it was busy (run it again)."""
    from datetime import datetime, timezone

    from observer.shape import rfc3339
    from observer.store.events import ConcurrentChange
    from observer.store.purge import PurgeBusy, PurgeRefused
    from observer.store.purge import purge as run_purge

    _logging()
    settings = _settings(
        {"retention_days": "--retention-days", "retention_override": "--retention-override"},
        db=db,
        retention_days=retention_days,
        retention_override=retention_override,
    )
    if settings.retention_days < MIN_RETENTION_DAYS:
        typer.echo(
            f"observer: warning: retention_days is {settings.retention_days}, under six months"
            " (retention_override is set)",
            err=True,
        )
    signer = None if dry_run else _signing_key(settings, key)
    trusted = _public_keys(settings, trust) if trust else []
    store = _open_read_only(settings.db)
    try:
        result = run_purge(
            store,
            signer,
            now=datetime.now(timezone.utc),
            retention_days=settings.retention_days,
            retention_override=settings.retention_override,
            actor=_actor(by),
            dry_run=dry_run,
            trusted=trusted,
        )
    except PurgeRefused as exc:
        typer.echo(f"observer: {exc}", err=True)
        raise typer.Exit(1) from None
    except (ConcurrentChange, PurgeBusy) as exc:
        _fail(str(exc))
    except _db_errors() as exc:
        _fail(f"cannot purge the audit store {_safe(settings.db)}: {_store_reason(exc)}")
    finally:
        store.dispose()
    verb = "would remove" if dry_run else "removed"
    typer.echo(
        f"observer: {verb} {result.total} records started before {rfc3339(result.cutoff)}"
        f" (retention {settings.retention_days} days): {sum(result.records.values())} chained in"
        f" {len(result.runs)} runs, {result.unchained} from before the chain; {result.held} kept under a legal hold;"
        f" {result.alerts} alerts" + ("" if result.event is None else f"; store event {result.event['seq']}")
    )
    for writer, n in sorted(result.records.items()):
        typer.echo(f"observer: writer {writer}: {n} records")
    if result.dropped:
        months = ", ".join(f"{y:04d}-{m:02d}" for y, m in result.dropped)
        typer.echo(f"observer: partitions dropped whole (PostgreSQL): {months}")


@hold_app.command("create")
def hold_create(
    reason: Annotated[str, typer.Option("--reason", help="Why (case, request, order): kept with the hold.")],
    since: TimeOpt = None,
    until: TimeOpt = None,
    user: Annotated[str | None, typer.Option("--user", help="Records of this end user (enduser.id).")] = None,
    host: Annotated[str | None, typer.Option("--host", help="Records sent to this host.")] = None,
    ids: Annotated[list[str] | None, typer.Option("--id", help="This record id (repeatable).")] = None,
    db: DbOpt = None,
    key: SignKeyOpt = None,
    by: ByOpt = None,
) -> None:
    """Put records under a legal hold (every condition given must match a record); prints the
    hold's id. Exit 2 for a bad scope or an unusable store."""
    from datetime import datetime, timezone

    from observer.store.holds import HoldError, Scope, count_held, create_hold

    _logging()
    settings = _settings(db=db)
    try:
        scope = Scope(
            since=_time_opt("--since", since),
            until=_time_opt("--until", until),
            end_user=user,
            host=host,
            exchange_ids=tuple(ids) if ids else None,
        )
    except HoldError as exc:
        _fail(str(exc))
    signer = _signing_key(settings, key)
    with _changing_store(settings) as store:
        row = create_hold(store.engine, signer, store.store_id(), scope, reason, _actor(by), datetime.now(timezone.utc))
        matching = count_held(store.engine, row)
    typer.echo(row["id"])
    typer.echo(f"observer: hold {row['id']} made: {_scope_text(row)}; {matching} records stored match it now", err=True)


@hold_app.command("release")
def hold_release(
    hold_id: Annotated[str, typer.Argument(help="The hold's id (observer hold list).")],
    reason: Annotated[str, typer.Option("--reason", help="Why it is released.")],
    db: DbOpt = None,
    key: SignKeyOpt = None,
    by: ByOpt = None,
) -> None:
    """Release a legal hold: its records are purged again once past retention."""
    from datetime import datetime, timezone

    from observer.store.holds import release_hold

    _logging()
    settings = _settings(db=db)
    signer = _signing_key(settings, key)
    with _changing_store(settings) as store:
        release_hold(store.engine, signer, store.store_id(), hold_id, reason, _actor(by), datetime.now(timezone.utc))
    typer.echo(f"observer: hold {hold_id} released")


@hold_app.command("list")
def hold_list(
    all_: Annotated[bool, typer.Option("--all", help="Released holds too.")] = False,
    db: DbOpt = None,
) -> None:
    """The legal holds (active ones unless --all), one per line: id, made (when, by whom), scope,
    reason, and when released."""
    from observer.shape import rfc3339
    from observer.store.holds import list_holds

    settings = _settings(db=db)
    with _reading_store(settings) as store:
        rows = list_holds(store.engine, include_released=all_)
    for row in rows:
        released = (
            ""
            if row["released_at"] is None
            else f"  released {rfc3339(row['released_at'])} by {row['released_by']}: {row['release_reason']}"
        )
        typer.echo(
            f"{row['id']}  {rfc3339(row['created_at'])} by {row['created_by']}  {_scope_text(row)}"
            f"  reason: {row['reason']}{released}"
        )
    if not rows:
        typer.echo("observer: no holds" if all_ else "observer: no active holds", err=True)


@app.command()
def conformance(
    group_by: Annotated[str, typer.Option("--group-by", help="host (endpoint and dialect), dialect or day.")] = "host",
    since: TimeOpt = None,
    until: Annotated[str | None, typer.Option(help="RFC 3339 time, exclusive (records started before it).")] = None,
    host: Annotated[str | None, typer.Option("--host", help="Records sent to this host.")] = None,
    dialect: Annotated[str | None, typer.Option("--dialect", help="Records of this dialect.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="The JSON body GET /v1/conformance returns.")] = False,
    db: DbOpt = None,
) -> None:
    """How the recorded streams kept their dialect's rules, per group: exchanges, completed
    (stream.end or the dialect's equivalent), usage reported, without violations, monotonic seq
    (dialects with a sequence number), violations per kind (observer.store.conformance). Exit 2
    for bad arguments or a store that cannot be read."""
    import json

    from observer.store.conformance import GROUP_BY, lines, report
    from observer.store.query import Filters

    if group_by not in GROUP_BY:
        _fail(f"--group-by must be one of {', '.join(GROUP_BY)}, got {group_by!r}")
    since_t, until_t = _time_opt("--since", since), _time_opt("--until", until)
    if since_t is not None and until_t is not None and since_t >= until_t:
        _fail("--since is not before --until")
    for flag, value in (("--host", host), ("--dialect", dialect)):
        if value is not None and "\x00" in value:
            _fail(f"{flag} must not hold a NUL")
    settings = _settings(db=db)
    with _reading_store(settings) as store:
        body = report(store.engine, group_by, Filters(since=since_t, until=until_t, host=host, dialect=dialect))
    if as_json:
        typer.echo(json.dumps(body, indent=2, ensure_ascii=False))
        return
    for line in lines(body):
        typer.echo(line)
    if not body["groups"]:
        typer.echo("observer: no exchanges", err=True)


@token_app.command("create")
def token_create(
    role: Annotated[str, typer.Option("--role", help="viewer, auditor, responder or admin.")],
    name: Annotated[str, typer.Option("--name", help="Whom it is for: the access log names calls by it.")],
    db: DbOpt = None,
    key: SignKeyOpt = None,
    by: ByOpt = None,
) -> None:
    """Make an API token; prints it once (the store keeps only its SHA-256). Exit 2 for an
    unknown role or a name in use."""
    from datetime import datetime, timezone

    from observer.store.tokens import create_token

    _logging()
    settings = _settings(db=db)
    signer = _signing_key(settings, key)
    with _changing_store(settings) as store:
        token, row = create_token(
            store.engine,
            signer,
            store.store_id(),
            name=name,
            role=role,
            actor=_actor(by),
            at=datetime.now(timezone.utc),
        )
    typer.echo(token)
    typer.echo(f"observer: token {row['name']!r} ({row['role']}, id {row['id']}) made; it is shown only now", err=True)


@token_app.command("list")
def token_list(
    all_: Annotated[bool, typer.Option("--all", help="Revoked tokens too.")] = False,
    db: DbOpt = None,
) -> None:
    """The API tokens (active ones unless --all): id, name, role, made, revoked. Never the tokens."""
    from observer.shape import rfc3339
    from observer.store.tokens import list_tokens

    settings = _settings(db=db)
    with _reading_store(settings) as store:
        rows = list_tokens(store.engine, include_revoked=all_)
    for row in rows:
        revoked = "" if row["revoked_at"] is None else f"  revoked {rfc3339(row['revoked_at'])} by {row['revoked_by']}"
        typer.echo(
            f"{row['id']}  {row['name']}  {row['role']}  made {rfc3339(row['created_at'])} by {row['created_by']}{revoked}"
        )
    if not rows:
        typer.echo("observer: no tokens" if all_ else "observer: no active tokens", err=True)


@token_app.command("revoke")
def token_revoke(
    ref: Annotated[str, typer.Argument(help="The token's id or name (observer token list).")],
    db: DbOpt = None,
    key: SignKeyOpt = None,
    by: ByOpt = None,
) -> None:
    """Revoke an API token: calls with it get 401 from now on (and are logged as revoked)."""
    from datetime import datetime, timezone

    from observer.store.tokens import revoke_token

    _logging()
    settings = _settings(db=db)
    signer = _signing_key(settings, key)
    with _changing_store(settings) as store:
        row = revoke_token(
            store.engine, signer, store.store_id(), ref=ref, actor=_actor(by), at=datetime.now(timezone.utc)
        )
    typer.echo(f"observer: token {row['name']!r} revoked")


def _fingerprint_of_input(settings: Settings, fingerprint: str | None) -> str:
    """``fingerprint`` as given, else the fingerprint of the credential read from standard input
    (a hidden prompt on a terminal; its first line otherwise): never from the command line, which
    other users of the host can read and shells keep. Exit 2 for an empty credential, or a key
    file that is missing (never made here: ``observer run`` makes it) or not a key
    (``observer.identity``)."""
    from observer.identity import FingerprintKey, credential_of_authorization

    if fingerprint is not None:
        return fingerprint
    if sys.stdin.isatty():
        secret = typer.prompt("API key (not shown)", hide_input=True, err=True)
    else:
        secret = sys.stdin.readline()
    secret = secret.strip()
    if secret.lower().startswith(("bearer ", "aws4-hmac-")):  # a whole Authorization value pasted
        secret = credential_of_authorization(secret) or ""
    if not secret:
        _fail("no API key on standard input (or give --fingerprint)")
    try:
        key = FingerprintKey.load_if_present(settings.fingerprint_key_path)
    except ConfigError as exc:
        _fail(str(exc))
    if key is None:  # a new secret would give fingerprints that match no record (trial finding)
        _fail(
            f"no fingerprint key {settings.fingerprint_key_path}: run this where observer run keeps its data"
            " (OBSERVER_DATA_DIR or data_dir in observer.toml), or set OBSERVER_FINGERPRINT_KEY, or give --fingerprint"
        )
    return key.fingerprint(secret)


FingerprintOpt = Annotated[
    str | None,
    typer.Option(
        "--fingerprint",
        help="The fingerprint (hmac-sha256:…, as records show it); without it the API key is read from standard input.",
    ),
]


@key_owner_app.command("add")
def key_owner_add(
    owner: Annotated[str, typer.Option("--owner", help="Who holds the key: a person or a service.")],
    team: Annotated[str | None, typer.Option("--team", help="Team or cost centre.")] = None,
    note: Annotated[str | None, typer.Option("--note", help="Free text (e.g. the key's name at the vendor).")] = None,
    fingerprint: FingerprintOpt = None,
    replace: Annotated[bool, typer.Option("--replace", help="Change the owner of a fingerprint that has one.")] = False,
    db: DbOpt = None,
    key: SignKeyOpt = None,
    by: ByOpt = None,
) -> None:
    """Say who holds an API key: its fingerprint (computed here from the key read from standard
    input with the proxy's fingerprint key file, setting fingerprint_key; the key itself is never
    stored) maps to OWNER and TEAM from now on, also for records stored before. Each change is an
    event of the store's chain. Exit 2 for a fingerprint that has an owner (without --replace),
    bad text or no key."""
    from datetime import datetime, timezone

    from observer.store.keyowners import set_owner

    _logging()
    settings = _settings(db=db)
    found = _fingerprint_of_input(settings, fingerprint)
    signer = _signing_key(settings, key)
    with _changing_store(settings) as store:
        row = set_owner(
            store.engine,
            signer,
            store.store_id(),
            fingerprint=found,
            owner=owner,
            team=team,
            note=note,
            actor=_actor(by),
            at=datetime.now(timezone.utc),
            replace=replace,
        )
    team_text = f" ({row['team']})" if row["team"] else ""
    typer.echo(f"observer: {row['fingerprint']} is {row['owner']}'s{team_text}")


@key_owner_app.command("list")
def key_owner_list(
    owner: Annotated[str | None, typer.Option("--owner", help="Only this owner's keys.")] = None,
    db: DbOpt = None,
) -> None:
    """The fingerprints with an owner: fingerprint, owner, team, note, who set it and when."""
    from observer.shape import rfc3339
    from observer.store.keyowners import list_owners

    settings = _settings(db=db)
    with _reading_store(settings) as store:
        rows = list_owners(store.engine, owner=owner)
    for row in rows:
        changed = "" if row["updated_at"] is None else f"  changed {rfc3339(row['updated_at'])} by {row['updated_by']}"
        typer.echo(
            f"{row['fingerprint']}  {row['owner']}  {row['team'] or '-'}  {row['note'] or '-'}"
            f"  set {rfc3339(row['created_at'])} by {row['created_by']}{changed}"
        )
    if not rows:
        typer.echo("observer: no key owners", err=True)


@key_owner_app.command("fingerprint")
def key_owner_fingerprint(db: DbOpt = None) -> None:
    """Print the fingerprint of the API key read from standard input (what records of requests
    sent with it hold in key_fingerprint), computed with the fingerprint key file. Nothing is stored."""
    settings = _settings(db=db)
    typer.echo(_fingerprint_of_input(settings, None))


@contextlib.contextmanager
def _reading_store(settings: Settings) -> Iterator[Any]:
    """The store for a reading command (existing, never made here), disposed after; a database
    error is a one-line exit 2."""
    store = _open_read_only(settings.db)
    try:
        yield store
    except _db_errors() as exc:
        _fail(f"cannot read the audit store {_safe(settings.db)}: {_store_reason(exc)}")
    finally:
        store.dispose()


@contextlib.contextmanager
def _changing_store(settings: Settings) -> Iterator[Any]:
    """The store for a hold command (existing, never made here), disposed after; a database
    error or a refusal (``HoldError``, ``ConcurrentChange``: ``ObserverError``s) is a one-line
    exit 2."""
    store = _open_read_only(settings.db)
    try:
        yield store
    except _db_errors() as exc:
        _fail(f"cannot write to the audit store {_safe(settings.db)}: {_store_reason(exc)}")
    except ObserverError as exc:
        _fail(str(exc))
    finally:
        store.dispose()


def _scope_text(row: dict[str, Any]) -> str:
    from observer.shape import rfc3339

    parts = []
    if row["since"] is not None:
        parts.append(f"since {rfc3339(row['since'])}")
    if row["until"] is not None:
        parts.append(f"until {rfc3339(row['until'])}")
    if row["end_user"] is not None:
        parts.append(f"user {row['end_user']!r}")
    if row["host"] is not None:
        parts.append(f"host {row['host']}")
    if row["exchange_ids"] is not None:
        parts.append(f"{len(row['exchange_ids'])} record ids")
    return ", ".join(parts)


def _signing_key(settings: Settings, given: str | None) -> Any:
    """The checkpoint key that signs a hold or purge: ``--key``, else the configured key file,
    which must exist (exit 2 otherwise: a new key would not be the one verify trusts)."""
    from observer.store.checkpoint import CheckpointKey

    path = Path(given) if given else settings.checkpoint_key_path
    if not path.is_file():
        _fail(
            f"no checkpoint key {path}: run this where observer run keeps its data (OBSERVER_DATA_DIR or data_dir in"
            " observer.toml) or give --key"
        )
    try:
        return CheckpointKey.load_or_create(path)
    except ConfigError as exc:
        _fail(str(exc))


def _actor(given: str | None) -> str:
    """Who runs the command, as the store's chained events record it (``actor``; a hold's or
    token's ``created_by``): ``--by``, else the OS user name (``getpass.getuser``: ``$LOGNAME``,
    ``$USER``, ``$LNAME``, ``$USERNAME``, then the password database), each checked by
    ``_checked_actor``; ``unknown`` when the system has no name for the user."""
    import getpass

    if given is not None:
        return _checked_actor(given, "--by")
    try:
        name = getpass.getuser()
    except (KeyError, OSError):
        return "unknown"
    return _checked_actor(name, "the OS user name (give --by instead)")


def _checked_actor(value: str, source: str) -> str:
    """``value`` without surrounding white space when it is 1..``keyowners.TEXT_MAX`` (200)
    printable characters, the bound and check of a key owner's name (``observer key-owner
    add``): ``str.isprintable``, so no control character (C0, DEL, C1: a terminal escape), no
    format character (a bidi override, a zero-width space: a name that prints as another) and
    no surrogate (an argument that was not UTF-8); what ``hold list`` and ``token list`` print
    then shows who it was. Exit 2 otherwise, naming ``source`` and the first offending
    character by its code point (never the character itself)."""
    from observer.store.keyowners import TEXT_MAX

    text = value.strip()
    if not text:
        _fail(f"{source} must not be blank")
    bad = next((c for c in text if not c.isprintable()), None)
    if bad is not None:
        _fail(f"{source}: 1..{TEXT_MAX} printable characters (U+{ord(bad):04X} is not printable)")
    if len(text) > TEXT_MAX:
        _fail(f"{source}: 1..{TEXT_MAX} printable characters (not {len(text)})")
    return text


def _store_reason(exc: BaseException) -> str:
    """``_reason``, with the fix when the schema is older than the command (a missing table)."""
    reason = _reason(exc)
    if "no such table" in reason or "no such column" in reason or "does not exist" in reason:
        reason += " (the store's schema is older than this command: run observer db upgrade)"
    return reason


ValuesOpt = list[str] | None


@export_app.callback(invoke_without_command=True)
def export_records(
    ctx: typer.Context,
    out: Annotated[str | None, typer.Option("--out", help="Folder to export into: new, or empty (made 0700).")] = None,
    file_format: Annotated[str, typer.Option("--format", help="jsonl, csv or parquet.")] = "jsonl",
    since: TimeOpt = None,
    until: Annotated[str | None, typer.Option(help="RFC 3339 time, exclusive (records started before it).")] = None,
    model: Annotated[ValuesOpt, typer.Option(help="Response or requested model (repeatable: any of them).")] = None,
    host: Annotated[ValuesOpt, typer.Option(help="Upstream host (repeatable).")] = None,
    user: Annotated[ValuesOpt, typer.Option(help="End user, request.end_user (repeatable).")] = None,
    dialect: Annotated[ValuesOpt, typer.Option(help="Wire dialect, e.g. openai.chat (repeatable).")] = None,
    outcome: Annotated[ValuesOpt, typer.Option(help="Outcome, e.g. error (repeatable).")] = None,
    writer: Annotated[
        ValuesOpt, typer.Option(help="Writer (journal) id (repeatable); leaves out unchained rows.")
    ] = None,
    key: Annotated[
        str | None,
        typer.Option("--key", help="Private key signing the manifest (default: the checkpoint_key setting)."),
    ] = None,
    jobs: Annotated[int, typer.Option("--jobs", help="Processes writing parts of the export in parallel (1-64).")] = 1,
    no_verify: Annotated[
        bool,
        typer.Option("--no-verify", help="Do not recompute the chain over the range first (faster; see the README)."),
    ] = False,
    db: DbOpt = None,
) -> None:
    """Export the records started in [--since, --until) that the filters take, with a manifest
    signed by the checkpoint key; `observer export verify DIR` checks an export offline.

    The chain over the range is recomputed first: a break refuses the export (exit 1). Exit 0:
    exported; 2: bad arguments, no key, a folder that is not empty, the store cannot be read,
    or writing failed (nothing is left in the folder then)."""
    if ctx.invoked_subcommand is not None:
        given = {"--out": out, "--since": since, "--until": until, "--key": key, "--db": db}
        given |= {"--model": model, "--host": host, "--user": user, "--dialect": dialect, "--outcome": outcome}
        given |= {"--writer": writer}
        named = [flag for flag, v in given.items() if v] + (["--format"] if file_format != "jsonl" else [])
        named += (["--jobs"] if jobs != 1 else []) + (["--no-verify"] if no_verify else [])
        if named:
            _fail(
                f"{', '.join(named)}: options of the export itself, not of `observer export {ctx.invoked_subcommand}`"
            )
        return
    from observer.errors import ConfigError
    from observer.records import Outcome
    from observer.store.checkpoint import CheckpointKey
    from observer.store.export import ExportError, ExportRefused, check_directory, export
    from observer.store.exportfiles import FORMATS, parquet_available
    from observer.store.reader import RecordFilter

    if not out:
        _fail("--out DIR is required: the folder to export into (new, or empty)")
    if file_format not in FORMATS:
        _fail(f"--format must be one of {', '.join(FORMATS)}, got {file_format!r}")
    if file_format == "parquet" and not parquet_available():
        _fail("--format parquet needs pyarrow: pip install 'llm-stream-observer[parquet]'")
    if not 1 <= jobs <= 64:
        _fail(f"--jobs must be 1-64, got {jobs}")
    since_t, until_t = _time_opt("--since", since), _time_opt("--until", until)
    if since_t is not None and until_t is not None and since_t >= until_t:
        _fail("--since is not before --until")
    _logging()
    settings = _settings(db=db)
    registry = load_registry(settings.dialect_registry).names if dialect else ()
    values = {}
    for flag, given, known in (
        ("--model", model, None),
        ("--host", host, None),
        ("--user", user, None),
        ("--dialect", dialect, registry),
        ("--outcome", outcome, tuple(o.value for o in Outcome)),
        ("--writer", writer, None),
    ):
        for v in given or ():
            if not v.strip():
                _fail(f"{flag} needs a value")
            if known is not None and v not in known:
                _fail(f"{flag} must be one of {', '.join(known)}, got {v!r}{did_you_mean(v, list(known))}")
        values[flag] = tuple(dict.fromkeys(given or ()))
    path = Path(out)
    try:
        check_directory(path)
        signer = CheckpointKey.load(Path(key) if key else settings.checkpoint_key_path)
    except ExportError as exc:
        _fail(str(exc))
    except ConfigError as exc:
        _fail(f"cannot sign the export: {exc} (observer run makes the checkpoint key; --key names another)")
    record_filter = RecordFilter(
        since_t,
        until_t,
        models=values["--model"],
        hosts=values["--host"],
        users=values["--user"],
        dialects=values["--dialect"],
        outcomes=values["--outcome"],
        writers=values["--writer"],
    )
    store = _open_read_only(settings.db)
    signal.signal(signal.SIGTERM, _interrupt)  # stopped like Ctrl-C: the folder is cleaned, the jobs ended
    try:
        with _Progress("exporting") as bar:
            manifest = export(
                store,
                record_filter,
                file_format,
                path,
                signer,
                jobs=jobs,
                total=bar.total,
                progress=bar.update,
                check=not no_verify,
            )
    except ExportRefused as exc:
        typer.echo(f"observer: {exc}", err=True)
        raise typer.Exit(1) from None
    except ExportError as exc:
        _fail(str(exc))
    except _db_errors() as exc:
        if isinstance(exc, OSError) and not isinstance(exc, ConnectionError):
            _fail(f"cannot write the export into {out}: {exc.strerror or exc}")
        _fail(f"cannot read the audit store {_safe(settings.db)}: {_store_reason(exc)}")
    finally:
        store.dispose()
    totals, files = manifest["totals"], manifest["files"]
    size_mb = sum(f["bytes"] for f in files) / 1e6
    typer.echo(
        f"observer: exported {totals['records']} records and {totals['gaps']} gaps to {out}"
        f" ({len(files)} files, {size_mb:.1f} MB); manifest signed by key {manifest['signer']['key_id']}"
    )


@export_app.command("verify")
def export_verify(
    directory: Annotated[str, typer.Argument(help="The export's folder.", show_default=False)],
    key: Annotated[
        list[str] | None,
        typer.Option(
            "--key",
            help="A trusted public key PEM (observer checkpoint public-key), or a key file: the exporter's, and each"
            " writer's for its checkpoint; repeatable (default: the manifest's own key, with a warning).",
        ),
    ] = None,
) -> None:
    """Check an export without the database: the manifest's signature, every file's bytes,
    SHA-256 and rows, no file added, the checkpoints, and for jsonl the hash chain.

    Exit 0: verified; 1: a check failed (each named: file, line, why); 2: bad arguments."""
    from observer.store.checkpoint import load_public_key
    from observer.store.manifest import verify_export

    path = Path(directory)
    if not path.is_dir():
        _fail(f"no export folder {directory}")
    keys = []
    for given in key or ():
        try:
            keys.append(load_public_key(Path(given).read_bytes()))
        except OSError as exc:
            _fail(f"cannot read the key {given}: {exc.strerror}")
        except ObserverError as exc:
            _fail(f"cannot use the key {given}: {exc}")
    with _Progress("verifying") as bar:
        try:
            report = verify_export(path, keys, total=bar.total, progress=bar.update)
        except OSError as exc:
            _fail(f"cannot read the export {directory}: {exc.strerror}")
    for warning in report.warnings:
        typer.echo(f"observer: warning: {warning}", err=True)
    if report.ok:
        typer.echo(f"observer: export verified: {report.summary()}")
        return
    for problem in report.problems:
        typer.echo(f"observer: FAILED: {problem}", err=True)
    typer.echo(f"observer: the export does not verify: {len(report.problems)} problems", err=True)
    raise typer.Exit(1)


@app.command()
def ingest(
    files: Annotated[
        list[str], typer.Argument(help="mitmproxy flow dumps (mitmdump -w FILE) or HAR files.", show_default=False)
    ],
    db: DbOpt = None,
    key: Annotated[
        str | None,
        typer.Option(
            "--key",
            help="The checkpoint key signing the run's chain (default: the checkpoint_key setting, else"
            " DATA_DIR/checkpoint-key.pem, made when missing as observer run makes it).",
        ),
    ] = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress bar and no per-flow warnings; the summary lines only.")
    ] = False,
) -> None:
    """Record the LLM exchanges of saved captures, offline, through the proxy's own capture path.

    Each flow runs through the audit addon's hooks as it ran live (the proxy settings decide
    what is recorded and how); each record says where it came from (provenance: file, SHA-256,
    flow id) and starts when its flow did. A flow ingested before (same flow id; for a HAR,
    same file and entry) is not stored again. An LLM exchange whose body the file does not hold
    (a body the proxy streamed) is not recorded: a warning names it. Prints one summary line per
    file: flows read, records stored, already stored, not LLM traffic, flows without a body.

    Exit 0: every file read and its records stored; 1: a file damaged part way, unreadable
    entries, or records the database refused (the rest was stored); 2: bad arguments, a file
    that is neither a flow dump nor a HAR file, or the store cannot be used."""
    from mitmproxy.exceptions import OptionsError

    from observer.identity import FingerprintKey
    from observer.ingest.captures import IngestError, NotACapture, open_capture
    from observer.ingest.replay import Replay
    from observer.ingest.run import ingest_file
    from observer.ingest.writer import IngestWriter
    from observer.store.checkpoint import CheckpointKey
    from observer.store.store import AuditStore

    _logging()
    settings = _settings(db=db)
    captures = []
    for name in files:  # every file checked (and hashed) before anything is stored
        try:
            captures.append(open_capture(name))
        except IngestError as exc:
            _fail(str(exc))
    _check_url(settings.db, writable=True)
    if settings.migrate:
        _upgrade(settings.db)
    try:
        signer = CheckpointKey.load_or_create(Path(key) if key else settings.checkpoint_key_path)
        fingerprints = FingerprintKey.load_if_present(settings.fingerprint_key_path)  # never a new secret
    except ConfigError as exc:
        _fail(str(exc))
    try:
        replay = Replay(settings, fingerprints)
    except OptionsError as exc:
        _fail(f"invalid settings: {exc}")
    store = AuditStore(settings.db)
    writer = IngestWriter(store, signer, checkpoint_every=settings.checkpoint_every)
    reports, not_captures = [], 0
    try:
        with _Progress("ingesting") as bar:
            if not quiet:
                bar.total(sum(c.size_bytes for c in captures))
            for capture in captures:
                try:
                    reports.append(ingest_file(capture, replay, writer, progress=bar.update))
                except NotACapture as exc:
                    not_captures += 1
                    typer.echo(f"observer: {exc}", err=True)
            writer.close()
    except _db_errors() as exc:
        _fail(f"cannot write to the audit store {_safe(settings.db)}: {_store_reason(exc)}")
    finally:
        replay.close()
        store.dispose()
    for report in reports:
        if not quiet:
            for line in [*report.warnings, *report.more()]:
                typer.echo(f"observer: warning: {line}", err=True)
        if report.damaged is not None:
            typer.echo(f"observer: {report.damaged}", err=True)
        typer.echo(f"observer: {report.summary()}")
    if len(reports) > 1:
        total = sum(r.stored for r in reports)
        typer.echo(f"observer: {total} records stored from {len(reports)} files")
    if writer.stored:
        typer.echo(f"observer: chained as writer {writer.writer_id} ({writer.checkpoints} checkpoints)")
    if not_captures:
        raise typer.Exit(2)
    if not all(r.ok for r in reports):
        raise typer.Exit(1)


def _public_keys(settings: Settings, given: list[str] | None) -> list[Any]:
    """The trusted keys: each ``--key`` file, or the configured key file if it exists (none:
    ``verify`` warns that checkpoints were not checked)."""
    from observer.store.checkpoint import load_public_key

    paths = [Path(g) for g in given] if given else [settings.checkpoint_key_path]
    keys = []
    for path in paths:
        try:
            keys.append(load_public_key(path.read_bytes()))
        except FileNotFoundError:
            if given:
                _fail(f"no key file {path}")
        except (OSError, ConfigError) as exc:
            _fail(f"cannot use the key {path}: {exc}")
    return keys


def _read_exported(path: str) -> list[dict[str, Any]]:
    from observer.jsontext import loads

    try:
        return [loads(line) for line in Path(path).read_bytes().splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        _fail(f"cannot read the checkpoints {path}: {exc}")


def _time_opt(flag: str, value: str | None) -> Any:
    from observer.shape import parse_rfc3339

    if value is None:
        return None
    try:
        return parse_rfc3339(value)
    except ValueError:
        _fail(f"{flag} must be an RFC 3339 time with an offset (e.g. 2026-06-01T00:00:00Z), got {value!r}")


def _db_errors() -> tuple[type[BaseException], ...]:
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

    return (ArgumentError, NoSuchModuleError, SQLAlchemyError, OSError)


def _reason(exc: BaseException) -> str:
    return str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]


def _settings(given_as: dict[str, str] | None = None, **overrides: object) -> Settings:
    """Settings from all sources, or a one-line error (exit 2) naming what is wrong and where."""
    try:
        return load_settings(given_as, **overrides)
    except ConfigError as exc:
        _fail(f"invalid settings: {exc}")


def _upgrade(url: str) -> None:
    """Migrates the store, or a one-line error (exit 2) when the URL is unusable or the
    database unreachable."""
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError

    from observer.store.migrate import upgrade

    _check_url(url, writable=True)
    try:
        upgrade(url)
    except (ArgumentError, NoSuchModuleError, OperationalError, ObserverError, OSError) as exc:
        _fail(f"cannot open the audit store {_safe(url)}: {_reason(exc)}")


def _open_store(settings: Settings, *, new_data_dir: bool = False) -> None:
    """``observer run``'s store, data folder, key and journal at start, in that order: the URL
    opened and the journal checked against the database (``check_journal_store``, before
    anything is written there); the data folder made (0700), the checkpoint key read or made,
    the journal's lock tried; then the migration (``migrate``). An unusable URL, a journal of
    another store, a bad key or a journal in use is a one-line error (exit 2); an unreachable
    database is a warning (the proxy records to the journal and the drainer stores it when the
    database answers), or with ``fail_closed`` an error."""
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError

    from observer.journal.journal import Journal
    from observer.store.checkpoint import CheckpointKey
    from observer.store.drain import UNAVAILABLE_ERRORS, check_journal_store
    from observer.store.migrate import upgrade
    from observer.store.store import AuditStore

    url = settings.db

    def unreachable(exc: BaseException) -> None:
        reason = _reason(exc)
        if not isinstance(exc, OperationalError | ConnectionError | TimeoutError) or url.startswith("sqlite"):
            _fail(f"cannot open the audit store {_safe(url)}: {reason}")
        if settings.fail_closed:
            _fail(f"cannot open the audit store {_safe(url)}: {reason} (fail_closed: not starting)")
        typer.echo(
            f"observer: WARNING: the audit store {_safe(url)} is unreachable ({reason}); recording to the journal"
            f" {settings.journal_path} until it answers (set fail_closed to refuse to start instead)",
            err=True,
        )

    reachable = True
    try:
        store = AuditStore(url)
        try:
            check_journal_store(settings.journal_path, store, url=_safe(url))  # before anything is written there
        finally:
            store.dispose()
    except (*UNAVAILABLE_ERRORS, OSError) as exc:
        reachable = False
        unreachable(exc)
    except (ArgumentError, NoSuchModuleError, ImportError, ObserverError) as exc:
        _fail(f"cannot open the audit store {_safe(url)}: {_reason(exc)}")
    try:  # the data folder holds the journal, the token and the keys: the owner's alone
        settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if new_data_dir:  # made by this run (mitmproxy makes its confdir inside it first, 0755)
            settings.data_dir.chmod(0o700)
    except OSError as exc:
        _fail(f"cannot make the data folder {settings.data_dir}: {exc.strerror}")
    try:  # refused now, in one line, rather than by the proxy once it runs
        CheckpointKey.load_or_create(settings.checkpoint_key_path)
        probe = Journal(settings.journal_path)
        probe.open()  # in use by another process: ConfigError
        probe.close()
    except ConfigError as exc:
        _fail(str(exc))
    if reachable and settings.migrate:
        try:
            upgrade(url)
        except (*UNAVAILABLE_ERRORS, OSError) as exc:
            unreachable(exc)


def _check_url(url: str, creatable: Path | None = None, *, writable: bool = False) -> None:
    """Exit 2 (one line) for a URL SQLAlchemy cannot parse or whose driver is not installed, or a
    SQLite file in a folder that does not exist (a mistyped path must not become a new, empty
    store somewhere: trial finding) other than ``creatable`` (``observer run``'s data folder,
    which it makes); with ``writable`` (a command that writes the store), also a SQLite file, or
    the folder it is to be made in, that this user cannot write (trial finding: a container's
    default store lay in root's WORKDIR, and ``observer config`` passed it). Nothing is
    connected or made."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        parsed = make_url(url)
        parsed.get_dialect().import_dbapi()
    except (ArgumentError, NoSuchModuleError, ImportError) as exc:
        _fail(f"cannot open the audit store {_safe(url)}: {_reason(exc)}")
    path = parsed.database
    if parsed.get_backend_name() == "sqlite" and path and path != ":memory:" and not path.startswith("file:"):
        folder = Path(path).parent
        if not folder.is_dir() and (creatable is None or folder.resolve() != creatable.resolve()):
            _fail(f"cannot open the audit store {_safe(url)}: the folder {folder} does not exist")
        if writable:
            target = Path(path) if Path(path).exists() else folder
            if target.exists() and not os.access(target, os.W_OK):
                what = "the file" if target == Path(path) else "the folder"
                _fail(f"cannot open the audit store {_safe(url)}: {what} {target} is not writable by this user")


def _open_read_only(url: str) -> Any:
    """The store for a command that only reads it (``verify``, ``checkpoint export``): exit 2
    for an unusable URL or a SQLite file that does not exist (never made empty here)."""
    from sqlalchemy.engine import make_url

    from observer.store.store import AuditStore

    _check_url(url)
    parsed = make_url(url)
    path = parsed.database
    if parsed.get_backend_name() == "sqlite" and path and path != ":memory:" and not Path(path).exists():
        _fail(f"cannot open the audit store {_safe(url)}: no such file {path}")
    return AuditStore(url)


def _interrupt(signum: int, frame: object) -> None:
    """A SIGTERM handler: stop as Ctrl-C does (``KeyboardInterrupt``), so cleanups run."""
    raise KeyboardInterrupt


class _Progress(contextlib.ExitStack):
    """A progress bar on stderr for a long command: ``total(n)`` (called once by the work)
    shows it, ``update(n)`` advances it; closed with the ``with`` block."""

    def __init__(self, label: str) -> None:
        super().__init__()
        self._label = label
        self._bar: Any = None

    def __enter__(self) -> _Progress:
        super().__enter__()
        return self

    def total(self, n: int) -> None:
        self._bar = self.enter_context(typer.progressbar(length=n, label=self._label, file=sys.stderr))

    def update(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(n)


def _fail(message: str) -> NoReturn:
    typer.echo(f"observer: {message}", err=True)
    raise typer.Exit(2)


def _safe(url: str) -> str:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<unparseable URL>"


if __name__ == "__main__":
    app()
