"""What the SSE decoder recovers from servers that break the framing, and where that is unambiguous.

Pure functions and constants (no I/O, no state), used by ``observer.wire.sse`` on its slow paths
only (a block of several ``data`` lines, a field line that is not ``data``/``event``/``id``/
``retry``): a conformant stream of one-line events never reaches them. Every recovery is put on
record by the decoder as a violation; nothing is recovered silently.

Several JSON documents in one event (``nonconformant_framing``)
    Some servers write consecutive events with one line end between them instead of a blank
    line (``data: {...}\\ndata: {...}\\n\\n``: GLM / Kimi via some hosts, vendor-wire-formats §9,
    eventsource-parser PR #31), which WHATWG §9.2.6 joins with LF into one data buffer. The
    draft (§5.1) requires "exactly one complete, valid JSON object" per event, so when the joined
    data is **not** one valid JSON value but **is** a sequence of two or more, each a valid JSON
    object or array (``observer.wire.jsonseq``'s scanner finds their extents), each is read as an
    event of its own: :func:`json_documents`. Anything else (text data, a pretty-printed JSON
    value split over lines, junk between the values, a scalar such as ``[DONE]``'s sibling
    ``42``) is left as WHATWG joins it.

Fields WHATWG ignores (``nonstandard_field``)
    WHATWG ignores a field whose name is not ``data``, ``event``, ``id`` or ``retry``, so an error
    a server sends under its own field name vanishes: llama.cpp's server sent mid-stream errors as
    ``error: {"code":400,"message":...}`` until Sept. 2025 (ggml-org/llama.cpp #16104, fixed in
    #16109 by sending them as data), and OpenAI-compatible clients then saw an empty event
    (coddy-project/coddy-agent #106). A field is **surfaced** when its name is a token
    (:data:`FIELD_NAME` : ASCII letters, digits, ``_``, ``-``; at most :data:`MAX_FIELD_NAME_BYTES`)
    and its value starts with ``{`` or ``[`` (a JSON text, the only payload the dialects read), or
    when its name is ``error`` whatever its value (:data:`ALWAYS_SURFACED`: an error in plain text,
    ``error: model overloaded``, read by ``observer.dialects.sse_errors``): it
    is dispatched as an event of its own whose **type is the field name** and whose data is the
    value, as if the server had written ``event: <name>`` and ``data: <value>`` (the form the
    llama.cpp maintainers discussed in #16109), so ``error: {...}`` reaches a dialect as an
    ``error`` event. At most :data:`MAX_SURFACED_PER_BLOCK` fields of one block are surfaced (the
    rest are named in the violation); a value is bounded by the decoder's ``max_event_bytes``
    like any line of the block. Other unknown fields stay ignored, as WHATWG says, and are named
    once per stream (at most :data:`MAX_NAMED_FIELDS` names, the bytes of the first
    :data:`MAX_SHOWN_NAME_BYTES` shown).
"""

from __future__ import annotations

import json
import re

import orjson

from observer.wire.jsonseq import JsonSequenceDecoder

__all__ = [
    "ALWAYS_SURFACED",
    "FIELD_NAME",
    "MAX_FIELD_NAME_BYTES",
    "MAX_NAMED_FIELDS",
    "MAX_SHOWN_NAME_BYTES",
    "MAX_SURFACED_PER_BLOCK",
    "documents",
    "json_documents",
    "shown",
    "surfaced",
]

#: Longest field name surfaced (bytes).
MAX_FIELD_NAME_BYTES = 32
#: Surfaced fields per event block, at most.
MAX_SURFACED_PER_BLOCK = 4
#: Distinct ignored field names named in violations per stream, at most.
MAX_NAMED_FIELDS = 8
#: Bytes of a field name shown in a detail, at most.
MAX_SHOWN_NAME_BYTES = 40
#: A field name that may be surfaced: an ASCII token.
FIELD_NAME = re.compile(rb"[A-Za-z0-9_-]{1,%d}" % MAX_FIELD_NAME_BYTES).fullmatch

#: Field names surfaced whatever their value: the error field of servers in the wild (llama.cpp).
ALWAYS_SURFACED = frozenset({b"error"})

_OPENERS = (b"{", b"[")
_CLOSERS = (b"}", b"]")
_BLANKS = b" \t"


def surfaced(name: bytes, value: bytes) -> bool:
    """True when the unknown field ``name: value`` is dispatched as an event (module docstring):
    a token name and a value that starts with ``{`` or ``[``, or a name of ``ALWAYS_SURFACED``."""
    return (value[:1] in _OPENERS and FIELD_NAME(name) is not None) or name in ALWAYS_SURFACED


def shown(name: bytes) -> str:
    """A field name for a violation detail: its first ``MAX_SHOWN_NAME_BYTES`` bytes, decoded
    with replacement, quoted (``repr``)."""
    return repr(name[:MAX_SHOWN_NAME_BYTES].decode("utf-8", "replace"))


def _valid(doc: bytes) -> bool:
    """True when ``doc`` is one JSON value (orjson; lone surrogates, which the consumer recovers
    on its own, do not make a document invalid here: ``\\u`` escapes are read by the stdlib)."""
    try:
        orjson.loads(doc)
        return True
    except orjson.JSONDecodeError:
        pass
    if b"\\u" not in doc:
        return False
    try:
        json.loads(doc)
        return True
    except (ValueError, RecursionError):
        return False


def json_documents(values: list[bytes]) -> list[bytes] | None:
    """The JSON documents of an event whose ``data`` lines ``values`` (two or more, undecoded)
    hold several, each as its exact bytes, in order (:func:`documents` of the lines joined with
    LF, as WHATWG joins them); ``None`` when the event is not that (module docstring).

    Cost: a scan of the line ends first (a line ending in ``}``/``]`` followed by one starting
    with ``{``/``[``); only then are the joined data's values framed and each parsed."""
    for i in range(len(values) - 1):
        if values[i].rstrip(_BLANKS).endswith(_CLOSERS) and values[i + 1].lstrip(_BLANKS).startswith(_OPENERS):
            break
    else:
        return None
    # One valid value is never two top-level values: no parse of the joined data is needed.
    return documents(b"\n".join(values))


def documents(data: bytes) -> list[bytes] | None:
    """The JSON documents of ``data`` when it is two or more valid JSON objects/arrays written
    one after another (``{...}{...}``) or separated only by JSON whitespace, each as its exact
    bytes; else ``None`` (one value, junk between or after the values, a value cut short or
    invalid). Framing by ``observer.wire.jsonseq``'s scanner, then one parse per document: meant
    for data whose own parse failed (a failure path)."""
    scanner = JsonSequenceDecoder(max_value_bytes=max(1, len(data)))
    items = scanner.feed(data) + scanner.close()
    docs = []
    for item in items:
        if item.__class__ is not tuple:
            return None  # junk between values, or a value cut short: not unambiguous
        docs.append(item[1])
    if len(docs) < 2 or not all(_valid(doc) for doc in docs):
        return None
    return docs
