"""The observer worker: a child process that parses streamed responses for the proxy
(``python -m observer.capture.worker``), so the parse leaves the proxy's event loop and its core.

The proxy keeps only what the record cannot do without (each chunk's arrival time, the batching,
one pipe write per batch) and sends the worker a ``ResponseSpec`` per flow (no prompts), then
its data; the worker answers each ``Finish`` with the response's ``Facts`` (messages:
``observer.capture.messages``). It parses with the same calls as the in-process backend
(``observer.capture.parsing``), so the facts are the same whichever process made them, and it
builds its dialect registry from the same factory name as the proxy (``load_registry``).

Failure modes on this side: a bug in one flow's parse stops that flow's observation
(``observer_error``) and the others go on; a corrupt frame or EOF without ``Stop`` (the proxy
went away) ends the process. The proxy's side of each failure is ``observer.capture.link``.
The parent going away: the kernel sends the worker SIGKILL (``observer.lifetime``), which also
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

import logging
import os
import sys

from observer.capture.messages import Data, Facts, Finish, FrameReader, Open, Stop, Stopped, Turn, encode
from observer.capture.parsing import Observer, final_facts, open_observer
from observer.capture.pipes import READ_BYTES, set_pipe_size
from observer.dialects.registry import DEFAULT_REGISTRY, load_registry
from observer.lifetime import parent_alive
from observer.tap import feed_pending

log = logging.getLogger("observer.worker")


class WorkerCore:
    """The worker's sans-IO part: ``handle(message)`` applies one decoded message and returns the
    answers to send. Every exception is contained per flow: a failed feed stops that flow's
    observation (``observer_error``) and a failed finish still yields facts. A ``Data`` message
    is answered with a ``Turn`` for each turn of a multi-turn stream it ended. Raises
    ``ValueError`` for a message it does not know or a ``Finish`` of an unknown flow."""

    def __init__(self, registry_factory: str = DEFAULT_REGISTRY) -> None:
        self._registry = load_registry(registry_factory)
        self._flows: dict[str, Observer] = {}

    @property
    def open_flows(self) -> int:
        return len(self._flows)

    def handle(self, msg: object) -> list:
        cls = msg.__class__
        if cls is Data:
            flows = self._flows
            answers = []
            for fid, pending in msg.batches:  # type: ignore[attr-defined]
                obs = flows.get(fid)
                if obs is not None:
                    feed_pending(obs, pending)  # type: ignore[arg-type]
                    if obs.turns:
                        answers += [Turn(fid, i, facts) for i, facts in obs.take_turns()]
            return answers
        if cls is Open:
            self._flows[msg.fid] = open_observer(self._registry, msg.spec, "worker open")  # type: ignore[attr-defined]
            return []
        if cls is Finish:
            obs = self._flows.pop(msg.fid, None)  # type: ignore[attr-defined]
            if obs is None:
                raise ValueError(f"Finish for unknown flow {msg.fid}")  # type: ignore[attr-defined]
            return [Facts(msg.fid, final_facts(obs, msg.end, msg.skipped_bytes))]  # type: ignore[attr-defined]
        raise ValueError(f"unknown worker message {cls.__name__}")


def serve(data_fd: int, records_fd: int, registry_factory: str = DEFAULT_REGISTRY) -> int:
    """The worker's loop: reads frames from ``data_fd`` until ``Stop`` or EOF, applies them
    (``WorkerCore``) and writes the answers to ``records_fd`` (blocking: the parent reads them
    from its event loop). Returns the exit status: 0 after ``Stop``, 1 after EOF without it (the
    parent went away), a corrupt frame or a registry that cannot be built. Closes
    ``records_fd`` when it returns (the proxy then reads EOF)."""
    try:
        core = WorkerCore(registry_factory)
    except Exception:  # noqa: BLE001 - the proxy sees the exit and observes in-process
        log.error("observer worker: cannot build the dialect registry %s", registry_factory, exc_info=True)
        os.close(records_fd)
        return 1
    set_pipe_size(records_fd)
    with os.fdopen(records_fd, "wb", buffering=0) as out:
        return _loop(core, data_fd, out)


def _loop(core: WorkerCore, data_fd: int, out) -> int:
    reader = FrameReader()
    while True:
        try:
            data = os.read(data_fd, READ_BYTES)
        except InterruptedError:  # pragma: no cover - PEP 475 retries; kept for clarity
            continue
        if not data:
            log.warning("observer worker: the proxy closed the data pipe without Stop (%d flows open)", core.open_flows)
            return 1
        try:
            messages = reader.feed(data)
        except Exception:  # noqa: BLE001 - corrupt pipe: nothing after it can be trusted
            log.error("observer worker: corrupt frame; exiting", exc_info=True)
            return 1
        answers: list[bytes] = []
        for msg in messages:
            if msg.__class__ is Stop:
                answers.append(encode(Stopped()))
                out.write(b"".join(answers))
                return 0
            try:
                answers.extend(encode(a) for a in core.handle(msg))
            except Exception:  # noqa: BLE001 - one bad message must not stop the others
                log.error("observer worker: a %s message failed", type(msg).__name__, exc_info=True)
        if answers:
            out.write(b"".join(answers))


def main(argv: list[str] | None = None) -> int:
    """``python -m observer.capture.worker DATA_FD RECORDS_FD PARENT_PID [NICE [REGISTRY]]``
    (started by ``observer.capture.link.WorkerLink``). ``NICE`` (default 0) is added to the
    worker's scheduling niceness (``os.nice``): when the proxy and its worker compete for a core,
    forwarding goes first. ``REGISTRY``: the dialect registry factory (``load_registry``).

    SIGINT and SIGTERM are ignored: a Ctrl-C reaches the whole foreground process group, and
    systemd's default ``KillMode=control-group`` sends SIGTERM to every process of the service at
    once; the proxy must still be able to hand over its last chunks and get the facts of the
    open streams. The proxy stops the worker with ``Stop``; if the proxy dies, the worker gets
    SIGKILL from the kernel (``observer.lifetime``), or EOF on its pipe. Both are set up by the
    first statements of this module when it runs as ``__main__``, before its slower imports."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 2 and not parent_alive(int(args[2])):
        return 1  # the proxy died before the parent-death signal was armed
    if len(args) > 3 and int(args[3]):
        try:
            os.nice(int(args[3]))
        except OSError:  # not permitted (a negative value without privileges): keep the proxy's
            pass
    logging.basicConfig(level=logging.WARNING, format="observer-worker %(levelname)s %(message)s")
    return serve(int(args[0]), int(args[1]), args[4] if len(args) > 4 else DEFAULT_REGISTRY)


__all__ = ["WorkerCore", "main", "serve"]


if __name__ == "__main__":
    sys.exit(main())
