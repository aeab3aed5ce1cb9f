"""Delivering alerts: one thread per proxy process stores each alert (``observer.store.alerts``)
and posts it to its webhooks, retried with backoff; it also ticks the rule engine every
``tick_s`` seconds with the pipeline's values. Nothing here runs on the proxy's loop: the loop
only hands over fired alerts (``submit``: a bounded queue, never blocking).

A webhook answer 2xx is delivered; 408, 425, 429, 5xx, a timeout or a connection error is
retried after ``backoff_s`` (1, 2, 5, 10, 30, 60 s, then 60 s) up to ``max_attempts``; any
other answer is final (a 4xx will not get better). Each alert's ``deliveries`` in the store end
as ``delivered`` or ``failed: <why>`` per webhook. A database that does not take the alert is
retried the same way; the webhooks are not held back for it.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from observer.alerting.rules import Alert, AlertConfig, AlertEngine, Webhook

log = logging.getLogger("observer.alerts")

BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
RETRIED_STATUS = frozenset({408, 425, 429})
QUEUE_MAX = 1000


def slack_text(alert: Alert) -> str:
    """The one line a chat webhook shows."""
    return (
        f"[{alert.severity}] {alert.rule}: {alert.summary} (proxy {alert.proxy}, "
        f"{alert.fired_at.isoformat(timespec='seconds').replace('+00:00', 'Z')}"
        + (f", exchange {alert.exchange_id}" if alert.exchange_id else "")
        + ")"
    )


def body_of(alert: Alert, hook: Webhook) -> dict[str, Any]:
    """The JSON body ``hook`` receives: the alert itself, or Slack's ``{"text": ...}``."""
    return {"text": slack_text(alert)} if hook.format == "slack" else alert.to_dict()


@dataclass(order=True, slots=True)
class _Task:
    due: float
    order: int
    alert: Alert = field(compare=False)
    hook: Webhook | None = field(compare=False)  # None: store the alert
    attempt: int = field(default=1, compare=False)


class AlertDispatcher:
    """The delivery thread. ``store``: a function storing one alert row and one updating its
    deliveries (``None``: alerts are not stored, logged only); ``post``: how a body is sent
    (tests; default httpx)."""

    def __init__(
        self,
        config: AlertConfig,
        engine: AlertEngine,
        pipeline: Callable[[], Mapping[str, float]],
        store: tuple[Callable[[dict[str, Any]], None], Callable[[str, dict[str, str]], None]] | None,
        *,
        tick_s: float = 5.0,
        backoff_s: tuple[float, ...] = BACKOFF_S,
        max_attempts: int = 8,
        queue_max: int = QUEUE_MAX,
        clock: Callable[[], float] = time.time,
        post: Callable[[Webhook, dict[str, Any]], int] | None = None,
    ) -> None:
        self._config = config
        self._engine = engine
        self._pipeline = pipeline
        self._store = store
        self._tick_s = tick_s
        self._backoff_s = backoff_s
        self._max_attempts = max_attempts
        self._queue_max = queue_max
        self._clock = clock
        self._post = post or self._http_post
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._incoming: list[Alert] = []
        self._tasks: list[_Task] = []
        self._order = itertools.count()
        self._deliveries: dict[str, dict[str, str]] = {}
        self._stored: set[str] = set()
        self._thread: threading.Thread | None = None
        self.fired = self.delivered = self.failed = self.dropped = 0
        self._last_drop_log = -3600.0

    # ----- any thread -----
    def submit(self, alerts: list[Alert]) -> None:
        """Hands fired alerts to the thread; beyond ``queue_max`` waiting they are dropped,
        counted and logged (at most once a minute)."""
        if not alerts:
            return
        with self._lock:
            room = self._queue_max - len(self._incoming) - len(self._tasks)
            take, lost = alerts[: max(0, room)], len(alerts) - max(0, room)
            self._incoming.extend(take)
            self.dropped += max(0, lost)
        if lost > 0:
            now = time.monotonic()
            if now - self._last_drop_log >= 60.0:
                self._last_drop_log = now
                log.error("observer: alerts: %d alerts dropped (%d waiting for delivery)", self.dropped, room)
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="observer-alerts", daemon=True)
        self._thread.start()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stops the thread after one last attempt at what is due; what is still undelivered is
        logged (stored alerts keep their pending deliveries)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._tasks or self._incoming:
            log.warning("observer: alerts: %d deliveries not done at shutdown", len(self._tasks) + len(self._incoming))
        if self._client is not None:
            self._client.close()

    def stats(self) -> dict[str, int]:
        return {"fired": self.fired, "delivered": self.delivered, "failed": self.failed, "dropped": self.dropped}

    # ----- the thread -----
    def _run(self) -> None:
        next_tick = self._clock() + self._tick_s
        while True:
            now = self._clock()
            if now >= next_tick:
                next_tick = now + self._tick_s
                try:
                    self.submit(self._engine.on_tick(self._pipeline(), now))
                except Exception:  # noqa: BLE001 - the thread must live on
                    log.error("observer: alerts: evaluating the rules failed", exc_info=True)
            self._take_incoming(now)
            self._run_due(now)
            if self._stop.is_set():
                return
            due = min([next_tick, *(t.due for t in self._tasks[:1])])
            self._wake.wait(max(0.0, min(due - self._clock(), self._tick_s)))
            self._wake.clear()

    def _take_incoming(self, now: float) -> None:
        with self._lock:
            new, self._incoming = self._incoming, []
        for alert in new:
            self.fired += 1
            log.warning("observer: alert %s: %s", alert.rule, alert.summary)
            hooks = self._config.targets(self._rule(alert))
            self._deliveries[alert.id] = {h.name: "pending" for h in hooks}
            if self._store is not None:
                self._schedule(_Task(now, next(self._order), alert, None))
            for hook in hooks:
                self._schedule(_Task(now, next(self._order), alert, hook))

    def _rule(self, alert: Alert):
        return next(r for r in self._config.rule if r.name == alert.rule)

    def _schedule(self, task: _Task) -> None:
        heapq.heappush(self._tasks, task)

    def _run_due(self, now: float) -> None:
        while self._tasks and (self._tasks[0].due <= now or self._stop.is_set()):
            task = heapq.heappop(self._tasks)
            if task.hook is None:
                self._store_alert(task, now)
            else:
                self._deliver(task, now)

    def _store_alert(self, task: _Task, now: float) -> None:
        assert self._store is not None
        alert_id = task.alert.id
        row = {**task.alert.to_dict(), "fired_at": task.alert.fired_at, "deliveries": dict(self._deliveries[alert_id])}
        try:
            self._store[0](row)
        except Exception as exc:  # noqa: BLE001
            self._retry(task, now, f"{type(exc).__name__}", what="storing")
            return
        self._stored.add(alert_id)
        self._forget_if_done(alert_id)

    def _deliver(self, task: _Task, now: float) -> None:
        hook = task.hook
        assert hook is not None
        try:
            status = self._post(hook, body_of(task.alert, hook))
        except httpx.HTTPError as exc:
            self._retry(task, now, type(exc).__name__, what=f"webhook {hook.name}")
            return
        if 200 <= status < 300:
            self.delivered += 1
            self._finish(task.alert, hook.name, "delivered")
        elif status in RETRIED_STATUS or status >= 500:
            self._retry(task, now, f"HTTP {status}", what=f"webhook {hook.name}")
        else:
            self.failed += 1
            log.error("observer: alert %s: webhook %s answered %d; not retried", task.alert.rule, hook.name, status)
            self._finish(task.alert, hook.name, f"failed: HTTP {status}")

    def _retry(self, task: _Task, now: float, why: str, *, what: str) -> None:
        if task.attempt >= self._max_attempts:
            log.error("observer: alert %s: %s failed after %d attempts (%s)", task.alert.rule, what, task.attempt, why)
            if task.hook is not None:
                self.failed += 1
                self._finish(task.alert, task.hook.name, f"failed: {why} after {task.attempt} attempts")
            return
        if (
            self._stop.is_set()
        ):  # cut off by the shutdown, not given up on (trial finding: said "failed after 6 attempts")
            log.error(
                "observer: alert %s: %s not done at shutdown, after %d of %d attempts (last: %s)",
                task.alert.rule,
                what,
                task.attempt,
                self._max_attempts,
                why,
            )
            if task.hook is not None:
                self.failed += 1
                self._finish(
                    task.alert, task.hook.name, f"not delivered: stopped after {task.attempt} attempts ({why})"
                )
            return
        wait = self._backoff_s[min(task.attempt - 1, len(self._backoff_s) - 1)]
        self._schedule(_Task(now + wait, next(self._order), task.alert, task.hook, task.attempt + 1))

    def _finish(self, alert: Alert, hook: str, state: str) -> None:
        deliveries = self._deliveries.get(alert.id)
        if deliveries is None:
            return
        deliveries[hook] = state
        if self._store is not None and alert.id in self._stored:
            try:
                self._store[1](alert.id, dict(deliveries))
            except Exception:  # noqa: BLE001 - the alert row says "pending" for it, and the log says why
                log.warning("observer: alert %s: its delivery state could not be stored", alert.id, exc_info=True)
        self._forget_if_done(alert.id)

    def _forget_if_done(self, alert_id: str) -> None:
        """Drops an alert's state once every webhook answered for good and it is stored."""
        deliveries = self._deliveries.get(alert_id)
        if deliveries is not None and "pending" not in deliveries.values():
            if self._store is None or alert_id in self._stored:
                del self._deliveries[alert_id]
                self._stored.discard(alert_id)

    def _http_post(self, hook: Webhook, body: dict[str, Any]) -> int:
        if self._client is None:
            self._client = httpx.Client()
        r = self._client.post(hook.url, json=body, headers=hook.resolved_headers(), timeout=hook.timeout_s)
        return r.status_code


__all__ = ["BACKOFF_S", "AlertDispatcher", "body_of", "slack_text"]
