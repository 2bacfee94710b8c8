"""The audit of some clusters (or all) in one transaction: the part of an audit run that one process does,
whether the run has one (:func:`auditor.audit.run.run_audit`) or one per group of clusters
(:mod:`auditor.audit.processes`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, text

from auditor.audit import infra, timing
from auditor.audit.findings import find_clusters
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


def audit_clusters(conn: Connection, cfg: Config, th: Thresholds, run_id: int, window: tuple[int, int, int, int],
                   clusters: list[str] | None, steps: timing.Steps) -> tuple[Any, int]:
    """The audit of ``clusters`` (None: all) in one transaction: attribute and judge their allocations into
    usage_gpu, write their per-allocation totals and money (usage_allocation) and their findings; returns
    (their part of the run summary, :class:`auditor.audit.findings.Part`; allocations refused). Memory
    follows their findings, not their allocations (:class:`AllocationRows`)."""
    s, u, horizon, now = window
    cf, cp = cluster_filter(clusters)
    p = {"since": s, "until": u, "horizon": horizon, **cp}
    fn = {**sql_names(conn.dialect.name), "cluster_filter": cf}
    setup_pg(conn)
    attribute_and_judge(conn, th, fn, p, run_id, s, horizon, 0, 1, steps)
    if not conn.info.get("gpu_audit_processes"):
        with steps.step("judge buckets"):
            # fresh statistics, so the findings' per-allocation lookups use (run_id, allocation_id) and do not
            # scan the whole run once per batch of allocations. Not in per-cluster processes: two ANALYZEs of one
            # table in overlapping transactions fail on its statistics rows
            conn.execute(text("ANALYZE usage_gpu"))
    rows = AllocationRows(conn, run_id, Pricing(cfg))
    with steps.step("per-allocation totals and money"):
        refused = rows.write(now)
    part = find_clusters(conn, rows, th, cfg, since=s, until=u, horizon=horizon, clusters=clusters)
    rows.drop()
    infra.finish(conn)
    return part, refused
