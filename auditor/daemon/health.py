"""The daemon's health: ``/healthz`` for liveness probes and alerts, the metrics for Prometheus, and the HTTP
endpoint that serves both (``/metrics`` through prometheus_client's WSGI exposition app).

The metrics live in one private ``CollectorRegistry`` of prometheus_client (no process/platform default
collectors mixed in, and tests can build several). Store-backed series (last collect per source, lag, the
latest audit's idle GPU time and cost per team) are read at scrape time from the store, so they survive
restarts and are the same whichever daemon is asked. Counters of step runs, durations and failures are this
process's own. Durations are in base units (seconds), as ``promtool check metrics`` wants.

The server is wsgiref's, threaded as prometheus_client's own ``start_wsgi_server`` is; no HTTP is parsed
here.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from sqlalchemy import select

from auditor.config import Config, source_key
from auditor.daemon.pipeline import RunSummary
from auditor.report.budgets import budget_gpu_hours
from auditor.report.context import usage_group_rows
from auditor.store import schema
from auditor.store.engine import Store
from auditor.timeutil import H, utcnow

log = logging.getLogger("gpu_audit.health")


def expected_sources(cfg: Config) -> list[tuple[str, str]]:
    """(cluster, source key) of every configured source: what /healthz expects to be fresh."""
    return [(c.name, source_key(role, i, src)) for c in cfg.clusters
            for role in ("allocations", "telemetry") for i, src in enumerate(getattr(c, role))]


def watermarks(store: Store) -> dict[tuple[str, str], tuple[int, int | None]]:
    """(cluster, source) -> (watermark_ts, updated_ts): updated_ts is the last successful collect."""
    t = schema.watermarks
    with store.engine.connect() as conn:
        return {(r.cluster, r.source): (r.watermark_ts, r.updated_ts)
                for r in conn.execute(select(t.c.cluster, t.c.source, t.c.watermark_ts, t.c.updated_ts))}


def health(store: Store, cfg: Config, max_age_s: float, now: datetime | None = None,
           scheduler_running: bool = True) -> tuple[bool, dict[str, Any]]:
    """Healthy when the scheduler runs and every configured source collected within ``max_age_s``."""
    now_ts = int((now or utcnow()).timestamp())
    marks = watermarks(store)
    stale: list[dict[str, Any]] = []
    sources: list[dict[str, Any]] = []
    for cluster, source in expected_sources(cfg):
        _wm, updated = marks.get((cluster, source), (None, None))
        age = None if updated is None else now_ts - updated
        ok = age is not None and age <= max_age_s
        item = {"cluster": cluster, "source": source, "last_success_ts": updated, "age_s": age, "ok": ok}
        sources.append(item)
        if not ok:
            stale.append(item)
    healthy = scheduler_running and not stale
    return healthy, {"status": "ok" if healthy else "unhealthy", "scheduler_running": scheduler_running,
                     "max_age_s": max_age_s, "stale": [f"{s['cluster']} {s['source']}" for s in stale],
                     "sources": sources}


PREFIX = "gpu_audit"


class StoreCollector:
    """Gauges read from the store at scrape time."""

    def __init__(self, store: Store, cfg: Config, clock: Callable[[], datetime] = utcnow) -> None:
        self.store, self.cfg, self.clock = store, cfg, clock

    def describe(self) -> list[Any]:
        return []  # values come from the store at scrape time; no registration-time query

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            yield from self._collect()
        except Exception as exc:  # a store outage must not break the scrape of the process counters
            log.warning("metrics: cannot read the store: %s", exc)
            up = GaugeMetricFamily(f"{PREFIX}_store_up", "1 when the store could be read at scrape time.")
            up.add_metric([], 0)
            yield up

    def _collect(self) -> Iterator[GaugeMetricFamily]:
        now = self.clock().timestamp()
        marks = watermarks(self.store)
        last = GaugeMetricFamily(f"{PREFIX}_last_collect_success_timestamp_seconds",
                                 "When each cluster source last collected successfully (UTC epoch).",
                                 labels=["cluster", "source"])
        lag = GaugeMetricFamily(f"{PREFIX}_collect_lag_seconds",
                                "Now minus the watermark: how far behind the collected data is.",
                                labels=["cluster", "source"])
        for (cluster, source), (wm, updated) in sorted(marks.items()):
            if updated is not None:
                last.add_metric([cluster, source], updated)
            lag.add_metric([cluster, source], max(0.0, now - wm))
        yield last
        yield lag
        yield from self._audit()
        up = GaugeMetricFamily(f"{PREFIX}_store_up", "1 when the store could be read at scrape time.")
        up.add_metric([], 1)
        yield up

    def _audit(self) -> Iterator[GaugeMetricFamily]:
        """The latest official audit's figures: the report's own team rows (one computation for the report's
        team table, its idle budgets and these gauges), its headline ratios and its findings per kind."""
        runs = schema.audit_runs
        cur = self.cfg.prices.currency
        with self.store.engine.connect() as conn:
            run = conn.execute(select(runs.c.id, runs.c.finished_ts, runs.c.since_ts, runs.c.until_ts,
                                      runs.c.summary)
                               .where(runs.c.status == "ok", runs.c.what_if.is_(False))
                               .order_by(runs.c.id.desc()).limit(1)).first()
            rows = [] if run is None else usage_group_rows(conn, run.id, ["u.team"])
        summary = dict((run.summary if run is not None else None) or {})
        info = GaugeMetricFamily(f"{PREFIX}_latest_audit_run_id", "Id of the latest successful audit run.")
        finished = GaugeMetricFamily(f"{PREFIX}_latest_audit_timestamp_seconds",
                                     "When the latest successful audit finished (UTC epoch).")
        window = GaugeMetricFamily(f"{PREFIX}_latest_audit_window_seconds", "Length of its audit window.")
        util = GaugeMetricFamily(f"{PREFIX}_latest_audit_gpu_util_ratio",
                                 "Mean GPU-Util of the reserved GPUs in the latest audit, 0-1: what a dashboard "
                                 "shows as busy.")
        sm = GaugeMetricFamily(f"{PREFIX}_latest_audit_sm_active_ratio",
                               "Mean SM activity of the reserved GPUs in the latest audit, 0-1: the work done.")
        found = GaugeMetricFamily(f"{PREFIX}_findings", "Findings of the latest audit per kind "
                                  "(docs/definitions.md, Finding kinds).", labels=["kind"])
        if run is not None:
            info.add_metric([], run.id)
            finished.add_metric([], run.finished_ts or 0)
            window.add_metric([], run.until_ts - run.since_ts)
            for fam, key in ((util, "mean_gpu_util"), (sm, "mean_sm_active")):
                if summary.get(key) is not None:
                    fam.add_metric([], float(summary[key]))
            for kind, n in sorted((summary.get("findings") or {}).items()):
                found.add_metric([kind], n)
        fams = {
            "reserved": GaugeMetricFamily(f"{PREFIX}_team_reserved_gpu_seconds",
                                          "Reserved GPU time per team in the latest audit (GPU-seconds).",
                                          labels=["team"]),
            "idle": GaugeMetricFamily(f"{PREFIX}_team_idle_gpu_seconds",
                                      "Idle (incl. mirage) GPU time per team in the latest audit (GPU-seconds).",
                                      labels=["team"]),
            "mirage": GaugeMetricFamily(f"{PREFIX}_team_mirage_gpu_seconds",
                                        "Mirage GPU time per team (idle by SM activity while GPU-Util read busy; "
                                        "part of the idle time) in the latest audit (GPU-seconds).",
                                        labels=["team"]),
            "unknown": GaugeMetricFamily(f"{PREFIX}_team_unknown_gpu_seconds",
                                         "Reserved GPU time no telemetry covered per team in the latest audit "
                                         "(GPU-seconds; never counted as idle).", labels=["team"]),
            "effective": GaugeMetricFamily(f"{PREFIX}_team_effective_gpu_seconds",
                                           "Effective GPU time (overlap x SM activity) per team (GPU-seconds).",
                                           labels=["team"]),
            "rcost": GaugeMetricFamily(f"{PREFIX}_team_reserved_cost", "Reserved cost per team.",
                                       labels=["team", "currency"]),
            "icost": GaugeMetricFamily(f"{PREFIX}_team_idle_cost", "Cost of idle GPU time per team.",
                                       labels=["team", "currency"]),
            "budget": GaugeMetricFamily(f"{PREFIX}_team_idle_budget_gpu_seconds",
                                        "A team's idle budget from the config, per 7 days, prorated to the "
                                        "latest audit's window (GPU-seconds); teams without one are absent.",
                                        labels=["team"]),
        }
        for r in rows:
            name = r["team"] or "(none)"
            fams["reserved"].add_metric([name], r["reserved_gpu_hours"] * H)
            fams["idle"].add_metric([name], r["idle_gpu_hours"] * H)
            fams["mirage"].add_metric([name], r["mirage_gpu_hours"] * H)
            fams["unknown"].add_metric([name], r["unknown_gpu_hours"] * H)
            fams["effective"].add_metric([name], r["effective_gpu_hours"] * H)
            fams["rcost"].add_metric([name, cur], r["reserved_cost"])
            fams["icost"].add_metric([name, cur], r["idle_cost"])
        if run is not None:
            for team in self.cfg.teams:
                budget = budget_gpu_hours(team, run.until_ts - run.since_ts)
                if budget is not None:
                    fams["budget"].add_metric([team.name], budget * H)
        yield from (info, finished, window, util, sm, found)
        yield from fams.values()


class Metrics:
    """This process's counters, plus the store-backed gauges, in one private registry."""

    def __init__(self, store: Store, cfg: Config, clock: Callable[[], datetime] = utcnow) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(StoreCollector(store, cfg, clock))
        r = self.registry
        self.step_runs = Counter(f"{PREFIX}_step_runs", "Steps run by the daemon.", ["step"], registry=r)
        self.step_failures = Counter(f"{PREFIX}_step_failures", "Steps that failed.", ["step"], registry=r)
        self.step_seconds = Histogram(f"{PREFIX}_step_duration_seconds", "Step run time.", ["step"],
                                      buckets=(0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600), registry=r)
        self.source_failures = Counter(f"{PREFIX}_collect_source_failures", "Collections of a source that "
                                       "failed (after retries).", ["cluster", "source"], registry=r)
        self.job_runs = Counter(f"{PREFIX}_job_runs", "Scheduled jobs started.", ["job"], registry=r)
        self.job_skips = Counter(f"{PREFIX}_job_skips", "Scheduled jobs skipped: lease held elsewhere, "
                                 "period already done, shutting down, or a collect folded into the same tick's "
                                 "audit job.", ["job", "reason"], registry=r)
        self.job_errors = Counter(f"{PREFIX}_job_errors", "Scheduled jobs that raised.", ["job"], registry=r)

    def observe(self, summary: RunSummary) -> None:
        for step in summary.steps:
            self.step_runs.labels(step.name).inc()
            self.step_seconds.labels(step.name).observe(step.seconds)
            if not step.ok:
                self.step_failures.labels(step.name).inc()
            for src in step.detail.get("sources", []) if step.name == "collect" else []:
                if not src.get("ok"):
                    self.source_failures.labels(src["cluster"], src["source"]).inc()

    def render(self) -> bytes:
        """The text exposition format of every series (prometheus_client's ``generate_latest``)."""
        return generate_latest(self.registry)


class _QuietHandler(WSGIRequestHandler):
    """Access lines go to the debug log, not stderr."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server API)
        log.debug("http: " + format, *args)


def _reply(start_response: Callable, status: str, ctype: str, body: bytes) -> list[bytes]:
    start_response(status, [("Content-Type", ctype), ("Content-Length", str(len(body)))])
    return [body]


def health_app(metrics: Metrics, check: Callable[[], tuple[bool, dict]]) -> Callable:
    """The WSGI app: ``/metrics`` is prometheus_client's exposition app over the metrics' registry,
    ``/healthz`` (or ``/health``) the JSON of ``check`` with 200 or 503."""
    metrics_app = make_wsgi_app(metrics.registry)

    def app(environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path == "/metrics":
            return metrics_app(environ, start_response)
        if path in ("/healthz", "/health"):
            try:
                ok, detail = check()
            except Exception as exc:
                ok, detail = False, {"status": "unhealthy", "error": str(exc).splitlines()[0][:300]}
            return _reply(start_response, "200 OK" if ok else "503 Service Unavailable", "application/json",
                          json.dumps(detail).encode())
        return _reply(start_response, "404 Not Found", "text/plain", b"not found: try /healthz or /metrics\n")

    return app


class HealthServer:
    """``/healthz`` and ``/metrics`` on a small threaded WSGI server in a daemon thread."""

    def __init__(self, host: str, port: int, metrics: Metrics, check: Callable[[], tuple[bool, dict]]) -> None:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0] if ":" in host else socket.AF_INET

        class Server(ThreadingWSGIServer):
            address_family = family

        self.httpd = make_server(host, port, health_app(metrics, check), server_class=Server,
                                 handler_class=_QuietHandler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="health-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def start(self) -> HealthServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)
