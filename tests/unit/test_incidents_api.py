"""Incidents (EU AI Act Art. 73), holds, export jobs and retention over the API.

Deadlines are hand-computed from the article (2, 10 or 15 days after awareness); linking an
exchange puts it under a chained legal hold that ``observer verify`` accepts; export jobs run,
report progress, are found again by a new API process, and serve only their own files.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from observer.api import create_app
from observer.api.app import ApiOptions
from observer.records import Exchange
from observer.store.checkpoint import CheckpointKey
from observer.store.incidents import CATEGORIES, deadline
from observer.store.store import AuditStore
from observer.store.verify import verify

TOKEN = "incident-tests-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NOW = datetime.now(timezone.utc)
IDS = [f"d0000000-0000-4000-8000-00000000000{i}" for i in range(3)]


@pytest.fixture
def key(tmp_path: Path) -> CheckpointKey:
    return CheckpointKey.load_or_create(tmp_path / "key.pem")


@pytest.fixture
def client(
    store: AuditStore, make_exchange: Callable[..., Exchange], key: CheckpointKey, tmp_path: Path
) -> Iterator[TestClient]:
    old = NOW - timedelta(days=400)
    records = [
        make_exchange(IDS[0], old),
        make_exchange(IDS[1], old + timedelta(seconds=1)),
        make_exchange(IDS[2], NOW),
    ]
    store.write_many(records, writer_id="e0000000-0000-4000-8000-00000000000e", seqs=[1, 2, 3])
    with TestClient(create_app(store, TOKEN, key, ApiOptions(exports_dir=tmp_path / "exports"))) as c:
        yield c


@pytest.mark.parametrize(
    "category,days",
    [
        ("widespread_infringement", 2),  # Art. 73(3)
        ("critical_infrastructure", 2),  # Art. 73(3), Art. 3(49)(b)
        ("death", 10),  # Art. 73(4)
        ("serious_harm_to_health", 15),  # Art. 73(2)
        ("fundamental_rights", 15),
        ("property_or_environment", 15),
        ("other", None),
    ],
)
def test_the_deadline_follows_the_category(category: str, days: int | None) -> None:
    aware = datetime(2026, 11, 30, 14, 30, tzinfo=timezone.utc)
    assert deadline(category, aware) == (None if days is None else aware + timedelta(days=days))
    assert category in CATEGORIES


def test_open_change_and_close_an_incident(client: TestClient, store: AuditStore, key: CheckpointKey) -> None:
    made = client.post(
        "/v1/incidents",
        headers=AUTH,
        json={
            "title": "Leak",
            "category": "death",
            "aware_at": "2026-11-30T14:30:00+01:00",
            "note": "first",
            "exchange_ids": [IDS[0]],
        },
    )
    assert made.status_code == 201, made.text
    incident = made.json()
    assert (incident["aware_at"], incident["deadline"]) == (
        "2026-11-30T13:30:00.000000Z",
        "2026-12-10T13:30:00.000000Z",
    )
    assert [n["text"] for n in incident["notes"]] == ["first"] and incident["status"] == "open"
    (link,) = incident["exchanges"]
    assert link["exchange_id"] == IDS[0] and link["linked_by"] == "api:bootstrap"
    holds = client.get("/v1/holds", headers=AUTH).json()
    assert [(h["id"], h["scope"]["exchange_ids"]) for h in holds] == [(link["hold_id"], [IDS[0]])]
    path = f"/v1/incidents/{incident['id']}"
    patched = client.patch(path, headers=AUTH, json={"category": "other", "note": "second", "link_exchanges": [IDS[1]]})
    assert patched.status_code == 200
    assert patched.json()["deadline"] is None and [n["position"] for n in patched.json()["notes"]] == [1, 2]
    assert [e["exchange_id"] for e in patched.json()["exchanges"]] == [IDS[0], IDS[1]]
    assert client.patch(path, headers=AUTH, json={"link_exchanges": [IDS[1]]}).status_code == 400  # twice
    assert client.patch(path, headers=AUTH, json={"link_exchanges": ["no-such-record"]}).status_code == 400
    # a bad value is 400 whatever its text holds (the router once matched "closed" in the message)
    assert client.patch(path, headers=AUTH, json={"link_exchanges": ["closed-record"]}).status_code == 400
    assert client.patch(path, headers=AUTH, json={"status": "reported"}).json()["status"] == "reported"
    assert client.patch(path, headers=AUTH, json={"status": "open"}).status_code == 400  # no way back
    assert client.patch(path, headers=AUTH, json={"status": "closed"}).status_code == 200
    closed = client.patch(path, headers=AUTH, json={"note": "late"})
    assert closed.status_code == 409 and closed.json()["error"]["code"] == "invalid_incident"
    assert [i["id"] for i in client.get("/v1/incidents?status=closed", headers=AUTH).json()] == [incident["id"]]
    assert client.get(f"/v1/incidents?exchange_id={IDS[1]}", headers=AUTH).json()[0]["id"] == incident["id"]
    assert client.get("/v1/incidents?status=open", headers=AUTH).json() == []
    assert client.get("/v1/incidents/nope", headers=AUTH).status_code == 404
    assert client.patch("/v1/incidents/nope", headers=AUTH, json={"note": "x"}).status_code == 404
    report = verify(store, [key.public])
    assert report.ok, report.breaks  # the holds are chained store events
    assert report.store_events == 2


def test_linked_records_survive_a_purge_over_the_api(client: TestClient) -> None:
    """Two records are past retention (400 days old); the one linked to an incident is held."""
    client.post(
        "/v1/incidents",
        headers=AUTH,
        json={"title": "t", "category": "other", "aware_at": "2026-11-30T00:00:00Z", "exchange_ids": [IDS[0]]},
    )
    policy = client.get("/v1/retention", headers=AUTH).json()
    assert (policy["retention_days"], policy["due"], policy["held"], policy["active_holds"]) == (183, 1, 1, 1)
    dry = client.post("/v1/retention/purge", headers=AUTH)
    assert dry.json()["dry_run"] is True and dry.json()["records"] == 1 and dry.json()["event_seq"] is None
    assert client.get(f"/v1/exchanges/{IDS[1]}", headers=AUTH).status_code == 200  # a dry run removes nothing
    done = client.post("/v1/retention/purge", headers=AUTH, json={"dry_run": False}).json()
    assert (done["records"], done["held"]) == (1, 1) and done["event_seq"] is not None
    assert client.get(f"/v1/exchanges/{IDS[1]}", headers=AUTH).status_code == 404
    assert client.get(f"/v1/exchanges/{IDS[0]}", headers=AUTH).status_code == 200


def test_holds_over_the_api(client: TestClient) -> None:
    made = client.post(
        "/v1/holds", headers=AUTH, json={"reason": "case 9", "user": "alice", "since": "2026-01-01T00:00:00Z"}
    )
    assert made.status_code == 201 and made.json()["scope"]["user"] == "alice"
    assert client.post("/v1/holds", headers=AUTH, json={"reason": "no scope"}).status_code == 400
    assert client.post("/v1/holds", headers=AUTH, json={"reason": "r", "since": "soon"}).status_code == 400
    hold_id = made.json()["id"]
    released = client.delete(f"/v1/holds/{hold_id}?reason=closed", headers=AUTH)
    assert released.status_code == 200 and released.json()["released_by"] == "api:bootstrap"
    assert client.delete(f"/v1/holds/{hold_id}?reason=again", headers=AUTH).status_code == 409
    assert client.delete("/v1/holds/" + "9" * 36 + "?reason=x", headers=AUTH).status_code == 404
    assert client.delete("/v1/holds/%00?reason=x", headers=AUTH).status_code == 404
    other = client.post("/v1/holds", headers=AUTH, json={"reason": "case 10", "user": "bob"}).json()["id"]
    blank = client.delete(f"/v1/holds/{other}?reason=%20", headers=AUTH)  # a bad reason, not a conflict
    assert (blank.status_code, blank.json()["error"]["code"]) == (400, "invalid_hold")
    assert client.delete(f"/v1/holds/{other}?reason=done", headers=AUTH).status_code == 200
    assert client.get("/v1/holds", headers=AUTH).json() == []
    assert [h["id"] for h in client.get("/v1/holds?include_released=true", headers=AUTH).json()] == [hold_id, other]


def _finished(client: TestClient, job_id: str) -> dict[str, Any]:
    for _ in range(200):
        job = client.get(f"/v1/exports/{job_id}", headers=AUTH).json()
        if job["status"] != "running":
            return job
        time.sleep(0.05)
    raise AssertionError(job)


def test_export_jobs(client: TestClient, store: AuditStore, key: CheckpointKey, tmp_path: Path) -> None:
    started = client.post("/v1/exports", headers=AUTH, json={"format": "csv", "since": "2020-01-01T00:00:00Z"})
    assert started.status_code == 202 and started.json()["status"] == "running"
    job = _finished(client, started.json()["id"])
    assert (job["status"], job["total"], job["done"], job["records"]) == ("done", 3, 3, 3)
    names = [f["name"] for f in job["files"]]
    assert names and all(n.endswith(".csv") for n in names)
    data = client.get(f"/v1/exports/{job['id']}/files/{names[0]}", headers=AUTH)
    assert data.status_code == 200 and IDS[2] in data.text
    assert client.get(f"/v1/exports/{job['id']}/files/manifest.json", headers=AUTH).json()["totals"]["records"] == 3
    for name in ("..%2Fkey.pem", "nothing.csv", "%2Fetc%2Fpasswd"):
        assert client.get(f"/v1/exports/{job['id']}/files/{name}", headers=AUTH).status_code == 404
    assert client.get("/v1/exports/not-a-uuid", headers=AUTH).status_code == 404
    assert client.post("/v1/exports", headers=AUTH, json={"format": "xml"}).status_code == 400
    assert (
        client.post(
            "/v1/exports", headers=AUTH, json={"since": "2026-02-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"}
        ).status_code
        == 400
    )
    # A new API process finds the finished export by its folder.
    with TestClient(create_app(store, TOKEN, key, ApiOptions(exports_dir=tmp_path / "exports"))) as other:
        (found,) = other.get("/v1/exports", headers=AUTH).json()
        assert (found["id"], found["status"], found["records"], found["format"]) == (job["id"], "done", 3, "csv")
        assert other.get(f"/v1/exports/{job['id']}/files/{names[0]}", headers=AUTH).status_code == 200
    (tmp_path / "exports" / "6a3c9a8e-0000-4000-8000-000000000000").mkdir()  # cut off by a crash
    listed = {j["id"]: j["status"] for j in client.get("/v1/exports", headers=AUTH).json()}
    assert listed["6a3c9a8e-0000-4000-8000-000000000000"] == "incomplete"


def test_an_export_of_a_tampered_chain_fails(client: TestClient, store: AuditStore) -> None:
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE exchanges SET model = 'forged' WHERE id = :i"), {"i": IDS[2]})
    job = _finished(client, client.post("/v1/exports", headers=AUTH, json={}).json()["id"])
    assert job["status"] == "failed" and "does not verify" in job["error"] and job["files"] == []


def test_without_a_key_or_folder_the_writing_routes_say_so(store: AuditStore) -> None:
    with TestClient(create_app(store, TOKEN)) as c:
        assert (
            c.post("/v1/holds", headers=AUTH, json={"reason": "r", "user": "u"}).json()["error"]["code"]
            == "no_signing_key"
        )
        assert c.get("/v1/exports", headers=AUTH).json()["error"]["code"] == "exports_unavailable"
        assert c.post("/v1/retention/purge", headers=AUTH, json={"dry_run": False}).status_code == 503


def test_trial_findings_are_400_not_500(client: TestClient) -> None:
    """Trial findings: a far-future aware_at overflowed the deadline (500), a NUL in a hold's
    user reached PostgreSQL (500), a NUL export filter failed the job with the driver's text,
    an unknown outcome answered an empty list, "yes" was taken for a dry run's true, a NUL in the
    incidents' exchange_id filter reached PostgreSQL (500)."""
    future = {"title": "t", "category": "death", "aware_at": "9999-12-31T23:59:59Z"}
    assert client.post("/v1/incidents", headers=AUTH, json=future).status_code == 400
    ancient = {**future, "aware_at": "0001-01-01T00:00:00Z"}
    assert client.post("/v1/incidents", headers=AUTH, json=ancient).status_code == 400
    made = client.post("/v1/incidents", headers=AUTH, json={**future, "aware_at": "2026-11-30T00:00:00Z"}).json()
    moved = client.patch(f"/v1/incidents/{made['id']}", headers=AUTH, json={"aware_at": "9999-01-01T00:00:00Z"})
    assert moved.status_code == 400
    assert client.post("/v1/holds", headers=AUTH, json={"reason": "r", "user": "a\u0000b"}).status_code == 400
    assert client.post("/v1/holds", headers=AUTH, json={"reason": "r\u0000", "user": "a"}).status_code == 400
    assert client.post("/v1/exports", headers=AUTH, json={"model": ["a\u0000b"]}).status_code == 400
    for query in ("outcome=bogus", "violation=bogus"):
        response = client.get(f"/v1/exchanges?{query}", headers=AUTH)
        assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_parameter"
    assert client.get("/v1/exchanges?outcome=completed", headers=AUTH).status_code == 200
    assert client.post("/v1/retention/purge", headers=AUTH, json={"dry_run": "yes"}).status_code == 400
    # A NUL in the incident list's exchange_id filter reached PostgreSQL (500; found by test_api_fuzz)
    response = client.get("/v1/incidents?exchange_id=a%00b", headers=AUTH)
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_parameter"
