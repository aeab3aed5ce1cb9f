"""Alert rules: their configuration and their evaluation (pure: no I/O, the clock is passed in).

The rules and webhooks live in a TOML file (setting ``alerts_file``)::

    [[webhook]]
    name = "secops"
    url = "https://hooks.example.com/observer"
    format = "json"                    # or "slack" (a Slack-compatible {"text": ...} body)
    headers = { Authorization = "env:SECOPS_WEBHOOK_AUTH" }   # "env:NAME": read from the environment

    [[rule]]
    name = "undeclared tool call"
    when = "undeclared_tool"           # see RULE_KINDS
    webhooks = ["secops"]              # default: every webhook
    severity = "critical"              # info, warning (default), critical
    cooldown_s = 60                    # at most one alert of this rule per cooldown; the rest are counted

    [[rule]]
    name = "errors"
    when = "error_rate"
    threshold = 0.2                    # share of the window's exchanges
    window_s = 300
    min_exchanges = 20                 # no rate alert on fewer exchanges than this in the window

Kinds (``RULE_KINDS``): per record ``undeclared_tool`` (a tool call naming no declared tool,
draft §8.2), ``content_filter`` (a content-filter stop); over a window ``error_rate`` (outcomes
``error``, ``http_error``) and ``truncation_rate`` (``truncated``, ``interrupted``); of the
pipeline ``record_dropped`` (a record lost: journal full or failing), ``recording_gap`` (a gap
record stored), ``spool_filling`` (journal bytes over ``threshold`` of its bound, default 0.8),
``database_down`` (records waiting for the database longer than ``threshold`` seconds, default 60).
"""

from __future__ import annotations

import os
import threading
import tomllib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from observer.errors import ConfigError
from observer.records import Exchange, Outcome, ViolationKind

RECORD_KINDS = ("undeclared_tool", "content_filter")
RATE_KINDS = ("error_rate", "truncation_rate")
PIPELINE_KINDS = ("record_dropped", "recording_gap", "spool_filling", "database_down")
RULE_KINDS = (*RECORD_KINDS, *RATE_KINDS, *PIPELINE_KINDS)
DEFAULT_THRESHOLD = {"error_rate": 0.2, "truncation_rate": 0.2, "spool_filling": 0.8, "database_down": 60.0}
RATE_OUTCOMES = {
    "error_rate": frozenset({Outcome.ERROR, Outcome.HTTP_ERROR}),
    "truncation_rate": frozenset({Outcome.TRUNCATED, Outcome.INTERRUPTED}),
}
MAX_WINDOW_S = 86400


class Webhook(BaseModel):
    """One receiver: ``url`` (http or https), ``format`` ``json`` (the alert as an object) or
    ``slack`` (``{"text": ...}``, what Slack, Mattermost and Teams' incoming webhooks take),
    extra ``headers`` (a value ``env:NAME`` is read from the environment, so secrets stay out of
    the file), ``timeout_s`` per attempt."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=100)
    url: str
    format: Literal["json", "slack"] = "json"
    headers: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = Field(5.0, gt=0, le=60)

    @field_validator("url")
    @classmethod
    def _http(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError("a webhook url is http:// or https://")
        return url

    def resolved_headers(self) -> dict[str, str]:
        """``headers`` with ``env:NAME`` values read from the environment; raises
        ``ConfigError`` naming a variable that is not set."""
        out = {}
        for name, value in self.headers.items():
            if value.startswith("env:"):
                var = value[4:]
                if var not in os.environ:
                    raise ConfigError(f"webhook {self.name}: header {name} names {var}, which is not set")
                value = os.environ[var]
            out[name] = value
        return out


class Rule(BaseModel):
    """One rule (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=100)
    when: Literal[RULE_KINDS]  # type: ignore[valid-type]
    threshold: float | None = Field(None, ge=0)
    window_s: int = Field(300, ge=10, le=MAX_WINDOW_S)
    min_exchanges: int = Field(10, ge=1)
    cooldown_s: int = Field(300, ge=0, le=MAX_WINDOW_S)
    severity: Literal["info", "warning", "critical"] = "warning"
    webhooks: list[str] | None = None

    @property
    def limit(self) -> float:
        """The threshold in force (the kind's default when not given)."""
        return self.threshold if self.threshold is not None else DEFAULT_THRESHOLD.get(self.when, 0.0)

    @model_validator(mode="after")
    def _threshold_fits(self) -> Rule:
        if self.when in (*RATE_KINDS, "spool_filling") and self.threshold is not None and self.threshold > 1:
            raise ValueError(f"the threshold of {self.when} is a share, 0-1")
        return self


class AlertConfig(BaseModel):
    """The alerts file: ``webhook`` and ``rule`` tables; names unique, every webhook a rule
    names defined."""

    model_config = ConfigDict(extra="forbid")

    webhook: list[Webhook] = Field(default_factory=list)
    rule: list[Rule] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> AlertConfig:
        hooks = [w.name for w in self.webhook]
        rules = [r.name for r in self.rule]
        for kind, names in (("webhook", hooks), ("rule", rules)):
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"{kind} names must be unique: {', '.join(dupes)}")
        for r in self.rule:
            unknown = [n for n in r.webhooks or () if n not in hooks]
            if unknown:
                raise ValueError(f"rule {r.name}: no webhook named {', '.join(unknown)}")
        return self

    def targets(self, rule: Rule) -> list[Webhook]:
        """The webhooks of ``rule`` (every webhook when it names none)."""
        if rule.webhooks is None:
            return list(self.webhook)
        return [w for w in self.webhook if w.name in rule.webhooks]


def load_alert_config(path: Path) -> AlertConfig:
    """Reads and checks the alerts file; raises ``ConfigError`` with one line naming the
    problem (unreadable, not TOML, an unknown key, a bad value, a header's variable unset)."""
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read the alerts file {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"the alerts file {path} is not TOML: {exc}") from None
    try:
        config = AlertConfig.model_validate(doc)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'file'}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise ConfigError(f"the alerts file {path}: {problems}") from None
    for hook in config.webhook:
        hook.resolved_headers()  # an unset variable is an error at start, not at the first alert
    return config


@dataclass(slots=True)
class Alert:
    """One fired alert: what the store keeps and the webhooks receive. ``details`` holds counts
    and ids only, never record content."""

    rule: str
    kind: str
    severity: str
    summary: str
    fired_at: datetime
    proxy: str
    details: dict[str, Any] = field(default_factory=dict)
    exchange_id: str | None = None
    id: str = field(default_factory=lambda: str(uuid.uuid4()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "rule": self.rule,
            "kind": self.kind,
            "severity": self.severity,
            "summary": self.summary,
            "fired_at": self.fired_at.isoformat().replace("+00:00", "Z"),
            "proxy": self.proxy,
            "exchange_id": self.exchange_id,
            "details": self.details,
        }


class AlertEngine:
    """Evaluates the rules: ``on_record`` for each finished record (cheap: it runs on the proxy's
    loop; it only compares and counts), ``on_tick`` every few seconds off the loop with the
    pipeline's values (``observer.metrics.pipeline_stats``). Both return the alerts that fire.
    Thread-safe. Times are epoch seconds."""

    def __init__(self, config: AlertConfig, proxy: str) -> None:
        self.config = config
        self._proxy = proxy
        self._lock = threading.Lock()
        self._last_fired: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._rates = {r.name: _Window(r.window_s) for r in config.rule if r.when in RATE_KINDS}
        self._seen: dict[str, float] = {}  # pipeline counters at the last tick

    def on_record(self, record: Exchange, now: float) -> list[Alert]:
        out: list[Alert] = []
        with self._lock:
            for rule in self.config.rule:
                if rule.when == "undeclared_tool":
                    if any(v.kind == ViolationKind.UNDECLARED_TOOL for v in record.violations):
                        names = sorted({c.name for c in record.tool_calls if not c.declared and c.name})
                        out += self._fire(
                            rule,
                            now,
                            f"undeclared tool call {', '.join(names)} on {record.host}",
                            {
                                "tools": names,
                                "model": record.model,
                                "dialect": record.dialect,
                                "host": record.host,
                            },
                            record.id,
                        )
                elif rule.when == "content_filter":
                    if record.stop_reason == "content_filter":
                        out += self._fire(
                            rule,
                            now,
                            f"content-filter stop on {record.host}",
                            {
                                "model": record.model,
                                "dialect": record.dialect,
                                "host": record.host,
                                "stop_reason_raw": record.stop_reason_raw,
                            },
                            record.id,
                        )
                elif rule.when in RATE_KINDS:
                    self._rates[rule.name].add(now, record.outcome in RATE_OUTCOMES[rule.when])
        return out

    def on_tick(self, pipeline: Mapping[str, float], now: float) -> list[Alert]:
        out: list[Alert] = []
        with self._lock:
            for rule in self.config.rule:
                if rule.when in RATE_KINDS:
                    total, hits = self._rates[rule.name].counts(now)
                    if total >= rule.min_exchanges and hits / total > rule.limit:
                        share = hits / total
                        out += self._fire(
                            rule,
                            now,
                            f"{rule.when.replace('_', ' ')} {share:.0%} over {rule.window_s} s",
                            {
                                "exchanges": total,
                                "matching": hits,
                                "share": round(share, 4),
                                "threshold": rule.limit,
                            },
                        )
                elif rule.when in ("record_dropped", "recording_gap"):
                    name = "records_dropped" if rule.when == "record_dropped" else "gaps_stored"
                    value = float(pipeline.get(name, 0.0))
                    before = self._seen.get(f"{rule.name}:{name}", 0.0)  # (the counters start at 0 with the process)
                    self._seen[f"{rule.name}:{name}"] = value
                    if value > before:
                        what = "records dropped" if rule.when == "record_dropped" else "gap records stored"
                        out += self._fire(
                            rule, now, f"{value - before:.0f} {what}", {"new": value - before, "total": value}
                        )
                elif rule.when == "spool_filling":
                    used, bound = float(pipeline.get("spool_bytes", 0.0)), float(pipeline.get("spool_max_bytes", 0.0))
                    if bound and used / bound >= rule.limit:
                        out += self._fire(
                            rule,
                            now,
                            f"the journal holds {used / bound:.0%} of its bound",
                            {
                                "spool_bytes": used,
                                "spool_max_bytes": bound,
                            },
                        )
                elif rule.when == "database_down":
                    waiting = float(pipeline.get("spool_oldest_age_seconds", 0.0))
                    if pipeline.get("database_up", 1.0) < 1.0 and waiting >= rule.limit:
                        out += self._fire(
                            rule,
                            now,
                            f"records wait for the database for {waiting:.0f} s",
                            {
                                "waiting_s": round(waiting, 1),
                                "spool_bytes": pipeline.get("spool_bytes", 0.0),
                            },
                        )
        return out

    def _fire(
        self, rule: Rule, now: float, summary: str, details: dict[str, Any], exchange_id: str | None = None
    ) -> list[Alert]:
        last = self._last_fired.get(rule.name)
        if last is not None and now - last < rule.cooldown_s:
            self._suppressed[rule.name] = self._suppressed.get(rule.name, 0) + 1
            return []
        self._last_fired[rule.name] = now
        suppressed = self._suppressed.pop(rule.name, 0)
        if suppressed:
            details = {**details, "suppressed_since_last": suppressed}
        fired = datetime.fromtimestamp(now, timezone.utc)
        return [Alert(rule.name, rule.when, rule.severity, summary, fired, self._proxy, details, exchange_id)]


class _Window:
    """Counts per second over the last ``window_s`` seconds (memory: one entry per second)."""

    def __init__(self, window_s: int) -> None:
        self._window_s = window_s
        self._buckets: dict[int, list[int]] = {}

    def add(self, now: float, hit: bool) -> None:
        bucket = self._buckets.setdefault(int(now), [0, 0])
        bucket[0] += 1
        bucket[1] += hit
        if len(self._buckets) > self._window_s + 1:
            self._trim(now)

    def counts(self, now: float) -> tuple[int, int]:
        self._trim(now)
        return sum(b[0] for b in self._buckets.values()), sum(b[1] for b in self._buckets.values())

    def _trim(self, now: float) -> None:
        oldest = int(now) - self._window_s
        for second in [s for s in self._buckets if s <= oldest]:
            del self._buckets[second]


__all__ = ["RULE_KINDS", "Alert", "AlertConfig", "AlertEngine", "Rule", "Webhook", "load_alert_config"]
