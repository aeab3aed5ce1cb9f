"""A throw-away PostgreSQL server of a test's own (``initdb`` into a temporary folder, trust auth,
127.0.0.1 on a free port), which the test can stop and start again at will.

The binaries (``initdb``, ``pg_ctl``) are looked up on ``PATH``, then under
``/usr/lib/postgresql/*/bin`` (Debian's layout; the newest version wins). ``initdb`` and
``postgres`` refuse to run as root: as root they run as the ``postgres`` user (else ``nobody``)
through ``runuser -u USER --`` (util-linux), else ``su USER -s /bin/sh -c``; the data folder is
made theirs. Not finding the binaries raises ``PgUnavailable`` (the fault tests fail on it: they
are not optional).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.e2e.harness import free_port


class PgUnavailable(RuntimeError):
    pass


def pg_bindir() -> Path:
    """The folder holding ``initdb`` and ``pg_ctl``."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(os.path.realpath(found)).parent
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: [int(x) if x.isdigit() else 0 for x in Path(p).parts[-3].split(".")],
    )
    for initdb in reversed(candidates):
        d = Path(initdb).parent
        if (d / "pg_ctl").exists() and (d / "postgres").exists():
            return d
    raise PgUnavailable("no PostgreSQL server binaries (initdb, pg_ctl) on PATH or under /usr/lib/postgresql/*/bin")


def _run_as_user() -> str | None:
    """The unprivileged user to run the server as when we are root (None: run as ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise PgUnavailable("running as root and there is neither a 'postgres' nor a 'nobody' user to run initdb as")


class LocalPostgres:
    """``init()`` (initdb), ``start()``, ``stop()`` (``pg_ctl stop -m fast``), ``cleanup()``;
    ``url(dbname)`` is a SQLAlchemy psycopg URL; ``create_database(name)``."""

    def __init__(self, superuser: str = "postgres"):
        self.bindir = pg_bindir()
        self.user = _run_as_user()
        self.superuser = superuser
        self.root = Path(tempfile.mkdtemp(prefix="e2e-pg-"))
        self.data = self.root / "data"
        self.sockdir = self.root / "sock"
        self.logfile = self.root / "server.log"
        self.port = free_port()
        self.sockdir.mkdir()
        if self.user is not None:
            pw = pwd.getpwnam(self.user)
            for p in (self.root, self.sockdir):
                os.chown(p, pw.pw_uid, pw.pw_gid)

    # ----- running the binaries -----
    def _argv(self, argv: list[str]) -> list[str]:
        if self.user is None:
            return argv
        runuser = shutil.which("runuser")
        if runuser:
            return [runuser, "-u", self.user, "--", *argv]
        su = shutil.which("su")
        if su is None:
            raise PgUnavailable("running as root without runuser or su to drop privileges for initdb")
        return [su, self.user, "-s", "/bin/sh", "-c", shlex.join(argv)]

    def _run(self, argv: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess[bytes]:
        p = subprocess.run(
            self._argv(argv), capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL, cwd=str(self.root)
        )
        if p.returncode != 0:
            out = (p.stdout + p.stderr).decode("utf-8", "replace")
            raise RuntimeError(f"{' '.join(argv)} failed ({p.returncode}):\n{out}\n--- server log:\n{self.log_tail()}")
        return p

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.logfile.read_text("utf-8", "replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"

    # ----- life cycle -----
    def init(self) -> LocalPostgres:
        self._run(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(self.data),
                "-A",
                "trust",
                "-U",
                self.superuser,
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ]
        )
        return self

    def start(self) -> None:
        opts = (
            f"-p {self.port} -k {self.sockdir} -c listen_addresses=127.0.0.1"
            " -c fsync=off -c full_page_writes=off -c synchronous_commit=off"
        )
        self._run(
            [
                str(self.bindir / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.logfile),
                "-w",
                "-t",
                "30",
                "-o",
                opts,
                "start",
            ]
        )

    def stop(self, mode: str = "fast") -> None:
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "30", "stop"])

    def running(self) -> bool:
        p = subprocess.run(
            self._argv([str(self.bindir / "pg_ctl"), "-D", str(self.data), "status"]),
            capture_output=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
            cwd=str(self.root),
        )
        return p.returncode == 0

    def cleanup(self) -> None:
        """Stops the server if it runs (immediate) and removes its folder."""
        with contextlib.suppress(Exception):
            if self.data.exists() and self.running():
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    # ----- clients -----
    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql+psycopg://{self.superuser}@127.0.0.1:{self.port}/{dbname}"

    def connect(self, dbname: str = "postgres", autocommit: bool = True):  # -> psycopg.Connection
        import psycopg

        return psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user=self.superuser,
            dbname=dbname,
            autocommit=autocommit,
            connect_timeout=5,
        )

    def create_database(self, name: str) -> str:
        with self.connect() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)
