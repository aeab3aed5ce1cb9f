"""Monthly partitions of the exchange tables on PostgreSQL (``observer.store.partitions``): names
and bounds by hand; partitions made ahead and on demand; a purge dropping a whole month; a late
record into a dropped month; the migration keeping every row both ways."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa

from observer.records import Block, Exchange, ToolCall
from observer.store.checkpoint import CheckpointKey
from observer.store.holds import Scope, create_hold
from observer.store.migrate import downgrade, upgrade
from observer.store.partitions import bounds, is_partition, month_of, next_month, partition_name
from observer.store.purge import purge
from observer.store.store import AuditStore
from observer.store.verify import verify

UTC = timezone.utc
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
W = "00000000-0000-4000-8000-00000000000a"


def test_names_and_bounds_by_hand() -> None:
    assert month_of(datetime(2026, 3, 31, 23, 30, tzinfo=timezone(timedelta(hours=-2)))) == (2026, 4)  # UTC
    assert next_month((2026, 12)) == (2027, 1)
    assert bounds((2026, 12)) == (datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))
    assert partition_name("exchange_blocks", (2026, 3)) == "exchange_blocks_p2026_03"
    assert is_partition("exchanges_p2026_03") and not is_partition("exchanges") and not is_partition("gaps_p2026_03")
    with pytest.raises(ValueError, match="gaps is not partitioned"):
        partition_name("gaps", (2026, 3))


def _months(store: AuditStore, table: str = "exchanges") -> list[str]:
    with store.engine.connect() as conn:
        return sorted(
            conn.execute(
                sa.text(
                    "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = :t ::regclass"
                ),
                {"t": table},
            ).scalars()
        )


def _where(store: AuditStore, table: str, key: str, value: str) -> list[str]:
    with store.engine.connect() as conn:
        return sorted(
            conn.execute(
                sa.text(f"SELECT tableoid::regclass::text FROM {table} WHERE {key} = :v"), {"v": value}
            ).scalars()
        )


@pytest.fixture
def pg_store(pg_migrated_url: str) -> AuditStore:
    store = AuditStore(pg_migrated_url)
    yield store  # type: ignore[misc]
    store.dispose()


@pytest.fixture
def key(tmp_path: Path) -> CheckpointKey:
    return CheckpointKey.load_or_create(tmp_path / "key.pem")


def _record(make_exchange: Callable[..., Exchange], rid: str, at: datetime) -> Exchange:
    return make_exchange(
        rid,
        at,
        blocks=[Block(index=0, text=f"text of {rid}")],
        tool_calls=[ToolCall(index=0, id="c", name="f", arguments="{}")],
    )


@pytest.mark.postgres
def test_months_are_made_ahead_and_on_demand(pg_store: AuditStore, make_exchange: Callable[..., Exchange]) -> None:
    this = month_of(datetime.now(UTC))
    ahead = {partition_name("exchanges", this), partition_name("exchanges", next_month(this))}
    assert ahead <= set(_months(pg_store))  # made by the migration
    pg_store.write_many([_record(make_exchange, "feb", datetime(2025, 2, 10, tzinfo=UTC))], writer_id=W, seqs=[1])
    assert "exchanges_p2025_02" in _months(pg_store)
    assert _where(pg_store, "exchanges", "id", "feb") == ["exchanges_p2025_02"]
    assert _where(pg_store, "exchange_blocks", "exchange_id", "feb") == ["exchange_blocks_p2025_02"]
    assert _where(pg_store, "exchange_tool_calls", "exchange_id", "feb") == ["exchange_tool_calls_p2025_02"]
    assert pg_store.get("feb")["blocks"][0]["text"] == "text of feb"  # type: ignore[index]


@pytest.mark.postgres
def test_a_purge_drops_whole_months_and_deletes_the_rest(
    pg_store: AuditStore, key: CheckpointKey, make_exchange: Callable[..., Exchange]
) -> None:
    march = [_record(make_exchange, f"mar-{i}", datetime(2026, 3, 1 + i, tzinfo=UTC)) for i in range(3)]
    april = [_record(make_exchange, f"apr-{i}", datetime(2026, 4, 1 + i, tzinfo=UTC)) for i in range(3)]
    recent = [_record(make_exchange, "recent", NOW - timedelta(days=1))]
    april[1].request.end_user = "held"
    pg_store.write_many([*march, *april, *recent], writer_id=W, seqs=list(range(1, 8)))
    create_hold(pg_store.engine, key, pg_store.store_id(), Scope(end_user="held"), "case", "legal", NOW)
    result = purge(pg_store, key, now=NOW, retention_days=183, retention_override=False, actor="ops")
    assert result.dropped == [(2026, 3)]  # April holds a held record: its rows are deleted one run at a time
    assert [(a, b) for _w, a, b, _h in result.runs] == [(1, 4), (6, 6)]
    assert "exchanges_p2026_03" not in _months(pg_store)
    assert "exchange_blocks_p2026_03" not in _months(pg_store, "exchange_blocks")
    assert "exchanges_p2026_04" in _months(pg_store)
    with pg_store.engine.connect() as conn:
        assert sorted(conn.execute(sa.text("SELECT id FROM exchanges")).scalars()) == ["apr-1", "recent"]
        assert conn.execute(sa.text("SELECT count(*) FROM exchange_blocks")).scalar() == 2
    report = verify(pg_store, key.public)
    assert report.ok, report.breaks
    assert report.purged == 5
    # A record of a dropped month arriving late: its partition is made again (the store's own
    # memory of the months is stale).
    late = _record(make_exchange, "late", datetime(2026, 3, 15, tzinfo=UTC))
    pg_store.write_many([late], writer_id=W, seqs=[8])
    assert _where(pg_store, "exchanges", "id", "late") == ["exchanges_p2026_03"]
    assert verify(pg_store, key.public).ok


def test_the_migration_keeps_every_row_both_ways(
    migrated_url: str, key: CheckpointKey, make_exchange: Callable[..., Exchange]
) -> None:
    store = AuditStore(migrated_url)
    try:
        records = [_record(make_exchange, f"m-{i}", datetime(2026, 1 + i, 5, tzinfo=UTC)) for i in range(4)]
        store.write_many(records, writer_id=W, seqs=[1, 2, 3, 4])
        before = [store.get(f"m-{i}") for i in range(4)]
        store.dispose()
        downgrade(migrated_url, "0004")
        with sa.create_engine(migrated_url).connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM exchange_blocks")).scalar() == 4
            columns = [c["name"] for c in sa.inspect(conn).get_columns("exchange_blocks")]
            assert "exchange_started_at" not in columns
        upgrade(migrated_url)
        assert [store.get(f"m-{i}") for i in range(4)] == before
        assert verify(store, None).ok
        if store.engine.dialect.name == "postgresql":
            assert {"exchanges_p2026_01", "exchanges_p2026_04"} <= set(_months(store))
    finally:
        store.dispose()
