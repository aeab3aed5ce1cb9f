"""The Grafana dashboards (``dashboards/``, issue 14 item 4) against the code and the store:

- every dashboard parses, has a uid, unique panel ids, and uses only the provisioned data
  sources (``dashboards/provisioning/datasources/observer.yaml``), directly or through a data
  source variable defaulting to one;
- every metric a PromQL expression (panel or variable query) names is one the API's
  ``GET /metrics`` exports, as produced by running the code (``ProxyMetrics`` -> snapshot file ->
  ``observer.api.metrics.exposition``), with labels that metric carries, counters only through
  a range (``rate``/``increase`` over ``$__rate_interval`` or ``$__range``), and known functions;
- every SQL query (panels and annotations) runs against a migrated PostgreSQL store holding a
  few records, with Grafana's macros expanded, as a role holding only the read grants
  ``dashboards/README.md`` lists, and returns rows with the columns its panel needs.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, text

from observer.api.metrics import exposition
from observer.metrics import PIPELINE, ProxyMetrics, SnapshotWriter
from observer.records import Exchange, ToolCall, Usage, Violation
from observer.store.alerts import add_alert
from observer.store.store import AuditStore

ROOT = Path(__file__).resolve().parents[2] / "dashboards"
DASHBOARDS = sorted(ROOT.glob("*.json"))
DATASOURCES = ROOT / "provisioning" / "datasources" / "observer.yaml"
PROVIDERS = ROOT / "provisioning" / "dashboards" / "observer.yaml"
PROMETHEUS = ROOT / "prometheus.yml"
#: What the read-only Grafana role is granted (``dashboards/README.md`` says the same).
GRAFANA_TABLES = ("exchanges", "exchange_tool_calls", "exchange_violations", "alerts", "gaps")
PROM, PG = "prometheus", "grafana-postgresql-datasource"
#: Ranges a counter may be read over: Grafana's, never a hand-written window.
RANGES = {"$__rate_interval", "$__range"}
T0 = datetime(2026, 6, 1, 9, 0, tzinfo=timezone.utc)
#: The dashboards' time range in the SQL tests: from before the seeded records to well after now
#: (a gap's ``created_at`` is the database clock's).
TIME_FROM, TIME_TO = "'2026-01-01T00:00:00Z'", "'2100-01-01T00:00:00Z'"

PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool"}
PROMQL_FUNCTIONS = {
    # aggregation operators
    *("sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values"),
    *("group", "limitk", "limit_ratio"),
    # functions
    *("abs", "absent", "absent_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min", "day_of_month"),
    *("day_of_week", "day_of_year", "days_in_month", "delta", "deriv", "exp", "floor", "histogram_quantile"),
    *("histogram_count", "histogram_sum", "histogram_fraction", "holt_winters", "hour", "idelta", "increase"),
    *("irate", "label_join", "label_replace", "ln", "log2", "log10", "minute", "month", "predict_linear", "rate"),
    *("resets", "round", "scalar", "sgn", "sort", "sort_desc", "sqrt", "time", "timestamp", "vector", "year"),
    *("avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time", "quantile_over_time"),
    *("stddev_over_time", "stdvar_over_time", "last_over_time", "present_over_time"),
}


# ---------------------------------------------------------------------------- the files


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def all_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def query_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The panels that query (rows and text panels do not)."""
    return (p for p in all_panels(dashboard) if p.get("type") != "row" and p.get("targets"))


def provisioned() -> dict[str, str]:
    """uid -> type of the provisioned data sources."""
    return {d["uid"]: d["type"] for d in yaml.safe_load(DATASOURCES.read_text())["datasources"]}


def variables(dashboard: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dashboard.get("templating", {}).get("list", [])}


def datasource_type(dashboard: dict[str, Any], ref: dict[str, Any]) -> str:
    """The type of a panel's or target's data source reference (a provisioned uid, or a data
    source variable of that type whose default is a provisioned one); fails otherwise."""
    sources = provisioned()
    uid, kind = ref.get("uid", ""), ref.get("type")
    var = re.fullmatch(r"\$\{?(\w+)\}?", uid)
    if var:
        variable = variables(dashboard).get(var[1])
        assert variable is not None and variable["type"] == "datasource", f"{uid}: not a data source variable"
        assert variable["query"] == kind, f"{uid}: a {variable['query']} variable used as {kind}"
        default = variable.get("current", {}).get("value")
        assert sources.get(default) == kind, f"{uid}: its default {default!r} is no provisioned {kind} data source"
        return kind
    assert sources.get(uid) == kind, f"{ref}: not a provisioned data source"
    return kind


def targets(dashboard: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(data source type, target, panel or annotation) of every query of the dashboard."""
    for panel in query_panels(dashboard):
        for target in panel["targets"]:
            yield datasource_type(dashboard, target.get("datasource", panel["datasource"])), target, panel
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if annotation.get("builtIn"):
            continue
        yield datasource_type(dashboard, annotation["datasource"]), annotation["target"], annotation


def promql(dashboard: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(expression, target) of every PromQL query: panels' and query variables' (whose
    ``label_values(selector, label)`` is turned into ``count by (label) (selector)``, its target
    naming the ``variable``: it lists label values, so a counter may be read without a range)."""
    for kind, target, _panel in targets(dashboard):
        if kind == PROM:
            yield target["expr"], target
    for variable in variables(dashboard).values():
        if variable["type"] != "query":
            continue
        assert datasource_type(dashboard, variable["datasource"]) == PROM
        query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query.strip())
        assert m, f"variable {variable['name']}: {query!r} is not label_values(selector, label)"
        yield f"count by ({m[2]}) ({m[1]})", {"legendFormat": f"{{{{{m[2]}}}}}", "variable": variable["name"]}


def sql_queries() -> Iterator[Any]:
    for path in DASHBOARDS:
        dashboard = load(path)
        for kind, target, panel in targets(dashboard):
            if kind == PG:
                yield pytest.param(target, panel, id=f"{path.stem}:{panel.get('title') or panel['name']}")


# ---------------------------------------------------------------------------- PromQL


def parse_promql(expr: str) -> dict[str, Any]:
    """The metric names of ``expr`` with the labels matched on each, the grouping labels
    (``by``, ``on``, ...), the functions called, the ranges, and the metrics read through a
    range (``metric{...}[...]``)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)  # string literals
    ident = r"[A-Za-z_:][A-Za-z0-9_:]*"
    ranged = set(re.findall(rf"({ident})\s*(?:\{{[^}}]*\}})?\s*\[", e))
    ranges = re.findall(r"\[([^\]]*)\]", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    matched: dict[str, set[str]] = {}
    for name, matchers in re.findall(rf"({ident})?\s*\{{([^}}]*)\}}", e):
        assert name, f"{expr!r}: a selector without a metric name"
        matched.setdefault(name, set()).update(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers))
    e = re.sub(r"\{[^}]*\}", " ", e)
    grouping: set[str] = set()
    for labels in re.findall(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", e):
        grouping.update(label.strip() for label in labels.split(",") if label.strip())
    e = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    functions = set(re.findall(rf"({ident})\s*\(", e))
    e = re.sub(rf"{ident}\s*\(", "(", e)
    e = re.sub(r"\b\d+(?:\.\d+)?(?:[eE][+-]?\d+)?\b", " ", e)  # numbers
    metrics = set(re.findall(ident, e)) - PROMQL_KEYWORDS
    assert not set(matched) - metrics, expr
    return {
        "metrics": metrics,
        "matched": matched,
        "grouping": grouping,
        "functions": functions,
        "ranges": ranges,
        "ranged": ranged,
    }


def test_promql_parser_finds_names_labels_and_ranges():
    got = parse_promql(
        'histogram_quantile(0.95, sum by (le, dialect) (rate(observer_x_bucket{proxy=~"$proxy", a!="b{c}"}'
        "[$__rate_interval])))\n/ on (proxy) group_left clamp_min(observer_y, 1e-3) > bool 2"
    )
    assert got["metrics"] == {"observer_x_bucket", "observer_y"}
    assert got["matched"] == {"observer_x_bucket": {"proxy", "a"}}
    assert got["grouping"] == {"le", "dialect", "proxy"}
    assert got["functions"] == {"histogram_quantile", "sum", "rate", "clamp_min"}
    assert got["ranges"] == ["$__rate_interval"]
    assert got["ranged"] == {"observer_x_bucket"}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, set[str]]]:
    """sample name -> (family type, label names) of what ``GET /metrics`` serves, made by the
    code: a proxy's metrics with every pipeline value, two records observed (one with usage,
    time to first token, a violation; one without usage: its counter exists only once counted),
    written as a snapshot file and read back by the API's exposition."""
    metrics = ProxyMetrics(pipeline=lambda: dict.fromkeys(PIPELINE, 1))
    base = {
        "dialect": "openai.chat",
        "host": "api.openai.com",
        "path": "/v1/chat/completions",
        "method": "POST",
        "http_version": "HTTP/1.1",
        "started_at": T0,
        "ended_at": T0 + timedelta(seconds=2),
    }
    metrics.observe(
        Exchange(
            id="a",
            model="gpt-4o",
            usage=Usage(10, 5, True),
            ttft_s=0.3,
            outcome="completed",
            violations=[Violation("undeclared_tool", None, "")],
            **base,
        )
    )
    metrics.observe(Exchange(id="b", model="gpt-4o", outcome="error", **base))
    metrics.db_write.observe(0.01)
    directory = tmp_path_factory.mktemp("metrics")
    SnapshotWriter(metrics, directory, "proxy-1").write()
    out: dict[str, tuple[str, set[str]]] = {}
    for family in text_string_to_metric_families(exposition(directory).decode()):
        for s in family.samples:
            kind, labels = out.setdefault(s.name, (family.type, set()))
            labels.update(s.labels)
    assert "observer_proxy_snapshot_age_seconds" in out
    return out


def test_there_are_dashboards():
    assert {p.name for p in DASHBOARDS} >= {
        "audit-store.json",
        "llm-usage.json",
        "stream-quality.json",
        "pipeline-health.json",
    }


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_dashboard_is_well_formed(path: Path):
    dashboard = load(path)
    assert dashboard.get("uid") and dashboard.get("title")
    assert 36 <= dashboard["schemaVersion"] <= 41
    ids = [p["id"] for p in all_panels(dashboard)]
    assert len(ids) == len(set(ids)), f"panel ids repeated: {ids}"
    for panel in all_panels(dashboard):
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        kind = datasource_type(dashboard, panel["datasource"])
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert datasource_type(dashboard, target.get("datasource", panel["datasource"])) == kind, panel["title"]
            assert target.get("expr") if kind == PROM else target.get("rawSql"), panel["title"]
    for variable in variables(dashboard).values():
        if variable["type"] == "datasource":
            assert provisioned().get(variable["current"]["value"]) == variable["query"], variable["name"]


def test_dashboard_uids_are_unique():
    uids = [load(p)["uid"] for p in DASHBOARDS]
    assert len(uids) == len(set(uids))


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_every_promql_metric_is_exported(path: Path, exported: dict[str, tuple[str, set[str]]]):
    dashboard = load(path)
    for expr, target in promql(dashboard):
        got = parse_promql(expr)
        unknown = got["metrics"] - set(exported)
        assert not unknown, f"{path.name}: {expr!r} reads metrics the code does not export: {sorted(unknown)}"
        assert got["functions"] <= PROMQL_FUNCTIONS, f"{expr!r}: unknown functions"
        labels = set().union(*(exported[m][1] for m in got["metrics"]))
        for metric, matched in got["matched"].items():
            assert matched <= exported[metric][1], f"{expr!r}: {metric} has no label {matched - exported[metric][1]}"
        assert got["grouping"] <= labels, f"{expr!r}: grouped by labels none of its metrics has"
        legend = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))
        assert legend <= (got["grouping"] or labels), f"{expr!r}: the legend names labels the result lacks"
        for metric in got["metrics"] if "variable" not in target else ():
            if exported[metric][0] in ("counter", "histogram"):
                assert metric in got["ranged"], f"{expr!r}: counter {metric} read without rate()/increase()"
        assert set(got["ranges"]) <= RANGES, f"{expr!r}: a range other than {RANGES}"
        if got["ranged"]:
            assert got["functions"] & {"rate", "increase", "irate"}, expr


def test_a_made_up_metric_fails_the_check(exported: dict[str, tuple[str, set[str]]]):
    """What the check above does with a name the code does not export."""
    got = parse_promql('sum by (model) (rate(observer_tokens_spent_total{proxy=~"$proxy"}[$__rate_interval]))')
    assert got["metrics"] - set(exported) == {"observer_tokens_spent_total"}


def test_every_exported_observer_metric_is_on_a_dashboard(exported: dict[str, tuple[str, set[str]]]):
    """Not a rule of the issue, a reminder: a new metric should find its panel."""
    used: set[str] = set()
    for path in DASHBOARDS:
        for expr, _target in promql(load(path)):
            used |= parse_promql(expr)["metrics"]
    families = {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in exported if not n.endswith("_created")}
    covered = {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in used}
    assert families - covered == set()


# ---------------------------------------------------------------------------- provisioning


def test_datasources_are_provisioned_without_secrets():
    config = yaml.safe_load(DATASOURCES.read_text())
    sources = {d["uid"]: d for d in config["datasources"]}
    assert {d["type"] for d in sources.values()} == {PROM, PG}
    prom = next(d for d in sources.values() if d["type"] == PROM)
    assert prom["url"] == "http://prometheus:9090"
    scrape = yaml.safe_load(PROMETHEUS.read_text())["global"]["scrape_interval"]
    assert prom["jsonData"]["timeInterval"] == scrape  # $__rate_interval is at least 4 scrapes
    pg = next(d for d in sources.values() if d["type"] == PG)
    env = re.compile(r"\$(\w+|\{\w+\}|__env\{\w+\}|__file\{[^}]+\})")
    for value in [pg["url"], pg["user"], pg["jsonData"]["database"], *pg["secureJsonData"].values()]:
        assert env.fullmatch(value), f"{value!r} is not taken from the environment"
    for source in sources.values():
        assert "password" not in source and "basicAuthPassword" not in source
        for value in source.get("secureJsonData", {}).values():
            assert env.fullmatch(value), "a secret written into the provisioning file"


def test_dashboards_provider_points_at_the_mounted_folder():
    (provider,) = yaml.safe_load(PROVIDERS.read_text())["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
    readme = (ROOT / "README.md").read_text()
    assert "/var/lib/grafana/dashboards" in readme and "/etc/grafana/provisioning" in readme


def test_prometheus_scrapes_the_api_with_a_token_file():
    (job,) = yaml.safe_load(PROMETHEUS.read_text())["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["authorization"] == {"type": "Bearer", "credentials_file": "/run/secrets/observer-token"}
    assert job["static_configs"][0]["targets"]


# ---------------------------------------------------------------------------- SQL


def interval_seconds(arg: str) -> int:
    arg = arg.strip().strip("'")
    if arg in ("$__interval", "$__interval_ms"):
        return 300
    m = re.fullmatch(r"(\d+)([smhdw])", arg)
    assert m, f"interval {arg!r}"
    return int(m[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m[2]]


def expand_macros(sql: str) -> str:
    """Grafana's PostgreSQL macros and template variables -> plain SQL (as Grafana expands
    them, over ``TIME_FROM``..``TIME_TO``)."""

    def group(m: re.Match[str], alias: str) -> str:
        step = interval_seconds(m[2])
        return f"floor(extract(epoch from {m[1]})/{step})*{step}{alias}"

    col = r"(\w+(?:\.\w+)?)"
    sql = re.sub(rf"\$__timeGroupAlias\(\s*{col}\s*,\s*([^,)]+)(?:,[^)]*)?\)", lambda m: group(m, ' AS "time"'), sql)
    sql = re.sub(rf"\$__timeGroup\(\s*{col}\s*,\s*([^,)]+)(?:,[^)]*)?\)", lambda m: group(m, ""), sql)
    sql = re.sub(rf"\$__timeFilter\(\s*{col}\s*\)", rf"\1 BETWEEN {TIME_FROM} AND {TIME_TO}", sql)
    sql = re.sub(r"\$__timeFrom\(\)", TIME_FROM, sql)
    sql = re.sub(r"\$__timeTo\(\)", TIME_TO, sql)
    sql = re.sub(r"\$\{\w+(?::\w+)?\}|\$(?!__)\w+", "'x'", sql)  # template variables
    assert "$" not in sql, sql
    return sql


def test_macros_expand_as_grafana_does():
    got = expand_macros(
        "SELECT $__timeGroupAlias(e.started_at, '1h'), $__timeGroup(x, $__interval) FROM t"
        " WHERE $__timeFilter(started_at) AND m IN (${model:sqlstring}) AND h = $host"
    )
    assert got == (
        'SELECT floor(extract(epoch from e.started_at)/3600)*3600 AS "time", floor(extract(epoch from x)/300)*300'
        f" FROM t WHERE started_at BETWEEN {TIME_FROM} AND {TIME_TO} AND m IN ('x') AND h = 'x'"
    )


def seed(url: str) -> None:
    """A few records (usage, time to first token, a violation, an undeclared tool call), a gap
    and an alert: every table a panel reads holds rows."""
    base = {
        "dialect": "openai.chat",
        "host": "api.openai.com",
        "path": "/v1/chat/completions",
        "method": "POST",
        "http_version": "HTTP/1.1",
        "status_code": 200,
    }
    records = [
        Exchange(
            id=str(uuid.uuid4()),
            started_at=T0 + timedelta(minutes=i),
            ended_at=T0 + timedelta(minutes=i, seconds=3),
            ttft_s=0.2 * (i + 1),
            model=model,
            usage=Usage(100 * (i + 1), 20, True) if usage else Usage(),
            outcome=outcome,
            violations=[Violation("missing_stream_end", None, "no [DONE]")] if outcome != "completed" else [],
            tool_calls=[ToolCall(0, "call_1", "rm_rf", "{}", declared=False)] if i == 0 else [],
            **base,
        )
        for i, (model, usage, outcome) in enumerate(
            [("gpt-4o", True, "completed"), ("gpt-4o", True, "truncated"), ("claude-x", False, "completed")]
        )
    ]
    gap = {"seq": 4, "seq_end": 4, "first_at": T0, "last_at": T0, "dropped": 2, "reason": "queue_full", "detail": None}
    store = AuditStore(url)
    try:
        store.write_many(records, writer_id=str(uuid.uuid4()), seqs=[1, 2, 3], gaps=[gap])
        add_alert(
            store.engine,
            {
                "id": str(uuid.uuid4()),
                "fired_at": T0 + timedelta(minutes=5),
                "rule": "undeclared-tools",
                "kind": "undeclared_tool",
                "severity": "critical",
                "summary": "undeclared tool rm_rf",
                "proxy": "proxy-1",
                "exchange_id": records[0].id,
                "details": {"tool": "rm_rf"},
                "deliveries": {},
            },
        )
    finally:
        store.dispose()


@pytest.fixture
def grafana_engine(pg_migrated_url: str) -> Iterator[Any]:
    """An engine on the seeded store whose connections act as a role holding only USAGE on the
    schema and SELECT on ``GRAFANA_TABLES`` (what README.md grants Grafana's role), read-only."""
    seed(pg_migrated_url)
    engine = create_engine(pg_migrated_url)
    role = f"grafana_ro_{uuid.uuid4().hex[:12]}"
    with engine.begin() as conn:
        schema = conn.execute(text("SELECT current_schema()")).scalar_one()
        conn.execute(text(f'CREATE ROLE "{role}" NOLOGIN'))
        conn.execute(text(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"'))
        conn.execute(text(f'GRANT SELECT ON {", ".join(GRAFANA_TABLES)} TO "{role}"'))
    try:
        yield engine, role
    finally:
        with engine.begin() as conn:
            conn.execute(text(f'DROP OWNED BY "{role}"'))
            conn.execute(text(f'DROP ROLE "{role}"'))
        engine.dispose()


@pytest.mark.postgres
@pytest.mark.parametrize(("target", "panel"), list(sql_queries()))
def test_sql_query_runs_on_the_store(grafana_engine: Any, target: dict[str, Any], panel: dict[str, Any]):
    engine, role = grafana_engine
    with engine.connect() as conn, conn.begin():
        conn.execute(text("SET TRANSACTION READ ONLY"))
        conn.execute(text(f'SET LOCAL ROLE "{role}"'))
        result = conn.execute(text(expand_macros(target["rawSql"])))
        columns = list(result.keys())
        rows = result.all()
    assert rows, "no rows from the seeded store: a join or filter matches nothing"
    assert len(columns) == len(set(columns)), columns
    first = dict(zip(columns, rows[0], strict=True))
    if target.get("format") == "time_series":
        assert "time" in columns, columns
        values = [c for c in columns if c not in ("time", "metric")]
        assert values and all(isinstance(first[c], int | float | Decimal) or first[c] is None for c in values), first
    if "name" in panel:  # an annotation
        assert {"time", "text"} <= set(columns), columns
    overrides = panel.get("fieldConfig", {}).get("overrides", [])
    named = {o["matcher"]["options"] for o in overrides if o["matcher"]["id"] == "byName"}
    assert named <= set(columns), f"overrides name columns the query lacks: {named - set(columns)}"
    x_field = panel.get("options", {}).get("xField")
    assert x_field is None or x_field in columns, x_field
