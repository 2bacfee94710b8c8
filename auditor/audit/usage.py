"""Judging: the attributed GPUs of ``_attr`` -> one ``usage_gpu`` row each (seconds idle, working, unknown...).

One set-based statement (:func:`auditor.audit.aggregate.sums_sql`): each attributed GPU's whole clock hours
read from the judged aggregate where it holds them, every other bucket's applicable rows combined and judged
(:mod:`auditor.audit.judge`, :mod:`auditor.audit.verdict`), summed per allocated GPU. On PostgreSQL an audit's
clusters can be judged in several processes at once (:mod:`auditor.audit.processes`); on a sharded store each
shard judges its own GPUs with the same statement (:mod:`auditor.store.shards`).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

from sqlalchemy import Connection, text

from auditor.audit import aggregate, infra, timing
from auditor.audit.attribute import attribute
from auditor.audit.judge import EXTRA, SUMS, usage_columns
from auditor.config import Thresholds
from auditor.store import shards
from auditor.store.engine import Store

USAGE_COLS = ("signal", "reserved_s", "observed_s", "idle_s", "idle_by_util_s", "mirage_s", "low_s", "working_s",
              "busy_unverified_s", "unknown_s", "infra_s", "effective_s", "gpu_util_s", "util_observed_s", "sm_s",
              "sm_observed_s", "tensor_s", "dram_s", "io_bps_s", "max_gpu_mirage_s", *(f"{k}_s" for k in EXTRA))
_INSERT = ("INSERT INTO usage_gpu (run_id, allocated_gpu_id, allocation_id, attribution, gpu_index, gpu_id, "
           + ", ".join(USAGE_COLS) + ", peak_fb_mib, idle_peak_fb_mib)\nSELECT :run_id, at.allocated_gpu_id, "
           "at.allocation_id, at.attribution, at.gpu_index, at.gpu_id, ")
_RESERVED = "(at.a_e - at.a_s)"
_INFRA = "COALESCE(ai.infra, 0)"
_JOIN_INFRA = " LEFT JOIN _attr_infra ai ON ai.allocated_gpu_id = at.allocated_gpu_id"


def judge_sql(dialect: str, th: Thresholds, skip: str = "") -> str:
    """The INSERT of usage_gpu for every allocated GPU of ``_attr`` (planned into ``_agg`` by
    :func:`auditor.audit.aggregate.plan`): the sums of :func:`auditor.audit.aggregate.sums_sql` (``:ths``, the
    aggregate's set) made usage columns; ``skip`` leaves out buckets of infrastructure-affected intervals
    (:func:`auditor.audit.infra.skip`), whose seconds come from ``_attr_infra``."""
    get = {k: f"COALESCE(j.{k}, 0)" for k in SUMS}
    cols = usage_columns(get, "at.share", _RESERVED, _INFRA)
    return (_INSERT + ", ".join(cols[c] for c in USAGE_COLS) + ", j.peak_fb, j.idle_fb\nFROM _attr at LEFT JOIN ("
            + aggregate.sums_sql(dialect, th, "_attr", "allocated_gpu_id", skip)
            + ") j ON j.id = at.allocated_gpu_id" + _JOIN_INFRA)


#: Whole hours from the judged aggregate (False: every bucket judged afresh, the reference the tests and
#: bench/audit.py compare with)
WHOLE_HOURS = True


def refresh_aggregate(store: Store, th: Thresholds, since: int) -> dict[str, Any]:
    """Re-judge the hours written since the last audit (:func:`auditor.audit.aggregate.refresh`), committed
    before the audit judges, so every per-cluster process reads the same fresh aggregate."""
    if not WHOLE_HOURS:
        return {}

    def refresh(conn: Connection) -> dict[str, Any]:
        setup_pg(conn)
        return aggregate.refresh(conn, th, since)

    done = shards.on_each(store, refresh)  # a sharded store: each shard its own GPUs' hours, at once
    return done[0] if len(done) == 1 else {"ths": done[0]["ths"], "shards": done,
                                             "rejudged_hours": sum(d["rejudged_hours"] for d in done)}


def aggregate_set(conn: Connection, th: Thresholds, since: int) -> str | None:
    """The judged aggregate's set that an audit of ``th`` from ``since`` reads whole hours from: None when
    :data:`WHOLE_HOURS` is off or the aggregate does not hold these thresholds from that hour on."""
    return aggregate.usable(conn, th, since) if WHOLE_HOURS else None


def run_thresholds(conn: Connection, run_id: int) -> Thresholds:
    """The thresholds an audit run judged with (audit_runs.thresholds)."""
    import json

    from sqlalchemy import select

    from auditor.store import schema

    t = schema.audit_runs
    got = conn.execute(select(t.c.thresholds).where(t.c.id == run_id)).scalar()
    return Thresholds(**(json.loads(got) if isinstance(got, str) else got or {}))


def whole_hour_gpus(conn: Connection, params: dict[str, Any], th: Thresholds, skip: str) -> int:
    """Plan which allocated GPUs of ``_attr`` read whole hours from the judged aggregate (``_agg``,
    :func:`auditor.audit.aggregate.plan`); returns how many (none with :data:`WHOLE_HOURS` off, or when the
    aggregate does not hold this run's thresholds from its window's first hour on)."""
    ths = aggregate_set(conn, th, params["since"])
    params["ths"] = ths or ""
    return aggregate.plan(conn, "_attr", "allocated_gpu_id", skip, ths)


def judge(conn: Connection, fn: dict[str, str], params: dict[str, Any], th: Thresholds) -> None:
    """Judge every bucket of ``_attr`` into usage_gpu: whole hours from the judged aggregate where it is fresh
    (:data:`WHOLE_HOURS`), every other bucket from gpu_buckets, in one statement; buckets of
    infrastructure-affected time are left out (:mod:`auditor.audit.infra`)."""
    skip = infra.skip(conn)
    lay = shards.layout(conn)
    if lay is not None:  # each shard judges its own GPUs with these same statements (docs/scale-out.md)
        def here(sconn: Connection) -> None:
            setup_pg(sconn)
            judge_here(sconn, params, th, skip)

        shards.run_shipped(conn, lay, {"_attr": "gpu_id", "_infra": "gpu_id", "_attr_infra": None}, here, "usage_gpu",
                           ["run_id", "allocated_gpu_id", "allocation_id", "attribution", "gpu_index", "gpu_id",
                            *USAGE_COLS, "peak_fb_mib", "idle_peak_fb_mib"], f"run_id = {int(params['run_id'])}")
        return
    judge_here(conn, params, th, skip)


def judge_here(conn: Connection, params: dict[str, Any], th: Thresholds, skip: str) -> None:
    """:func:`judge` on this connection's own tables."""
    p = dict(params)
    whole_hour_gpus(conn, p, th, skip)
    conn.execute(text(judge_sql(conn.dialect.name, th, skip)), p)
    conn.execute(text("DROP TABLE _agg"))


def setup_pg(conn: Connection) -> None:
    if conn.dialect.name == "postgresql" and (conn.dialect.server_version_info or (0,)) >= (11,):
        # JIT compiling the judging statement cost more than it ran (0.7 s of 1.5 s at 512 GPUs), and its
        # per-GPU sort spilled to disk with the default work_mem
        conn.execute(text("SET LOCAL jit = off"))
        conn.execute(text("SET LOCAL work_mem = '64MB'"))


def attribute_and_judge(conn: Connection, th: Thresholds, fn: dict[str, str], p: dict[str, Any], run_id: int,
                        since: int, horizon: int, share: int, shares: int, steps: timing.Steps | None) -> None:
    """Attribute and judge share ``share`` of ``shares`` of the audit's allocations (by allocation id) into
    usage_gpu; the infrastructure intervals (``_infra``) stay for the finding rules of this connection."""
    step = steps.step if steps is not None else (lambda _name: nullcontext())
    cf = fn["cluster_filter"] + (f" AND MOD(a.id, {shares}) = {share}" if shares > 1 else "")
    fn = {**fn, "cluster_filter": cf}
    attribute(conn, fn, p, cf, step)
    with step("infrastructure intervals"):
        infra.prepare(conn, th, since, horizon)
    with step("judge buckets"):
        judge(conn, fn, {**p, "run_id": run_id}, th)
        conn.execute(text("DROP TABLE _attr"))
