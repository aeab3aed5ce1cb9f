"""The observer worker: a child process that runs the core (``StreamObserver``) for the proxy, so
the parsing of streamed responses leaves the proxy's event loop and its core.

Why: inside mitmdump the core's parse costs ~3-4 µs per 300-byte event on the proxy's own thread;
a bulk HTTP/1.1 stream saturates that thread, so every µs of parsing is throughput lost to the
client (``bench/bulk.py``: 0.75x the no-addon proxy in-process; docs/performance.md). With the
worker, the proxy keeps only what the record cannot do without: each chunk's arrival time, the
batching, and one pipe write per batch.

Protocol (private to this module; parent and worker are the same code, so it is not versioned):
two anonymous pipes, *data* (parent -> worker) and *records* (worker -> parent). Each frame is a
4-byte little-endian payload length followed by a pickle (protocol 5) of one tuple:

- ``(OPEN, fid, dialect_name, exchange, view, status_code, content_type, content_encoding, limits)``
  starts observing flow ``fid`` (int) with the record skeleton ``exchange``;
- ``(DATA, [(fid, pending), ...])``: for each flow, ``pending`` = ``[chunk, arrival_s, chunk,
  arrival_s, ...]`` (bytes, epoch seconds), oldest first, exactly as the proxy forwarded them. The
  batches of all flows handed over in one loop callback (one ``TapBatcher`` slice) travel in one
  frame: one pickle and one write for ~100 token streams instead of one per flow;
- ``(FINISH, fid, end, now_s, ended_at_s, transport_error, skipped_bytes)``: the transport ended;
  ``skipped_bytes`` were forwarded but not sent (the data pipe was over its bound), so observation
  stopped at the first of them;
- ``(STOP,)``: no more frames; the worker answers ``(STOPPED,)`` after its last record and exits.

The worker answers each FINISH with ``(RECORD, fid, record)``. Records are built with the same calls
the in-process tap makes (``observer.tap.feed_pending``, then ``finish``), so a record is the same
whichever process made it (tests/unit/test_worker.py compares them).

Failure modes, each decided:

- The worker dies or cannot start (EOF on the records pipe, a broken data pipe): the parent's
  ``on_death`` callback gets the reason once; the addon records every flow the worker held as
  ``observer_error`` from the skeleton it kept, with the bytes it counted, and starts a new worker
  if the dead one had run 60 s (else observes new flows in-process). No record is lost; the
  stream content of the flows in flight is.
- The worker falls behind: the parent buffers at most ``max_buffer_bytes`` of frames (memory
  bound); a flow whose data would cross it is no longer sent (``data`` returns False), its later
  bytes are only counted, and its record gets ``observer_error`` (``WorkerOverloaded``); while over
  half the bound waits, new flows are observed in-process. The client's bytes are never held: the
  proxy never waits for the worker.
- The worker hangs (no read and no answer for ``stall_timeout_s`` while something is
  outstanding): it is killed, then as when it dies ("worker stalled").
- A bug in the worker's parse: as in-process, that flow's observation stops with ``observer_error``
  and the others go on.
- The parent goes away: the kernel sends the worker SIGKILL (``observer.lifetime``), which also
  ends a stopped worker; failing that, it reads EOF on the data pipe and exits. It ignores SIGINT
  and SIGTERM and has its own session, so a Ctrl-C at the terminal or a service manager's SIGTERM
  to the whole group reaches only the proxy, which then stops it cleanly (see ``main``).
"""

from __future__ import annotations

import signal

if __name__ == "__main__":  # the worker process (see ``main``): first, before the slower imports below
    for _sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(_sig, signal.SIG_IGN)
    from observer.lifetime import die_with_parent as _arm

    _arm(signal.SIGKILL)

import asyncio
import fcntl
import logging
import os
import pickle
import selectors
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable

from observer.dialects.base import RequestView
from observer.dialects.registry import default_registry
from observer.lifetime import parent_alive
from observer.limits import Limits
from observer.reassembly import EndCause, Reassembler
from observer.records import Exchange, Violation, ViolationKind, utc_from_epoch
from observer.tap import StreamObserver, feed_pending

log = logging.getLogger("observer.worker")

OPEN, DATA, FINISH, STOP, RECORD, STOPPED = range(6)
_HEADER = 4  # bytes of the little-endian payload length
MAX_FRAME_BYTES = 1 << 30  # a frame announcing more is a protocol error (a corrupt pipe)
PIPE_BYTES = 1 << 20  # requested pipe capacity (Linux F_SETPIPE_SZ; the unprivileged maximum by default)
READ_BYTES = 1 << 20  # one read() from a pipe
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


class WorkerDied(Exception):
    """The observer worker process is gone (the message says why)."""


class WorkerOverloaded(Exception):
    """The worker fell behind: a flow's bytes past the bound were not observed."""


def encode(message: tuple) -> bytes:
    """One frame: 4-byte little-endian length + pickle (protocol 5) of ``message``."""
    payload = pickle.dumps(message, protocol=5)
    return len(payload).to_bytes(_HEADER, "little") + payload


class FrameReader:
    """Incremental frame decoder: ``feed(bytes)`` returns the messages the bytes complete, in
    order, whatever the chunking. Raises ``ValueError`` on a frame longer than
    ``MAX_FRAME_BYTES`` (a corrupt pipe); unpickling errors propagate."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple]:
        buf = self._buf
        buf += data
        out = []
        pos, n = 0, len(buf)
        while n - pos >= _HEADER:
            size = int.from_bytes(buf[pos : pos + _HEADER], "little")
            if size > MAX_FRAME_BYTES:
                raise ValueError(f"frame of {size} bytes announced: corrupt pipe")
            end = pos + _HEADER + size
            if end > n:
                break
            out.append(pickle.loads(memoryview(buf)[pos + _HEADER : end]))
            pos = end
        if pos:
            del buf[:pos]
        return out

    @property
    def pending_bytes(self) -> int:
        """Bytes of an incomplete frame held."""
        return len(self._buf)


def _set_pipe_size(fd: int) -> None:
    try:
        fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:  # not Linux, or over /proc/sys/fs/pipe-max-size: the default (64 KiB) works
        pass


# ----------------------------------------------------------------------------- worker side


class _Flow:
    __slots__ = ("exchange", "observer")

    def __init__(self, observer, exchange: Exchange) -> None:
        self.observer = observer
        self.exchange = exchange


class WorkerCore:
    """The worker's sans-IO part: ``handle(message)`` applies one decoded frame and returns the
    answers to send (a list of message tuples). Every exception is contained per flow, as in the
    in-process tap: a failed feed stops that flow's observation (``observer_error``) and a failed
    finish still yields a record."""

    def __init__(self) -> None:
        self._registry = default_registry()
        self._flows: dict[int, _Flow] = {}

    @property
    def open_flows(self) -> int:
        return len(self._flows)

    def handle(self, msg: tuple) -> list[tuple]:
        kind = msg[0]
        if kind == DATA:
            flows = self._flows
            for fid, pending in msg[1]:
                flow = flows.get(fid)
                if flow is not None:
                    feed_pending(flow.observer, pending)
            return []
        if kind == OPEN:
            self._open(*msg[1:])
            return []
        if kind == FINISH:
            return [self._finish(*msg[1:])]
        raise ValueError(f"unknown worker message kind {kind!r}")

    def _open(self, fid, dialect_name, exchange, view, status_code, content_type, content_encoding, limits) -> None:
        try:
            obs = StreamObserver(
                self._registry.get(dialect_name),
                exchange,
                view=view,
                status_code=status_code,
                content_type=content_type,
                content_encoding=content_encoding,
                limits=limits,
            )
        except Exception as exc:  # noqa: BLE001 - recorded on the flow's record
            log.error("observer worker: cannot observe flow %s", fid, exc_info=True)
            obs = _FailedObserver(exchange, f"worker open: {type(exc).__name__}: {exc}")
        self._flows[fid] = _Flow(obs, exchange)

    def _finish(self, fid, end, now_s, ended_at_s, transport_error, skipped_bytes) -> tuple:
        flow = self._flows.pop(fid, None)
        if flow is None:
            raise ValueError(f"FINISH for unknown flow {fid}")
        obs = flow.observer
        try:
            if skipped_bytes:
                obs.fail(WorkerOverloaded(f"the worker fell behind; the last {skipped_bytes} bytes were not observed"))
                flow.exchange.response_bytes += skipped_bytes
            record = obs.finish(end, now_s=now_s, ended_at_s=ended_at_s, transport_error=transport_error)
        except Exception as exc:  # noqa: BLE001 - never lose the record
            log.error("observer worker: finish failed for flow %s", fid, exc_info=True)
            record = flow.exchange
            record.transport_error = transport_error
            record.violations.append(Violation(ViolationKind.OBSERVER_ERROR, None, f"finish: {type(exc).__name__}"))
        return (RECORD, fid, record)


class _FailedObserver:
    """Stands in for a ``StreamObserver`` that could not be built: counts bytes, and finishes
    with the skeleton plus one ``observer_error``."""

    needs_arrival_times = False

    def __init__(self, exchange: Exchange, detail: str) -> None:
        self._exchange = exchange
        exchange.violations.append(Violation(ViolationKind.OBSERVER_ERROR, None, detail))

    def feed(self, data: bytes, now_s: float) -> None:
        self._exchange.response_bytes += len(data)

    def fail(self, exc: BaseException) -> None:
        pass

    def finish(self, end, *, now_s, ended_at_s=None, transport_error=None) -> Exchange:
        ex = self._exchange
        ex.transport_error = transport_error
        ex.ended_at = utc_from_epoch(ended_at_s if ended_at_s is not None else now_s)
        Reassembler(ex.request, limits=Limits()).finish(
            ex, end, request_start_s=ex.started_at.timestamp(), readable=False
        )
        return ex


def serve(data_fd: int, records_fd: int) -> int:
    """The worker's loop: reads frames from ``data_fd`` until STOP or EOF, applies them
    (``WorkerCore``) and writes the answers to ``records_fd`` (blocking: the parent reads them
    from its event loop). Returns the exit status: 0 after STOP, 1 after EOF without STOP (the
    parent went away) or a corrupt frame."""
    core = WorkerCore()
    reader = FrameReader()
    out = os.fdopen(records_fd, "wb", buffering=0)
    _set_pipe_size(records_fd)
    while True:
        try:
            data = os.read(data_fd, READ_BYTES)
        except InterruptedError:  # pragma: no cover - PEP 475 retries; kept for clarity
            continue
        if not data:
            log.warning("observer worker: the proxy closed the data pipe without STOP (%d flows open)", core.open_flows)
            return 1
        try:
            messages = reader.feed(data)
        except Exception:  # noqa: BLE001 - corrupt pipe: nothing after it can be trusted
            log.error("observer worker: corrupt frame; exiting", exc_info=True)
            return 1
        answers: list[bytes] = []
        for msg in messages:
            if msg[0] == STOP:
                answers.append(encode((STOPPED,)))
                out.write(b"".join(answers))
                return 0
            try:
                answers.extend(encode(a) for a in core.handle(msg))
            except Exception:  # noqa: BLE001 - one bad message must not stop the others
                log.error("observer worker: message %r failed", msg[:2], exc_info=True)
        if answers:
            out.write(b"".join(answers))


def main(argv: list[str] | None = None) -> int:
    """``python -m observer.worker DATA_FD RECORDS_FD PARENT_PID [NICE]`` (started by
    ``WorkerLink``). ``NICE`` (default 0) is added to the worker's scheduling niceness
    (``os.nice``): when the proxy and its worker compete for a core, forwarding goes first.

    SIGINT and SIGTERM are ignored: a Ctrl-C reaches the whole foreground process group, and
    systemd's default ``KillMode=control-group`` sends SIGTERM to every process of the service at
    once; the proxy must still be able to hand over its last chunks and get the records of the
    open streams (trial finding: with SIGTERM the worker died first and those records lost their
    text). The proxy stops the worker with STOP; if the proxy dies, the worker gets SIGKILL from
    the kernel (``observer.lifetime``), or EOF on its pipe. Both are set up by the first
    statements of this module when it runs as ``__main__``, before its slower imports."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 2 and not parent_alive(int(args[2])):
        return 1  # the proxy died before the parent-death signal was armed
    if len(args) > 3 and int(args[3]):
        try:
            os.nice(int(args[3]))
        except OSError:  # not permitted (a negative value without privileges): keep the proxy's
            pass
    logging.basicConfig(level=logging.WARNING, format="observer-worker %(levelname)s %(message)s")
    return serve(int(args[0]), int(args[1]))


# ----------------------------------------------------------------------------- parent side


class WorkerLink:
    """The proxy's handle on one worker process (runs on the proxy's asyncio loop; no method
    blocks except ``close``).

    - ``start(loop)`` starts ``python -m observer.worker`` (``python``: default ``sys.executable``;
      ``PYTHONPATH``: this process's ``sys.path``) with two pipes; raises ``OSError`` if it cannot
      be started. A worker that starts but cannot run (an import error) exits: a death, as below.
    - ``open`` queues a flow's first frame and returns True, or False (nothing queued: the caller
      observes that flow itself) when the worker is gone or over half of ``max_buffer_bytes`` is
      waiting for it (a worker that fell behind gets no new flows, and the flows it has keep the
      other half for their data).
    - ``open``/``finish`` write what the pipe takes now; the rest is written by a loop writer
      callback when the pipe drains. ``data`` stages a flow's batch; the batches
      staged during one loop callback go out as one DATA frame, from a ``call_soon`` callback or
      before the next other frame (so the order of a flow's frames is kept). ``data`` returns
      False, staging nothing, when the queued and staged bytes would pass ``max_buffer_bytes``
      (the caller stops observing that flow); ``finish`` frames are small and always queued.
    - A worker that makes no progress (reads nothing from the data pipe and answers nothing)
      for ``stall_timeout_s`` seconds while frames or answers are outstanding is hung: it is
      killed, a death as below (checked every ``stall_timeout_s / 4`` seconds).
    - ``on_record(fid, record)`` is called from the loop for each record that comes back;
      ``on_death(reason)`` once when the worker is found dead (EOF, broken pipe, corrupt frame,
      ``close`` timing out). After a death every method is a no-op and ``alive`` is False.
    - ``close(timeout_s)`` (shutdown, blocking up to ``timeout_s`` seconds): writes what is queued,
      sends STOP and delivers the records that come back until STOPPED; then reaps the process.
    """

    def __init__(
        self,
        *,
        on_record: Callable[[int, Exchange], None],
        on_death: Callable[[str], None],
        max_buffer_bytes: int = 64 << 20,
        python: str | None = None,
        stall_timeout_s: float = 60.0,
        nice: int = 0,
    ) -> None:
        self._on_record = on_record
        self._on_death = on_death
        self.max_buffer_bytes = max_buffer_bytes
        self._python = python or sys.executable
        self._proc: subprocess.Popen | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wfd = -1  # data pipe, our end (non-blocking)
        self._rfd = -1  # records pipe, our end (non-blocking)
        self._out: deque[memoryview] = deque()
        self._out_bytes = 0
        self._writing = False  # a loop writer callback is registered
        self._reader = FrameReader()
        self._staged: list[tuple[int, list]] = []  # (fid, pending) for the next DATA frame
        self._staged_bytes = 0  # chunk bytes in _staged
        self.stall_timeout_s = stall_timeout_s
        self.nice = nice  # added to the worker's niceness (see ``main``)
        self._progress = 0.0  # monotonic seconds of the worker's last read of ours or answer
        self._awaiting = 0  # FINISH frames sent whose RECORD has not come back
        self._watch_handle: asyncio.TimerHandle | None = None
        self.started_at = 0.0  # monotonic seconds of start()
        self.alive = False
        self.frames_sent = 0
        self.bytes_sent = 0
        self.data_refused = 0  # data frames not sent: over max_buffer_bytes

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def queued_bytes(self) -> int:
        """Bytes of frames written to no pipe yet."""
        return self._out_bytes

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        d_r, d_w = os.pipe()
        r_r, r_w = os.pipe()
        try:
            _set_pipe_size(d_w)
            # The proxy's own import path, so the worker imports the same ``observer`` package
            # (mitmdump may have found it through its script's directory, not site-packages).
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
            self._proc = subprocess.Popen(
                [self._python, "-m", "observer.worker", str(d_r), str(r_w), str(os.getpid()), str(self.nice)],
                pass_fds=(d_r, r_w),
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
        except BaseException:
            for fd in (d_r, d_w, r_r, r_w):
                os.close(fd)
            raise
        os.close(d_r)
        os.close(r_w)
        os.set_blocking(d_w, False)
        os.set_blocking(r_r, False)
        self._wfd, self._rfd, self._loop = d_w, r_r, loop
        self.alive = True
        self._progress = self.started_at = time.monotonic()
        loop.add_reader(r_r, self._on_readable)
        self._watch_handle = loop.call_later(self.stall_timeout_s / 4, self._watch)

    def _watch(self) -> None:
        """The stall check (a loop timer, re-armed while the worker lives)."""
        self._watch_handle = None
        if not self.alive:
            return
        idle = time.monotonic() - self._progress
        if (self._out or self._awaiting) and idle > self.stall_timeout_s:
            self._died(f"worker stalled: no progress for {idle:.0f} s")
            return
        self._watch_handle = self._loop.call_later(self.stall_timeout_s / 4, self._watch)  # type: ignore[union-attr]

    # ----- sending -----
    def open(self, fid: int, dialect_name: str, exchange: Exchange, view: RequestView, status_code: int,
             content_type: str | None, content_encoding: str | None, limits: Limits) -> bool:  # fmt: skip
        """Opens flow ``fid`` in the worker; False (nothing sent) when the worker is gone, more
        than half the buffer bound is queued, or the flow cannot be pickled (a request nested
        ~900 levels is past pickle's recursion limit: trial finding, the record lost its text):
        the caller observes that flow in-process."""
        if not self.alive or self._out_bytes + self._staged_bytes > self.max_buffer_bytes // 2:
            return False
        try:
            frame = encode((OPEN, fid, dialect_name, exchange, view, status_code, content_type, content_encoding,
                            limits))  # fmt: skip
        except Exception:  # noqa: BLE001 - that flow is observed in-process instead
            log.warning("observer: record %s cannot be handed to the worker", exchange.id, exc_info=True)
            return False
        self.commit()  # staged data first: frames keep their order
        self._send(frame)
        return self.alive

    def data(self, fid: int, pending: list, nbytes: int) -> bool:
        """Stages ``pending`` (``[chunk, arrival_s, ...]`` of ``nbytes`` chunk bytes) for flow
        ``fid``; False (nothing staged) when the worker is gone or the bound would be passed."""
        if not self.alive:
            return False
        if self._out_bytes + self._staged_bytes + nbytes > self.max_buffer_bytes:
            self.data_refused += 1
            return False
        if not self._staged and self._loop is not None:
            self._loop.call_soon(self.commit)
        self._staged.append((fid, pending))
        self._staged_bytes += nbytes
        return True

    def commit(self) -> None:
        """Sends the staged batches as one DATA frame (no-op when none are staged)."""
        staged = self._staged
        if staged:
            self._staged = []
            self._staged_bytes = 0
            self._send(encode((DATA, staged)))

    def finish(self, fid: int, end: EndCause, now_s: float, ended_at_s: float | None, transport_error: str | None,
               skipped_bytes: int) -> None:  # fmt: skip
        self.commit()
        if self.alive:
            self._awaiting += 1
            if self._awaiting == 1:
                self._progress = time.monotonic()  # the wait for an answer starts now
        self._send(encode((FINISH, fid, end, now_s, ended_at_s, transport_error, skipped_bytes)))

    def _send(self, frame: bytes) -> None:
        if not self.alive:
            return
        self.frames_sent += 1
        self.bytes_sent += len(frame)
        if not self._out:
            if not self._awaiting:
                self._progress = time.monotonic()  # nothing was outstanding: the clock starts now
            try:
                n = os.write(self._wfd, frame)
            except BlockingIOError:
                n = 0
            except OSError as exc:
                self._pipe_failed(exc)
                return
            if n == len(frame):
                return
            frame = memoryview(frame)[n:]
        else:
            frame = memoryview(frame)
        self._out.append(frame)
        self._out_bytes += len(frame)
        if not self._writing and self._loop is not None:
            self._loop.add_writer(self._wfd, self._on_writable)
            self._writing = True

    def _write_queued(self) -> bool:
        """Writes queued frames until the pipe is full; True when nothing is left. Non-blocking."""
        out = self._out
        while out:
            head = out[0]
            try:
                n = os.write(self._wfd, head)
            except BlockingIOError:
                return False
            self._progress = time.monotonic()  # the worker read: there was room
            self._out_bytes -= n
            if n == len(head):
                out.popleft()
            else:
                out[0] = head[n:]
                return False
        return True

    def _on_writable(self) -> None:
        try:
            done = self._write_queued()
        except OSError as exc:
            self._pipe_failed(exc)
            return
        if done and self._writing:
            self._loop.remove_writer(self._wfd)  # type: ignore[union-attr]
            self._writing = False

    # ----- receiving -----
    def _on_readable(self) -> None:
        try:
            data = os.read(self._rfd, READ_BYTES)
        except BlockingIOError:
            return
        except OSError as exc:
            self._died(f"records pipe: {exc}")
            return
        if not data:
            self._died(f"worker exited ({self._exit_status()})")
            return
        self._progress = time.monotonic()
        self._deliver(data)

    def _deliver(self, data: bytes) -> bool:
        """Hands the records ``data`` completes to ``on_record``; True once STOPPED was read."""
        try:
            messages = self._reader.feed(data)
        except Exception as exc:  # noqa: BLE001
            self._died(f"corrupt records frame: {type(exc).__name__}: {exc}")
            return False
        stopped = False
        for msg in messages:
            if msg[0] == RECORD:
                self._awaiting -= 1
                try:
                    self._on_record(msg[1], msg[2])
                except Exception:  # noqa: BLE001 - a loop callback must not raise
                    log.error("observer: handling a worker record failed", exc_info=True)
            elif msg[0] == STOPPED:
                stopped = True
        return stopped

    # ----- ending -----
    def _exit_status(self) -> str:
        proc = self._proc
        if proc is None:
            return "not started"
        try:
            code = proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return "still running"
        return f"exit status {code}" if code >= 0 else f"killed by signal {-code}"

    def _detach(self) -> None:
        """Stops the loop callbacks and closes our pipe ends (idempotent)."""
        self.alive = False
        loop = self._loop
        for fd, writer in ((self._rfd, False), (self._wfd, True)):
            if fd < 0:
                continue
            if loop is not None and not loop.is_closed():
                try:
                    loop.remove_writer(fd) if writer else loop.remove_reader(fd)
                except Exception:  # noqa: BLE001
                    pass
            try:
                os.close(fd)
            except OSError:
                pass
        self._rfd = self._wfd = -1
        self._writing = False
        if self._watch_handle is not None:
            self._watch_handle.cancel()
            self._watch_handle = None
        self._out.clear()
        self._out_bytes = 0
        self._staged = []
        self._staged_bytes = 0

    def _pipe_failed(self, exc: OSError) -> None:
        """A write to the data pipe failed. A broken pipe means the worker's end is closed, i.e.
        it exited: the reason is its exit status, as when its records pipe reaches EOF, whichever
        the proxy notices first (the e2e kill test saw either)."""
        if isinstance(exc, BrokenPipeError):
            self._died(f"worker exited ({self._exit_status()})")
        else:
            self._died(f"data pipe: {exc}")

    def _died(self, reason: str) -> None:
        if not self.alive:
            return
        self._detach()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            try:
                proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:  # pragma: no cover - a killed child always exits
                pass
        log.error("observer: the worker process is gone (%s); its open flows are recorded with observer_error", reason)
        self._on_death(reason)

    def close(self, timeout_s: float = 10.0) -> bool:
        """Shutdown: delivers every queued frame and STOP, then the records until STOPPED, for at
        most ``timeout_s`` seconds (blocking: the loop is stopping). True on a clean stop; False
        if the worker was dead or did not finish in time (``on_death`` then ran)."""
        self.commit()
        if not self.alive:
            return False
        loop = self._loop
        if self._writing and loop is not None and not loop.is_closed():
            loop.remove_writer(self._wfd)
        if loop is not None and not loop.is_closed():
            loop.remove_reader(self._rfd)
        self._writing = False
        self._send_raw_stop()
        deadline = time.monotonic() + timeout_s
        stopped = False
        with selectors.DefaultSelector() as sel:
            sel.register(self._rfd, selectors.EVENT_READ, "r")
            if self._out:
                sel.register(self._wfd, selectors.EVENT_WRITE, "w")
            while not stopped and self.alive:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                for key, _ in sel.select(timeout=left):
                    if key.data == "w":
                        try:
                            if self._write_queued():
                                sel.unregister(self._wfd)
                        except OSError as exc:
                            self._pipe_failed(exc)
                            return False
                    else:
                        try:
                            data = os.read(self._rfd, READ_BYTES)
                        except BlockingIOError:
                            continue
                        if not data:
                            self._died(f"worker exited before STOPPED ({self._exit_status()})")
                            return False
                        stopped = self._deliver(data) or stopped
        if not stopped:
            if self.alive:
                self._died(f"worker did not stop within {timeout_s:g} s")
            return False
        self._detach()
        try:
            self._proc.wait(timeout=max(0.1, deadline - time.monotonic()))  # type: ignore[union-attr]
        except subprocess.TimeoutExpired:
            self._proc.kill()  # type: ignore[union-attr]
            self._proc.wait()  # type: ignore[union-attr]
        return True

    def _send_raw_stop(self) -> None:
        frame = memoryview(encode((STOP,)))
        self._out.append(frame)
        self._out_bytes += len(frame)
        try:
            self._write_queued()
        except OSError as exc:
            self._pipe_failed(exc)


__all__ = ["FrameReader", "WorkerCore", "WorkerDied", "WorkerLink", "WorkerOverloaded", "encode", "serve"]


if __name__ == "__main__":
    sys.exit(main())
