"""Fault tests with real processes: ``observer run`` (proxy + API + worker) between a client and
the local scripted upstream (``tests/e2e/upstream.py``), with the faults made for real:

- (a) the PostgreSQL server (an instance of the test's own, ``tests/e2e/pg_local.py``) is stopped
  while 200 streams go through and started again: every exchange is stored exactly once, seqs
  1..200 without a hole, no gap;
- (b) ``kill -9`` of the proxy process with streams in flight and records journaled but not yet
  stored (the SQLite store is write-locked by the test meanwhile): the next start on the same
  data folder stores each completed exchange once (``completed``) and each in-flight one once
  (``interrupted``, request facts, the text that had arrived as a prefix, "recovered from its
  journal"); the same for a WebSocket turn (a real SignalR client, ``tests/e2e/chathub.py``'s
  ChatHub, ``signalr.copilot``) open at the kill: the turn before it stored once (``completed``),
  the open one rebuilt from its journaled events (``interrupted``, its prompt, the text that had
  arrived);
- (c) the journal's bound (``spool_max_bytes`` = 1 MiB) reached with no database to drain to:
  the segments stay within the bound plus the entry that crossed it (and the open exchange
  carried into a new segment), the loss is one ``spool_full`` gap whose ``dropped`` + the stored
  records = the streams sent; with ``fail_closed`` new LLM requests get 503
  (``recording_unavailable``, never forwarded) while other traffic passes, until the database is
  back, for requests with a body too (a trial found those crashed the connection: fixed);
- (d) the journal's filesystem fills up (a 2 MiB tmpfs; as a fallback ``RLIMIT_FSIZE``,
  ``E2E_FAULTS_DISK=rlimit`` forces it): the proxy keeps forwarding every stream in full, and
  after a restart with room the loss is a gap (``disk_error``/``spool_full``) whose ``dropped`` +
  the stored records = the streams sent: with space back while running, after an idle stop, or
  right after the failure (a trial found the gap lost there: fixed, close() tries once more);
- (e) the start-up and shutdown log lines carry the counts (checked in (a), (b), (c), (d)).

Every test's expectations are computed here: the tids sent, the texts the upstream script sends
(``script_long``), the counts of streams. Each ``observer run`` gets its own data folder (the
harness's default, ``.observer`` under the repository, would be shared).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import (
    LLM_CONTENT_TYPE,
    ObserverProcess,
    StreamResult,
    free_port,
    stream_request,
    wait_until,
)
from tests.e2e.pg_local import LocalPostgres
from tests.e2e.upstream import COMPLETE_TEXT, JSON_ANSWER, UpstreamServer, expected_body, script_long

pytestmark = [pytest.mark.e2e]

REQUEST_MODEL = "fault-test-model"
MESSAGES = [{"role": "user", "content": "What is the weather in Vienna?"}]
RECOVERED_MARK = "recovered from its journal"
MiB = 1 << 20

STARTUP_RE = re.compile(
    r"observer: journal (?P<dir>\S+): (?P<waiting>\d+) records waiting for the store, "
    r"(?P<recovered>\d+) open exchanges recovered as records"
)
SHUTDOWN_RE = re.compile(
    r"observer: shutdown: (?P<journaled>\d+) records journaled, (?P<stored>\d+) stored \((?P<gaps>\d+) gaps\), "
    r"(?P<dropped>\d+) dropped, (?P<waiting>\d+) waiting in the journal for the next start"
)


# --------------------------------------------------------------------------------------------
# helpers


class FaultObserver(ObserverProcess):
    """``observer run`` with its own workdir (log, confdir) under ``root/run`` and the given data
    folder (journal, token) and store; optionally ``journal_dir`` and a file-size limit
    (``RLIMIT_FSIZE``, set in the process before it execs ``observer``)."""

    def __init__(
        self,
        root: Path,
        run: str,
        data_dir: Path,
        db_url: str,
        sets: dict[str, str] | None = None,
        journal_dir: Path | None = None,
        fsize_limit: int | None = None,
    ):
        extra = ["--data-dir", str(data_dir)]
        if journal_dir is not None:
            extra += ["--journal-dir", str(journal_dir)]
        super().__init__(workdir=str(root / run), db_url=db_url, sets=sets, extra_args=extra)
        self.fsize_limit = fsize_limit

    def build_argv(self) -> list[str]:
        argv = super().build_argv()
        if self.fsize_limit is None:
            return argv
        shim = (
            "import os, resource, signal, sys; "
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            f"resource.setrlimit(resource.RLIMIT_FSIZE, ({self.fsize_limit}, resource.RLIM_INFINITY)); "
            "os.execv(sys.argv[1], sys.argv[1:])"
        )
        return [sys.executable, "-c", shim, *argv]

    def log_text(self) -> str:
        try:
            return self.log_path.read_text("utf-8", "replace")
        except OSError:
            return ""

    def startup_counts(self) -> dict[str, Any]:
        m = wait_until(lambda: STARTUP_RE.search(self.log_text()), 10, what="the journal start-up log line")
        return {"dir": m["dir"], "waiting": int(m["waiting"]), "recovered": int(m["recovered"])}

    def shutdown_counts(self) -> dict[str, int]:
        m = SHUTDOWN_RE.search(self.log_text())
        assert m, f"no shutdown line in the log:\n{self.tail(30)}"
        return {k: int(v) for k, v in m.groupdict().items()}


@contextlib.contextmanager
def running(obs: FaultObserver, timeout: float = 45.0) -> Iterator[FaultObserver]:
    obs.start(timeout=timeout)
    try:
        yield obs
    finally:
        obs.stop(timeout=20)


def llm_body(tid: str) -> bytes:
    return json.dumps(
        {
            "version": "1.0",
            "stream": True,
            "model": REQUEST_MODEL,
            "messages": MESSAGES,
            "metadata": {"session_id": tid},
        }
    ).encode()


def llm_stream(
    obs: ObserverProcess,
    upstream: UpstreamServer,
    tid: str,
    query: str = "script=complete_example&gap_ms=10",
    timeout: float = 20.0,
    on_chunk: Callable[[StreamResult], None] | None = None,
) -> StreamResult:
    def stop_when(res: StreamResult) -> bool:
        if on_chunk is not None:
            on_chunk(res)
        return False

    return stream_request(
        upstream.url(f"/v1/stream?{query}&tid={tid}"),
        proxy=obs.proxy_url,
        ca_path=obs.ca_path,
        content=llm_body(tid),
        headers={"Content-Type": LLM_CONTENT_TYPE},
        timeout=timeout,
        stop_when=stop_when,
    )


def sse_text(body: bytes) -> str:
    """The text of the complete ``content.delta`` events in an SSE body (a torn last event is
    left out: it was never dispatched)."""
    out = []
    for block in body.split(b"\n\n")[:-1]:
        for line in block.split(b"\n"):
            if line.startswith(b"data: "):
                ev = json.loads(line[6:])
                if ev.get("type") == "content.delta":
                    out.append(ev["delta"]["text"])
    return "".join(out)


def long_text(n: int) -> str:
    return "".join(e["delta"]["text"] for e in script_long(n) if e["type"] == "content.delta")


def as_json(v: Any) -> Any:
    return json.loads(v) if isinstance(v, (str, bytes)) else v


def new_tids(prefix: str, n: int) -> list[str]:
    run = uuid.uuid4().hex[:8]
    return [f"{prefix}-{run}-{i:03d}" for i in range(n)]


def segment_bytes(journal: Path) -> int:
    total = 0
    for p in journal.glob("seg-*.log"):
        with contextlib.suppress(FileNotFoundError):  # the drainer may delete one meanwhile
            total += p.stat().st_size
    return total


def settled_segment_bytes(journal: Path, quiet_s: float = 0.15, timeout: float = 3.0) -> int:
    """``segment_bytes`` once it has not changed for ``quiet_s`` (the record of a stream the
    client just finished is journaled a few ms later)."""
    deadline = time.monotonic() + timeout
    last = segment_bytes(journal)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = segment_bytes(journal)
        if now == last:
            break
        last = now
    return last


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def _proc_info(d: Path) -> tuple[str, int, int, str] | None:
    """(state, ppid, pgrp, command line) of /proc/PID, None when it is gone."""
    try:
        stat = (d / "stat").read_text()
        rest = stat[stat.rfind(")") + 2 :].split()
        cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        return rest[0], int(rest[1]), int(rest[2]), cmd
    except (OSError, ValueError, IndexError):
        return None


def children_of(pid: int) -> dict[int, str]:
    """Live (not zombie) child processes of ``pid``: pid -> command line."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            info = _proc_info(d)
            if info is not None and info[1] == pid and info[0] != "Z":
                out[int(d.name)] = info[3]
    return out


def still_alive(procs: dict[int, str]) -> dict[int, str]:
    """Those of ``procs`` (pid -> command line) that still run (same pid, same command line)."""
    out = {}
    for pid, cmd in procs.items():
        info = _proc_info(Path(f"/proc/{pid}"))
        if info is not None and info[0] != "Z" and info[3] == cmd:
            out[pid] = cmd
    return out


def sqlite_rows(db: Path, sql: str) -> list[tuple]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def sqlite_count(db: Path, table: str = "exchanges") -> int:
    return sqlite_rows(db, f"SELECT count(*) FROM {table}")[0][0]


def migrated_sqlite(path: Path) -> str:
    url = f"sqlite:///{path}"
    from observer.store.migrate import upgrade

    upgrade(url)
    return url


def dead_pg_url() -> str:
    """A PostgreSQL URL on a port nobody listens on (connection refused at once)."""
    return f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nothing"


def check_complete(res: StreamResult, body: bytes | None = None, what: str = "") -> None:
    assert res.error is None, f"{what}: client error {res.error!r}"
    assert res.status == 200, f"{what}: status {res.status}"
    if body is not None:
        assert res.body == body, f"{what}: the client did not get the upstream's body byte for byte"


# --------------------------------------------------------------------------------------------
# (a) PostgreSQL stopped mid-run


@pytest.mark.timeout(180)
def test_postgres_stopped_and_started_mid_run_stores_each_exchange_once(
    upstream: UpstreamServer, tmp_path: Path
) -> None:
    total, concurrency, stop_after, start_after = 200, 4, 60, 140
    pg = LocalPostgres()  # no PostgreSQL binaries: PgUnavailable, the test fails
    try:
        pg.init()
        pg.start()
        url = pg.create_database("audit")
        tids = new_tids("pgdown", total)
        want_body = expected_body("complete_example")
        results: dict[str, StreamResult] = {}
        ended_wall: dict[str, float] = {}
        lock = threading.Lock()

        def one(obs: FaultObserver, tid: str) -> None:
            res = llm_stream(obs, upstream, tid, "script=complete_example&gap_ms=15")
            with lock:
                results[tid] = res
                ended_wall[tid] = time.time()

        def finished() -> int:
            with lock:
                return len(results)

        with running(FaultObserver(tmp_path, "run", tmp_path / "data", url)) as obs:
            with ThreadPoolExecutor(concurrency) as pool:
                futures = [pool.submit(one, obs, t) for t in tids]
                wait_until(lambda: finished() >= stop_after, 60, what=f"{stop_after} streams done")
                pg.stop("fast")
                down_at = time.time()
                wait_until(lambda: finished() >= start_after, 60, what=f"{start_after} streams done")
                up_at = time.time()
                pg.start()
                for f in futures:
                    f.result(timeout=60)
            for tid in tids:
                check_complete(results[tid], want_body, tid)
            during = [t for t in tids if down_at < ended_wall[t] < up_at]
            # The outage really covered streams (else the test proves nothing).
            assert len(during) >= 40, f"only {len(during)} streams ended while PostgreSQL was down"

            def stored() -> int:
                with pg.connect("audit") as conn:
                    return conn.execute("SELECT count(*) FROM exchanges").fetchone()[0]

            wait_until(lambda: stored() >= total, 60, interval=0.25, what=f"{total} rows in PostgreSQL")
            time.sleep(1.0)  # nothing more may arrive (a replayed batch would show here)
            api_ids = {item["id"] for item in obs.api().all_items(page=100)}
            code = obs.stop(timeout=30)
        assert code == 0, obs.describe()

        with pg.connect("audit") as conn:
            rows = conn.execute(
                "SELECT id, writer_id, seq, outcome, text, request, created_at FROM exchanges"
            ).fetchall()
            gaps = conn.execute("SELECT writer_id, seq, seq_end, dropped, reason, detail FROM gaps").fetchall()
        assert len(rows) == total, f"{len(rows)} rows, not {total}"
        ids = [r[0] for r in rows]
        assert len(set(ids)) == total, "an exchange id is stored twice"
        assert len({(r[1], r[2]) for r in rows}) == total, "a (writer_id, seq) is stored twice"
        assert len({r[1] for r in rows}) == 1, "more than one writer"
        assert sorted(r[2] for r in rows) == list(range(1, total + 1)), "seqs are not 1..200"
        assert gaps == [], f"gap rows: {gaps}"
        by_tid = {as_json(r[5])["metadata"]["session_id"]: r for r in rows}
        assert set(by_tid) == set(tids), "the stored exchanges are not the 200 sent"
        for tid in tids:
            r = by_tid[tid]
            assert (r[3], r[4]) == ("completed", COMPLETE_TEXT), (tid, r[3], r[4])
        for tid in during:  # ended while the database was down: inserted only after it came back
            assert by_tid[tid][6].timestamp() >= up_at - 1.0, (tid, by_tid[tid][6], up_at)
        assert api_ids == set(ids), "the API lists other exchanges than the table holds"

        # (e) the shutdown line: everything journaled, stored, nothing dropped or left over.
        counts = obs.shutdown_counts()
        assert counts["journaled"] == total and counts["dropped"] == 0 and counts["waiting"] == 0, counts
        assert counts["stored"] == total and counts["gaps"] == 0, counts
        start = obs.startup_counts()
        assert (start["waiting"], start["recovered"]) == (0, 0), start
    finally:
        pg.cleanup()


def stop_after_kill(observers: tuple[FaultObserver, ...], kids: dict[int, str]) -> None:
    """Stops ``observers`` and kills the children of a killed proxy still alive (the test then failed)."""
    for obs in observers:
        obs.stop()
    for pid in still_alive(kids):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


# --------------------------------------------------------------------------------------------
# (b) kill -9 of the proxy


@pytest.mark.timeout(150)
def test_kill9_with_streams_in_flight_and_records_queued(upstream: UpstreamServer, tmp_path: Path) -> None:
    data = tmp_path / "data"
    db = tmp_path / "observer.db"
    url = f"sqlite:///{db}"
    n_long, gap_ms = 40, 250  # in-flight streams last 10 s; the kill comes after ~2 s
    full = long_text(n_long)
    stored_tids, queued_tids, inflight_tids = new_tids("k9-stored", 2), new_tids("k9-queued", 3), new_tids("k9-open", 4)
    want_body = expected_body("complete_example")
    obs1 = FaultObserver(tmp_path, "run1", data, url)
    obs2 = FaultObserver(tmp_path, "run2", data, url)
    lock_conn: sqlite3.Connection | None = None
    live: dict[str, StreamResult] = {}
    final: dict[str, StreamResult] = {}
    threads: list[threading.Thread] = []
    kids: dict[int, str] = {}
    try:
        obs1.start(timeout=45)
        proxy_pid = obs1.proc.pid  # started with start_new_session: the proxy process leads its group
        assert os.getpgid(proxy_pid) == proxy_pid
        for tid in stored_tids:
            check_complete(llm_stream(obs1, upstream, tid), want_body, tid)
        wait_until(lambda: sqlite_count(db) == len(stored_tids), 20, what="the first records stored")

        # The store takes no writes from here on: records wait in the journal.
        lock_conn = sqlite3.connect(db, timeout=10, isolation_level=None)
        lock_conn.execute("BEGIN EXCLUSIVE")
        for tid in queued_tids:
            check_complete(llm_stream(obs1, upstream, tid), want_body, tid)

        def inflight(tid: str) -> None:
            final[tid] = llm_stream(
                obs1,
                upstream,
                tid,
                f"script=long&n={n_long}&gap_ms={gap_ms}",
                timeout=30,
                on_chunk=lambda res: live.setdefault(tid, res),
            )

        for tid in inflight_tids:
            t = threading.Thread(target=inflight, args=(tid,), daemon=True)
            t.start()
            threads.append(t)
        for tid in inflight_tids:
            up = upstream.wait_exchange(tid, timeout=15, finished=False)
            wait_until(lambda up=up: len(up.send_times) >= 5, 15, what=f"{tid}: five events sent")
            wait_until(lambda tid=tid: len(sse_text(live[tid].body)) > 0, 15, what=f"{tid}: text at the client")
        snapshot = {tid: sse_text(live[tid].body) for tid in inflight_tids}
        time.sleep(0.5)  # > tap batch (50 ms) + one group commit: the snapshot's bytes are journaled

        kids = children_of(proxy_pid)  # the API child (same group) and the worker (its own session)
        assert any("observer.cli api" in c for c in kids.values()), f"no API child: {kids}"
        assert any("observer.capture.worker" in c for c in kids.values()), f"no worker: {kids}"
        os.kill(proxy_pid, signal.SIGKILL)
        obs1.proc.wait(10)
        assert obs1.proc.returncode == -signal.SIGKILL
        # The API child (parent-death SIGTERM) and the worker (parent-death SIGKILL) go too.
        wait_until(lambda: not still_alive(kids), 15, what=f"the children {kids} to exit after the kill")
        for t in threads:
            t.join(30)
        for tid in inflight_tids:
            res = final[tid]
            assert res.error is not None, f"{tid}: the stream ended normally despite the kill"
            assert res.body.startswith(b"event: stream.start"), tid
        lock_conn.rollback()
        lock_conn.close()
        lock_conn = None

        obs2.start(timeout=45)
        every = stored_tids + queued_tids + inflight_tids
        wait_until(lambda: sqlite_count(db) >= len(every), 30, interval=0.2, what="all records stored after restart")
        time.sleep(0.5)
        code = obs2.stop(timeout=30)
        assert code == 0, obs2.describe()

        rows = sqlite_rows(
            db, "SELECT id, writer_id, seq, outcome, transport_error, text, request, status_code FROM exchanges"
        )
        gaps = sqlite_rows(db, "SELECT seq, seq_end, dropped, reason FROM gaps")
        assert len(rows) == len(every), [(r[3], as_json(r[6])["metadata"]) for r in rows]
        assert len({r[0] for r in rows}) == len(rows)
        by_tid: dict[str, tuple] = {}
        for r in rows:
            tid = as_json(r[6])["metadata"]["session_id"]
            assert tid not in by_tid, f"{tid} stored twice"
            by_tid[tid] = r
        assert set(by_tid) == set(every)
        assert len({r[1] for r in rows}) == 1, "one writer (the data folder's identity) for both runs"
        assert sorted(r[2] for r in rows) == list(range(1, len(every) + 1)), sorted(r[2] for r in rows)
        assert gaps == []
        for tid in stored_tids + queued_tids:
            _id, _w, _s, outcome, terr, text, _req, status = by_tid[tid]
            assert (outcome, terr, text, status) == ("completed", None, COMPLETE_TEXT, 200), (tid, by_tid[tid])
        for tid in inflight_tids:
            _id, _w, _s, outcome, terr, text, req, status = by_tid[tid]
            req = as_json(req)
            assert outcome == "interrupted", (tid, outcome)
            assert terr and RECOVERED_MARK in terr, (tid, terr)
            assert status == 200
            assert req["model"] == REQUEST_MODEL and req["messages"] == MESSAGES and req["stream"] is True, req
            client_text = sse_text(final[tid].body)
            assert text.startswith(snapshot[tid]), (tid, len(text), len(snapshot[tid]))
            assert client_text.startswith(text), f"{tid}: the record has text the client never got"
            assert full.startswith(text) and len(text) < len(full), tid

        # (e) start-up line of the second run: 3 journaled records were not stored, 4 exchanges
        # were open; its shutdown line: it journaled the 4 rebuilt records and stored 3 + 4.
        start = obs2.startup_counts()
        assert (start["waiting"], start["recovered"]) == (len(queued_tids), len(inflight_tids)), start
        assert Path(start["dir"]) == data / "journal"
        counts = obs2.shutdown_counts()
        assert counts == {
            "journaled": len(inflight_tids),
            "stored": len(queued_tids) + len(inflight_tids),
            "gaps": 0,
            "dropped": 0,
            "waiting": 0,
        }, counts
    finally:
        if lock_conn is not None:
            lock_conn.close()
        stop_after_kill((obs1, obs2), kids)


class HubClient:
    """A pysignalr client (JSON protocol) on an event loop of its own in a daemon thread, so the
    socket stays open while the test kills and restarts processes; ``chat`` starts a turn and
    returns (the ``update`` texts and items arrive in ``updates`` / ``items`` by prompt). Its
    socket follows ``HTTPS_PROXY`` (websockets), its negotiate POST goes to the hub directly
    (aiohttp, ``trust_env`` off): ``ssl_ctx`` trusts the proxy's CA and the hub's."""

    def __init__(self, url: str, ssl_ctx: Any):
        from pysignalr.client import SignalRClient
        from pysignalr.protocol.json import JSONProtocol

        self.client = SignalRClient(url, protocol=JSONProtocol(), ssl=ssl_ctx, retry_count=1, connection_timeout=10)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="e2e-signalr", daemon=True)
        self.lock = threading.Lock()
        self.updates: dict[str, list[str]] = {}  # prompt -> the bot texts of its ``update``s
        self.items: dict[str, list[Any]] = {}  # prompt -> its StreamItems
        self.ended: dict[str, str] = {}  # prompt -> "completed" | the error
        self.current: str | None = None
        self.task: asyncio.Future[Any] | None = None
        self.opened = threading.Event()

    def _call(self, coro: Any, timeout: float) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def open(self, timeout: float = 15.0) -> None:
        async def on_open() -> None:
            self.opened.set()

        async def on_update(args: list[Any]) -> None:
            msgs = (args[0] or {}).get("messages") or []
            if msgs and msgs[-1].get("author") == "bot" and not msgs[-1].get("messageType"):
                with self.lock:
                    if self.current is not None:
                        self.updates[self.current].append(msgs[-1]["text"])

        async def start() -> None:
            self.client.on_open(on_open)
            self.client.on("update", on_update)
            self.task = asyncio.ensure_future(self.client.run())

        self.thread.start()
        self._call(start(), 5)
        if not self.opened.wait(timeout):
            raise TimeoutError("the SignalR client did not open its socket")

    def chat(self, prompt: str, timeout: float = 10.0) -> None:
        with self.lock:
            self.current = prompt
            self.updates[prompt], self.items[prompt] = [], []

        async def on_next(item: Any) -> None:
            with self.lock:
                self.items[prompt].append(item)

        async def on_complete(_: Any) -> None:
            with self.lock:
                self.ended[prompt] = "completed"

        async def on_error(message: Any) -> None:
            with self.lock:
                self.ended[prompt] = str(getattr(message, "error", message))

        arg = {
            "source": "cib",
            "isStartOfSession": True,
            "tone": "Creative",
            "message": {"author": "user", "inputMethod": "Keyboard", "text": prompt, "messageType": "Chat"},
            "conversationId": "conv-e2e-kill9",
        }
        self._call(self.client.stream("chat", [arg], on_next, on_complete, on_error), timeout)

    def texts(self, prompt: str) -> list[str]:
        with self.lock:
            return list(self.updates.get(prompt, []))

    def close(self) -> None:
        """Stops the client (its ``run()`` cancelled) and the loop; bounded."""
        if not self.thread.is_alive():
            return

        async def stop() -> None:
            if self.task is None:
                return
            self.task.cancel()  # a no-op when run() ended already (its reconnect to the killed proxy failed)
            with contextlib.suppress(BaseException):  # awaited either way: its exception is retrieved
                await asyncio.wait_for(self.task, 10)

        with contextlib.suppress(Exception):
            self._call(stop(), 15)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            self.loop.close()


@pytest.mark.timeout(150)
def test_kill9_with_a_websocket_turn_open_recovers_it_from_its_journaled_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SignalR socket (Copilot's ChatHub, ``signalr.copilot``) through ``observer run``: one
    turn completes and is stored; a second (``slow``: the hub sends two updates, then waits) is
    open when the proxy gets ``kill -9``. The next start on the same data folder stores it from
    the journal: ``interrupted``, "recovered from its journal", its request the prompt, the text
    that had arrived; the completed turn is not stored again."""
    pytest.importorskip("aiohttp")
    pytest.importorskip("msgpack")
    pytest.importorskip("pysignalr.client")
    import ssl

    from observer.journal.recovery import RECOVERED
    from tests.e2e.chathub import ChatHubServer, answer_for, cumulative

    data = tmp_path / "data"
    db = tmp_path / "observer.db"
    url = f"sqlite:///{db}"
    run_id = uuid.uuid4().hex[:8]
    first, slow = f"Wie ist das Wetter in Wien? #{run_id}", f"slow answer please #{run_id}"
    obs1 = FaultObserver(tmp_path, "run1", data, url)
    obs2 = FaultObserver(tmp_path, "run2", data, url)
    hub = ChatHubServer(gap_s=0.03, slow_s=30.0, lifetime_s=140.0)  # slow_s > the test: no more text
    client: HubClient | None = None
    kids: dict[int, str] = {}
    try:
        hub.start()
        obs1.start(timeout=45)
        proxy_pid = obs1.proc.pid  # started with start_new_session: the proxy process leads its group
        assert os.getpgid(proxy_pid) == proxy_pid
        for k in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
            monkeypatch.setenv(k, obs1.proxy_url)  # the client's socket follows them (websockets)
        for k in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.delenv(k, raising=False)
        ctx = ssl.create_default_context(cafile=obs1.ca_path)
        ctx.load_verify_locations(cafile=hub.ca_path)  # the negotiate POST goes to the hub directly
        client = HubClient(hub.url(tls=True), ctx)
        client.open()

        # A complete turn, stored before the kill.
        client.chat(first)
        wait_until(lambda: client.ended.get(first), 15, what="the first turn's Completion at the client")
        assert client.ended[first] == "completed", client.ended
        assert client.texts(first) == cumulative(answer_for(first))
        wait_until(lambda: sqlite_count(db) == 1, 20, interval=0.1, what="the first turn's record stored")

        # The slow turn: two updates, then the hub waits (slow_s) for a cancel or a close.
        client.chat(slow)
        sent_two = cumulative(answer_for(slow))[:2]
        wait_until(lambda: client.texts(slow) == sent_two, 15, what="the slow turn's two updates at the client")
        snapshot = client.texts(slow)[-1]
        server_open = hub.turn(slow, ended=False)
        assert server_open.ended is None and server_open.updates == sent_two, server_open
        time.sleep(0.5)  # > the journal's group commit: the events of what the client got are on disk

        kids = children_of(proxy_pid)  # the API child (same group) and the worker (its own session)
        assert any("observer.cli api" in c for c in kids.values()), f"no API child: {kids}"
        os.kill(proxy_pid, signal.SIGKILL)
        obs1.proc.wait(10)
        assert obs1.proc.returncode == -signal.SIGKILL
        wait_until(lambda: not still_alive(kids), 15, what=f"the children {kids} to exit after the kill")
        # The hub sees its socket to the proxy go: the turn ends there, never completed.
        server = hub.turn(slow, timeout=10)
        assert server.ended == "closed" and server.final_text is None, server
        assert server.updates == sent_two, server.updates
        assert slow not in client.ended or client.ended[slow] != "completed", client.ended
        client.close()
        client = None
        assert sqlite_count(db) == 1, "the open turn was stored before the restart"

        obs2.start(timeout=45)
        wait_until(lambda: sqlite_count(db) >= 2, 30, interval=0.2, what="the recovered turn stored after restart")
        time.sleep(0.5)  # nothing more may arrive (a duplicate of the first turn would show here)
        start2 = obs2.startup_counts()
        code = obs2.stop(timeout=30)
        assert code == 0, obs2.describe()

        rows = sqlite_rows(
            db,
            "SELECT id, writer_id, seq, outcome, transport_error, text, request, status_code, dialect, path"
            " FROM exchanges ORDER BY seq",
        )
        dump = [(r[3], r[4], r[5], as_json(r[6]).get("messages"), r[8], r[2]) for r in rows]
        assert len(rows) == 2, dump
        assert len({r[0] for r in rows}) == 2, f"one id stored twice: {dump}"
        assert {r[8] for r in rows} == {"signalr.copilot"}, dump
        assert len({r[9] for r in rows}) == 1, f"not one socket's turns: {[r[9] for r in rows]}"
        assert len({r[1] for r in rows}) == 1, "one writer (the data folder's identity) for both runs"
        assert [r[2] for r in rows] == [1, 2], dump
        assert sqlite_rows(db, "SELECT seq, seq_end, dropped, reason FROM gaps") == []
        by_prompt: dict[str, tuple] = {}
        for r in rows:
            msgs = as_json(r[6])["messages"]
            assert len(msgs) == 1 and msgs[0]["role"] == "user", dump
            assert msgs[0]["content"] not in by_prompt, f"{msgs[0]['content']!r} stored twice"
            by_prompt[msgs[0]["content"]] = r
        assert set(by_prompt) == {first, slow}, dump

        _id, _w, _s, outcome, terr, text, _req, status, _d, _p = by_prompt[first]
        assert (outcome, terr, text, status) == ("completed", None, answer_for(first), 101), dump

        _id, _w, _s, outcome, terr, text, _req, status, _d, _p = by_prompt[slow]
        assert (outcome, terr, status) == ("interrupted", RECOVERED, 101), dump
        assert RECOVERED_MARK in terr
        # The proxy relays a server message only after its websocket_message hook returned, and
        # that hook hands the message's events to the journal: whatever the client had when the
        # snapshot was taken was queued for the journal before, and on disk 0.5 s later (group
        # commit), before the kill. So the client's text is a prefix of the recovered one (never
        # the other way round in general: the proxy may journal a message the kill keeps it from
        # relaying). The recovered text is a prefix of what the hub sent (nothing invented), and
        # here the hub sent nothing after the second update (slow_s): all three are equal.
        assert text, dump
        assert text.startswith(snapshot), (text, snapshot)
        assert server.updates[-1].startswith(text), (text, server.updates)
        assert answer_for(slow).startswith(text) and len(text) < len(answer_for(slow)), text
        assert text == snapshot == server.updates[-1], (text, snapshot, server.updates)

        # (e) the second start found no record waiting and one exchange (the turn) open; it
        # journaled and stored only the rebuilt turn.
        assert (start2["waiting"], start2["recovered"]) == (0, 1), start2
        assert Path(start2["dir"]) == data / "journal"
        counts = obs2.shutdown_counts()
        assert counts == {"journaled": 1, "stored": 1, "gaps": 0, "dropped": 0, "waiting": 0}, counts
    finally:
        if client is not None:
            client.close()
        stop_after_kill((obs1, obs2), kids)
        hub.stop()


# --------------------------------------------------------------------------------------------
# (c) full spool


LONG_N = 100  # ~32 KB of SSE per stream, ~60 KB of journal (data + record): ~17 fill 1 MiB


def _long_query() -> str:
    return f"script=long&n={LONG_N}&gap_ms=0"


@pytest.mark.timeout(150)
def test_full_spool_drops_new_records_into_one_gap(upstream: UpstreamServer, tmp_path: Path) -> None:
    sent = 30
    data = tmp_path / "data"
    journal = data / "journal"
    tids = new_tids("spool", sent)
    full = long_text(LONG_N)
    sizes: list[int] = []
    ended: dict[str, float] = {}
    raw_len = 0
    run1 = FaultObserver(tmp_path, "run1", data, dead_pg_url(), sets={"observer_spool_max_bytes": str(MiB)})
    with running(run1):
        for tid in tids:
            res = llm_stream(run1, upstream, tid, _long_query())
            up = upstream.wait_exchange(tid, finished=True)
            check_complete(res, up.raw_body, tid)  # fail open: every client gets its stream
            raw_len = max(raw_len, len(up.raw_body))
            ended[tid] = time.time()
            sizes.append(settled_segment_bytes(journal))
        time.sleep(0.3)
        sizes.append(segment_bytes(journal))
        code = run1.stop(timeout=30)
    assert code == 0, run1.describe()
    after_stop = segment_bytes(journal)
    counts1 = run1.shutdown_counts()
    run1_segments = sorted(p.name for p in journal.glob("seg-*.log"))
    # The bound is checked before each entry is encoded, so the entry that crosses it is written
    # whole (at most a DATA entry, <= one stream's raw bytes here, or a RECORD, about its text
    # twice: below the raw bytes too); when that entry starts a new segment, the open exchange's
    # OPEN and DATA entries are first carried into it (<= raw bytes + 2 KiB). Past the bound
    # only small entries follow (CUT, FORGET, the GAP at close).
    overshoot = max(max(sizes), after_stop) - MiB
    bound = MiB + 2 * raw_len + 8192
    assert max(sizes) <= bound, f"journal grew to {max(sizes)} bytes (bound {MiB}, raw {raw_len}, allowed {bound})"
    assert after_stop - max(sizes) < 4096, (after_stop, max(sizes))
    assert folder_bytes(journal) <= bound + 4096, folder_bytes(journal)  # + identity.json, lock
    print(
        f"\nspool: raw body/stream {raw_len} B; segments max {max(sizes)} B during the run, {after_stop} B after"
        f" stop; overshoot {overshoot} B; folder {folder_bytes(journal)} B; shutdown line {counts1}"
    )

    # Restart against a reachable store: the journal drains into it.
    store = tmp_path / "store.db"
    run2 = FaultObserver(tmp_path, "run2", data, migrated_sqlite(store))
    with running(run2):
        wait_until(
            lambda: not any((journal / n).exists() for n in run1_segments),
            30,
            interval=0.2,
            what="the first run's segments stored and deleted",
        )
        start2 = run2.startup_counts()
        code = run2.stop(timeout=30)
    assert code == 0, run2.describe()

    rows = sqlite_rows(store, "SELECT outcome, text, request, seq FROM exchanges")
    gaps = sqlite_rows(store, "SELECT seq, seq_end, dropped, reason, first_at, last_at FROM gaps")
    stored_tids = [as_json(r[2])["metadata"]["session_id"] for r in rows]
    k = len(rows)
    assert 0 < k < sent, f"{k} of {sent} stored: the spool never filled, or took nothing"
    # Nothing drained during the run: the first k streams fit, every later one was dropped.
    assert sorted(stored_tids) == sorted(tids[:k]), "the stored records are not the first ones sent"
    for outcome, text, _req, _seq in rows:
        assert (outcome, text) == ("completed", full)
    assert gaps, "no gap row for the dropped records"
    assert {g[3] for g in gaps} == {"spool_full"}, gaps
    assert sum(g[2] for g in gaps) == sent - k, f"stored {k} + dropped {sum(g[2] for g in gaps)} != sent {sent}"
    window = ended[tids[-1]] - ended[tids[k]] if k < sent else 0.0
    if window < 9.0:  # one gap per reason and window (gap_flush_s = 10 s)
        assert len(gaps) == 1, gaps
    assert sorted([r[3] for r in rows] + [g[0] for g in gaps]) == list(range(1, k + len(gaps) + 1))

    # (e) the first run journaled k and dropped the rest; nothing stored, k waiting; the second
    # run found k waiting and nothing open.
    assert counts1 == {"journaled": k, "stored": 0, "gaps": 0, "dropped": sent - k, "waiting": k}, counts1
    assert (start2["waiting"], start2["recovered"]) == (k, 0), start2


def _refused(res: StreamResult) -> bool:
    """Whether ``res`` is the proxy's fail_closed refusal: 503 with the JSON body saying why."""
    if res.status != 503:
        return False
    assert res.headers.get("content-type", "").startswith("application/json"), res.headers
    body = json.loads(res.body)
    assert body["error"]["type"] == "recording_unavailable", body
    return True


def bodyless_llm_probe(obs: ObserverProcess, upstream: UpstreamServer, tid: str) -> StreamResult:
    """An LLM request (by its media type) without a body (``Content-Length: 0``)."""
    return stream_request(
        upstream.url(f"/v1/stream?script=complete_example&gap_ms=5&tid={tid}"),
        proxy=obs.proxy_url,
        content=b"",
        headers={"Content-Type": LLM_CONTENT_TYPE},
        timeout=10,
    )


@contextlib.contextmanager
def fail_closed_with_full_journal(
    upstream: UpstreamServer, tmp_path: Path
) -> Iterator[tuple[LocalPostgres, FaultObserver, list[str], list[str], Iterator[str]]]:
    """``fail_closed`` refuses to start without a reachable database, so the store is a PostgreSQL
    instance of the test's own, stopped once the proxy runs: nothing drains and streams fill the
    1 MiB journal. Yields (pg, the observer, the tids of the streams accepted, of those refused,
    fresh tids) once the segments on disk reach the bound."""
    pg = LocalPostgres()
    try:
        pg.init()
        pg.start()
        url = pg.create_database("audit")
        journal = tmp_path / "data" / "journal"
        obs = FaultObserver(
            tmp_path,
            "run",
            tmp_path / "data",
            url,
            sets={"observer_spool_max_bytes": str(MiB), "observer_fail_closed": "true"},
        )
        with running(obs):
            pg.stop("fast")
            tids = iter(new_tids("closed", 500))
            accepted: list[str] = []
            refused: list[str] = []
            for _ in range(60):  # ~16 fit in 1 MiB
                tid = next(tids)
                res = llm_stream(obs, upstream, tid, _long_query(), timeout=10)
                if res.status != 200 and upstream.get(tid) is None:
                    # Full already (the size below was read before the last record landed):
                    # refused, cleanly (503) or not (the bug test_fail_closed_refuses_an_llm_
                    # request_with_a_body shows). Never forwarded either way.
                    refused.append(tid)
                    break
                check_complete(res, upstream.wait_exchange(tid).raw_body, tid)
                accepted.append(tid)
                if settled_segment_bytes(journal) >= MiB:
                    break
            assert settled_segment_bytes(journal) >= MiB, f"the journal did not fill after {len(accepted)} streams"
            time.sleep(0.3)  # the journal thread's round after the last record: it knows it is full
            yield pg, obs, accepted, refused, tids
    finally:
        pg.cleanup()


@pytest.mark.timeout(150)
def test_full_spool_fail_closed_refuses_llm_requests_until_the_store_is_back(
    upstream: UpstreamServer, tmp_path: Path
) -> None:
    """With the journal full, LLM requests get the proxy's 503 and never reach the upstream; other
    traffic passes; once the database is back the journal drains and LLM requests pass again.
    The probes are LLM requests without a body: one with a body is not refused cleanly (see
    ``test_fail_closed_refuses_an_llm_request_with_a_body``)."""
    with fail_closed_with_full_journal(upstream, tmp_path) as (pg, obs, accepted, refused, tids):
        for _ in range(3):
            tid = next(tids)
            res = bodyless_llm_probe(obs, upstream, tid)
            assert _refused(res), (tid, res.status, res.error)
            refused.append(tid)
        # Other traffic passes.
        res = stream_request(upstream.url("/v1/json?tid=" + next(tids)), proxy=obs.proxy_url, method="GET")
        assert (res.status, json.loads(res.body)) == (200, JSON_ANSWER), res.status
        time.sleep(0.5)
        for tid in refused:
            assert upstream.get(tid) is None, f"{tid} was refused but reached the upstream"

        pg.start()  # the drainer stores the journal, which makes room: LLM requests pass again
        back_at = time.monotonic()
        while True:
            tid = next(tids)
            res = bodyless_llm_probe(obs, upstream, tid)
            if not _refused(res):
                check_complete(res, upstream.wait_exchange(tid).raw_body, tid)
                accepted.append(tid)
                break
            refused.append(tid)
            assert time.monotonic() - back_at < 40, "still refusing 40 s after the database came back"
            time.sleep(0.3)
        recovery_s = time.monotonic() - back_at
        last = accepted[-1]

        def last_stored() -> bool:
            with pg.connect("audit") as conn:
                q = "SELECT count(*) FROM exchanges WHERE path LIKE %s"
                return conn.execute(q, (f"%tid={last}%",)).fetchone()[0] == 1

        wait_until(last_stored, 30, interval=0.25, what="the request after the recovery stored")
        code = obs.stop(timeout=30)
        assert code == 0, obs.describe()
        with pg.connect("audit") as conn:
            rows = conn.execute("SELECT path, outcome, text FROM exchanges").fetchall()
            gaps = conn.execute("SELECT dropped, reason FROM gaps").fetchall()
    stored_tids = [re.search(r"tid=([\w-]+)", r[0])[1] for r in rows]
    assert len(set(stored_tids)) == len(stored_tids)
    assert not set(stored_tids) & set(refused), "a refused request was recorded"
    assert set(stored_tids) <= set(accepted)
    dropped = sum(g[0] for g in gaps if g[1] == "spool_full")
    assert {g[1] for g in gaps} <= {"spool_full"}, gaps
    # Records of accepted streams may still be dropped: the stream that crossed the bound was
    # admitted while there was room. Every accepted one is stored or counted in a gap.
    assert len(stored_tids) + dropped == len(accepted), (len(stored_tids), dropped, len(accepted))
    full = long_text(LONG_N)
    for path, outcome, text in rows:
        assert outcome == "completed", (path, outcome)
        assert text == (COMPLETE_TEXT if last in path else full), path
    print(
        f"\nfail_closed: {len(accepted)} accepted ({len(stored_tids)} stored, {dropped} dropped),"
        f" {len(refused)} refused; gaps {gaps}; accepting again {recovery_s:.1f} s after the database;"
        f" shutdown {obs.shutdown_counts()}"
    )


@pytest.mark.timeout(90)
def test_fail_closed_refuses_an_llm_request_with_a_body(upstream: UpstreamServer, tmp_path: Path) -> None:
    with fail_closed_with_full_journal(upstream, tmp_path) as (_pg, obs, _accepted, _earlier, tids):
        tid = next(tids)
        res = llm_stream(obs, upstream, tid, _long_query(), timeout=5)
        assert upstream.get(tid) is None, "a request was forwarded while the journal was full"
        assert _refused(res), f"no 503: status {res.status}, error {res.error!r}"


# --------------------------------------------------------------------------------------------
# (d) the journal's disk fills up


@contextlib.contextmanager
def small_filesystem(path: Path, size: int) -> Iterator[Callable[[int], None] | None]:
    """A tmpfs of ``size`` bytes mounted at ``path``; yields a function that resizes it (remount),
    or ``None`` when mounting is not permitted (then the caller limits file sizes instead)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        yield None
        return
    p = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], capture_output=True, timeout=30
    )
    if p.returncode != 0:
        yield None
        return

    def resize(new_size: int) -> None:
        subprocess.run(["mount", "-o", f"remount,size={new_size}", str(path)], check=True, timeout=30)

    try:
        yield resize
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    "room",
    [
        "while_running",
        "after_stop_idle",
        "after_stop",
    ],
)
def test_journal_disk_full_keeps_forwarding_and_records_the_loss(
    upstream: UpstreamServer, tmp_path: Path, room: str
) -> None:
    """The journal on a 2 MiB filesystem and no database to drain to: the disk fills. Every client
    still gets its whole stream. ``while_running``: space comes back while the proxy runs (one more
    stream then); ``after_stop_idle``: the proxy is stopped (SIGTERM) after 1.5 s without traffic,
    and space comes back for the next start; ``after_stop``: the same, stopped at once after the
    last stream (as a stop under traffic would). Every time, after the next start on a reachable
    store, the stored records and the gaps' ``dropped`` add up to the streams sent."""
    sent = 45  # ~66 KB of journal each: ~32 fill 2 MiB
    fs_size = 2 * MiB
    mnt = tmp_path / "small"
    data = tmp_path / "data"
    tids = new_tids("disk", sent + 1)
    full = long_text(LONG_N)
    force_rlimit = os.environ.get("E2E_FAULTS_DISK") == "rlimit"
    with small_filesystem(mnt, fs_size) as resize:
        if resize is None or force_rlimit:
            # No mount (not root): a file-size cap on the proxy process is a full disk for its
            # journal, whose segment only rolls at min(8 MiB, spool_max_bytes / 4) = 8 MiB here.
            # (The cap applies to the SQLite store too: the store here is unreachable PostgreSQL.)
            mode, journal, limit = "rlimit", tmp_path / "journal", fs_size
        else:
            mode, journal, limit = "tmpfs", mnt / "journal", None
        run1 = FaultObserver(tmp_path, "run1", data, dead_pg_url(), journal_dir=journal, fsize_limit=limit)

        def make_room() -> None:
            if mode == "tmpfs":
                assert resize is not None
                resize(64 * MiB)
            elif run1.alive():
                import resource

                resource.prlimit(run1.proc.pid, resource.RLIMIT_FSIZE, (64 * MiB, resource.RLIM_INFINITY))

        with running(run1):
            for tid in tids[:sent]:
                res = llm_stream(run1, upstream, tid, _long_query())
                check_complete(res, upstream.wait_exchange(tid).raw_body, tid)  # forwarding never stops
            assert run1.alive(), run1.describe()
            assert "journal: cannot write" in run1.log_text(), "the journal never hit the full disk"
            if room == "while_running":
                make_room()
                time.sleep(1.2)  # the journal retries after retry_s (1 s) of a disk error
                tid = tids[sent]
                res = llm_stream(run1, upstream, tid, _long_query())
                check_complete(res, upstream.wait_exchange(tid).raw_body, tid)
                sent += 1
                tids = tids[:sent]
                settled_segment_bytes(journal)
            else:
                tids = tids[:sent]
                if room == "after_stop_idle":
                    time.sleep(1.5)  # > retry_s: the journal is no longer blocked by the last failure
            code = run1.stop(timeout=30)
        assert code == 0, run1.describe()
        counts1 = run1.shutdown_counts()
        used = segment_bytes(journal)
        print(f"\ndisk ({mode}, room {room}): segments {used} B on a {fs_size} B filesystem; shutdown {counts1}")

        if room != "while_running":
            make_room()
        store = tmp_path / "store.db"
        run2 = FaultObserver(tmp_path, "run2", data, migrated_sqlite(store), journal_dir=journal)
        old = sorted(p.name for p in journal.glob("seg-*.log"))
        with running(run2):
            wait_until(
                lambda: not any((journal / n).exists() for n in old),
                30,
                interval=0.2,
                what="the first run's segments stored and deleted",
            )
            start2 = run2.startup_counts()
            code = run2.stop(timeout=30)
        assert code == 0, run2.describe()

    rows = sqlite_rows(store, "SELECT outcome, text, request FROM exchanges")
    gaps = sqlite_rows(store, "SELECT seq, seq_end, dropped, reason FROM gaps")
    stored_tids = [as_json(r[2])["metadata"]["session_id"] for r in rows]
    k = len(rows)
    print(f"disk: {k} stored, gaps {gaps}; second start {start2}")
    assert len(set(stored_tids)) == k and set(stored_tids) <= set(tids)
    assert 0 < k < sent, f"{k} of {sent} stored: the disk never filled, or took nothing"
    for outcome, text, _req in rows:
        assert (outcome, text) == ("completed", full)
    if room == "while_running":
        assert tids[-1] in stored_tids, "the stream after space came back was not stored"
    assert gaps, f"no gap row; {sent - k} records lost without a trace (shutdown line {counts1})"
    assert {g[3] for g in gaps} <= {"disk_error", "spool_full"}, gaps
    assert sum(g[2] for g in gaps) + k == sent, f"stored {k} + dropped {[g[2] for g in gaps]} != sent {sent}"
    # (e) the first run's counts add up to what was sent and what was stored; the second start
    # found the first run's records waiting and no exchange left open.
    assert counts1["journaled"] == k and counts1["dropped"] == sent - k, counts1
    assert (start2["waiting"], start2["recovered"]) == (k, 0), start2
