"""Every SQL query of the Grafana dashboards runs against a migrated PostgreSQL store (with
Grafana's macros expanded), so a schema change that breaks a panel fails the tests."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

DASHBOARDS = sorted((Path(__file__).resolve().parents[2] / "dashboards").glob("*.json"))


def expand_macros(sql: str) -> str:
    """Grafana PostgreSQL macros -> plain SQL over the last day."""
    sql = re.sub(r"\$__timeGroupAlias\((\w+(?:\.\w+)?),\s*'[^']+'\)", r"date_trunc('minute', \1) AS time", sql)
    sql = re.sub(r"\$__timeFilter\((\w+(?:\.\w+)?)\)", r"\1 > now() - interval '1 day'", sql)
    assert "$__" not in sql, sql
    return sql


def queries():
    for path in DASHBOARDS:
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel["targets"]:
                yield pytest.param(target["rawSql"], id=f"{path.stem}:{panel['title']}")


def test_there_are_dashboards():
    assert DASHBOARDS


@pytest.mark.postgres
@pytest.mark.parametrize("sql", list(queries()))
def test_panel_query_runs(pg_migrated_url, sql):
    engine = create_engine(pg_migrated_url)
    try:
        with engine.connect() as conn:
            conn.execute(text(expand_macros(sql))).all()
    finally:
        engine.dispose()
