"""JSON text for the journal, the store's JSON columns and exports: ``dumps`` and an exact
``loads`` (pure: no I/O, no SQLAlchemy).

``loads`` gives exactly what the standard library's ``json.loads`` gives (which the store's JSON
columns use, so what ``AuditStore.get`` returns), at orjson's speed where orjson agrees. orjson
reads an integer beyond 64 bits as a float (``18446744073709551616`` -> ``1.8446744073709552e19``)
and refuses lone surrogates, ``NaN`` and numbers beyond a double: a text with a run of 19 or more
digits (``-9223372036854775809``, the first integer orjson misreads, has 19) or that orjson refuses
is read by ``json.loads`` instead. A long digit run inside a string only costs the slower path.

``dumps`` writes orjson's compact JSON, or for what orjson cannot encode (a lone surrogate, an
integer beyond 64 bits) the standard library's, ASCII-escaped: valid UTF-8 either way, and
``loads(dumps(v)) == v``.

``without_lone_surrogates`` reads a JSON text that orjson refused only because a string holds
half of a UTF-16 surrogate pair (``"\\ud83d"`` without its ``"\\ude00"``: a server that cut a
string between the two halves of an emoji; RFC 8259 §8.2 calls such strings' behaviour
unpredictable), with each lone surrogate replaced by U+FFFD, and says where they were.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

#: Digits to ``0``, every other byte to a space: a long digit run becomes a run of ``0``
#: (``bytes.translate`` and ``in``: ~4 µs for 6 KB, against ~45 µs for the regex ``[0-9]{19}``).
_DIGITS = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
#: A digit run that orjson may read as something else than ``json.loads`` does.
_LONG_RUN = b"0" * 19
#: A ``\\uD800``-``\\uDFFF`` escape (either half of a UTF-16 pair): the cheap test before a slow read.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
#: A surrogate code point left in a ``str`` by ``json.loads`` (a pair is read as one character).
_LONE = re.compile("[\ud800-\udfff]")
#: At most this many places are named in a detail (the rest are counted).
MAX_PLACES = 3


def loads(text: str | bytes | memoryview) -> Any:
    """The value of the JSON ``text``, exactly as ``json.loads`` reads it; raises ``ValueError``
    (``json.JSONDecodeError``) on text that is not JSON."""
    if isinstance(text, memoryview):
        text = bytes(text)
    raw = text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")
    if _LONG_RUN not in raw.translate(_DIGITS):
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    try:
        return json.loads(text)
    except RecursionError:  # nested deeper than the parser goes (orjson refuses it first)
        raise ValueError("JSON nested too deeply") from None


def dumps(value: Any) -> bytes:
    """Compact JSON bytes of ``value`` (UTF-8; ASCII-escaped where orjson refuses the value)."""
    try:
        return orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(value, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def dumps_line(value: Any) -> bytes:
    """``dumps(value)`` followed by ``\\n`` (one JSON Lines line)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_APPEND_NEWLINE)
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(value, ensure_ascii=True, separators=(",", ":")).encode("ascii") + b"\n"


def without_lone_surrogates(text: str) -> tuple[Any, int, list[str]] | None:
    """(the value of the JSON ``text`` with every lone UTF-16 surrogate in its strings, keys
    included, replaced by U+FFFD, how many were replaced, the first places), or ``None`` when
    ``text`` has none or is not JSON even so (then nothing is recovered: its error stands).

    A place is ``"<JSON path> (character <i>)"``: the path in JSONPath's dot/bracket notation
    (``$.choices[0].delta.content``; a key that is not an identifier as ``["a b"]``; a key itself:
    ``$.<key> (key, character <i>)``), ``i`` the 0-based character index in the string as read
    (a valid pair counts as one character). At most ``MAX_PLACES`` places are listed.
    Called only on text that orjson refused (a failure path): ``json.loads`` reads what orjson
    will not, then the value is walked once."""
    if "\\u" not in text or _SURROGATE_ESCAPE.search(text) is None:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    places: list[str] = []
    found = [0]
    value = _replace(value, "$", places, found)
    if not found[0]:
        return None
    return value, found[0], places


def _replace(value: Any, path: str, places: list[str], found: list[int]) -> Any:
    """``value`` with lone surrogates replaced in its strings (recursively); each replacement
    counted in ``found[0]`` and its place appended to ``places`` (up to ``MAX_PLACES``)."""
    if isinstance(value, str):
        return _fix(value, path, "", places, found)
    if isinstance(value, list):
        return [_replace(v, f"{path}[{i}]", places, found) for i, v in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for key, v in value.items():
            where = f"{path}.{key}" if key.isidentifier() else f"{path}[{json.dumps(key)}]"
            key = _fix(key, where, "key, ", places, found)
            out[key] = _replace(v, where, places, found)
        return out
    return value


def _fix(s: str, path: str, what: str, places: list[str], found: list[int]) -> str:
    """``s`` with each lone surrogate replaced by U+FFFD (places recorded as ``_replace``)."""
    if _LONE.search(s) is None:
        return s
    for m in _LONE.finditer(s):
        found[0] += 1
        if len(places) < MAX_PLACES:
            places.append(f"{path} ({what}character {m.start()})")
    return _LONE.sub("\ufffd", s)


__all__ = ["dumps", "dumps_line", "loads", "without_lone_surrogates"]
