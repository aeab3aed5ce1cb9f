"""The proxy's side of its worker process (``observer.capture.worker``): start it, send it
frames without ever blocking the proxy's loop, read back the facts, notice when it dies, hangs or
falls behind.

Failure modes, each decided (the failover between worker and in-process parsing is
``observer.capture.backend``'s):

- The worker dies or cannot start (EOF on the records pipe, a broken data pipe, a corrupt
  frame): ``on_death`` gets the reason once; from then on every method is a no-op.
- The worker falls behind: at most ``max_buffer_bytes`` of frames wait in the proxy's memory;
  ``data`` refuses a batch that would cross it, and ``open`` refuses new flows while over half
  of it waits. The client's bytes are never held: the proxy never waits for the worker.
- The worker hangs (no read and no answer for ``stall_timeout_s`` while something is
  outstanding): it is killed, then as when it dies ("worker stalled").
"""

from __future__ import annotations

import asyncio
import logging
import os
import selectors
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable

from observer.capture.messages import Data, Facts, Finish, FrameReader, Open, Stop, Stopped, Turn, encode
from observer.capture.pipes import READ_BYTES, set_pipe_size
from observer.dialects.registry import DEFAULT_REGISTRY
from observer.lifetime import death_signal_setter
from observer.response import ResponseFacts, ResponseSpec, StreamEnd

log = logging.getLogger("observer.capture")


class WorkerLink:
    """The proxy's handle on one worker process (runs on the proxy's asyncio loop; no method
    blocks except ``close``).

    - ``start(loop)`` starts ``python -m observer.capture.worker`` (``python``: default ``sys.executable``;
      ``PYTHONPATH``: this process's ``sys.path``) with two pipes; raises ``OSError`` if it cannot
      be started. A worker that starts but cannot run (an import error) exits: a death, as below.
    - ``open`` queues a flow's first frame and returns True, or False (nothing queued: the caller
      observes that flow itself) when the worker is gone or over half of ``max_buffer_bytes`` is
      waiting for it (a worker that fell behind gets no new flows, and the flows it has keep the
      other half for their data).
    - ``open``/``finish`` write what the pipe takes now; the rest is written by a loop writer
      callback when the pipe drains. ``data`` stages a flow's batch; the batches
      staged during one loop callback go out as one ``Data`` frame, from a ``call_soon`` callback or
      before the next other frame (so the order of a flow's frames is kept). ``data`` returns
      False, staging nothing, when the queued and staged bytes would pass ``max_buffer_bytes``
      (the caller stops observing that flow); ``finish`` frames are small and always queued.
    - A worker that makes no progress (reads nothing from the data pipe and answers nothing)
      for ``stall_timeout_s`` seconds while frames or answers are outstanding is hung: it is
      killed, a death as below (checked every ``stall_timeout_s / 4`` seconds).
    - ``on_facts(fid, facts)`` is called from the loop for each flow's facts that come back
      (``None``: nothing after its last turn), ``on_turn(fid, index, facts)`` for each turn of
      a multi-turn stream the worker cut (before that flow's facts);
      ``on_death(reason)`` once when the worker is found dead (EOF, broken pipe, corrupt frame,
      ``close`` timing out). After a death every method is a no-op and ``alive`` is False.
    - ``close(timeout_s)`` (shutdown, blocking up to ``timeout_s`` seconds): writes what is queued,
      sends ``Stop`` and delivers the facts that come back until ``Stopped``; then reaps the process.
    """

    def __init__(
        self,
        *,
        on_facts: Callable[[str, ResponseFacts | None], None],
        on_death: Callable[[str], None],
        on_turn: Callable[[str, int, ResponseFacts], None] | None = None,
        max_buffer_bytes: int = 64 << 20,
        python: str | None = None,
        stall_timeout_s: float = 60.0,
        nice: int = 0,
        registry_factory: str = DEFAULT_REGISTRY,
    ) -> None:
        self._on_facts = on_facts
        self._on_death = on_death
        self._on_turn = on_turn
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
        self._staged: list[tuple[str, list]] = []  # (fid, pending) for the next DATA frame
        self._staged_bytes = 0  # chunk bytes in _staged
        self.stall_timeout_s = stall_timeout_s
        self.nice = nice  # added to the worker's niceness (``observer.capture.worker.main``)
        self.registry_factory = registry_factory  # the worker builds its dialects from this
        self._progress = 0.0  # monotonic seconds of the worker's last read of ours or answer
        self._awaiting = 0  # Finish frames sent whose Facts have not come back
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
            set_pipe_size(d_w)
            # The proxy's own import path, so the worker imports the same ``observer`` package
            # (mitmdump may have found it through its script's directory, not site-packages).
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
            self._proc = subprocess.Popen(
                [
                    self._python,
                    "-m",
                    "observer.capture.worker",
                    str(d_r),
                    str(r_w),
                    str(os.getpid()),
                    str(self.nice),
                    self.registry_factory,
                ],
                pass_fds=(d_r, r_w),
                preexec_fn=death_signal_setter(signal.SIGKILL),  # before its first statement, too
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
    def open(self, fid: str, spec: ResponseSpec) -> bool:
        """Opens flow ``fid`` in the worker; False (nothing sent) when the worker is gone or more
        than half the buffer bound is queued: the caller observes that flow in-process."""
        if not self.alive or self._out_bytes + self._staged_bytes > self.max_buffer_bytes // 2:
            return False
        self.commit()  # staged data first: frames keep their order
        self._send(encode(Open(fid, spec)))
        return self.alive

    def data(self, fid: str, pending: list, nbytes: int) -> bool:
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
            self._send(encode(Data(staged)))

    def finish(self, fid: str, end: StreamEnd, skipped_bytes: int) -> None:
        """Asks for flow ``fid``'s facts (``skipped_bytes``: forwarded but not sent)."""
        self.commit()
        if self.alive:
            self._awaiting += 1
            if self._awaiting == 1:
                self._progress = time.monotonic()  # the wait for an answer starts now
        self._send(encode(Finish(fid, end, skipped_bytes)))

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
        """Hands the facts ``data`` completes to ``on_facts``; True once ``Stopped`` was read."""
        try:
            messages = self._reader.feed(data)
        except Exception as exc:  # noqa: BLE001
            self._died(f"corrupt records frame: {type(exc).__name__}: {exc}")
            return False
        stopped = False
        for msg in messages:
            if msg.__class__ is Facts:
                self._awaiting -= 1
                try:
                    self._on_facts(msg.fid, msg.facts)
                except Exception:  # noqa: BLE001 - a loop callback must not raise
                    log.error("observer: handling a worker's facts failed", exc_info=True)
            elif msg.__class__ is Turn:
                if self._on_turn is not None:
                    try:
                        self._on_turn(msg.fid, msg.index, msg.facts)
                    except Exception:  # noqa: BLE001 - a loop callback must not raise
                        log.error("observer: handling a worker's turn failed", exc_info=True)
            elif msg.__class__ is Stopped:
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
        """Shutdown: delivers every queued frame and ``Stop``, then the facts until ``Stopped``, for at
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
        frame = memoryview(encode(Stop()))
        self._out.append(frame)
        self._out_bytes += len(frame)
        try:
            self._write_queued()
        except OSError as exc:
            self._pipe_failed(exc)


__all__ = ["WorkerLink"]
