"""Reassembly: a sans-IO state machine from canonical events to one audit record.

Input: ``CanonicalEvent``s and ``Violation``s in wire order, each with the caller's clock
reading ``now_s`` (seconds since the epoch; the core reads no clock). Output: the response half
of an ``Exchange`` (text per block, tool calls, usage, stop reason and per-choice results,
response identity, error, request id, timing, violations, outcome).

Generic lifecycle rules enforced here (draft §5.4 "Stream Lifecycle", §8.2): events after
``stream.end`` (``event_after_end``, not applied), no ``stream.end`` before the stream ended
(``missing_stream_end``), a ``tool.call`` naming a tool the request did not declare
(``undeclared_tool``), a ``request_id`` differing from the request's ``metadata.request_id``
(``request_id_mismatch``, draft §4.6). Wire-level rules of a dialect (``seq``, ``type``) are the
dialect adapter's job.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from observer.events import (
    CanonicalEvent,
    ChoiceOpen,
    ContentDelta,
    ContentStop,
    ErrorEvent,
    ModelEvent,
    ResponseIdentity,
    StopEvent,
    StreamEnd,
    StreamStart,
    ToolCallDelta,
    ToolCallEvent,
    UsageEvent,
)
from observer.limits import DEFAULT_LIMITS, MAX_DETAIL_CHARS, MAX_MESSAGE_CHARS, MAX_NAME_CHARS, Limits, clip
from observer.records import Block, ErrorInfo, Outcome, ToolCall, Usage, Violation, ViolationKind

if TYPE_CHECKING:
    from observer.response import ResponseFacts


class EndCause(enum.StrEnum):
    """Why the byte stream stopped, as the transport saw it (not what the payload said)."""

    EOF = "eof"  # the upstream finished the body cleanly (mitmproxy ``response`` hook)
    CLIENT_ABORTED = "client_aborted"  # the client went away (mitmproxy ``error``: client side)
    UPSTREAM_FAILED = "upstream_failed"  # the upstream connection broke or reset mid-body
    SHUTDOWN = "shutdown"  # the observer stopped while the stream was still open


_COALESCE_PARTS = 256  # join a block's pieces this often: one-character deltas must not cost ~58 B each
_RUN_MAX = 256  # pieces a run holds before they are applied
MAX_USAGE_DETAILS = 32  # names kept per group of usage.details (a vendor's few; beyond: later names dropped)


class _Parts(list):
    """The text pieces of one block or tool call. ``joined`` counts the leading entries that
    are already coalesced runs; only the pieces after them are ever joined again, so each
    character is copied at most twice before ``finish`` (linear, not quadratic, in the
    stream's length) and the list holds about one entry per ``_COALESCE_PARTS`` deltas."""

    __slots__ = ("joined",)

    def __init__(self) -> None:
        super().__init__()
        self.joined = 0


def _coalesce(parts: _Parts) -> None:
    """Joins the pieces after the already-coalesced runs into one run."""
    j = parts.joined
    parts[j:] = ["".join(parts[j:])]
    parts.joined = j + 1


def _append(parts: _Parts, text: str) -> None:
    """Appends ``text``; every ``_COALESCE_PARTS`` new pieces are joined into one, so memory
    stays proportional to the characters kept, not to the number of deltas (amortised O(n))."""
    parts.append(text)
    if len(parts) - parts.joined >= _COALESCE_PARTS:
        _coalesce(parts)


def _fill_call(call: ToolCall, index: int | None, id: str | None, name: str | None) -> None:
    """Sets what a fragment tells of its call that earlier fragments did not."""
    if call.index is None:
        call.index = index
    if call.id is None:
        call.id = clip(id, MAX_NAME_CHARS)
    if call.name is None:
        call.name = clip(name, MAX_NAME_CHARS)


@dataclass(slots=True)
class _BlockState:
    index: int
    type: str
    parts: _Parts = field(default_factory=_Parts)
    stop_reason: str | None = None


class Reassembler:
    """Accumulates one response stream.

    Memory per stream is bounded by ``limits`` (``observer.limits.Limits``): generated text
    (``max_stream_text_chars``, all blocks and tool arguments together; beyond it text is
    dropped and one ``oversize_stream`` violation recorded), and the number of violations,
    tool calls and content blocks kept (``max_violations``, ``max_tool_calls``, ``max_blocks``;
    beyond them items are counted, not kept, and one ``oversize_record`` violation at the end
    says how many of each were dropped).

    Runs: consecutive text deltas of one block (or argument fragments of one tool call, same
    key, index, id and name) differ only in their text, and the only time ever read is the
    first text's, so after the first is applied the next non-empty ones are held in a run and
    applied together (one block lookup, one cap check, one ``extend``: cheaper per token, same
    record; docs/performance.md, "Runs"). Every other entry point applies the run first, so the
    state is always what one call per delta would have made.
    """

    def __init__(
        self, tool_names: Iterable[str] | None = (), request_id: str | None = None, *, limits: Limits = DEFAULT_LIMITS
    ) -> None:
        # The request's declared tools (draft §8.2); ``None``: the dialect's requests do not declare
        # tools (``observer.response.ResponseSpec.tool_names``), so no call is judged (``_judged``).
        self._declared = None if tool_names is None else frozenset(tool_names)
        self._request_meta_id = request_id  # the client's correlation id (draft §4.6), if the dialect has one
        self._limits = limits
        self._max_text_chars = limits.max_stream_text_chars
        self._text_chars = 0
        self._dropped: Counter[str] = Counter()
        self._blocks: dict[int, _BlockState] = {}
        self._tool_calls: list[ToolCall] = []
        self._fragments: dict[str, tuple[ToolCall, _Parts, int | None]] = {}  # key -> (call, parts, seq)
        self._usage = Usage()
        self._violations: list[Violation] = []
        self._model: str | None = None
        self._request_id: str | None = None
        self._stop_reason: str | None = None
        self._stop_reason_raw: str | None = None
        # choice -> (stop_reason, raw, the index of its text block)
        self._choices: dict[int, tuple[str | None, str | None, int]] = {}
        self._response_id: str | None = None
        self._system_fingerprint: str | None = None
        self._service_tier: str | None = None
        self._error: ErrorInfo | None = None
        self._started = False
        self._ended = False
        self._first_text_s: float | None = None
        self._events = 0
        self._oversize = False
        # The run (class docstring): pieces after the run's first, not yet applied; the run is a
        # text run (``_run_index``/``_run_type`` set) or a fragment run (``_run_key`` set, with
        # the index, id and name of its fragments), or none.
        self._run: list[str] = []
        self._run_index: int | None = None
        self._run_type: str | None = None
        self._run_key: str | None = None
        self._run_fi: int | None = None
        self._run_fid: str | None = None
        self._run_fname: str | None = None

    @property
    def ended(self) -> bool:
        """True once ``stream.end`` was applied."""
        return self._ended

    @property
    def untouched(self) -> bool:
        """True while nothing a record holds was applied: no block, tool call, model, stop
        reason, usage, error or violation (``stream.start``, ``stream.end`` and messages the
        dialect maps to nothing, such as heartbeats, do not count). The part of a multi-turn
        stream after its last turn is discarded when it is untouched (``observer.tap``)."""
        return not (
            self._blocks
            or self._run
            or self._tool_calls
            or self._fragments
            or self._violations
            or self._dropped
            or self._model is not None
            or self._stop_reason is not None
            or self._usage.reported
            or self._error is not None
        )

    @property
    def first_text_s(self) -> float | None:
        """The clock reading (epoch seconds) of the first non-empty text delta, or ``None``."""
        return self._first_text_s

    def violation(self, v: Violation) -> None:
        """Records a violation found by a lower layer (wire decoder, dialect adapter, tap)."""
        if self._run:
            self._flush_run()
        if len(self._violations) < self._limits.max_violations:
            if len(v.detail) > MAX_DETAIL_CHARS:
                v = Violation(v.kind, v.seq, clip(v.detail, MAX_DETAIL_CHARS) or "")
            self._violations.append(v)
        else:
            self._dropped[f"violation {v.kind}"] += 1

    def apply(self, ev: CanonicalEvent, now_s: float) -> None:
        """Applies one canonical event observed at ``now_s`` (epoch seconds)."""
        cls = ev.__class__
        if cls is ContentDelta and not self._ended:  # the hot path: most events of every stream
            self.text(ev.index, ev.block_type, ev.text, now_s)
            return
        if self._run:
            self._flush_run()
        if self._ended:
            self.violation(
                Violation(ViolationKind.EVENT_AFTER_END, ev.seq, f"{_type_name(ev)} after stream.end (ignored)")
            )
            return
        if cls is ResponseIdentity:  # metadata of the response, not one of its events (draft §5.3)
            self._on_identity(ev)
            return
        if cls is ChoiceOpen:  # metadata too: which choices the response has
            if ev.choice not in self._choices and len(self._choices) < self._limits.max_blocks:
                self._choices[ev.choice] = (None, None, ev.text_block)
            return
        self._events += 1
        if cls is ToolCallDelta:
            self._on_tool_fragment(ev.seq, ev.key, ev.index, ev.id, ev.name, ev.arguments)
            return
        match ev:
            case StreamStart():
                self._started = True
                if ev.model is not None:
                    self._model = clip(ev.model, MAX_NAME_CHARS)
                self._check_request_id(ev.request_id, ev.seq, "stream.start")
            case ContentStop():
                block = self._block(ev.index, "text")
                reason = clip(ev.stop_reason, MAX_NAME_CHARS)
                if block is not None:
                    block.stop_reason = reason
                self._stop_reason = reason
                self._stop_reason_raw = clip(ev.stop_reason_raw, MAX_NAME_CHARS)
            case ToolCallEvent():
                self._on_tool_call(ev)
            case StopEvent():
                self._stop_reason = clip(ev.stop_reason, MAX_NAME_CHARS)
                self._stop_reason_raw = clip(ev.stop_reason_raw, MAX_NAME_CHARS)
                if ev.choice is not None and (
                    ev.choice in self._choices or len(self._choices) < self._limits.max_blocks
                ):
                    block = ev.text_block
                    if block is None:  # its ChoiceOpen's, else the choice's own index
                        block = self._choices[ev.choice][2] if ev.choice in self._choices else ev.choice
                    self._choices[ev.choice] = (self._stop_reason, self._stop_reason_raw, block)
            case ModelEvent():
                if ev.model:
                    self._model = clip(ev.model, MAX_NAME_CHARS)
            case UsageEvent():
                self._on_usage(ev)
            case ErrorEvent():
                if self._error is None:
                    self._error = ErrorInfo(clip(ev.code, MAX_NAME_CHARS), clip(ev.message, MAX_MESSAGE_CHARS))
            case StreamEnd():
                self._check_request_id(ev.request_id, ev.seq, "stream.end")
                self._ended = True

    def _on_identity(self, ev: ResponseIdentity) -> None:
        """A later value replaces an earlier one; empty values are ignored. Not counted in
        ``events`` (the record's count of the stream's events)."""
        if ev.response_id:
            self._response_id = clip(ev.response_id, MAX_NAME_CHARS)
        if ev.system_fingerprint:
            self._system_fingerprint = clip(ev.system_fingerprint, MAX_NAME_CHARS)
        if ev.service_tier:
            self._service_tier = clip(ev.service_tier, MAX_NAME_CHARS)

    def _on_usage(self, ev: UsageEvent) -> None:
        """Assign, never add: each usage event carries the totals so far (draft §5.3); each
        count on its own, so a later event that lacks one keeps the earlier value."""
        usage = self._usage
        if ev.input_tokens is not None:
            usage.input_tokens = ev.input_tokens
        if ev.output_tokens is not None:
            usage.output_tokens = ev.output_tokens
        if ev.cache_read_input_tokens is not None:
            usage.cache_read_input_tokens = ev.cache_read_input_tokens
        if ev.cache_creation_input_tokens is not None:
            usage.cache_creation_input_tokens = ev.cache_creation_input_tokens
        if ev.reasoning_output_tokens is not None:
            usage.reasoning_output_tokens = ev.reasoning_output_tokens
        if ev.total_tokens is not None:
            usage.total_tokens = ev.total_tokens
        for group, name, value in ev.details:
            if usage.details is None:
                usage.details = {}
            names = usage.details.setdefault(clip(group, MAX_NAME_CHARS) or "", {})
            key = clip(name, MAX_NAME_CHARS) or ""
            if key in names or len(names) < MAX_USAGE_DETAILS:
                names[key] = value
        usage.reported = True

    def apply_items(self, items: list, now_s: float) -> None:
        """Applies a dialect's output in order: each ``Violation`` recorded (``violation``),
        each canonical event applied (``apply``), all observed at ``now_s`` (epoch seconds)."""
        for item in items:
            if item.__class__ is Violation:  # final by use: one exact-type test
                self.violation(item)
            else:
                self.apply(item, now_s)

    def text(self, index: int, block_type: str, text: str, now_s: float) -> None:
        """Applies ``ContentDelta(seq, index, text, block_type)`` observed at ``now_s`` (epoch
        seconds) without building it: exactly what :meth:`apply` does with that event (event
        count, first-text time, block creation and ``max_blocks``, ``max_stream_text_chars``)
        except the ``event_after_end`` check, which the caller makes first (:attr:`ended` must be
        false). The dialects' fast lanes (``StreamAdapter.fast``) land here. A non-empty
        ``text`` on the block of the text run joins the run (class docstring)."""
        if text and index == self._run_index and block_type == self._run_type:
            run = self._run
            run.append(text)
            if len(run) >= _RUN_MAX:
                self._flush_run()
            return
        if self._run:
            self._flush_run()
        self._run_key = None
        if text:
            self._run_index, self._run_type = index, block_type
        else:
            self._run_index = self._run_type = None
        self._text(index, block_type, text, now_s)

    def _text(self, index: int, block_type: str, text: str, now_s: float) -> None:
        """:meth:`text` without the run."""
        self._events += 1
        block = self._blocks.get(index)
        if block is None:
            block = self._block(index, block_type)
        if text and self._first_text_s is None:
            self._first_text_s = now_s
        if block is None or not text:
            return
        n = len(text)
        if self._text_chars + n > self._max_text_chars:
            text = self._take(text)
            if not text:
                return
        else:
            self._text_chars += n
        parts = block.parts
        parts.append(text)
        if len(parts) - parts.joined >= _COALESCE_PARTS:
            _coalesce(parts)

    def _flush_run(self) -> None:
        """Applies the run's pending pieces (the run stays open: its next pieces may join it)."""
        run = self._run
        self._run = []
        if self._run_key is None:
            index, block_type = self._run_index, self._run_type
            block = self._blocks.get(index)  # type: ignore[arg-type]
            if block is None or not self._extend(block.parts, run):
                # Beyond max_blocks or the text cap: one delta at a time (the first text's time
                # is already taken, so the time passed is never read).
                for t in run:
                    self._text(index, block_type, t, 0.0)  # type: ignore[arg-type]
            return
        key, index, id, name = self._run_key, self._run_fi, self._run_fid, self._run_fname
        entry = self._fragments.get(key)
        if entry is None or not self._extend(entry[1], run):
            for p in run:
                self._events += 1
                self._on_tool_fragment(None, key, index, id, name, p)
            return
        _fill_call(entry[0], index, id, name)

    def _extend(self, parts: _Parts, pieces: list[str]) -> bool:
        """Appends ``pieces`` (one event each) to ``parts`` and counts them if their text fits
        under ``max_stream_text_chars``; False (nothing done) if it does not."""
        total = 0
        for p in pieces:
            total += len(p)
        if self._text_chars + total > self._max_text_chars:
            return False
        self._text_chars += total
        self._events += len(pieces)
        parts.extend(pieces)
        if len(parts) - parts.joined >= _COALESCE_PARTS:
            _coalesce(parts)
        return True

    def _judged(self, name: str | None, shown: str | None, seq: int | None) -> bool | None:
        """``ToolCall.declared`` of a call naming ``name``: whether the request declared it,
        with an ``undeclared_tool`` violation (naming ``shown``, the clipped name) when it did
        not (draft §8.2); ``None``, and no violation, when the request declares no tools at all
        by the dialect's design (``tool_names=None``: the AI SDK UI request, whose tools live on
        the app's server), so the question cannot be answered from the wire."""
        if self._declared is None:
            return None
        if name is not None and name in self._declared:
            return True
        self.violation(Violation(ViolationKind.UNDECLARED_TOOL, seq, _undeclared_detail(shown)))
        return False

    def _on_tool_call(self, ev: ToolCallEvent) -> None:
        name = clip(ev.name, MAX_NAME_CHARS)
        declared = self._judged(ev.name, name, ev.seq)
        if len(self._tool_calls) < self._limits.max_tool_calls:
            call = ToolCall(ev.index, clip(ev.id, MAX_NAME_CHARS), name, self._take(ev.arguments), declared)
            self._tool_calls.append(call)
        else:
            self._dropped["tool call"] += 1

    def fragment(
        self, seq: int | None, key: str, index: int | None, id: str | None, name: str | None, arguments: str
    ) -> None:
        """Applies ``ToolCallDelta(seq, key, index, id, name, arguments)`` without building it:
        exactly what :meth:`apply` does with that event except the ``event_after_end`` check,
        which the caller makes first (:attr:`ended` must be false). For the dialects' fast
        lanes (``StreamAdapter.fast``). Non-empty ``arguments`` continuing the fragment run (same
        key, index, id and name; ``seq`` is only read when a call opens) join the run."""
        if (
            arguments
            and key == self._run_key
            and index == self._run_fi
            and id == self._run_fid
            and name == self._run_fname
        ):
            run = self._run
            run.append(arguments)
            if len(run) >= _RUN_MAX:
                self._flush_run()
            return
        if self._run:
            self._flush_run()
        self._run_index = self._run_type = None
        self._run_key, self._run_fi, self._run_fid, self._run_fname = key, index, id, name
        self._events += 1
        self._on_tool_fragment(seq, key, index, id, name, arguments)

    def _on_tool_fragment(
        self, seq: int | None, key: str, index: int | None, id: str | None, name: str | None, arguments: str
    ) -> None:
        entry = self._fragments.get(key)
        if entry is None:
            if len(self._tool_calls) >= self._limits.max_tool_calls:
                self._dropped["tool call fragment"] += 1
                return
            call = ToolCall(index, clip(id, MAX_NAME_CHARS), clip(name, MAX_NAME_CHARS), "", False)
            self._tool_calls.append(call)
            entry = self._fragments[key] = (call, _Parts(), seq)
        call, parts, _ = entry
        _fill_call(call, index, id, name)
        arguments = self._take(arguments)
        if arguments:
            _append(parts, arguments)

    def _take(self, text: str) -> str:
        """Returns the part of ``text`` that fits under the per-stream cap."""
        room = self._max_text_chars - self._text_chars
        if len(text) > room:
            if not self._oversize:
                self._oversize = True
                self.violation(
                    Violation(ViolationKind.OVERSIZE_STREAM, None, f"text beyond {self._max_text_chars} chars dropped")
                )
            text = text[: max(room, 0)]
        self._text_chars += len(text)
        return text

    def _block(self, index: int, block_type: str) -> _BlockState | None:
        """The block ``index``, created on first use; ``None`` (counted) beyond ``max_blocks``."""
        block = self._blocks.get(index)
        if block is None:
            if len(self._blocks) >= self._limits.max_blocks:
                self._dropped["content block event"] += 1
                return None
            block = self._blocks[index] = _BlockState(index, block_type)
        return block

    def _check_request_id(self, rid: str | None, seq: int | None, where: str) -> None:
        if rid is None:
            return
        rid = clip(rid, MAX_NAME_CHARS) or ""
        if self._request_id is None:
            self._request_id = rid
        expected = self._request_meta_id if self._request_meta_id is not None else self._request_id
        if rid != expected:
            self.violation(
                Violation(ViolationKind.REQUEST_ID_MISMATCH, seq, f"{where} request_id {rid!r} != {expected!r}")
            )

    def finish(
        self, exchange: ResponseFacts, end: EndCause, *, request_start_s: float | None, readable: bool = True
    ) -> ResponseFacts:
        """Writes the reassembled response into ``exchange`` (``observer.response.ResponseFacts``,
        or anything with its fields) and decides its outcome.

        ``readable`` is false when the caller could not read the stream (undecodable content,
        not an event stream, a whole JSON body over its cap, observer failure): then a missing ``stream.end`` is not the
        upstream's fault and is not flagged. Outcome: ``error`` if an error event arrived; else
        ``completed`` if ``stream.end`` was seen; else by ``end``: ``client_aborted``,
        ``interrupted`` (observer shutdown), ``unreadable`` (clean end of a stream we could not
        read) or ``truncated``. ``http_error`` is decided by the caller, which never feeds a
        non-2xx body here.
        """
        if self._run:
            self._flush_run()
        exchange.model = self._model
        exchange.request_id = self._request_id if self._request_id is not None else self._request_meta_id
        tool_indexes = {t.index for t in self._tool_calls}
        exchange.blocks = [
            Block(b.index, _block_type(b, tool_indexes), "".join(b.parts), b.stop_reason)
            for b in sorted(self._blocks.values(), key=_index)
        ]
        for call, parts, seq in self._fragments.values():
            call.arguments = "".join(parts)
            call.declared = self._judged(call.name, call.name, seq)
        self._fragments = {}
        exchange.tool_calls = list(self._tool_calls)
        exchange.response_id = self._response_id
        exchange.system_fingerprint = self._system_fingerprint
        exchange.service_tier = self._service_tier
        exchange.choices = self._choice_results(exchange.blocks)
        exchange.usage = self._usage
        exchange.stop_reason = self._stop_reason
        exchange.stop_reason_raw = self._stop_reason_raw
        exchange.error = self._error
        exchange.events = self._events
        if self._first_text_s is not None and request_start_s is not None:
            exchange.ttft_s = max(0.0, self._first_text_s - request_start_s)
        exchange.violations.extend(self._violations)
        if not self._ended and readable:  # end-of-stream facts are kept even when the cap is full
            exchange.violations.append(Violation(ViolationKind.MISSING_STREAM_END, None, _MISSING_END_DETAIL[end]))
        if self._dropped:
            counts = ", ".join(f"{n} {what}" for what, n in sorted(self._dropped.items()))
            exchange.violations.append(
                Violation(ViolationKind.OVERSIZE_RECORD, None, f"dropped beyond the per-record caps: {counts}")
            )
        if self._error is not None:
            exchange.outcome = Outcome.ERROR
        elif self._ended:
            exchange.outcome = Outcome.COMPLETED
        elif end is EndCause.CLIENT_ABORTED:
            exchange.outcome = Outcome.CLIENT_ABORTED
        elif end is EndCause.SHUTDOWN:
            exchange.outcome = Outcome.INTERRUPTED
        elif end is EndCause.EOF and not readable:
            exchange.outcome = Outcome.UNREADABLE
        else:
            exchange.outcome = Outcome.TRUNCATED
        return exchange

    def _choice_results(self, blocks: list[Block]) -> list[dict[str, Any]] | None:
        """One result per choice (``ChoiceOpen``, ``StopEvent.choice``), in index order, when the
        response had several choices (or one whose index is not 0); else ``None`` (the record's
        ``text``/``stop_reason`` are it); a choice that never stopped has ``None`` stop reasons.
        A choice's text is its ``text`` block (``StopEvent.text_block``, by default the choice's
        own index; "" without one)."""
        if not self._choices or list(self._choices) == [0]:
            return None
        texts = {b.index: b.text for b in blocks if b.type == "text"}
        return [
            {"index": c, "text": texts.get(block, ""), "stop_reason": reason, "stop_reason_raw": raw}
            for c, (reason, raw, block) in sorted(self._choices.items())
        ]


_MISSING_END_DETAIL = {
    EndCause.EOF: "upstream closed the stream before stream.end",
    EndCause.CLIENT_ABORTED: "client aborted before stream.end",
    EndCause.UPSTREAM_FAILED: "upstream connection failed before stream.end",
    EndCause.SHUTDOWN: "observer shut down before stream.end",
}


def _block_type(b: _BlockState, tool_indexes: set[int | None]) -> str:
    """A block that carried no text, stopped with ``tool_use`` and shares its index with a tool
    call is that call's block (draft §4.8: ``tool.call`` then ``content.stop`` at one index)."""
    if not b.parts and b.stop_reason == "tool_use" and b.index in tool_indexes:
        return "tool_use"
    return b.type


def _undeclared_detail(name: str | None) -> str:
    if name is None:
        return "a tool call without a name (the request declares tools by name)"
    return f"tool {name!r} was not declared in the request"


def _index(b: _BlockState) -> int:
    return b.index


def _type_name(ev: CanonicalEvent) -> str:
    return {
        StreamStart: "stream.start",
        ContentDelta: "content.delta",
        ContentStop: "content.stop",
        ToolCallEvent: "tool.call",
        ToolCallDelta: "tool call fragment",
        StopEvent: "stop reason",
        ChoiceOpen: "choice",
        ModelEvent: "model",
        UsageEvent: "usage",
        ResponseIdentity: "response identity",
        ErrorEvent: "error",
        StreamEnd: "stream.end",
    }[type(ev)]
