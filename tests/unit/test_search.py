"""The words the search indexes and asks for (``observer.store.search``), pure: the values are
written out by hand from the module's rules."""

from __future__ import annotations

import pytest

from observer.store import search


def test_lexemes_are_the_distinct_folded_words_of_text_then_messages() -> None:
    record = {
        "text": "Le Café, café!",
        "request": {"messages": [{"role": "user", "content": [{"type": "text", "text": "Straße-Ünïcode"}]}]},
    }
    assert search.lexemes(record) == "'cafe' 'le' 'straße' 'text' 'unicode' 'user'"  # sorted (by bytes)
    # ASCII: the byte-table path, punctuation and control characters split words
    assert search.lexemes({"text": "b_2 A1, b_2!\tx-y\x00(z) it's"}) == "'a1' 'b_2' 'it' 's' 'x' 'y' 'z'"


def test_a_word_longer_than_any_query_is_left_out() -> None:
    record = {"text": f"{'a' * 501} {'b' * 500} c"}
    assert search.lexemes(record) == f"'{'b' * 500}' 'c'"


def test_words_past_the_vector_bound_are_not_indexed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search, "VECTOR_MAX_BYTES", 20)
    # alpha 5+4 = 9, beta 4+4 = 17, gamma 26 > 20; ß is two UTF-8 bytes; a repeat costs nothing
    assert search.lexemes({"text": "alpha beta gamma"}) == "'alpha' 'beta'"
    assert search.lexemes({"text": "ßßßß ßßßß ßß"}) == "'ßß' 'ßßßß'"  # 8+4 = 12, + 4+4 = 20: not over, sorted
    assert search.lexemes({"text": "ßßßß ßßßß ßßß"}) == "'ßßßß'"  # 12, + 6+4 = 22


def test_a_record_without_text_has_an_empty_vector() -> None:
    assert search.lexemes({"text": None, "request": None}) == ""


def test_a_query_is_its_folded_words_anded_once_each() -> None:
    assert search.tsquery_literal("Café  CAFE crème?") == "'cafe' & 'creme'"
    assert search.tsquery_literal("AND OR 'x'") == "'and' & 'or' & 'x'"


@pytest.mark.parametrize("q", ["?!", "x" * 501, " ".join(["w"] * 33)])
def test_a_query_without_a_word_or_too_big_is_refused(q: str) -> None:
    with pytest.raises(ValueError):
        search.tsquery_literal(q)
