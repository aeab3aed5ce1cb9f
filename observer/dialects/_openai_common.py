"""Pieces shared by the two OpenAI dialects (``openai.chat``, ``openai.responses``): reading the
request envelope both APIs have in common, reducing inline base64 payloads, error objects,
``sequence_number`` checks and small JSON helpers (what other dialects share too is in
``observer.dialects.toolkit``).

Sources: OpenAI API reference "Chat Completions" and "Responses" (request bodies: ``model``,
``stream``, ``metadata``, ``user`` (deprecated) / ``safety_identifier``, content parts
``image_url``/``input_audio``/``file``/``input_image``/``input_file``; error object
``{message, type, param, code}``); vendor-wire-formats §1 (identification), §2 "Errors",
§3 (``sequence_number``), §9 (OpenRouter numeric ``error.code``, vLLM ``{"object":"error"}``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote_to_bytes

import orjson

from observer.dialects.toolkit import INT64_MAX, base64_decoded_size, is_int, not_llm_request, vendor_object
from observer.dialects.usage import UsageMap
from observer.events import ErrorEvent, ResponseIdentity
from observer.records import RequestFacts, Violation, ViolationKind

V = ViolationKind

# Keys recorded in their own RequestFacts field by both dialects (never copied to parameters).
COMMON_FIELDS = frozenset({"model", "stream", "tools", "metadata", "user", "safety_identifier"})
REDUCE_DEPTH = 100  # levels of nesting ``reduce_binary`` walks (well under the recursion limit)
_URL_KEYS = frozenset({"url", "image_url"})  # chat ``image_url.url``; Responses ``input_image.image_url``


#: OpenAI ``CompletionUsage`` (Chat Completions; API reference "The chat completion object"):
#: ``prompt_tokens`` (cached included), ``completion_tokens`` (reasoning included),
#: ``total_tokens``, ``prompt_tokens_details`` {``cached_tokens``, ``audio_tokens``},
#: ``completion_tokens_details`` {``reasoning_tokens``, ``audio_tokens``,
#: ``accepted_prediction_tokens``, ``rejected_prediction_tokens``}; DeepSeek's
#: ``prompt_cache_hit_tokens`` and OpenRouter's ``prompt_tokens_details.cache_write_tokens``
#: where OpenAI's own fields are absent.
CHAT_USAGE = UsageMap(
    input=("prompt_tokens",),
    output=("completion_tokens",),
    cache_read=("prompt_tokens_details.cached_tokens", "prompt_cache_hit_tokens"),
    cache_creation=("prompt_tokens_details.cache_write_tokens",),
    reasoning=("completion_tokens_details.reasoning_tokens",),
    total=("total_tokens",),
    objects=(("input", "prompt_tokens_details"), ("output", "completion_tokens_details")),
    mapped=frozenset({"cached_tokens", "cache_write_tokens", "reasoning_tokens"}),
)
#: OpenAI ``ResponseUsage`` (Responses API reference, "The response object" ``usage``):
#: ``input_tokens`` (cached included), ``input_tokens_details.cached_tokens``,
#: ``output_tokens`` (reasoning included), ``output_tokens_details.reasoning_tokens``,
#: ``total_tokens``.
RESPONSES_USAGE = UsageMap(
    input=("input_tokens",),
    output=("output_tokens",),
    cache_read=("input_tokens_details.cached_tokens",),
    reasoning=("output_tokens_details.reasoning_tokens",),
    total=("total_tokens",),
    objects=(("input", "input_tokens_details"), ("output", "output_tokens_details")),
    mapped=frozenset({"cached_tokens", "reasoning_tokens"}),
)


def identity(obj: dict[str, Any], seq: int | None, out: list[Any], seen: set[str] | None = None) -> None:
    """Appends a ``ResponseIdentity`` of the response object ``obj`` (``id``,
    ``system_fingerprint``, ``service_tier``) when it has one of them — with ``seen`` (the
    names already given; updated) only when one is new: chat chunks repeat them all."""
    values = {key: text(obj.get(key)) for key in ("id", "system_fingerprint", "service_tier")}
    given = {key for key, v in values.items() if v is not None}
    if given and (seen is None or not given <= seen):
        if seen is not None:
            seen.update(given)
        out.append(ResponseIdentity(seq, values["id"], values["system_fingerprint"], values["service_tier"]))


def text(v: Any) -> str | None:
    """A non-empty string, else ``None`` (empty strings carry nothing)."""
    return v if isinstance(v, str) and v else None


def call_id(v: Any) -> str | None:
    """A tool-call id, or ``None`` when absent, empty or the string ``"null"`` (some servers send
    ``"id": "null"`` on continuation fragments, vendor-wire-formats §9)."""
    return v if isinstance(v, str) and v and v != "null" else None


def arguments(v: Any) -> str:
    """Tool-call arguments as a JSON string: strings as sent; an object or array (sent by some
    compatible servers instead of a string) serialised compactly with orjson; else ``""``."""
    if isinstance(v, str):
        return v
    if isinstance(v, (dict, list)):
        return orjson.dumps(v).decode()
    return ""


def error_event(seq: int | None, err: Any) -> ErrorEvent:
    """An ``ErrorEvent`` from an OpenAI-style error object ``{message, type, param, code}``:
    code = ``code`` (numbers, e.g. OpenRouter's HTTP-like 502 or vLLM's 400, as decimal text)
    else ``type``; a bare string error is the message."""
    if isinstance(err, str):
        return ErrorEvent(seq, None, err)
    if not isinstance(err, dict):
        return ErrorEvent(seq, None, None)
    code = err.get("code")
    if is_int(code):
        code = str(code)
    if not text(code):
        code = text(err.get("type"))
    message = err.get("message")
    return ErrorEvent(seq, code, message if isinstance(message, str) else None)


def reduce_binary(value: Any, _depth: int = 0) -> Any:
    """A copy of ``value`` (any JSON) with inline binary payloads replaced by their size.

    - ``data:`` URLs under ``url`` / ``image_url`` (chat ``image_url`` parts, Responses
      ``input_image``) and ``file_data`` (chat ``file`` parts, Responses ``input_file``; a data
      URL or bare base64): the key is dropped and ``media_type`` (from the data URL, else not
      set) and ``data_bytes`` (decoded size in bytes) are added to the same object.
    - ``input_audio.data`` (base64): replaced by ``input_audio.data_bytes``.
    - ``result`` of an ``image_generation_call`` item (base64 image): replaced by ``data_bytes``.
    Remote ``http(s)`` URLs and everything else are kept as sent. Below ``REDUCE_DEPTH`` levels
    a value is kept as it is (the store keeps 64 levels, ``observer.store.portable``; trial
    finding: a request nested ~970 levels raised ``RecursionError`` here and lost its facts).
    """
    if _depth > REDUCE_DEPTH:
        return value
    if isinstance(value, list):
        return [reduce_binary(v, _depth + 1) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, v in value.items():
        if isinstance(v, str) and ((key in _URL_KEYS and v[:5].lower() == "data:") or key == "file_data"):
            media, size = payload_size(v)
            if media:
                out["media_type"] = media
            out["data_bytes"] = size
        elif key == "input_audio" and isinstance(v, dict) and isinstance(v.get("data"), str):
            out[key] = {k: x for k, x in v.items() if k != "data"} | {"data_bytes": base64_decoded_size(v["data"])}
        elif key == "result" and value.get("type") == "image_generation_call" and isinstance(v, str):
            out["data_bytes"] = base64_decoded_size(v)
        else:
            out[key] = reduce_binary(v, _depth + 1)
    return out


def payload_size(value: str) -> tuple[str | None, int]:
    """(media type, decoded size in bytes) of a ``data:`` URL (RFC 2397: base64 or
    percent-encoded), or (``None``, base64 decoded size) of a bare base64 string."""
    if value[:5].lower() != "data:":
        return None, base64_decoded_size(value)
    header, _, payload = value[5:].partition(",")
    params = [p.strip().lower() for p in header.split(";")]
    if "base64" in params[1:]:
        return params[0] or None, base64_decoded_size(payload)
    return params[0] or None, len(unquote_to_bytes(payload))


def read_envelope(
    body: bytes, own_fields: Iterable[str]
) -> tuple[dict[str, Any] | None, RequestFacts, list[Violation]]:
    """Reads what both OpenAI request bodies share into ``RequestFacts``: ``model`` (string),
    ``stream`` (absent = ``False``: both APIs default to a single JSON answer), ``metadata``,
    ``end_user`` (``safety_identifier`` else the deprecated ``user``), ``body_bytes``, and
    ``parameters`` = every other top-level key except ``own_fields`` (read by the dialect),
    keyed by the vendor's own names, with inline binary payloads reduced.

    Returns (the JSON object or ``None``, facts, ``invalid_request`` violations); a body that is
    not a JSON object gives ``None`` and the ``not_llm_request`` facts (``toolkit.not_llm_request``).
    Never raises.
    """
    doc, why = vendor_object(body)
    if doc is None:
        facts, violations = not_llm_request(body, why)
        return None, facts, violations
    facts = RequestFacts(body_bytes=len(body))
    violations: list[Violation] = []

    model = doc.get("model")
    facts.model = model if isinstance(model, str) else None
    if model is not None and not isinstance(model, str):
        violations.append(Violation(V.INVALID_REQUEST, None, "model is not a string"))
    stream = doc.get("stream", False)
    facts.stream = stream if isinstance(stream, bool) else None
    if not isinstance(stream, bool) and stream is not None:
        violations.append(Violation(V.INVALID_REQUEST, None, "stream is not a boolean"))
    metadata = doc.get("metadata")
    if isinstance(metadata, dict):
        facts.metadata = metadata
    elif metadata is not None:
        violations.append(Violation(V.INVALID_REQUEST, None, "metadata is not an object"))
    facts.end_user = text(doc.get("safety_identifier")) or text(doc.get("user"))
    skip = COMMON_FIELDS | frozenset(own_fields)
    facts.parameters = {k: reduce_binary(v) for k, v in doc.items() if k not in skip}
    return doc, facts, violations


class SequenceCheck:
    """Checks a stream's ``sequence_number`` values (OpenAI Responses streaming events, §3) the
    way the standard checks ``seq`` (draft §5.2): a value not above the previous one is a
    ``seq_repeat``; a jump over more values than messages were lost below the dialect
    (``lost``: oversize events, unparseable JSON) is a ``seq_gap``. A missing value is
    tolerated (compatible servers omit it); a non-integer one is ``invalid_event``."""

    def __init__(self) -> None:
        self._last: int | None = None
        self._skipped = 0

    def lost(self) -> None:
        """One message was lost: the next value may be one higher than otherwise expected."""
        self._skipped += 1

    def advance(self, value: Any) -> bool:
        """What :meth:`check` does for a value it would accept without a violation (``None``,
        or an int just above the previous one within the lost allowance): the same update and
        True; for any other value False and nothing changed (call :meth:`check` then)."""
        if value is None:
            return True
        if value.__class__ is not int or value < 0 or value > INT64_MAX:
            return False
        last = self._last
        if last is not None and not last < value <= last + 1 + self._skipped:
            return False
        self._last = value
        self._skipped = 0
        return True

    def check(self, value: Any, out: list[Any]) -> int | None:
        """The event's sequence number (or ``None``); violations appended to ``out``."""
        if value is None:
            return None
        if not is_int(value) or value < 0:
            out.append(Violation(V.INVALID_EVENT, None, f"sequence_number is not a non-negative integer: {value!r}"))
            return None
        last = self._last
        if last is not None:
            if value <= last:
                out.append(Violation(V.SEQ_REPEAT, value, f"sequence_number {value} after {last}"))
            elif value > last + 1 + self._skipped:
                out.append(Violation(V.SEQ_GAP, value, f"expected {last + 1}, got {value}"))
        self._last = value if last is None else max(last, value)
        self._skipped = 0
        return value
