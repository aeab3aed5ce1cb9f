"""WebSocket observation: one socket's turns turned into records (issue 15 item 2).

mitmproxy relays a WebSocket message only after its ``websocket_message`` hook returns (shared
reference binary-formats §1.1), so the work per message here is small and bounded: the socket
dialect's session (``observer.dialects.copilot.CopilotSession``: framing and turn tracking)
and, per open turn, a ``Reassembler`` fed in this process (no worker: a turn's messages are few
and each is framed already). A turn's record is made when its session says it closed, or when
the socket ends or the proxy stops (then with what arrived). The hooks (``capture.hooks``) pass
plain values: this module does not import mitmproxy.

Records: one per turn, its id a UUID 5 of the flow id and the turn's key (``turn_record_id``),
its request the upgrade request's HTTP facts (URL credentials redacted, status 101) with the
turn's request facts, its start the client message that opened the turn. Memory: a socket holds
its session (bounded decoders) and its open turns (each a bounded ``Reassembler``); how many may
be open is the session's to bound (``observer.dialects.copilot.MAX_OPEN_TURNS``: past it the
session closes its oldest, with an ``oversize_record`` violation).

Crashes: with a ``journal``, each turn is an open exchange of its own (``OPEN`` with its record
skeleton when it opens, a ``DATA`` chunk of the canonical events each message added,
``observer.journal.turnlog``, handed to the journal in the tap batcher's sweeps, not on the
relay path: ``TurnLog``), closed by its record; a kill leaves it to journal recovery,
which rebuilds it from those events (``interrupted``, with what had arrived). The socket's raw
messages are never journaled (the client's may hold credentials; only the turn's redacted
request facts are).
"""

from __future__ import annotations

import copy
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from observer.capture.flows import FlowState, FlowTable
from observer.capture.request import FLOW_NAMESPACE, redacted, skeleton
from observer.capture.sender import stamp_sender
from observer.dialects.base import RequestView
from observer.dialects.copilot import TurnClosed, TurnEvents, TurnOpened
from observer.journal import turnlog
from observer.limits import Limits
from observer.reassembly import EndCause, Reassembler
from observer.records import RequestFacts, Violation, ViolationKind, utc_from_epoch
from observer.redact import REDACTED
from observer.response import ResponseFacts, ResponseSpec

log = logging.getLogger(__name__)


def turn_record_id(flow_id: str, key: str, n: int) -> str:
    """The record id of the ``n``-th turn (0-based) with key ``key`` of the socket flow ``flow_id``."""
    return str(uuid.uuid5(FLOW_NAMESPACE, f"mitmproxy-websocket:{flow_id}:{n}:{key}"))


class TurnLog:
    """One WebSocket turn's feed to the journal: the canonical events of each message are kept
    (``add``) and journaled as ``observer.journal.turnlog`` chunks in the ``batcher``'s next
    sweep (``observer.capture.batcher.Batched``), or at once without one; ``flush`` before the
    turn's record. Never raises (a failure is logged: the record is still made)."""

    __slots__ = ("_batcher", "_journal", "_key", "_pending", "queued")

    def __init__(self, journal: Any, key: str, batcher: Any) -> None:
        self._journal = journal
        self._key = key
        self._batcher = batcher
        self._pending: list = []  # items, arrival time, items, arrival time, ...
        self.queued = False  # in one of the batcher's queues (set and cleared by the batcher)

    def add(self, items: list, at_s: float) -> None:
        self._pending += (items, at_s)
        if not self.queued and (self._batcher is None or not self._batcher.mark(self)):
            self.flush()

    def observe(self, deadline: float | None, clock: Any) -> bool:
        self.flush()
        return True

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        if not pending:
            return
        try:
            chunks: list = []
            nbytes = 0
            for i in range(0, len(pending), 2):
                chunk = turnlog.encode(pending[i])
                chunks += (chunk, pending[i + 1])
                nbytes += len(chunk)
            self._journal.data(self._key, chunks, nbytes)
        except Exception:  # noqa: BLE001 - never out of a hook or a sweep
            log.error("observer: journaling a websocket turn's events failed", exc_info=True)


@dataclass(slots=True)
class _Open:
    state: FlowState
    reassembler: Reassembler
    started_s: float
    log: TurnLog | None = None


@dataclass(slots=True)
class Socket:
    """One observed socket: its dialect and session, the upgrade request (``view``, ``http``:
    scheme, host, port, path, method, http_version; ``secrets``: its header credentials;
    ``sender``: who sent it, ``observer.capture.sender``), the open
    turns by key, how many turns it has had, and its socket-level violations counted."""

    flow_id: str
    client_id: str
    dialect: Any
    session: Any
    view: RequestView
    http: dict[str, Any]
    secrets: list[str]
    turns: dict[str, _Open] = field(default_factory=dict)
    count: int = 0
    problems: int = 0
    sender: dict[str, str | None] = field(default_factory=dict)  # observer.capture.sender.sender_of


def redact_params(path: str, names: tuple[str, ...], removed: list[str]) -> str:
    """``path`` with the values of the query parameters ``names`` (case-insensitive) replaced by
    ``REDACTED`` (appended to ``removed``): the ones a socket dialect knows to be secrets though
    ``observer.redact`` does not name them (SignalR's ``id``, the connection token, ASP.NET
    SignalR "TransportProtocols.md": it must be kept private)."""
    base, sep, query = path.partition("?")
    if not sep or not names:
        return path
    wanted = {n.lower() for n in names}
    parts = []
    for part in query.split("&"):
        key, eq, value = part.partition("=")
        if eq and value and key.lower() in wanted:
            removed.append(unquote(value))
            part = f"{key}={REDACTED}"
        parts.append(part)
    return base + "?" + "&".join(parts)


class SocketRecorder:
    """Applies sessions' effects to turns and records them through ``flows`` (``FlowTable``)."""

    def __init__(self, flows: FlowTable, limits: Limits) -> None:
        self._flows = flows
        self.limits = limits  # the settings' (``configure`` replaces it)
        self.sockets: dict[str, Socket] = {}  # flow id -> observed socket
        self.journal: Any = None  # ``observer.journal.Journal`` once the proxy journals (module docstring)
        self.batcher: Any = None  # ``observer.capture.batcher.TapBatcher``: when turn events are journaled

    def message(self, sock: Socket, from_client: bool, content: bytes, at_s: float) -> None:
        """One WebSocket message of ``sock``."""
        self._apply(sock, sock.session.feed(from_client, content, at_s))

    def end(self, sock: Socket, by_client: bool | None, at_s: float, *, shutdown: bool = False) -> None:
        """``sock`` ended (or the proxy stops): its open turns are recorded, it is forgotten."""
        self._apply(sock, sock.session.close(by_client, at_s, shutdown=shutdown))
        for key in list(sock.turns):  # any the session did not close
            self._close(sock, key, EndCause.SHUTDOWN if shutdown else EndCause.UPSTREAM_FAILED, at_s)
        self.sockets.pop(sock.flow_id, None)

    def fail(self, sock: Socket, what: str, at_s: float) -> None:
        """An observer failure on ``sock``: its open turns are recorded with an ``observer_error``
        and the socket is no longer observed (its messages still pass)."""
        for turn in sock.turns.values():
            turn.reassembler.violation(Violation(ViolationKind.OBSERVER_ERROR, None, f"{what}: observation stopped"))
        for key in list(sock.turns):
            self._close(sock, key, EndCause.UPSTREAM_FAILED, at_s)
        self.sockets.pop(sock.flow_id, None)

    def _apply(self, sock: Socket, effects: list[Any]) -> None:
        for effect in effects:
            if isinstance(effect, TurnEvents):
                turn = sock.turns.get(effect.key)
                if turn is None:
                    continue
                turn.reassembler.apply_items(effect.items, effect.at_s)
                if turn.log is not None and effect.items:
                    turn.log.add(effect.items, effect.at_s)
            elif isinstance(effect, TurnOpened):
                self._open(sock, effect)
            elif isinstance(effect, TurnClosed):
                self._close(sock, effect.key, effect.cause, effect.at_s)
            elif isinstance(effect, Violation):
                sock.problems += 1
                if sock.problems == 1:
                    log.warning("observer: websocket %s%s: %s", sock.http["host"], sock.view.path_only, effect.detail)
                    if not sock.turns:  # nothing of it recorded otherwise: say so (trial finding)
                        self._unreadable(sock, effect, at_s=time.time())

    def _open(self, sock: Socket, opened: TurnOpened) -> None:
        if opened.key in sock.turns:  # the same key again: the earlier turn ends here
            self._close(sock, opened.key, EndCause.CLIENT_ABORTED, opened.at_s)
        removed = list(sock.secrets)
        path = redact_params(sock.http["path"], getattr(sock.dialect, "secret_query_params", ()), removed)
        ex = skeleton(
            sock.dialect,
            scheme=sock.http["scheme"],
            host=sock.http["host"],
            port=sock.http["port"],
            path=path,
            method=sock.http["method"],
            http_version=sock.http["http_version"],
            started_at_s=opened.at_s,
            removed=removed,
            record_id=turn_record_id(sock.flow_id, opened.key, sock.count),
        )
        sock.count += 1
        if sock.sender:
            stamp_sender(ex, sock.sender)
        ex.status_code = 101
        ex.request = opened.facts
        state = FlowState(sock.dialect, ex, sock.view, sock.client_id, envelope_secrets=removed)
        state.parsed = True
        state.violations.extend(opened.violations)
        # Credential-named fields of the request (as for an HTTP request: observer.redact), and
        # their values scrubbed from the answer too.
        state.secrets = redacted(opened.facts, state.violations)
        reassembler = Reassembler(opened.facts.tool_names, opened.facts.request_id, limits=self.limits)
        turn_log = None
        if self.journal is not None:
            spec = ResponseSpec(sock.dialect.name, 101, started_at_s=opened.at_s, path=ex.path, limits=self.limits)
            self.journal.open_exchange(ex.id, copy.copy(ex), spec, list(state.violations))
            turn_log = TurnLog(self.journal, ex.id, self.batcher)
        sock.turns[opened.key] = _Open(state, reassembler, opened.at_s, turn_log)

    def _unreadable(self, sock: Socket, problem: Violation, at_s: float) -> None:
        """A record for a socket on an LLM host whose traffic cannot be read (its first problem,
        outside any turn: a bad or missing handshake, a protocol not read here, broken framing):
        its HTTP facts, the violation, outcome ``unreadable``; at most one per socket."""
        key = "unreadable"
        self._open(sock, TurnOpened(key, RequestFacts(), [], at_s))
        sock.turns[key].reassembler.violation(problem)
        self._close(sock, key, EndCause.EOF, at_s, readable=False)

    def _close(self, sock: Socket, key: str, cause: EndCause, at_s: float, *, readable: bool = True) -> None:
        """Records turn ``key`` (if open) as ended by ``cause`` at ``at_s``; ``readable`` false:
        its traffic could not be read (outcome ``unreadable``, no ``missing_stream_end``)."""
        turn = sock.turns.pop(key, None)
        if turn is None:
            return
        if turn.log is not None:
            turn.log.flush()  # its events before its record
        facts = ResponseFacts()
        turn.reassembler.finish(facts, cause, request_start_s=turn.started_s, readable=readable)
        facts.ended_at = utc_from_epoch(at_s)
        turn.state.finished = True
        self._flows.record(turn.state, facts)


__all__ = ["Socket", "SocketRecorder", "TurnLog", "turn_record_id"]
