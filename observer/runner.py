"""Process wiring of ``observer run``: the query API in a child process (uvicorn), the forward
proxy (embedded mitmproxy ``DumpMaster`` with the audit addon) in this one.

DESIGN "Queries never share the proxy's loop": mitmproxy runs one asyncio loop on one thread,
so the API gets its own process; ``run`` supervises it: an API that dies is started again (with
backoff, logged) while the proxy keeps serving, so staff keep reaching their LLMs. SIGTERM or
SIGINT drains: the proxy stops accepting connections and lets open streams finish for up to
``drain_timeout_s``; what is still open then is recorded as ``interrupted`` (a second signal
stops at once).
This module is the composition root: it is the one place that builds the proxy with the addon.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from observer.config import SPECS, Settings, proxy_option_values
from observer.errors import ConfigError
from observer.lifetime import death_signal_setter

if TYPE_CHECKING:
    from mitmproxy.tools.dump import DumpMaster

log = logging.getLogger("observer.run")
API_CHECK_INTERVAL_S = 0.5
API_STOP_TIMEOUT_S = 10.0
API_RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)  # waits before the 1st, 2nd, ... restart
API_HEALTHY_AFTER_S = 60.0  # an API that ran this long resets the backoff
DRAIN_POLL_S = 0.1


def check_port_free(host: str, port: int, option: str) -> None:
    """Raises ``ConfigError`` naming ``option`` when ``host:port`` cannot be bound (in use,
    not a local address), before anything starts. Port 0 (any free port) is not checked."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        # As mitmproxy and uvicorn bind: sockets of a just-stopped run in TIME_WAIT do not count.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port} ({exc.strerror}); choose another with {option}") from exc


def start_api_process(settings: Settings, token: str) -> subprocess.Popen:
    """Starts ``observer api`` as a child process with the token, the checkpoint key, the data
    folder and the retention policy in its environment. It gets
    SIGTERM from the kernel if this process dies (``observer.lifetime``; trial finding: after a
    ``kill -9`` of ``observer run`` the API kept its port and the next start failed)."""
    # What the API needs of this run's settings, however they were given (flags included): the
    # same checkpoint key (it signs the access log; another would not be trusted by verify),
    # data folder (export jobs) and retention policy (GET /v1/retention, purges).
    env = dict(
        os.environ,
        OBSERVER_API_TOKEN=token,
        OBSERVER_DATA_DIR=str(settings.data_dir),
        OBSERVER_CHECKPOINT_KEY=str(settings.checkpoint_key_path),
        OBSERVER_METRICS_DIR=str(settings.metrics_path),
        OBSERVER_API_TLS_CERT=str(settings.api_tls_cert or ""),
        OBSERVER_API_TLS_KEY=str(settings.api_tls_key or ""),
        OBSERVER_RETENTION_DAYS=str(settings.retention_days),
        OBSERVER_RETENTION_OVERRIDE="true" if settings.retention_override else "false",
    )
    cmd = [
        sys.executable,
        "-m",
        "observer.cli",
        "api",
        "--host",
        settings.api_host,
        "--port",
        str(settings.api_port),
        "--db",
        settings.db,
    ]
    return subprocess.Popen(cmd, env=env, preexec_fn=death_signal_setter(signal.SIGTERM))


def stop_process(proc: subprocess.Popen, timeout_s: float = API_STOP_TIMEOUT_S) -> None:
    """SIGTERM, then SIGKILL after ``timeout_s`` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout_s)


def embedded_proxy_options(settings: Settings) -> dict[str, object]:
    """The observer's mitmproxy options on ``observer run``'s proxy: every proxy setting, with the
    journal and the checkpoint key resolved into the data folder (``Settings.journal_path``,
    ``Settings.checkpoint_key_path``), and the API's address added to the upstreams the proxy
    never connects clients to (``capture.guard``)."""
    protected = [p for p in (settings.protected_upstreams, _api_address(settings)) if p]
    return proxy_option_values(settings) | {
        SPECS["journal_dir"].option: str(settings.journal_path),
        SPECS["checkpoint_key"].option: str(settings.checkpoint_key_path),
        SPECS["fingerprint_key"].option: str(settings.fingerprint_key_path),
        SPECS["metrics_dir"].option: str(settings.metrics_path),
        SPECS["protected_upstreams"].option: ",".join(protected),
    }


def _api_address(settings: Settings) -> str | None:
    """``host:port`` of the API (``[v6]:port``), or ``None`` when its port is chosen at start."""
    if settings.api_port == 0:
        return None
    host = settings.api_host
    return f"[{host}]:{settings.api_port}" if ":" in host else f"{host}:{settings.api_port}"


def proxy_master(settings: Settings, mitm_sets: list[str]) -> DumpMaster:
    """The embedded mitmproxy with the audit addon and every option applied (needs a running
    event loop). ``mitm_sets``: plain mitmproxy options as ``name=value``; a malformed one raises
    ``mitmproxy.exceptions.OptionsError``."""
    from mitmproxy import options
    from mitmproxy.tools.dump import DumpMaster

    from observer.capture.hooks import LLMAudit

    confdir = settings.mitmproxy_confdir
    confdir.mkdir(parents=True, exist_ok=True)
    opts = options.Options(listen_host=settings.proxy_host, listen_port=settings.proxy_port, confdir=str(confdir))
    master = DumpMaster(opts, with_termlog=True, with_dumper=False)
    master.addons.add(LLMAudit())
    opts.update(**embedded_proxy_options(settings))
    if mitm_sets:
        opts.set(*mitm_sets)
    return master


async def run_proxy(
    settings: Settings, mitm_sets: list[str], start_api: Callable[[], subprocess.Popen | None] | None = None
) -> int:
    """Runs the forward proxy until SIGINT/SIGTERM (exit code 0, after the drain). ``mitm_sets``
    are extra mitmproxy options as ``name=value`` strings; a malformed or out-of-range one raises
    ``mitmproxy.exceptions.OptionsError`` before ``start_api`` is called (so nothing is started
    and no banner is printed for a bad ``--set``: trial finding). ``start_api`` starts the query
    API and returns its process, which is watched: when it exits it is started again (after
    ``API_RESTART_BACKOFF_S``, logged; the caller stops every process it started)."""
    # The root logger stays at WARNING outside mitmproxy's own main(); the observer's start-up
    # and shutdown counts are INFO lines and must reach the terminal (mitmproxy's termlog).
    logging.getLogger("observer").setLevel(logging.INFO)
    master = proxy_master(settings, mitm_sets)
    api = start_api() if start_api is not None else None
    exit_code = 0

    stopping = False
    draining: asyncio.Task | None = None

    def stop(*_: object) -> None:
        nonlocal stopping, draining
        if draining is None:
            draining = asyncio.create_task(drain(master, settings.drain_timeout_s))
            return
        stopping = True  # a second signal: now
        master.shutdown()

    async def drain(master: DumpMaster, timeout_s: float) -> None:
        nonlocal stopping
        await drain_proxy(master, timeout_s)
        stopping = True
        master.shutdown()

    loop = asyncio.get_running_loop()
    default_handler = loop.get_exception_handler()

    def on_loop_exception(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        # mitmproxy's connection tasks are cancelled when it shuts down with clients still
        # connected; asyncio then reports each CancelledError. That is the shutdown, not a fault.
        if stopping and isinstance(context.get("exception"), asyncio.CancelledError):
            return
        if default_handler is not None:
            default_handler(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(on_loop_exception)
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)

    async def watch_api() -> None:
        nonlocal api
        restarts = 0
        started = loop.time()
        while api is not None and start_api is not None:
            await asyncio.sleep(API_CHECK_INTERVAL_S)
            if api.poll() is None or draining is not None:
                continue
            if loop.time() - started >= API_HEALTHY_AFTER_S:
                restarts = 0
            wait_s = API_RESTART_BACKOFF_S[min(restarts, len(API_RESTART_BACKOFF_S) - 1)]
            log.error(
                "observer: the API process exited with code %s; the proxy keeps recording; restarting the API"
                " in %.0f s (restart %d)",
                api.returncode,
                wait_s,
                restarts + 1,
            )
            await asyncio.sleep(wait_s)
            if draining is not None:
                return
            restarts += 1
            try:
                api = start_api()
            except Exception:
                log.error("observer: the API could not be started again", exc_info=True)
            started = loop.time()

    watcher = asyncio.create_task(watch_api())
    try:
        await master.run()
    finally:
        watcher.cancel()
        if draining is not None:
            draining.cancel()
    return exit_code


async def drain_proxy(master: DumpMaster, timeout_s: float) -> None:
    """Stops accepting connections (mitmproxy's ``server`` option off closes the listening
    sockets; open connections go on) and waits until the audit addon has no open exchange, or
    ``timeout_s`` seconds. Logs what it waits for and what is left."""
    from observer.capture.hooks import LLMAudit

    addon = next((a for a in master.addons.chain if isinstance(a, LLMAudit)), None)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    try:
        master.options.update(server=False)
    except Exception:
        log.error("observer: could not stop accepting connections", exc_info=True)
    open_now = addon.open_exchanges if addon is not None else 0
    if open_now and timeout_s > 0:
        log.info(
            "observer: stopping: %d open exchanges may finish for up to %.0f s (signal again to stop now)",
            open_now,
            timeout_s,
        )
    while addon is not None and addon.open_exchanges and loop.time() < deadline:
        await asyncio.sleep(DRAIN_POLL_S)
    left = addon.open_exchanges if addon is not None else 0
    if left:
        log.info("observer: stopping: %d exchanges still open are recorded as interrupted", left)
