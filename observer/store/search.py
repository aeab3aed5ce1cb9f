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
- PostgreSQL: a GIN index on ``SEARCH_VECTOR_PG`` (``simple`` configuration: no stemming, no
  stop words, like unicode61), queried with ``plainto_tsquery`` (words ANDed,
  https://www.postgresql.org/docs/15/textsearch-controls.html); nothing is copied. ``simple``
  keeps accents, so both sides pass through ``translate`` with ``FOLD_FROM``/``FOLD_TO`` first
  (what unicode61 folds: a Latin letter with combining marks -> the letter, lone marks
  dropped), a built-in immutable function: no ``unaccent`` extension needed (trial finding:
  ``CAFE`` did not find ``café`` on PostgreSQL).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, column, delete, select, table, text
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


def _fold_table() -> tuple[str, str]:
    """(from, to) of ``translate``: each Latin letter of U+00C0..U+024F and U+1E00..U+1EFF whose
    canonical decomposition is an ASCII letter and combining marks -> that letter (unicode61
    ``remove_diacritics 2`` folds these; it leaves ``ø``, ``ł``, ``ß``, ``æ`` as they are), then
    the combining marks U+0300..U+036F, dropped (text written decomposed)."""
    import unicodedata

    src, dst = [], []
    for cp in (*range(0xC0, 0x250), *range(0x1E00, 0x1F00)):
        decomposed = unicodedata.normalize("NFD", chr(cp))
        base, marks = decomposed[0], decomposed[1:]
        if marks and base.isascii() and base.isalpha() and all(unicodedata.category(m) == "Mn" for m in marks):
            src.append(chr(cp))
            dst.append(base)
    return "".join(src) + "".join(chr(cp) for cp in range(0x300, 0x370)), "".join(dst)


FOLD_FROM, FOLD_TO = _fold_table()
_FOLD = f"'{FOLD_FROM}', '{FOLD_TO}'"
#: The indexed expression on PostgreSQL (``ix_exchanges_search``).
SEARCH_VECTOR_PG = (
    f"(to_tsvector('simple', translate(text, {_FOLD}))"
    f" || jsonb_to_tsvector('simple', translate((request -> 'messages')::text, {_FOLD})::jsonb, '[\"string\"]'))"
)
SEARCH_INDEX_PG = "ix_exchanges_search"
CREATE_SEARCH_INDEX_PG = f"CREATE INDEX {SEARCH_INDEX_PG} ON exchanges USING gin ({SEARCH_VECTOR_PG})"

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


def fts5_query(q: str) -> str:
    """An FTS5 MATCH expression holding every word of ``q`` as a quoted string (so ``AND``,
    ``NEAR``, ``*`` or ``"`` in ``q`` are words, not operators; FTS5 §3.1)."""
    return " ".join('"' + w.replace('"', '""') + '"' for w in words(q))


def condition(dialect: str, q: str, stored_seq: ColumnElement[int]) -> ColumnElement[bool]:
    """The WHERE condition of ``q`` on the exchanges table for ``dialect`` (``sqlite`` or
    ``postgresql``). Raises ``ValueError`` as ``words`` does."""
    if dialect == "sqlite":
        fts = table(FTS_TABLE, column("rowid"))
        match = select(fts.c.rowid).where(text(f"{FTS_TABLE} MATCH :fts_q").bindparams(fts_q=fts5_query(q)))
        return stored_seq.in_(match)
    joined = " ".join(words(q))
    return text(f"{SEARCH_VECTOR_PG} @@ plainto_tsquery('simple', translate(:pg_q, {_FOLD}))").bindparams(pg_q=joined)  # type: ignore[return-value]


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
