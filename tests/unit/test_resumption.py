"""Resumed event streams (issue 16, item 8): the last SSE ``id`` a response dispatched, the
``Last-Event-ID`` a later request carried, and the store's link from the resumption to the
exchange it resumes (``observer.store.resumption``), on SQLite and PostgreSQL.

WHATWG HTML §9.2: a reconnecting ``EventSource`` sends ``Last-Event-ID`` with the id of the last
event it dispatched; an unterminated final event is never dispatched (the wire fixture
``llm-stream-1.0/event_ids`` ends in one: its last event id is the one before).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from observer.records import Exchange
from observer.store.chain import canonical_record
from observer.store.store import AuditStore

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)


def _id(n: int) -> str:
    return f"00000000-0000-5000-8000-{n:012d}"


def test_a_resumption_links_to_the_stream_it_resumes(store: AuditStore, make_exchange: Callable[..., Exchange]) -> None:
    first = make_exchange(_id(1), T0, host="llm.example", last_event_id="evt-3", outcome="truncated")
    other_host = make_exchange(_id(2), T0 + timedelta(seconds=1), host="other.example", last_event_id="evt-3")
    store.write_many([first, other_host])
    resumed = make_exchange(_id(3), T0 + timedelta(seconds=5), host="llm.example", request_last_event_id="evt-3")
    unknown = make_exchange(_id(4), T0 + timedelta(seconds=6), host="llm.example", request_last_event_id="evt-77")
    # one batch: a resumption of a stream stored in the same batch is linked too
    again = make_exchange(_id(5), T0 + timedelta(seconds=7), host="llm.example", last_event_id="evt-9")
    later = make_exchange(_id(6), T0 + timedelta(seconds=8), host="llm.example", request_last_event_id="evt-9")
    store.write_many([later, resumed, unknown, again])
    got = {n: store.get(_id(n), store_fields=True) for n in range(1, 7)}
    assert {n: r["resumes_id"] for n, r in got.items() if r is not None} == {
        1: None,
        2: None,
        3: _id(1),
        4: None,
        5: None,
        6: _id(5),
    }
    assert (got[3]["request_last_event_id"], got[1]["last_event_id"]) == ("evt-3", "evt-3")


def test_a_resumption_by_another_sender_or_too_late_is_not_linked(
    store: AuditStore, make_exchange: Callable[..., Exchange]
) -> None:
    """Trial finding: SSE ids are often small counters (``5``), so the id alone linked another
    user's stream on a shared vendor host: the sender (key fingerprint, proxy user) must match,
    within an hour of the stream's start."""
    fp_a, fp_b = "hmac-sha256:" + "a" * 32, "hmac-sha256:" + "b" * 32
    store.write_many([make_exchange(_id(1), T0, host="h", last_event_id="5", key_fingerprint=fp_a, proxy_user="ann")])
    later = [
        make_exchange(_id(2), T0 + timedelta(seconds=9), host="h", request_last_event_id="5", key_fingerprint=fp_b),
        make_exchange(
            _id(3),
            T0 + timedelta(seconds=9),
            host="h",
            request_last_event_id="5",
            key_fingerprint=fp_a,
            proxy_user="bo",
        ),
        make_exchange(
            _id(4), T0 + timedelta(hours=2), host="h", request_last_event_id="5", key_fingerprint=fp_a, proxy_user="ann"
        ),
        make_exchange(
            _id(5),
            T0 + timedelta(seconds=9),
            host="h",
            request_last_event_id="5",
            key_fingerprint=fp_a,
            proxy_user="ann",
        ),
    ]
    store.write_many(later)
    got = {n: store.get(_id(n), store_fields=True) for n in range(2, 6)}
    assert {n: r["resumes_id"] for n, r in got.items() if r is not None} == {2: None, 3: None, 4: None, 5: _id(1)}


def test_a_resumption_started_before_the_stream_is_not_linked(
    store: AuditStore, make_exchange: Callable[..., Exchange]
) -> None:
    store.write_many([make_exchange(_id(1), T0, host="h", last_event_id="e")])
    store.write_many([make_exchange(_id(2), T0 - timedelta(seconds=1), host="h", request_last_event_id="e")])
    got = store.get(_id(2), store_fields=True)
    assert got is not None and got["resumes_id"] is None


def test_the_event_ids_are_chained_only_when_present(make_exchange: Callable[..., Exchange]) -> None:
    plain = make_exchange("r", T0).to_dict()
    before = {k: v for k, v in plain.items() if k not in ("request_last_event_id", "last_event_id")}
    assert canonical_record(plain, "w", 1) == canonical_record(before, "w", 1)
    resumed = make_exchange("r", T0, request_last_event_id="evt-3").to_dict()
    assert b'"request_last_event_id":"evt-3"' in canonical_record(resumed, "w", 1)
