"""The audit: attribute reserved GPU-intervals to telemetry and judge every bucket, in set-based SQL.

Flow: allocations overlapping the window -> ``_attr`` (one row per allocated GPU: which telemetry GPU it
is, by scheduler index, whole node, or telemetry labels; else unattributed) -> one grouped join with
``gpu_buckets`` that takes each bucket's applicable rows, its observed seconds and its verdict
(:mod:`auditor.audit.judging`, :mod:`auditor.audit.verdict`) and sums seconds per allocated GPU into
``usage_gpu`` -> per allocation totals and money into ``usage_allocation`` -> findings
(:mod:`auditor.audit.findings`). Unknown is never idle: reserved time without samples, or on a GPU no
telemetry can be tied to, counts as unknown; observed time without profiling fields is judged by
GPU-Util (idle-by-util or busy-unverified), never unknown.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, insert, select, update

from auditor.audit import timing
from auditor.audit.judging import DEFAULT, Judging
from auditor.audit.usage import refresh_aggregate
from auditor.config import Config, Thresholds
from auditor.store import cascade, schema
from auditor.store.engine import Store
from auditor.timeutil import to_epoch, utcnow

log = logging.getLogger("gpu_audit.audit")


@dataclass
class AuditResult:
    run_id: int
    since: datetime
    until: datetime
    summary: dict[str, Any] = field(default_factory=dict)
    #: wall-clock seconds per audit step (:mod:`auditor.audit.timing`); with per-cluster processes a step
    #: they share holds the slowest process's seconds (the critical path)
    steps: dict[str, float] = field(default_factory=dict)
    #: processes that audited the run's clusters at once (``store.audit_processes``; 1: this one)
    processes: int = 1
    #: per process (``processes`` > 1): its clusters, wall and CPU seconds and peak RSS (MiB)
    workers: list[dict[str, Any]] = field(default_factory=list)


def run_audit(store: Store, cfg: Config, since: datetime, until: datetime, *,
              thresholds: Thresholds | None = None, clusters: list[str] | None = None,
              what_if: bool = False, purpose: str | None = None, judging: Judging = DEFAULT) -> AuditResult:
    """Judge [since, until) and store usage and findings under a new audit run. ``purpose`` (e.g.
    ``"chargeback"``) goes into the run's summary: the web UI shows the newest weekly audit, not a run made
    for another purpose (:func:`auditor.web.data.pick_run`). ``judging``: what the judging statement reads
    (:class:`auditor.audit.judging.Judging`; the figures are the same either way)."""
    th = thresholds or cfg.thresholds
    s, u = to_epoch(since), to_epoch(until)
    assert s is not None and u is not None
    if u <= s:
        from auditor.errors import GpuAuditError

        raise GpuAuditError(f"empty audit window: until {until.isoformat()} is not after since")
    now = int(utcnow().timestamp())
    horizon = min(u, now)
    steps = timing.start()
    with store.begin() as conn:
        abandoned(conn, now)
        deleted = cascade.deletions(conn)  # before anything is judged (cascade.sweep_run)
        run_id = conn.execute(insert(schema.audit_runs).values(
            started_ts=now, since_ts=s, until_ts=u, status="running", what_if=what_if,
            thresholds=th.model_dump())).inserted_primary_key[0]
    window = (s, u, horizon, now)
    workers: list[dict[str, Any]] = []
    groups: list[list[str]] = []
    parts: list[int] = []
    try:
        # the judged aggregate of this run's thresholds, up to date (what-ifs read it only as is)
        if not what_if and judging.whole_hours:
            with steps.step("judged aggregate upkeep"):
                refresh_aggregate(store, th, s)
        from auditor.audit import processes
        from auditor.audit.clusters import audit_clusters
        from auditor.audit.findings import finish

        groups = processes.groups(store, cfg, clusters, s, horizon)
        if len(groups) > 1:
            # every cluster group in its own process and connection, under a part run id each; the parts'
            # rows become the run's below, in the transaction that marks it ok
            found, refused, workers, parts = processes.run(store, cfg, th, run_id, window, groups, steps,
                                                           judging)
        with store.begin() as conn:
            if parts:
                with steps.step("clusters: rows to the run"):
                    processes.relabel(conn, run_id, parts)
            else:
                part, refused = audit_clusters(conn, cfg, th, run_id, window, clusters, steps, judging)
                found = [part]
            summary = finish(conn, found, cfg, since=s, until=u, horizon=horizon)
            with steps.step("rows of GPUs deleted meanwhile"):
                swept = cascade.sweep_run(conn, run_id, deleted)
            if swept:
                log.warning("audit run %d: %d row(s) dropped: their GPU or reservation was deleted by an ingest "
                            "while the audit ran", run_id, swept)
            log.debug("audit run %d steps: %s", run_id,  # timings: --debug, never above a headline
                     ", ".join(f"{k} {v:.2f} s" for k, v in steps.seconds.items()))
            if refused:
                summary["refused_allocations"] = refused
            if purpose:
                summary["purpose"] = purpose
            conn.execute(update(schema.audit_runs).where(schema.audit_runs.c.id == run_id).values(
                status="ok", finished_ts=int(utcnow().timestamp()), summary=summary))
    except Exception:
        with store.begin() as conn:
            if parts:  # the processes' parts, when the run failed after they were done
                from auditor.audit.processes import drop_parts

                drop_parts(conn, parts)
            _delete_rows(conn, [run_id])
            conn.execute(update(schema.audit_runs).where(schema.audit_runs.c.id == run_id).values(
                status="failed", finished_ts=int(utcnow().timestamp())))
        raise
    return AuditResult(run_id, since, until, summary, steps.seconds, max(1, len(groups)), workers)


def _delete_rows(conn: Connection, ids: list[int]) -> None:
    """The usage and findings rows of failed or abandoned runs (the parts of per-cluster processes commit
    their own)."""
    for t in (schema.usage_gpu, schema.usage_allocation, schema.findings):
        conn.execute(t.delete().where(t.c.run_id.in_(ids)))


#: A run still "running" this long after it started was abandoned (its process killed): no audit takes a day
ABANDONED_S = 86_400


def abandoned(conn: Connection, now: int) -> int:
    """Mark runs left "running" for a day as failed and delete the rows their per-cluster processes had
    committed (``audit.processes`` > 1: a killed audit leaves them behind; reports read only ok runs, so this
    is space, not numbers). Returns the runs swept."""
    t = schema.audit_runs
    ids = [r for (r,) in conn.execute(select(t.c.id).where(t.c.status == "running",
                                                           t.c.started_ts < now - ABANDONED_S))]
    if ids:
        _delete_rows(conn, ids)
        conn.execute(update(t).where(t.c.id.in_(ids)).values(status="failed", finished_ts=now))
        log.warning("audit runs %s were left running for over a day: marked failed, their rows deleted",
                    ", ".join(map(str, ids)))
    return len(ids)


def latest_run(store: Store, *, what_if: bool = False) -> int | None:
    t = schema.audit_runs
    with store.engine.connect() as conn:
        return conn.execute(select(t.c.id).where(t.c.status == "ok", t.c.what_if == what_if)
                            .order_by(t.c.id.desc()).limit(1)).scalar()
