"""The audit of some clusters (or all) in one transaction: the part of an audit run that one process does,
whether the run has one (:func:`auditor.audit.run.run_audit`) or one per group of clusters
(:mod:`auditor.audit.processes`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, text

from auditor.audit import infra, starved, timing
from auditor.audit.findings import find_clusters
from auditor.audit.judging import DEFAULT, Judging
from auditor.audit.money import Pricing
from auditor.audit.totals import AllocationRows
from auditor.audit.usage import attribute_and_judge, setup_pg
from auditor.config import Config, Thresholds
from auditor.store.sqlfuncs import sql_names


def cluster_filter(clusters: list[str] | None) -> tuple[str, dict[str, str]]:
    """The attribution's SQL condition on ``a.cluster`` and its parameters ("" when every cluster)."""
    if not clusters:
        return "", {}
    return (" AND a.cluster IN (" + ", ".join(f":c{i}" for i in range(len(clusters))) + ")",
            {f"c{i}": c for i, c in enumerate(clusters)})


def judge_clusters(conn: Connection, th: Thresholds, run_id: int, window: tuple[int, int, int, int],
                   clusters: list[str] | None, steps: timing.Steps, judging: Judging = DEFAULT) -> None:
    """Attribute and judge the allocations of ``clusters`` (None: all) into usage_gpu under ``run_id``, and
    take the seconds their own input starved out of idle (:mod:`auditor.audit.starved`); the
    infrastructure intervals (``_infra``) stay for the rules on this connection. ``judging``: what the judging
    statement reads (:class:`auditor.audit.judging.Judging`)."""
    s, u, horizon, _now = window
    cf, cp = cluster_filter(clusters)
    p = {"since": s, "until": u, "horizon": horizon, **cp}
    fn = {**sql_names(conn.dialect.name), "cluster_filter": cf}
    setup_pg(conn)
    attribute_and_judge(conn, th, fn, p, run_id, s, horizon, 0, 1, steps, judging)
    with steps.step("starved GPUs (input/storage wait)"):
        starved.refine(conn, run_id, th, p)  # before any total, finding or action reads idle_s


def find_in_clusters(conn: Connection, cfg: Config, th: Thresholds, run_id: int, window: tuple[int, int, int, int],
                     clusters: list[str] | None, judging: Judging = DEFAULT) -> tuple[Any, int]:
    """Per-allocation totals and money (usage_allocation) and the findings of the usage judged under
    ``run_id`` (of ``clusters``, or all); returns (their part of the run summary,
    :class:`auditor.audit.findings.Part`; allocations refused). Memory follows their findings, not their
    allocations (:class:`AllocationRows`)."""
    s, u, horizon, now = window
    rows = AllocationRows(conn, run_id, Pricing(cfg))
    with timing.step("per-allocation totals and money"):
        refused = rows.write(now)
    part = find_clusters(conn, rows, th, cfg, since=s, until=u, horizon=horizon, clusters=clusters, judging=judging)
    rows.drop()
    return part, refused


def audit_clusters(conn: Connection, cfg: Config, th: Thresholds, run_id: int, window: tuple[int, int, int, int],
                   clusters: list[str] | None, steps: timing.Steps, judging: Judging = DEFAULT) -> tuple[Any, int]:
    """The audit of ``clusters`` (None: all) in one transaction: judged into usage_gpu
    (:func:`judge_clusters`), fresh statistics, then totals and findings (:func:`find_in_clusters`)."""
    judge_clusters(conn, th, run_id, window, clusters, steps, judging)
    with steps.step("judge buckets"):
        # fresh statistics, so the findings' per-allocation lookups use (run_id, allocation_id) and do not
        # scan the whole run once per batch of allocations
        conn.execute(text("ANALYZE usage_gpu"))
    out = find_in_clusters(conn, cfg, th, run_id, window, clusters, judging)
    infra.finish(conn)
    return out
