"""The flow table and finishing: what the proxy keeps per observed flow until its record is
made, and the one path from a flow's end to its record (``FlowTable.finish`` -> the backend's
facts -> ``observer.response.assemble`` -> redaction -> the sink). A multi-turn stream's turns
take the same path as each is cut (``FlowTable.on_turn``; ids and skeletons:
``observer.capture.turns``), while the stream is still open."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from observer.capture.backend import Backend
from observer.capture.request import RequestRead, RequestTap, incomplete_request
from observer.capture.tap import StreamTap
from observer.capture.turns import turn_skeleton
from observer.dialects.base import Dialect, RequestView
from observer.records import Exchange, Violation, ViolationKind, utc_from_epoch
from observer.redact import redact_record
from observer.response import ResponseFacts, StreamEnd, assemble, no_response_facts, unread_facts

log = logging.getLogger("observer.capture")

Sink = Callable[[Exchange], bool]


@dataclass(slots=True, eq=False)
class FlowState:
    """One observed flow: its ``dialect``, record skeleton ``exchange`` (HTTP and request
    facts), request ``view``, client connection id, whether the request body was read
    (``parsed``), its upload copy and stream tap, whether its backend has it (``opened``), the
    request-side ``violations``, and the credential values redacted from the request body
    (``secrets``) and those of its URL query and headers (``envelope_secrets``): in memory only,
    to scrub echoes of them from the record. ``metadata_only``: the request is not the dialect's
    (``not_llm_request``): neither body is kept, the response is not read, only its bytes
    counted (``unread_bytes``, by ``count_unread`` as mitmproxy's stream callable). A multi-turn
    stream: ``turns`` recorded so far, when the last one ended (``turn_ended_at``), and
    ``reread(until_s)``, which reads the request body as received by then (a streamed upload:
    the client's later turns travel in it), or ``None``. ``held``: the request's body was kept
    before any dialect claimed it (``capture.held``): it is read once its upload has ended."""

    dialect: Dialect
    exchange: Exchange
    view: RequestView
    client_id: str = ""
    parsed: bool = False
    request_tap: RequestTap | None = None
    tap: StreamTap | None = None
    opened: bool = False
    metadata_only: bool = False
    finished: bool = False
    violations: list[Violation] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)
    envelope_secrets: list[str] = field(default_factory=list)
    unread_bytes: int = 0
    turns: int = 0
    turn_ended_at: datetime | None = None
    reread: Callable[[float | None], RequestRead] | None = None
    held: bool = False

    def count_unread(self, chunk: bytes) -> bytes:
        """``flow.response.stream`` of a metadata-only exchange: the chunk passed on unchanged,
        its size counted (bytes as received, content-encoded)."""
        self.unread_bytes += len(chunk)
        return chunk

    def take(self, read: RequestRead) -> None:
        """Puts what reading the request body gave into the record: its facts and the values
        redacted from them, or, unparsed, only its size (violations are the caller's); a body
        that is not the dialect's request makes the record metadata only."""
        self.metadata_only = read.not_llm
        if read.facts is None:
            self.exchange.request.body_bytes = read.body_bytes
        else:
            self.exchange.request = read.facts
            self.secrets = read.secrets

    @property
    def key(self) -> str:
        """The flow's key in its backend: the record id."""
        return self.exchange.id


class FlowTable:
    """Every observed, unfinished flow (by mitmproxy flow id, and by client connection for the
    flows mitmproxy ends without a hook), and their finishing. ``sink`` receives each record and
    returns False when it had to drop it; ``sink`` may be set later (``set_sink``), with
    ``forget``: told the record id of a flow whose records all have other ids (a multi-turn
    stream's), so the journal no longer holds it open."""

    def __init__(
        self,
        backend: Backend | None = None,
        sink: Sink | None = None,
        observe: Callable[[Exchange], None] | None = None,
    ) -> None:
        self.backend = backend
        self._sink = sink
        self.observe = observe  # sees each record before the sink (metrics); must not raise
        self._open: dict[str, FlowState] = {}  # flow id -> state
        self._by_client: dict[str, set[str]] = {}  # client connection id -> ids of its open flows
        # record id -> observed flows whose backend facts have not come (streaming, or finished
        # and waiting): where a turn's or the end's facts find their flow
        self._unrecorded: dict[str, FlowState] = {}
        self._forget: Callable[[str], None] | None = None
        self.records_submitted = 0
        self.records_dropped = 0
        self.errors = 0

    def set_sink(self, sink: Sink | None, forget: Callable[[str], None] | None = None) -> None:
        self._sink = sink
        self._forget = forget

    # ----- the table -----
    def track(self, flow_id: str, state: FlowState) -> None:
        self._open[flow_id] = state
        self._by_client.setdefault(state.client_id, set()).add(flow_id)
        self._unrecorded[state.key] = state

    def untrack(self, flow_id: str) -> FlowState | None:
        state = self._open.pop(flow_id, None)
        if state is not None:
            ids = self._by_client.get(state.client_id)
            if ids is not None:
                ids.discard(flow_id)
                if not ids:
                    del self._by_client[state.client_id]
        return state

    @property
    def open_count(self) -> int:
        """Observed flows not finished yet."""
        return len(self._open)

    def of_client(self, client_id: str) -> list[FlowState]:
        """Removes and returns the open flows of client connection ``client_id``."""
        states = [self._open.pop(i, None) for i in self._by_client.pop(client_id, ())]
        return [s for s in states if s is not None and not s.finished]

    def take_all(self) -> list[FlowState]:
        """Removes and returns every open flow (shutdown)."""
        states, self._open, self._by_client = list(self._open.values()), {}, {}
        return states

    def on_turn(self, key: str, index: int, facts: ResponseFacts) -> None:
        """The backend's callback: turn ``index`` of flow ``key``'s multi-turn stream ended; its
        record is made now (``_turn``). Never raises."""
        state = self._unrecorded.get(key)
        if state is None:
            log.error("observer: a turn of unknown record %s", key)
            return
        try:
            self._turn(state, index, facts)
        except Exception:  # noqa: BLE001 - a callback of the backend's; the stream goes on
            self._failed("turn")

    # ----- finishing -----
    def finish(self, state: FlowState, end: StreamEnd, status: int | None = None) -> None:
        """Ends one flow (once): its pending chunks are handed over, then its facts asked of
        the backend (the record is made when they come, ``on_facts``), or, without a response,
        made now. ``status``: the response's status code, if any."""
        if state.finished:
            return
        state.finished = True
        try:
            if state.tap is not None:
                state.tap.flush()  # chunks still waiting for the batch sweep
            if not state.parsed:
                state.parsed = True
                seen = state.request_tap.total_bytes if state.request_tap is not None else None
                if seen is not None:
                    state.exchange.request.body_bytes = seen
                state.violations.append(incomplete_request(seen))
            if state.opened and self.backend is not None:
                self._unrecorded[state.key] = state  # (tracked already, unless a caller finishes an untracked flow)
                self.backend.finish(state.key, end)
                return
            self._unrecorded.pop(state.key, None)
            if status is not None:
                state.exchange.status_code = status
            request_id = state.exchange.request.request_id
            if state.metadata_only:
                self._record(state, unread_facts(end, state.exchange.status_code, request_id, state.unread_bytes))
            else:
                self._record(state, no_response_facts(end, request_id))
        except Exception as exc:  # noqa: BLE001 - never out of a hook; the record is still made
            self._failed("finish")
            self._unrecorded.pop(state.key, None)
            failure = Violation(ViolationKind.OBSERVER_ERROR, None, f"finish: {type(exc).__name__}")
            self._record(state, ResponseFacts(transport_error=end.transport_error, violations=[failure]))

    def on_facts(self, key: str, facts: ResponseFacts | None) -> None:
        """The backend's callback: a finished flow's facts. After turns (a multi-turn stream),
        they are the part after the last turn: a turn record of its own, or none (``None``)."""
        state = self._unrecorded.pop(key, None)
        if state is None:
            log.error("observer: facts for unknown record %s", key)
            return
        if not state.turns:
            self._record(state, facts if facts is not None else ResponseFacts())
            return
        try:
            if facts is not None:
                self._turn(state, state.turns, facts)
        finally:
            if self._forget is not None:
                self._forget(key)

    def _turn(self, state: FlowState, index: int, facts: ResponseFacts) -> None:
        """Records turn ``index``: the stream's skeleton copied with the turn's id. After the
        first turn, of a streamed upload: the request as it was when the turn ended (``reread``:
        a prompt the client sent later is the next turn's), with its credential values scrubbed
        as for the stream's (an upload that outgrew its copy: the stream's request, with the
        ``oversize_request``); the start is the client's first message after the previous turn
        ended (its follow-up; ``ttft_s`` counted from there), else that end."""
        request, secrets, violations = None, state.secrets, state.violations
        started = state.turn_ended_at if index else None
        tap = state.request_tap
        if index and state.reread is not None and tap is not None:
            ended_s = facts.ended_at.timestamp() if facts.ended_at is not None else None
            read = state.reread(ended_s)
            if read.facts is not None:  # the whole request read again: its violations replace the first read's
                request, secrets, violations = read.facts, [*state.secrets, *read.secrets], read.violations
            else:
                violations = [*violations, *read.violations]
            prev_s = started.timestamp() if started is not None else None
            sent_s = tap.first_after(prev_s) if prev_s is not None else None
            if sent_s is not None and (ended_s is None or sent_s <= ended_s):
                started = utc_from_epoch(sent_s)
                if facts.ttft_s is not None:
                    facts.ttft_s = max(0.0, facts.ttft_s - (sent_s - prev_s))  # type: ignore[operator]
        turn = turn_skeleton(state.exchange, index, started, request)
        state.turns = index + 1
        state.turn_ended_at = facts.ended_at
        self._record(
            FlowState(
                state.dialect,
                turn,
                state.view,
                state.client_id,
                violations=violations,
                secrets=secrets,
                envelope_secrets=state.envelope_secrets,
            ),
            facts,
        )

    def record(self, state: FlowState, facts: ResponseFacts) -> None:
        """Makes the record of a flow whose facts the caller has (``capture.sockets``: a
        WebSocket turn): as for a finished flow (``_record``)."""
        self._record(state, facts)

    def _record(self, state: FlowState, facts: ResponseFacts) -> None:
        """Assembles the record, removes echoes of the request's credential values and
        credentials in its request ids (``observer.redact.redact_record``), and submits it."""
        record = assemble(state.exchange, state.violations, facts)
        try:
            redact_record(record, [*state.envelope_secrets, *state.secrets])
        except Exception:  # noqa: BLE001 - never lose the record
            self._failed("scrub")
        if self.observe is not None:
            self.observe(record)
        sink = self._sink
        if sink is None:
            self.records_dropped += 1
            log.error("observer: no record sink; record %s dropped", record.id)
            return
        try:
            accepted = sink(record)
        except Exception:  # noqa: BLE001
            accepted = False
            log.error("observer: record sink failed; record %s dropped", record.id, exc_info=True)
        if accepted:
            self.records_submitted += 1
        else:
            self.records_dropped += 1

    def _failed(self, what: str) -> None:
        self.errors += 1
        log.error("observer: %s failed; the flow passes through unobserved", what, exc_info=True)


__all__ = ["FlowState", "FlowTable", "Sink"]
