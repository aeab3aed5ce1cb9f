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
- PostgreSQL: the column ``search_vector`` (``tsvector``), filled by the storing transaction
  from ``lexemes`` of the same text and matched with ``@@`` against a ``tsquery`` of the
  query's lexemes, under a GIN index (https://www.postgresql.org/docs/15/datatype-textsearch.html
  §8.11.1-2: the literals are lexemes as given, no parser or dictionary runs), so both engines
  fold the same way and a row's vector is never recomputed by a query. Records stored before
  migration 0006 get the server's ``to_tsvector('simple', ...)`` of the same fields, without
  accent folding. (An expression index with ``translate`` for the folding cost 3.8 ms per row
  on insert: bench/queries.py.)

**Words** (``lexemes``, ``words``): runs of Unicode word characters (``\\w+``) after lower-
casing and removal of combining marks (NFD), what FTS5's ``unicode61 remove_diacritics 2``
does for Latin text: ``CAFÉ`` and ``cafe`` are one word; ``ø``, ``ß``, ``æ`` stay as they are.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
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


SEARCH_INDEX_PG = "ix_exchanges_search"
CREATE_SEARCH_INDEX_PG = f"CREATE INDEX {SEARCH_INDEX_PG} ON exchanges USING gin (search_vector)"
#: The vector of a record stored before the column existed (migration 0006), computed by the server.
BACKFILL_VECTOR_PG = "to_tsvector('simple', text) || jsonb_to_tsvector('simple', request -> 'messages', '[\"string\"]')"
#: Longest lexeme kept (characters; PostgreSQL allows 2 KiB) and most lexemes per record.
LEXEME_MAX = 200
LEXEMES_MAX = 20_000

#: Longest ``q`` accepted, in characters, and most words.
QUERY_MAX_CHARS = 500
QUERY_MAX_WORDS = 32

_WORD = re.compile(r"\w+", re.UNICODE)


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


def fold(value: str) -> str:
    """``value`` lower-cased, canonically decomposed (NFD), without combining marks (``ß`` stays:
    ``str.casefold`` would make it ``ss``, which FTS5 does not)."""
    decomposed = unicodedata.normalize("NFD", value.lower())
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def lexemes(texts: Iterable[str]) -> list[str]:
    """The distinct words of ``texts`` (folded, module docstring), in first-seen order, at most
    ``LEXEMES_MAX``, each at most ``LEXEME_MAX`` characters (longer runs are left out)."""
    seen: dict[str, None] = {}
    for value in texts:
        for w in _WORD.findall(fold(value)):
            if len(w) <= LEXEME_MAX and w not in seen:
                seen[w] = None
                if len(seen) >= LEXEMES_MAX:
                    return list(seen)
    return list(seen)


def _quoted(lexeme: str) -> str:
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"


def tsvector(record: Mapping[str, Any]) -> str:
    """The ``tsvector`` literal of a record dict (``Exchange.to_dict()``): its text and the
    strings of its request messages."""
    texts: list[str] = [record.get("text") or ""]
    _strings((record.get("request") or {}).get("messages"), texts)
    return " ".join(_quoted(w) for w in lexemes(texts))


def _strings(value: Any, out: list[str], depth: int = 0) -> None:
    if isinstance(value, str):
        out.append(value)
    elif depth < 64 and isinstance(value, list):
        for v in value:
            _strings(v, out, depth + 1)
    elif depth < 64 and isinstance(value, dict):
        for v in value.values():
            _strings(v, out, depth + 1)


def tsquery(q: str) -> str:
    """The ``tsquery`` literal of ``q``: every word, ANDed. Raises ``ValueError`` as ``words``."""
    return " & ".join(_quoted(w) for w in dict.fromkeys(_WORD.findall(fold(" ".join(words(q))))))


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
    return text("exchanges.search_vector @@ CAST(:pg_q AS tsquery)").bindparams(pg_q=tsquery(q))  # type: ignore[return-value]


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
