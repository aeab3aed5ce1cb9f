"""Full-text search of prompts and completions (``GET /v1/exchanges?q=``).

What is searched: the record's ``text`` (the completion: all text blocks joined) and every
string value inside ``request.messages`` (the prompt as sent, roles and part types included).
A query is split into words; a record matches when it holds every word (any order, either
field), case- and accent-insensitively. No operators, prefixes or phrases: the same query means
the same on both engines.

- SQLite: an FTS5 table ``exchanges_fts`` (``tokenize = 'unicode61 remove_diacritics 2'``,
  https://sqlite.org/fts5.html §4.3.1) whose rowid is the record's ``stored_seq``; the store
  fills it in the transaction that stores the records (``index_sqlite``) and a purge deletes
  from it (``unindex_sqlite``). It keeps a copy of the searched text.
- PostgreSQL: the column ``search_vector`` (``tsvector``): the distinct words of the record,
  made by the writer (``lexemes``: the same ``words`` as a query's) and passed as a ``tsvector``
  literal, without positions; a query is the ``tsquery`` literal of its words ANDed
  (``tsquery_literal``), under a GIN index
  (https://www.postgresql.org/docs/15/datatype-textsearch.html §8.11.1-2). The server never
  parses text, so both sides split words alike, and alike with SQLite. Words longer than
  ``LEXEME_MAX_CHARS`` are left out (no query can hold one), and words past
  ``VECTOR_MAX_BYTES`` of a record (a vector is at most 1 MB) are not indexed. Records stored
  before migration 0006 get the server's vector of the same fields (``to_tsvector('simple')``:
  not folded, and URLs, e-mail addresses and hyphenated words are also kept whole).
  (``to_tsvector`` of the folded text in the storing transaction cost ~1 ms per 12 KB record
  and took PostgreSQL ingest from 2,098 to 458 records/s; an expression index folding with
  ``translate`` cost 3.8 ms per row: docs/performance.md.)

**Words** (``fold``, ``words``): runs of Unicode word characters (``\\w+``) after lower-
casing and removal of combining marks (NFD), what FTS5's ``unicode61 remove_diacritics 2``
does for Latin text: ``CAFÉ`` and ``cafe`` are one word; ``ø``, ``ß``, ``æ`` stay as they are.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Select, column, delete, exists, select, table, text
from sqlalchemy.sql.elements import ColumnElement

from observer.store.models import ExchangeRow

#: The SQLite FTS5 table (and the prefix of its shadow tables, left out of ``alembic check``).
FTS_TABLE = "exchanges_fts"
CREATE_FTS_SQLITE = (
    f"CREATE VIRTUAL TABLE {FTS_TABLE} USING fts5(prompt, completion, tokenize = 'unicode61 remove_diacritics 2')"
)
#: The prompt's text on SQLite: the string values of ``request.messages`` in document order.
PROMPT_SQLITE = (
    "(SELECT group_concat(value, char(10)) FROM json_tree(exchanges.request, '$.messages') WHERE type = 'text')"
)


#: The vector of a new row: ``lexemes`` of its record, bound as ``search_text``.
VECTOR_PG = "CAST(:search_text AS tsvector)"
SEARCH_INDEX_PG = "ix_exchanges_search"
CREATE_SEARCH_INDEX_PG = f"CREATE INDEX {SEARCH_INDEX_PG} ON exchanges USING gin (search_vector)"
#: The vector of a record stored before the column existed (migration 0006), computed by the server.
BACKFILL_VECTOR_PG = "to_tsvector('simple', text) || jsonb_to_tsvector('simple', request -> 'messages', '[\"string\"]')"

#: Longest ``q`` accepted, in characters, and most words.
QUERY_MAX_CHARS = 500
QUERY_MAX_WORDS = 32
#: Longest word indexed on PostgreSQL (a query cannot hold a longer one; a lexeme is at most
#: 2047 bytes, 500 characters at most 2000).
LEXEME_MAX_CHARS = QUERY_MAX_CHARS
#: Bound on a record's vector on PostgreSQL: its words' UTF-8 bytes plus 4 each (the entry),
#: below the 1 MB a ``tsvector`` may hold.
VECTOR_MAX_BYTES = 1_000_000

_WORD = re.compile(r"\w+", re.UNICODE)
#: Byte table keeping the ASCII word characters (``\w``: letters, digits, ``_``), every other
#: byte a space.
_ASCII_WORD_BYTES = bytes(b if chr(b).isascii() and (chr(b).isalnum() or b == 0x5F) else 0x20 for b in range(256))


def words(q: str) -> list[str]:
    """The words of a search query (Unicode ``\\w+`` runs). Raises ``ValueError`` when there is
    none (``"?!"``), or when ``q`` is longer than ``QUERY_MAX_CHARS`` or has more than
    ``QUERY_MAX_WORDS`` words."""
    if len(q) > QUERY_MAX_CHARS:
        raise ValueError(f"q is longer than {QUERY_MAX_CHARS} characters")
    found = _WORD.findall(q)
    if not found:
        raise ValueError("q has no word to search for")
    if len(found) > QUERY_MAX_WORDS:
        raise ValueError(f"q has more than {QUERY_MAX_WORDS} words")
    return found


#: The combining diacritical mark blocks (U+0300-036F, 1AB0-1AFF, 1DC0-1DFF, 20D0-20FF,
#: FE20-FE2F): what is left of an accent after NFD.
_COMBINING = re.compile("[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]+")


def fold(value: str) -> str:
    """``value`` lower-cased, canonically decomposed (NFD), without combining marks (``ß`` stays:
    ``str.casefold`` would make it ``ss``, which FTS5 does not). ASCII text only lower-cased (the
    writer folds every record: bench/queries.py)."""
    lowered = value.lower()
    if lowered.isascii():
        return lowered
    return _COMBINING.sub("", unicodedata.normalize("NFD", lowered))


def _strings(value: Any, out: list[str], depth: int = 0) -> None:
    if isinstance(value, str):
        out.append(value)
    elif depth < 64 and isinstance(value, list):
        for v in value:
            _strings(v, out, depth + 1)
    elif depth < 64 and isinstance(value, dict):
        for v in value.values():
            _strings(v, out, depth + 1)


def document(record: Mapping[str, Any]) -> str:
    """The folded searched text of a record dict (``Exchange.to_dict()``): its text and the
    strings of its request messages, one per line."""
    texts: list[str] = [record.get("text") or ""]
    _strings((record.get("request") or {}).get("messages"), texts)
    return fold("\n".join(texts))


def lexemes(record: Mapping[str, Any]) -> str:
    """PostgreSQL: the ``tsvector`` literal of a record dict (``search_vector``, bound to
    ``VECTOR_PG``): the distinct words of ``document``, each quoted (a word never holds a quote,
    backslash or space: none is ``\\w``; their order means nothing, the server sorts them).
    Words longer than ``LEXEME_MAX_CHARS`` are left out; when the words hold more than
    ``VECTOR_MAX_BYTES``, those first seen (completion first) up to the bound are kept."""
    text = document(record)
    if text.isascii():  # ASCII \w is [A-Za-z0-9_]: a byte table and split (faster than findall: docs/performance.md)
        found = text.encode().translate(_ASCII_WORD_BYTES).split()
    else:
        found = [w.encode() for w in _WORD.findall(text)]
    distinct = set(found)
    if (
        max(map(len, distinct), default=0) > LEXEME_MAX_CHARS
        or sum(map(len, distinct)) + 4 * len(distinct) > VECTOR_MAX_BYTES
    ):
        kept: list[bytes] = []
        size = 0
        for word in dict.fromkeys(found):
            if len(word.decode()) > LEXEME_MAX_CHARS:
                continue
            size += len(word) + 4
            if size > VECTOR_MAX_BYTES:
                break
            kept.append(word)
    else:
        kept = sorted(distinct)
    return (b"'" + b"' '".join(kept) + b"'").decode() if kept else ""


def tsquery_literal(q: str) -> str:
    """PostgreSQL: the ``tsquery`` literal matching records that hold every word of ``q``
    (folded as ``lexemes`` folds): ``'w1' & 'w2'``. Raises ``ValueError`` as ``words`` does."""
    found = _WORD.findall(fold(" ".join(words(q))))
    if not found:
        raise ValueError("q has no word to search for")
    return " & ".join(f"'{w}'" for w in dict.fromkeys(found))


def fts5_query(q: str) -> str:
    """An FTS5 MATCH expression holding every word of ``q`` as a quoted string (so ``AND``,
    ``NEAR``, ``*`` or ``"`` in ``q`` are words, not operators; FTS5 §3.1)."""
    return " ".join('"' + w.replace('"', '""') + '"' for w in words(q))


def matches_sqlite(q: str) -> Select[Any]:
    """SQLite: the FTS5 rowids (``stored_seq``) of the records matching ``q``."""
    fts = table(FTS_TABLE, column("rowid"))
    return select(fts.c.rowid).where(text(f"{FTS_TABLE} MATCH :fts_q").bindparams(fts_q=fts5_query(q)))


def condition(dialect: str, q: str, stored_seq: ColumnElement[int], *, few: bool = True) -> ColumnElement[bool]:
    """The WHERE condition of ``q`` on the exchanges table for ``dialect`` (``sqlite`` or
    ``postgresql``). On SQLite ``few`` (matches are few: ``observer.store.query.SELECTIVE_MAX``)
    takes the set of matching rowids, else probes the FTS5 index per row along the page's order
    (a common word: the page fills after a few rows). Raises ``ValueError`` as ``words`` does."""
    if dialect == "sqlite":
        if few:
            return stored_seq.in_(matches_sqlite(q))
        fts = table(FTS_TABLE, column("rowid"))
        match = text(f"{FTS_TABLE} MATCH :fts_q").bindparams(fts_q=fts5_query(q))
        return exists().where(match, fts.c.rowid == stored_seq)
    query = tsquery_literal(q)
    return text("exchanges.search_vector @@ CAST(:pg_q AS tsquery)").bindparams(pg_q=query)  # type: ignore[return-value]


def index_sqlite(conn: Connection, first: int, last: int) -> None:
    """Adds the records with ``stored_seq`` in ``first..last`` to the FTS5 table (SQLite)."""
    conn.execute(
        text(
            f"INSERT INTO {FTS_TABLE} (rowid, prompt, completion) SELECT stored_seq, {PROMPT_SQLITE}, text "
            "FROM exchanges WHERE stored_seq BETWEEN :first AND :last"
        ),
        {"first": first, "last": last},
    )


def unindex_sqlite(conn: Connection, where: ColumnElement[bool], params: Sequence[Mapping[str, Any]] = ()) -> None:
    """Removes from the FTS5 table the records of ``exchanges`` that ``where`` selects (SQLite;
    run before they are deleted); ``params``: one execution per mapping, as ``execute`` takes."""
    ex = ExchangeRow.__table__
    fts = table(FTS_TABLE, column("rowid"))
    stmt = delete(fts).where(fts.c.rowid.in_(select(ex.c.stored_seq).where(where)))
    conn.execute(stmt, list(params)) if params else conn.execute(stmt)
