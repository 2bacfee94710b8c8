"""Judging an audit's allocated GPUs: attribution (``_attr``), the infrastructure intervals, then the one
judging statement (:mod:`auditor.audit.judging`) into ``usage_gpu``; and the judged aggregate brought up to
date before an official audit judges (:mod:`auditor.audit.aggregate`). On PostgreSQL an audit's clusters can
be judged in several processes at once (:mod:`auditor.audit.processes`). Past one server the store is
partitioned by cluster, shared-nothing (docs/scale-out.md): no judging crosses stores.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

from sqlalchemy import Connection, text

from auditor.audit import aggregate, infra, timing
from auditor.audit.attribute import attribute
from auditor.audit.judging import DEFAULT, Judging, judge
from auditor.config import Thresholds
from auditor.store.engine import Store


def refresh_aggregate(store: Store, th: Thresholds, since: int) -> dict[str, Any]:
    """Re-judge the hours written since the last audit (:func:`auditor.audit.aggregate.refresh`), committed
    before the audit judges, so every per-cluster process reads the same fresh aggregate."""
    with store.begin() as conn:
        setup_pg(conn)
        return aggregate.refresh(conn, th, since)


def run_thresholds(conn: Connection, run_id: int) -> Thresholds:
    """The thresholds an audit run judged with (audit_runs.thresholds)."""
    import json

    from sqlalchemy import select

    from auditor.store import schema

    t = schema.audit_runs
    got = conn.execute(select(t.c.thresholds).where(t.c.id == run_id)).scalar()
    return Thresholds.of_run(json.loads(got) if isinstance(got, str) else got)


def setup_pg(conn: Connection) -> None:
    if conn.dialect.name == "postgresql" and (conn.dialect.server_version_info or (0,)) >= (11,):
        # JIT compiling the judging statement cost more than it ran (0.7 s of 1.5 s at 512 GPUs), and its
        # per-GPU sort spilled to disk with the default work_mem
        conn.execute(text("SET LOCAL jit = off"))
        conn.execute(text("SET LOCAL work_mem = '64MB'"))


def attribute_and_judge(conn: Connection, th: Thresholds, fn: dict[str, str], p: dict[str, Any], run_id: int,
                        since: int, horizon: int, share: int, shares: int, steps: timing.Steps | None,
                        judging: Judging = DEFAULT) -> None:
    """Attribute and judge share ``share`` of ``shares`` of the audit's allocations (by allocation id) into
    usage_gpu (``judging``: what the judging statement reads); the infrastructure intervals (``_infra``) stay for the
    finding rules of this connection."""
    step = steps.step if steps is not None else (lambda _name: nullcontext())
    cf = fn["cluster_filter"] + (f" AND MOD(a.id, {shares}) = {share}" if shares > 1 else "")
    fn = {**fn, "cluster_filter": cf}
    attribute(conn, fn, p, cf, step)
    with step("infrastructure intervals"):
        infra.prepare(conn, th, since, horizon)
    with step("judge buckets"):
        judge(conn, {**p, "run_id": run_id}, th, judging)
        conn.execute(text("DROP TABLE _attr"))
