"""The ``observer`` command (typer): ``run`` (proxy + API), ``api``, ``db upgrade``.

Every command that touches the store takes ``--db URL`` (default: the config file or env
``OBSERVER_DB``, else ``sqlite:///observer.db``).
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import tomllib
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from pydantic import ValidationError
from pydantic_settings import SettingsError

from observer.config import Settings, load_settings
from observer.errors import ObserverError

app = typer.Typer(help="Passive observer and compliance logger for LLM inference streams.", no_args_is_help=True)
db_app = typer.Typer(help="Audit store maintenance.", no_args_is_help=True)
app.add_typer(db_app, name="db")

DbOpt = Annotated[
    str | None, typer.Option("--db", help="SQLAlchemy URL of the audit store (env OBSERVER_DB; default sqlite:///observer.db).")
]


def _logging() -> None:
    """Log to stderr for the commands that have no mitmproxy termlog (``run`` logs through it)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@app.command()
def run(
    proxy_port: Annotated[int | None, typer.Option(help="Forward proxy port (default 8080).")] = None,
    api_port: Annotated[int | None, typer.Option(help="Query API port (default 8081).")] = None,
    db: DbOpt = None,
    confdir: Annotated[Path | None, typer.Option(help="mitmproxy confdir holding the CA (default DATA_DIR/mitmproxy).")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Folder for the API token and CA (default .observer).")] = None,
    proxy_host: Annotated[str | None, typer.Option(help="Proxy bind address (default 127.0.0.1).")] = None,
    api_host: Annotated[str | None, typer.Option(help="API bind address (default 127.0.0.1).")] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Extra mitmproxy option NAME=VALUE (repeatable).")
    ] = None,
) -> None:
    """Run the forward proxy with the audit addon and the query API, until Ctrl-C."""
    from observer.runner import check_port_free, run_proxy, start_api_process, stop_process
    from observer.token import resolve_token

    _check_sets(set_ or [])
    settings = _settings(
        db=db, proxy_port=proxy_port, api_port=api_port, confdir=confdir, data_dir=data_dir,
        proxy_host=proxy_host, api_host=api_host,
    )  # fmt: skip
    try:
        check_port_free(settings.proxy_host, settings.proxy_port, "--proxy-port")
        check_port_free(settings.api_host, settings.api_port, "--api-port")
    except ObserverError as exc:
        _fail(str(exc))
    _upgrade(settings.db)
    started: list[subprocess.Popen] = []

    def start_api() -> subprocess.Popen:
        """Called once the proxy accepted every option: the token, the API, the banner."""
        started.append(start_api_process(settings, resolve_token(settings)))
        ca = settings.mitmproxy_confdir / "mitmproxy-ca-cert.pem"
        typer.echo(
            f"observer: proxy http://{settings.proxy_host}:{settings.proxy_port} "
            f"(clients trust {ca}), API http://{settings.api_host}:{settings.api_port}/docs, "
            f"store {_safe(settings.db)}"
        )
        return started[0]

    from mitmproxy.exceptions import OptionsError

    try:
        code = asyncio.run(run_proxy(settings, list(set_ or []), start_api))
    except OptionsError as exc:
        _fail(f"invalid --set option: {exc}")
    finally:
        for proc in started:
            stop_process(proc)
    raise typer.Exit(code)


@app.command()
def api(
    host: Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 8081).")] = None,
    db: DbOpt = None,
) -> None:
    """Serve the query API only (token from env OBSERVER_API_TOKEN or the data folder)."""
    import uvicorn

    from observer.api.app import create_app
    from observer.store.store import AuditStore
    from observer.token import resolve_token

    _logging()
    settings = _settings(db=db, api_host=host, api_port=port)
    token = resolve_token(settings)
    uvicorn.run(
        create_app(AuditStore(settings.db), token), host=settings.api_host, port=settings.api_port, log_level="warning"
    )


@db_app.command("upgrade")
def db_upgrade(db: DbOpt = None) -> None:
    """Create or migrate the audit store schema to the newest version (alembic upgrade head)."""
    _logging()
    settings = _settings(db=db)
    _upgrade(settings.db)
    typer.echo(f"observer: store {_safe(settings.db)} is at the newest schema")


def _settings(**overrides: object) -> Settings:
    """Settings from all sources, or a one-line error (exit 2) naming what is wrong."""
    try:
        return load_settings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors())
        _fail(f"invalid settings ({problems}); see observer.toml / OBSERVER_* variables")
    except (tomllib.TOMLDecodeError, SettingsError) as exc:
        _fail(f"cannot read the config file: {exc}")


def _upgrade(url: str) -> None:
    """Migrates the store, or a one-line error (exit 2) when the URL is unusable or the
    database unreachable."""
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError

    from observer.store.migrate import upgrade

    try:
        upgrade(url)
    except (ArgumentError, NoSuchModuleError, OperationalError, ObserverError, OSError) as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        _fail(f"cannot open the audit store {_safe(url)}: {reason}")


# Options ``observer run`` sets itself from its settings, so that the proxy and the API share one
# store: a ``--set`` of them would send records where the API never looks (trial finding).
_MANAGED_OPTIONS = {
    "observer_db": "use --db (or OBSERVER_DB): the proxy and the API share the store",
    "observer_spool": "set OBSERVER_SPOOL_PATH (default DATA_DIR/spool.jsonl)",
    "observer_migrate": "observer run migrates the store itself before starting",
}


def _check_sets(sets: list[str]) -> None:
    """Exits 2 with one line if a ``--set`` names an option ``observer run`` manages."""
    for item in sets:
        name = item.split("=", 1)[0].strip()
        if name in _MANAGED_OPTIONS:
            _fail(f"--set {name} is not accepted by observer run: {_MANAGED_OPTIONS[name]}")


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
