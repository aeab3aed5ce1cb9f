"""Where responses are parsed: the one seam between the proxy's flows and their parse.

A ``Backend`` is opened per flow with its ``ResponseSpec``, fed the flow's chunks, and finished
with the ``StreamEnd``; the ``ResponseFacts`` come back through the one ``on_facts(key, facts)``
callback it was built with (at once in-process, later from the worker), ``None`` when a
multi-turn stream had nothing after its last turn; each turn of such a stream comes through
``on_turn(key, index, facts)`` as soon as it is cut (in-process: inside ``data``), always before
that flow's ``on_facts``. Two implementations:
``InProcessBackend`` (the proxy's own thread) and ``FailoverBackend`` (the worker process, with
the in-process backend for what the worker cannot take, and the policy between the two).
No method raises: a failure is recorded on the flow's facts (``observer_error``)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from observer.capture.link import WorkerLink
from observer.capture.parsing import Observer, WorkerDied, failed_observer, final_facts, open_observer
from observer.dialects.registry import DialectRegistry
from observer.response import ResponseFacts, ResponseSpec, StreamEnd
from observer.tap import feed_pending

log = logging.getLogger("observer.capture")

OnFacts = Callable[[str, ResponseFacts | None], None]
OnTurn = Callable[[str, int, ResponseFacts], None]
# Bytes a flow's tap collects before handing them over outside the timed sweep. In-process: the
# most one parse slice takes at once. Worker: a batch costs one pipe write and one worker wake-up
# whatever its size, so bigger (docs/performance.md, "Worker batches").
IN_PROCESS_FLUSH_BYTES = 32 << 10
WORKER_FLUSH_BYTES = 256 << 10


class Backend(Protocol):
    """Parses responses; ``key`` is the flow's record id."""

    def open(self, key: str, spec: ResponseSpec) -> int:
        """Starts parsing the response ``spec`` describes; returns the bytes of chunks the tap
        should hand over at once (the batch size that suits where it is parsed)."""
        ...

    def data(
        self,
        key: str,
        pending: list,
        nbytes: int,
        deadline: float | None = None,
        clock: Callable[[], float] | None = None,
    ) -> int:
        """Takes ``pending`` = ``[chunk, arrival_s, ...]`` (``nbytes`` chunk bytes, oldest
        first); returns how many items it consumed (``len(pending)`` unless ``deadline``, a
        ``clock()`` reading, passed first)."""
        ...

    def finish(self, key: str, end: StreamEnd) -> None:
        """The flow's transport ended: its facts go to ``on_facts``, now or later."""
        ...


class InProcessBackend:
    """Parses in the proxy process: the facts reach ``on_facts`` inside ``finish``, a turn
    ``on_turn`` inside the ``data`` call that ended it (not given: turns are not taken)."""

    def __init__(self, registry: DialectRegistry, on_facts: OnFacts, on_turn: OnTurn | None = None) -> None:
        self._registry = registry
        self._on_facts = on_facts
        self._on_turn = on_turn
        self._observers: dict[str, Observer] = {}

    def open(self, key: str, spec: ResponseSpec) -> int:
        self._observers[key] = open_observer(self._registry, spec, "open")
        return IN_PROCESS_FLUSH_BYTES

    def adopt(self, key: str, observer: Observer) -> None:
        """Takes over a flow whose observer was made elsewhere (a dead worker's flows)."""
        self._observers[key] = observer

    def data(
        self,
        key: str,
        pending: list,
        nbytes: int,
        deadline: float | None = None,
        clock: Callable[[], float] | None = None,
    ) -> int:
        obs = self._observers[key]
        consumed = feed_pending(obs, pending, deadline, clock)
        if obs.turns and self._on_turn is not None:
            for index, facts in obs.take_turns():
                self._on_turn(key, index, facts)
        return consumed

    def finish(self, key: str, end: StreamEnd) -> None:
        self._on_facts(key, final_facts(self._observers.pop(key), end))


@dataclass(slots=True)
class _Remote:
    """A flow the worker parses: its spec (to go on in-process if the worker dies), the bytes
    handed over and those forwarded but not handed over, and its end once asked for."""

    spec: ResponseSpec
    sent_bytes: int = 0
    skipped_bytes: int = 0
    end: StreamEnd | None = None


class FailoverBackend:
    """Parses in a worker process (``observer.capture.link.WorkerLink``), and in-process what
    the worker cannot take.

    Policy: a flow goes to the worker while it lives and is less than half behind (else
    in-process). A batch the worker's bound refuses ends that flow's observation: its later
    bytes are only counted and its facts get ``observer_error`` (``WorkerOverloaded``). A worker
    that dies hands every flow it held to the in-process backend with an observer that has
    failed (``observer_error`` naming the reason; it counts the bytes still to come), so the
    record keeps the skeleton and the bytes forwarded, not the stream's content; flows already
    finished get their facts at once. A dead worker that had lived ``restart_after_s`` seconds
    is replaced (e.g. after an out-of-memory kill); one that died sooner (a crash loop) is not:
    in-process until the proxy restarts. ``link_factory`` builds a ``WorkerLink`` (tests)."""

    def __init__(
        self,
        registry: DialectRegistry,
        registry_factory: str,
        on_facts: OnFacts,
        *,
        on_turn: OnTurn | None = None,
        buffer_bytes: int = 64 << 20,
        nice: int = 0,
        restart_after_s: float = 60.0,
        link_factory: Callable[..., WorkerLink] = WorkerLink,
    ) -> None:
        self._registry = registry
        self._registry_factory = registry_factory
        self._on_facts = on_facts
        self._on_turn = on_turn
        self._local = InProcessBackend(registry, on_facts, on_turn)
        self._remote: dict[str, _Remote] = {}
        self._link: WorkerLink | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._link_factory = link_factory
        self.buffer_bytes = buffer_bytes
        self.nice = nice
        self.restart_after_s = restart_after_s
        self.worker_deaths = 0
        self._stopping = False

    @property
    def link(self) -> WorkerLink | None:
        """The live worker, if any."""
        return self._link

    def held(self, key: str) -> bool:
        """True while the worker parses flow ``key``."""
        return key in self._remote

    def sent_bytes(self, key: str) -> int:
        """Bytes of flow ``key`` handed to the worker so far."""
        remote = self._remote.get(key)
        return remote.sent_bytes if remote is not None else 0

    def skipped_bytes(self, key: str) -> int:
        """Bytes of flow ``key`` forwarded but not handed to the worker (over its bound)."""
        remote = self._remote.get(key)
        return remote.skipped_bytes if remote is not None else 0

    def start(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Starts the worker on ``loop``; False (flows parsed in-process) if it cannot start."""
        self._loop = loop
        link = self._link_factory(
            on_facts=self._worker_facts,
            on_death=self._worker_died,
            on_turn=self._worker_turn,
            max_buffer_bytes=self.buffer_bytes,
            nice=self.nice,
            registry_factory=self._registry_factory,
        )
        try:
            link.start(loop)
        except Exception:  # noqa: BLE001 - in-process instead
            log.error("observer: cannot start the worker process; observing in-process", exc_info=True)
            return False
        self._link = link
        log.info("observer: parsing streams in worker process %s", link.pid)
        return True

    def open(self, key: str, spec: ResponseSpec) -> int:
        link = self._link
        if link is not None and link.open(key, spec):
            self._remote[key] = _Remote(spec)
            return WORKER_FLUSH_BYTES
        return self._local.open(key, spec)

    def data(
        self,
        key: str,
        pending: list,
        nbytes: int,
        deadline: float | None = None,
        clock: Callable[[], float] | None = None,
    ) -> int:
        remote = self._remote.get(key)
        if remote is None:
            return self._local.data(key, pending, nbytes, deadline, clock)
        link = self._link
        if not remote.skipped_bytes and link is not None and link.data(key, pending, nbytes):
            remote.sent_bytes += nbytes
            return len(pending)
        if key not in self._remote:  # the worker was found dead just now: the flow went in-process
            return self._local.data(key, pending, nbytes, deadline, clock)
        if not remote.skipped_bytes and link is not None and link.alive:
            log.error(
                "observer: the worker fell behind (over observer_worker_buffer_mb); record %s: "
                "the rest of its stream is not observed",
                key,
            )
        # (A closed link: the addon stopped, e.g. a script reload; the flow is recorded.)
        remote.skipped_bytes += nbytes
        return len(pending)

    def finish(self, key: str, end: StreamEnd) -> None:
        remote = self._remote.get(key)
        if remote is None:
            self._local.finish(key, end)
            return
        remote.end = end
        assert self._link is not None  # a remote flow has a live link (a death empties _remote)
        self._link.finish(key, end, remote.skipped_bytes)

    def stopping(self) -> None:
        """The proxy is shutting down: a worker that dies from here on is not replaced."""
        self._stopping = True

    def close(self, timeout_s: float = 10.0) -> None:
        """Shutdown: the worker's last facts (or, if it fails to stop, in-process ones)."""
        self._stopping = True
        link = self._link
        if link is None:
            return
        stopped = link.close(timeout_s=timeout_s)
        log.info(
            "observer: worker %s (%d frames, %d bytes sent, %d data batches refused)",
            "stopped" if stopped else "lost",
            link.frames_sent,
            link.bytes_sent,
            link.data_refused,
        )
        self._link = None

    def _worker_turn(self, key: str, index: int, facts: ResponseFacts) -> None:
        if key in self._remote and self._on_turn is not None:
            self._on_turn(key, index, facts)

    def _worker_facts(self, key: str, facts: ResponseFacts | None) -> None:
        if self._remote.pop(key, None) is None:
            log.error("observer: the worker returned facts for unknown flow %s", key)
            return
        self._on_facts(key, facts)

    def _worker_died(self, reason: str) -> None:
        self.worker_deaths += 1
        link = self._link
        lived = time.monotonic() - link.started_at if link is not None else 0.0
        self._link = None
        remote, self._remote = self._remote, {}
        for key, r in remote.items():
            try:
                self._local.adopt(
                    key, failed_observer(self._registry, r.spec, WorkerDied(reason), r.sent_bytes + r.skipped_bytes)
                )
                if r.end is not None:
                    self._local.finish(key, r.end)
            except Exception:  # noqa: BLE001 - one flow's failure must not lose the others
                log.error("observer: moving flow %s off the dead worker failed", key, exc_info=True)
        if self._stopping or self._loop is None:
            return
        if lived >= self.restart_after_s:
            log.warning("observer: the worker had run %.0f s; starting a new one", lived)
            self.start(self._loop)
        else:
            log.error(
                "observer: the worker died %.1f s after it started; parsing in the proxy process from now on"
                " (restart the proxy to try a worker again)",
                lived,
            )


__all__ = ["IN_PROCESS_FLUSH_BYTES", "WORKER_FLUSH_BYTES", "Backend", "FailoverBackend", "InProcessBackend"]
