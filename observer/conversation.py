"""Conversation linking without client cooperation: canonical messages and their running hash
(issue 13 part 4; the store decides what to do with the hashes).

Chat clients resend the whole conversation each turn. An exchange B *continues* an earlier
exchange A when B's request messages begin with A's request messages followed by A's answer
(as the next assistant message) and go on with at least one message more (a user message, a
tool result). Both sides are compared in a canonical form, through a chain hash over it:

- ``prefix_hashes(messages)``: element ``i`` is ``H_i = sha256(H_{i-1} || bytes(message_i))``
  (hex), ``H_-1 = GENESIS``, so a prefix of any length is compared by one hash;
- ``continuation_hash(A)``: the hash of A's request messages plus A's answer;
- ``link_candidates(B)``: the hashes of B's proper prefixes that end with an assistant message,
  longest first. The store looks for an earlier exchange whose continuation hash is among them
  and takes the longest match.

The canonical message (``CanonicalMessage``). In: the role (each dialect maps its own roles:
Gemini ``model`` is ``assistant``); the text parts, joined (reasoning and refusals are not text);
the tool calls (call id, name, arguments as JSON re-dumped with sorted keys when they parse, so
the streamed string ``{"b": 1, "a": 2}`` and a resent object ``{"a": 2, "b": 1}`` are equal;
empty arguments are ``{}``), sorted; the tool results (call id, result text: a JSON result is
normalised like arguments); attachments as type, decoded size (``data_bytes``, what the record
keeps of a base64 payload) and reference (remote URL or file id). Call ids are kept where the
vendor makes the client echo them exactly (OpenAI ``tool_call_id``, Anthropic ``tool_use_id``,
Responses ``call_id``, AI SDK ``toolCallId``; Gemini's optional ids) and dropped by the Ollama
mapping, whose clients do not keep them. Out: message and item ids, ``name``, ``cache_control``,
citations and annotations, status fields, reasoning/thinking (clients drop or encrypt it, the
record keeps only a summary), signatures, refusals, anything a dialect's mapping does not read.
The text of a message and of a tool result is stripped of leading and trailing whitespace (UIs
trim answers); inner whitespace counts. Consecutive assistant messages are one (Responses
output items, Gemini's streamed history keeps one ``model`` content per chunk, Anthropic merges
them itself).

An exchange can be continued only when its outcome is ``completed`` (otherwise the record is not
known to hold what the client received: an SDK raises on an error and keeps nothing, an aborted
or truncated stream holds what was forwarded, not what was shown), its answer has text or tool
calls, its request has messages and does not end with an assistant message (a prefill: the
answer completes that message, and what a client resends then is not known). A ``max_tokens``
answer can be continued: the client has the same cut text.

What breaks a link (no false link follows, only a missing one): a client that edits, truncates,
reorders or summarises the history (also a proxy or framework that summarises, e.g. context
compaction); a changed system prompt (it is the first message; Responses ``instructions`` too);
a client that rewrites tool call ids, re-serialises arguments into different JSON values,
re-encodes attachments (another size) or inserts messages of its own; a client that picks a
choice other than the first of ``n > 1`` (such exchanges are not continued at all); a client
that resends only new items (Responses ``previous_response_id``: link by that id instead);
Responses ``item_reference`` items in place of the output; an AI SDK continuation of a tool
result merged into the same UI message (the next turn resends one merged message); an answer
the record cut (``oversize_record``) or a request stored empty (``oversize_request``).
Identical conversations (same prompts, same answers) give identical hashes: the store must pick
among equal matches (same end user, latest).

Pure: no I/O, no clock; ``hashlib`` and ``json`` only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import TYPE_CHECKING, Any

from observer.records import Exchange, Outcome, RequestFacts

if TYPE_CHECKING:
    from observer.dialects.registry import DialectRegistry

__all__ = [
    "ASSISTANT",
    "GENESIS",
    "CanonicalAttachment",
    "CanonicalCall",
    "CanonicalMessage",
    "CanonicalResult",
    "attachment",
    "call",
    "canonical_answer",
    "canonical_request",
    "content_parts",
    "continuation_hash",
    "default_message",
    "default_messages",
    "finish",
    "link_candidates",
    "normalise_json",
    "part_text",
    "prefix_hashes",
    "recorded_answer",
    "result",
]

ASSISTANT = "assistant"
TOOL = "tool"
GENESIS = hashlib.sha256(b"llm-stream-observer/conversation/1").digest()  # H_-1
TEXT_PART_TYPES = frozenset({None, "text", "input_text", "output_text"})
REF_KEYS = ("url", "image_url", "file_id", "file_url", "fileUri", "file_uri")


@dataclass(frozen=True, slots=True)
class CanonicalCall:
    """A tool call: ``id`` (``None`` when the dialect drops ids), ``name``, ``arguments``
    normalised by ``normalise_json``."""

    id: str | None
    name: str | None
    arguments: str


@dataclass(frozen=True, slots=True)
class CanonicalResult:
    """A tool result: the ``id`` of the call it answers and its ``text`` (stripped)."""

    id: str | None
    text: str


@dataclass(frozen=True, slots=True)
class CanonicalAttachment:
    """A binary or referenced part: ``type`` (part type or media type), ``data_bytes`` (decoded
    size as recorded), ``ref`` (remote URL or file id; data URLs are already reduced)."""

    type: str | None
    data_bytes: int | None = None
    ref: str | None = None


@dataclass(frozen=True, slots=True)
class CanonicalMessage:
    """One message in canonical form (see the module docstring for what is in and out)."""

    role: str
    text: str = ""
    tool_calls: tuple[CanonicalCall, ...] = ()
    tool_results: tuple[CanonicalResult, ...] = ()
    attachments: tuple[CanonicalAttachment, ...] = ()

    def to_bytes(self) -> bytes:
        """The hashed form: the compact ASCII JSON array ``[role, text, [[id, name, arguments],
        ...], [[id, text], ...], [[type, data_bytes, ref], ...]]``."""
        value = [
            self.role,
            self.text,
            [[c.id, c.name, c.arguments] for c in self.tool_calls],
            [[r.id, r.text] for r in self.tool_results],
            [[a.type, a.data_bytes, a.ref] for a in self.attachments],
        ]
        return json.dumps(value, separators=(",", ":")).encode("ascii")


# ----- building blocks for the dialects' mappings -----


def normalise_json(value: Any) -> str:
    """Arguments or a result as compared: a string that parses as JSON, and any other value, is
    dumped with sorted keys, compactly; a string that does not parse is kept stripped; ``""``,
    whitespace and ``None`` are ``{}`` (a call without arguments, streamed or resent); a value
    JSON cannot hold (never one parsed from a body) is ``"<unserialisable>"``."""
    if isinstance(value, str):
        value = value.strip()
        if not value:
            return "{}"
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return value
    elif value is None:
        return "{}"
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (ValueError, TypeError, RecursionError):
        return "<unserialisable>"


def call(id: Any, name: Any, arguments: Any) -> CanonicalCall:
    """A ``CanonicalCall``; non-string ``id``/``name`` are ``None``."""
    return CanonicalCall(_str(id), _str(name), normalise_json(arguments))


def result(id: Any, value: Any) -> CanonicalResult:
    """A ``CanonicalResult``: a string as is, a list of parts as their joined text
    (``part_text``), anything else as ``normalise_json``; stripped."""
    if isinstance(value, list):
        text = "".join(t for t in map(part_text, value) if t is not None)
    elif isinstance(value, str):
        text = value
    else:
        text = normalise_json(value)
    return CanonicalResult(_str(id), text.strip())


def part_text(part: Any) -> str | None:
    """The ``text`` of a text part (``type`` absent, ``text``, ``input_text``, ``output_text``),
    else ``None``."""
    if isinstance(part, dict) and part.get("type") in TEXT_PART_TYPES and isinstance(part.get("text"), str):
        return part["text"]
    return None


def attachment(part: Any, type: str | None = None) -> CanonicalAttachment | None:
    """The attachment a part holds: an integer ``data_bytes`` and a string reference
    (``REF_KEYS``) looked up in the part and in its object values (``image_url: {...}``,
    ``source: {...}``); ``None`` when it has neither. ``type`` defaults to the part's ``type``."""
    if not isinstance(part, dict):
        return None
    size: int | None = None
    ref: str | None = None
    for obj in [part, *(v for v in part.values() if isinstance(v, dict))]:
        value = obj.get("data_bytes")
        if size is None and isinstance(value, int) and not isinstance(value, bool):
            size = value
        for key in REF_KEYS:
            if ref is None and isinstance(obj.get(key), str):
                ref = obj[key]
    if size is None and ref is None:
        return None
    return CanonicalAttachment(type if type is not None else _str(part.get("type")), size, ref)


def default_message(m: Any, *, keep_ids: bool = True) -> CanonicalMessage:
    """The default mapping of a recorded message of the common ``{"role", "content"}`` shape:
    ``content`` a string or parts (text parts joined, attachments by ``attachment``);
    ``tool_calls`` as ``[{id, function: {name, arguments}}]`` or ``[{id, name, arguments}]``;
    a ``tool`` message's ``tool_call_id`` and content as its result. A value that is not an
    object is a message with no role whose text is its JSON."""
    if not isinstance(m, dict):
        return CanonicalMessage("", normalise_json(m))
    role = _str(m.get("role")) or ""
    content = m.get("content")
    if role == TOOL:
        tool_id = m.get("tool_call_id") if keep_ids else None
        return CanonicalMessage(role, tool_results=(result(tool_id, content if content is not None else ""),))
    text, attachments = content_parts(content)
    calls = []
    given = m.get("tool_calls")
    for c in given if isinstance(given, list) else ():
        if isinstance(c, dict):
            fn = c.get("function") if isinstance(c.get("function"), dict) else c
            calls.append(call(c.get("id") if keep_ids else None, fn.get("name"), fn.get("arguments")))
    return CanonicalMessage(role, text, tuple(calls), attachments=attachments)


def default_messages(messages: Sequence[Any], *, keep_ids: bool = True) -> list[CanonicalMessage]:
    """``default_message`` of each recorded message."""
    return [default_message(m, keep_ids=keep_ids) for m in messages]


def content_parts(content: Any) -> tuple[str, tuple[CanonicalAttachment, ...]]:
    """(joined text, attachments) of a ``content`` string or parts list; other values: nothing."""
    if isinstance(content, str):
        return content, ()
    if not isinstance(content, list):
        return "", ()
    texts = [t for t in map(part_text, content) if t is not None]
    found = (attachment(p) for p in content if part_text(p) is None)
    return "".join(texts), tuple(a for a in found if a is not None)


def recorded_answer(exchange: Exchange, *, keep_ids: bool = True) -> CanonicalMessage | None:
    """The default answer of a record as the client resends it: an assistant message with the
    record's ``text`` (text blocks joined, reasoning and refusals left out) and its tool calls;
    ``None`` when it has neither."""
    calls = tuple(call(c.id if keep_ids else None, c.name, c.arguments) for c in exchange.tool_calls)
    if not exchange.text.strip() and not calls:
        return None
    return CanonicalMessage(ASSISTANT, exchange.text, calls)


# ----- the generic part: canonical sequences, hashes, links -----


def canonical_request(exchange: Exchange, registry: DialectRegistry | None = None) -> list[CanonicalMessage]:
    """The canonical messages of the exchange's request, by its dialect's mapping
    (``conversation_messages(request)``, default ``default_messages``), finished by
    ``finish``."""
    mapper = getattr(_dialect(exchange.dialect, registry), "conversation_messages", None)
    messages = mapper(exchange.request) if mapper is not None else _default_conversation(exchange.request)
    return finish(messages)


def canonical_answer(exchange: Exchange, registry: DialectRegistry | None = None) -> CanonicalMessage | None:
    """The exchange's answer as the next canonical message, by its dialect's mapping
    (``answer_message(exchange)``, default ``recorded_answer``); ``None`` when the exchange
    cannot be continued (module docstring)."""
    if exchange.outcome != Outcome.COMPLETED:
        return None
    mapper = getattr(_dialect(exchange.dialect, registry), "answer_message", None)
    answer = mapper(exchange) if mapper is not None else recorded_answer(exchange)
    return finish([answer])[0] if answer is not None else None


def link_hashes(exchange: Exchange, registry: DialectRegistry | None = None) -> tuple[str | None, list[str]]:
    """``(continuation_hash(exchange), link_candidates(exchange))`` with the request put in
    canonical form and hashed once (the store links every record it writes)."""
    messages = canonical_request(exchange, registry)
    hashes = prefix_hashes(messages)
    candidates = [hashes[i] for i in range(len(messages) - 2, 0, -1) if messages[i].role == ASSISTANT]
    if not messages or messages[-1].role == ASSISTANT:
        return None, candidates
    answer = canonical_answer(exchange, registry)
    if answer is None:
        return None, candidates
    continuation = hashlib.sha256(bytes.fromhex(hashes[-1]) + answer.to_bytes()).hexdigest()
    return continuation, candidates


def continuation_hash(exchange: Exchange, registry: DialectRegistry | None = None) -> str | None:
    """The hex chain hash of the request's canonical messages followed by the answer: what a
    continuing request's ``link_candidates`` contain; ``None`` when it cannot be continued."""
    return link_hashes(exchange, registry)[0]


def link_candidates(exchange: Exchange, registry: DialectRegistry | None = None) -> list[str]:
    """The hex chain hashes of the request's proper prefixes that end with an assistant message
    (only those can be a continuation hash), longest first. The full request is not one: a
    continuing request has at least one message after the earlier answer."""
    return link_hashes(exchange, registry)[1]


def prefix_hashes(messages: Iterable[CanonicalMessage]) -> list[str]:
    """Element ``i``: hex SHA-256 ``H_i = sha256(H_{i-1} || messages[i].to_bytes())`` over the
    raw 32-byte digests, ``H_-1 = GENESIS``."""
    out: list[str] = []
    digest = GENESIS
    for message in messages:
        digest = hashlib.sha256(digest + message.to_bytes()).digest()
        out.append(digest.hex())
    return out


def finish(messages: Iterable[CanonicalMessage]) -> list[CanonicalMessage]:
    """A dialect's mapped messages as hashed: consecutive assistant messages merged into one
    (texts joined, calls, results and attachments concatenated), then each text stripped and
    each message's calls sorted (id, name, arguments)."""
    merged: list[CanonicalMessage] = []
    for m in messages:
        last = merged[-1] if merged else None
        if last is not None and last.role == ASSISTANT and m.role == ASSISTANT:
            merged[-1] = CanonicalMessage(
                ASSISTANT,
                last.text + m.text,
                last.tool_calls + m.tool_calls,
                last.tool_results + m.tool_results,
                last.attachments + m.attachments,
            )
        else:
            merged.append(m)
    return [replace(m, text=m.text.strip(), tool_calls=tuple(sorted(m.tool_calls, key=_call_key))) for m in merged]


def _call_key(c: CanonicalCall) -> tuple[str, str, str]:
    return (c.id or "", c.name or "", c.arguments)


def _default_conversation(request: RequestFacts) -> list[CanonicalMessage]:
    return default_messages(request.messages)


def _dialect(name: str, registry: DialectRegistry | None) -> object | None:
    """The registered dialect called ``name`` (``None``, hence the defaults, when there is none)."""
    if registry is None:
        registry = _default_registry()
    try:
        return registry.get(name)
    except KeyError:
        return None


@cache
def _default_registry() -> DialectRegistry:
    from observer.dialects.registry import default_registry  # here: the dialects import this module

    return default_registry()


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None
