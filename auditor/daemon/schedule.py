"""The daemon behind ``gpu-audit serve``: APScheduler 3 runs collect, audit, the weekly report + nudges and
the monthly chargeback on cron triggers from ``[schedule]``, in the configured timezone.

Guarantees, and how:

- one instance of each job at a time: ``max_instances=1`` in this process, and a lease in the store's
  ``locks`` table across processes (a second daemon on the same store skips the job while it is held);
- misfires: ``coalesce=True`` and ``misfire_grace_time = MISFIRE_GRACE_S`` (a late job runs once);
- a restart neither loses nor repeats a weekly report or a monthly chargeback: each completed one leaves a
  marker row in ``notifications`` (kind ``weekly_report_run`` / ``chargeback_run``, ``period_key`` such as
  ``2026-W48`` / ``2026-10``); the job checks it under the lease before doing anything, and at start-up a
  daemon runs a missed one (when the store has a marker of an earlier period, i.e. this is a restart, not a
  first install). APScheduler's own job store stays in memory: its SQLAlchemyJobStore must not be shared
  by two schedulers, and the markers are what matters;
- one order within a tick: when collect and audit fire at the same time (say ``*/15`` and ``0 * * * *``),
  the audit job collects first, then audits, then enforces, and that tick's collect firing stands aside:
  audit and enforcement never judge the store as it was before the tick's collection;
- clean shutdown: SIGTERM/SIGINT stop new jobs; ``scheduler.shutdown(wait=True)`` lets the running job end
  (collection stops between clusters; every batch is one transaction, so a kill rolls it back and the
  watermark, moved only after a commit, makes the next run catch up).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from sqlalchemy import func, insert, select

from auditor.config import Config
from auditor.daemon.health import Metrics
from auditor.daemon.pipeline import RunSummary, run_steps
from auditor.errors import GpuAuditError
from auditor.store import schema
from auditor.store.engine import Store
from auditor.store.locks import Lease, default_holder
from auditor.timeutil import utcnow

#: A scheduled job this late (seconds: the daemon was busy or paused) still runs, once; later it waits for its
#: next time (a `schedule` setting until issue 45)
MISFIRE_GRACE_S = 600

log = logging.getLogger("gpu_audit.schedule")

JOBS = ("collect", "audit", "report", "chargeback")
#: Steps each job runs through :func:`auditor.daemon.pipeline.run_steps`.
JOB_STEPS = {"collect": ["collect"], "audit": ["audit", "enforce"], "report": ["audit", "report", "notify"],
             "chargeback": ["chargeback"]}
#: Marker kinds in ``notifications`` for jobs that must run once per period.
MARKER_KIND = {"report": "weekly_report_run", "chargeback": "chargeback_run"}
LEASE_NAME = {"collect": "collect", "audit": "audit", "report": "weekly-report", "chargeback": "chargeback"}

Runner = Callable[..., RunSummary]


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise GpuAuditError(f"schedule.timezone: unknown timezone {name!r}") from None


def cron_triggers(cfg: Config) -> dict[str, BaseTrigger]:
    """One CronTrigger per job from ``[schedule]``, in its timezone; a bad expression names its key."""
    tz = zone(cfg.schedule.timezone)
    out: dict[str, BaseTrigger] = {}
    for job in JOBS:
        expr = getattr(cfg.schedule, job)
        try:
            out[job] = CronTrigger.from_crontab(expr, timezone=tz)
        except ValueError as exc:
            raise GpuAuditError(f"schedule.{job}: bad cron expression {expr!r}: {exc}") from None
    return out


def previous_fire(trigger: BaseTrigger, now: datetime, horizon: timedelta = timedelta(days=3660)) -> datetime | None:
    """The latest fire time <= ``now`` of a cron trigger, exactly, for any schedule (APScheduler 3 only
    computes the next one). ``g(t)``, the first firing at or after ``t``, is <= ``now`` exactly when ``t`` is
    at or before the wanted firing; so: widen a window back from ``now`` until it holds a firing, then
    bisect on whole seconds (cron fires on whole seconds). About 60 trigger calls whatever the schedule;
    None when it never fired within ``horizon``."""
    tz = now.tzinfo

    def g(ts: int) -> datetime | None:
        return trigger.get_next_fire_time(None, datetime.fromtimestamp(ts, tz))

    def fired_by_now(ts: int) -> bool:
        f = g(ts)
        return f is not None and f <= now

    hi = int(now.timestamp()) + 1  # g(hi) > now: firings are on whole seconds
    span, most = 60, int(horizon.total_seconds())
    while not fired_by_now(hi - min(span, most)):
        if span >= most:
            return None
        span *= 2
    span = min(span, most)
    lo = hi - span  # g(lo) <= now < g(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fired_by_now(mid):
            lo = mid
        else:
            hi = mid
    return g(lo)


def period_key(job: str, fire: datetime) -> str:
    """The period a firing belongs to. Weekly report: the ISO week (UTC) its audit window ends in, the
    same key :mod:`auditor.report.notify` stamps on the admin emails (``2026-W49`` for Monday 30 Nov 2026 08:00);
    monthly chargeback: the month before the firing, the one it bills (``2026-10`` for 1 Nov 2026)."""
    if job == "report":
        year, week, _ = (fire.astimezone(UTC) - timedelta(seconds=1)).isocalendar()
        return f"{year}-W{week:02d}"
    prev = fire.replace(day=1) - timedelta(days=1)
    return f"{prev.year}-{prev.month:02d}"


def period_done(store: Store, job: str, key: str, dry_run: bool) -> bool:
    t = schema.notifications
    with store.engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(t).where(
            t.c.kind == MARKER_KIND[job], t.c.period_key == key, t.c.dry_run == dry_run)).scalar() > 0


def any_marker(store: Store, job: str) -> bool:
    t = schema.notifications
    with store.engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(t).where(t.c.kind == MARKER_KIND[job])).scalar() > 0


def mark_done(store: Store, job: str, key: str, dry_run: bool, holder: str) -> None:
    """Record the period as done (a marker row; the emails themselves are recorded by notify)."""
    t = schema.notifications
    with store.begin() as conn:
        conn.execute(insert(t).values(recipient="", kind=MARKER_KIND[job], sent_ts=int(utcnow().timestamp()),
                                      dry_run=dry_run, message_id=holder[:255], period_key=key))


class Daemon:
    """The jobs and their scheduler. ``runner`` (default :func:`run_steps`) and ``triggers`` can be swapped
    for tests; ``clock`` drives period keys and leases."""

    def __init__(self, store: Store, cfg: Config, *, base_dir: Path, dry_run: bool = False,
                 per_cluster: bool = False, runner: Runner = run_steps,
                 triggers: dict[str, BaseTrigger] | None = None, lease_ttl_s: int = 300,
                 holder: str | None = None, clock: Callable[[], datetime] = utcnow,
                 metrics: Metrics | None = None, workers: int | None = None) -> None:
        self.store, self.cfg, self.base_dir = store, cfg, base_dir
        self.dry_run, self.per_cluster, self.runner = dry_run, per_cluster, runner
        self.tz = zone(cfg.schedule.timezone)
        self.triggers = {**cron_triggers(cfg), **(triggers or {})}
        self.lease_ttl_s, self.clock = lease_ttl_s, clock
        self.holder = holder or default_holder()
        self.metrics = metrics or Metrics(store, cfg, clock)
        # SQLite has one writer: one job at a time there (concurrent writers get "database is locked")
        self.workers = workers or (1 if store.dialect == "sqlite" else 4)
        self.stopping = threading.Event()
        self.scheduler: BackgroundScheduler | None = None
        self._current = threading.local()  # the lease of the job running in this thread

    # -- jobs ---------------------------------------------------------------------------------------
    def _run(self, job: str, steps: Sequence[str], clusters: list[str] | None = None) -> RunSummary:
        lease: Lease | None = getattr(self._current, "lease", None)
        summary = self.runner(self.store, self.cfg, list(steps), base_dir=self.base_dir, dry_run=self.dry_run,
                              clusters=clusters, keep_going=lease.check if lease is not None else None)
        self.metrics.observe(summary)
        for step in summary.steps:
            if not step.ok:
                log.error("%s: step %s failed: %s", job, step.name, step.error)
        return summary

    def _skip(self, job: str, reason: str) -> None:
        self.metrics.job_skips.labels(job, reason).inc()

    def _leased(self, job: str, lease_name: str, body: Callable[[], Any]) -> Any:
        if self.stopping.is_set():
            self._skip(job, "stopping")
            return None
        self.metrics.job_runs.labels(job).inc()
        try:
            with Lease(self.store, lease_name, self.holder, self.lease_ttl_s, self.clock) as lease:
                if not lease.acquired:
                    log.info("%s: skipped, lease %s is held by another daemon", job, lease_name)
                    self._skip(job, "lease_held")
                    return None
                self._current.lease = lease
                try:
                    return body()
                finally:
                    self._current.lease = None
        except Exception as exc:  # one bad run must not stop the daemon; the next firing retries
            self.metrics.job_errors.labels(job).inc()
            log.error("%s: job failed: %s: %s", job, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "",
                      exc_info=log.isEnabledFor(logging.DEBUG))
            return None

    def collect_job(self, cluster: str | None = None) -> list[RunSummary]:
        """Collect every cluster (one run_steps each, stopping between clusters on shutdown), or one."""
        names = [cluster] if cluster else [c.name for c in self.cfg.clusters]

        def body() -> list[RunSummary]:
            out = []
            for name in names:
                if self.stopping.is_set():
                    log.info("collect: shutting down, %s left for the next run", name)
                    break
                out.append(self._run("collect", JOB_STEPS["collect"], [name]))
            return out

        lease = f"collect:{cluster}" if cluster else LEASE_NAME["collect"]
        return self._leased("collect", lease, body) or []

    def same_tick(self) -> bool:
        """Whether the latest collect and audit firings are the same moment (both cron schedules)."""
        collect, audit = self.triggers["collect"], self.triggers["audit"]
        if not (isinstance(collect, CronTrigger) and isinstance(audit, CronTrigger)):
            return False
        now = self.clock().astimezone(self.tz)
        fired = previous_fire(audit, now)
        return fired is not None and fired == previous_fire(collect, now)

    def collect_tick(self, cluster: str | None = None) -> list[RunSummary]:
        """The scheduled collect: stands aside when the audit fires in the same tick (that job collects)."""
        if self.same_tick():
            log.info("collect: this tick's audit job collects first, then audits and enforces")
            self._skip("collect", "same_tick_as_audit")
            return []
        return self.collect_job(cluster)

    def audit_job(self) -> RunSummary | None:
        """Audit, then enforce; when collect fires in the same tick, collect first (every cluster)."""
        if self.same_tick():
            for name in ([c.name for c in self.cfg.clusters] if self.per_cluster else [None]):
                self.collect_job(name)
        return self._leased("audit", LEASE_NAME["audit"], lambda: self._run("audit", JOB_STEPS["audit"]))

    def _fire_time(self, job: str, fire: datetime | None) -> datetime:
        now = self.clock().astimezone(self.tz)
        if fire is not None:
            return fire.astimezone(self.tz)
        trig = self.triggers[job]
        return (previous_fire(trig, now) or now) if isinstance(trig, CronTrigger) else now

    def period_job(self, job: str, fire: datetime | None = None) -> RunSummary | None:
        """Weekly report (job "report") or monthly chargeback, at most once per period across daemons."""
        key = period_key(job, self._fire_time(job, fire))

        def body() -> RunSummary | None:
            if period_done(self.store, job, key, self.dry_run):
                log.info("%s: period %s already done, skipped", job, key)
                self._skip(job, "period_done")
                return None
            summary = self._run(job, JOB_STEPS[job])
            last = summary.steps[-1] if summary.steps else None
            lease: Lease | None = getattr(self._current, "lease", None)
            if last is not None and last.ok and lease is not None and not lease.check():
                log.error("%s: period %s finished after the lease was lost; the new holder decides", job, key)
            elif last is not None and last.ok:
                mark_done(self.store, job, key, self.dry_run, self.holder)
                log.info("%s: period %s done", job, key)
            else:
                log.error("%s: period %s not done; it is retried at the next start-up or firing", job, key)
            return summary

        return self._leased(job, LEASE_NAME[job], body)

    def report_job(self, fire: datetime | None = None) -> RunSummary | None:
        return self.period_job("report", fire)

    def chargeback_job(self, fire: datetime | None = None) -> RunSummary | None:
        return self.period_job("chargeback", fire)

    # -- scheduler ----------------------------------------------------------------------------------
    def build(self) -> BackgroundScheduler:
        defaults = {"max_instances": 1, "coalesce": True, "misfire_grace_time": MISFIRE_GRACE_S}
        sched = BackgroundScheduler(timezone=self.tz, executors={"default": ThreadPoolExecutor(self.workers)},
                                    job_defaults=defaults)
        if self.per_cluster:
            for c in self.cfg.clusters:
                sched.add_job(self.collect_tick, self.triggers["collect"], args=[c.name], id=f"collect:{c.name}",
                              name=f"collect {c.name}")
        else:
            sched.add_job(self.collect_tick, self.triggers["collect"], id="collect", name="collect")
        sched.add_job(self.audit_job, self.triggers["audit"], id="audit", name="audit")
        sched.add_job(self.report_job, self.triggers["report"], id="report", name="weekly report + nudges")
        sched.add_job(self.chargeback_job, self.triggers["chargeback"], id="chargeback", name="monthly chargeback")
        self.scheduler = sched
        return sched

    def missed(self) -> list[tuple[str, datetime]]:
        """Weekly report / chargeback firings missed while down: the latest firing of each whose period is
        not done, provided an earlier period was (a restart, not a first install)."""
        out: list[tuple[str, datetime]] = []
        now = self.clock().astimezone(self.tz)
        for job in ("report", "chargeback"):
            trig = self.triggers[job]
            if not isinstance(trig, CronTrigger):
                continue
            fire = previous_fire(trig, now)
            if fire is None or not any_marker(self.store, job):
                continue
            if not period_done(self.store, job, period_key(job, fire), self.dry_run):
                out.append((job, fire))
        return out

    def catch_up(self) -> list[str]:
        """After a restart: run each missed weekly report / chargeback once, now."""
        assert self.scheduler is not None
        due = self.missed()
        for job, fire in due:
            log.info("catching up the missed %s for %s", job, period_key(job, fire))
            self.scheduler.add_job(self.period_job, "date", args=[job, fire], id=f"catch-up-{job}",
                                   name=f"catch-up {job} {period_key(job, fire)}")
        return [job for job, _fire in due]

    def start(self, *, once_now: bool = False) -> BackgroundScheduler:
        sched = self.scheduler or self.build()
        sched.start()
        if once_now:
            sched.add_job(self._once_now, "date", id="once-now", name="collect + audit at start-up")
        self.catch_up()
        for j in sched.get_jobs():
            log.info("job %s: next run %s", j.name, j.next_run_time)
        return sched

    def _once_now(self) -> None:
        self.collect_job()
        self.audit_job()

    def shutdown(self) -> None:
        """Stop taking jobs and wait for the running one (it finishes its batch or rolls it back)."""
        self.stopping.set()
        if self.scheduler is not None and self.scheduler.running:
            self.scheduler.shutdown(wait=True)

    @property
    def running(self) -> bool:
        return self.scheduler is not None and self.scheduler.running and not self.stopping.is_set()

    def run_until_signalled(self, *, once_now: bool = False, on_stop: Callable[[], None] | None = None) -> None:
        """Run until SIGTERM or SIGINT, then shut down cleanly. A second signal exits at once."""
        done = threading.Event()

        def handler(signum: int, _frame: FrameType | None) -> None:
            if done.is_set():
                log.warning("second %s: exiting now (open transactions roll back)", signal.Signals(signum).name)
                os._exit(128 + signum)
            log.info("%s: shutting down after the running job", signal.Signals(signum).name)
            done.set()

        old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start(once_now=once_now)
            while not done.wait(0.5):
                pass
            self.shutdown()
        finally:
            if on_stop:
                on_stop()
            for s, h in old.items():
                signal.signal(s, h)
        log.info("stopped")
