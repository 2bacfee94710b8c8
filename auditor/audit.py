"""The audit: attribute reserved GPU-intervals to telemetry and judge every bucket, in set-based SQL.

Flow: allocations overlapping the window -> ``_attr`` (one row per allocated GPU: which telemetry GPU it
is, by scheduler index, whole node, or telemetry labels; else unattributed) -> one grouped join with
``gpu_buckets`` that judges each bucket (unknown / idle / idle-by-util / mirage / low / working) and sums
seconds per allocated GPU into ``usage_gpu`` -> per allocation totals and money into ``usage_allocation``
-> findings (:mod:`auditor.rules`). Unknown is never idle: a bucket without samples or a usable signal, or a
GPU no telemetry can be tied to, counts as unknown.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, insert, select, text, update

from auditor import schema
from auditor.config import Config, Thresholds
from auditor.money import Pricing
from auditor.store import Store
from auditor.timeutil import to_epoch, utcnow

log = logging.getLogger("gpu_audit.audit")


def _fn(conn: Connection) -> dict[str, str]:
    pg = conn.dialect.name == "postgresql"
    return {"GREATEST": "GREATEST" if pg else "max", "LEAST": "LEAST" if pg else "min"}


ATTR_DDL = """CREATE TEMPORARY TABLE _attr (allocated_gpu_id INTEGER PRIMARY KEY, allocation_id INTEGER,
 gpu_id INTEGER, gpu_index INTEGER, attribution VARCHAR(16), a_s INTEGER, a_e INTEGER, share FLOAT)"""

_IN_WINDOW = """a.start_ts IS NOT NULL AND a.start_ts < :until AND COALESCE(a.end_ts, :horizon) > :since
 AND a.start_ts < :horizon {cluster_filter}"""
_CLIP = "{GREATEST}(a.start_ts, :since), {LEAST}(COALESCE(a.end_ts, :horizon), :horizon)"

ATTR_BY_INDEX = """INSERT INTO _attr SELECT ag.id, a.id, tg.id, ag.gpu_index, 'index',
 """ + _CLIP + """, ag.share FROM allocations a JOIN allocated_gpus ag ON ag.allocation_id = a.id
LEFT JOIN telemetry_gpus tg ON tg.cluster = a.cluster AND tg.host = ag.node AND tg.gpu_index = ag.gpu_index
 AND tg.gpu_instance = ''
WHERE ag.gpu_index IS NOT NULL AND """ + _IN_WINDOW

ATTR_BY_NODE = """INSERT INTO _attr SELECT ag.id, a.id, tg.id, tg.gpu_index, 'node',
 """ + _CLIP + """, ag.share FROM allocations a JOIN allocated_gpus ag ON ag.allocation_id = a.id
JOIN (SELECT allocation_id, node, COUNT(*) AS n FROM allocated_gpus WHERE gpu_index IS NULL AND share >= 1
      GROUP BY allocation_id, node) held ON held.allocation_id = a.id AND held.node = ag.node
JOIN (SELECT cluster, host, MAX(n) AS n FROM (
        SELECT cluster, host, COUNT(*) AS n FROM gpu_inventory GROUP BY cluster, host
        UNION ALL SELECT cluster, host, COUNT(*) AS n FROM telemetry_gpus WHERE gpu_instance = ''
        GROUP BY cluster, host) caps GROUP BY cluster, host) cap
  ON cap.cluster = a.cluster AND cap.host = ag.node AND held.n >= cap.n
JOIN telemetry_gpus tg ON tg.cluster = a.cluster AND tg.host = ag.node AND tg.gpu_instance = ''
 AND tg.gpu_index = ag.slot
WHERE ag.gpu_index IS NULL AND ag.share >= 1 AND """ + _IN_WINDOW

LABEL_CANDIDATES = """SELECT DISTINCT ag.allocation_id, ag.node, tg.id AS gpu_id, tg.gpu_index
FROM allocations a JOIN allocated_gpus ag ON ag.allocation_id = a.id
JOIN telemetry_gpus tg ON tg.cluster = a.cluster AND tg.host = ag.node
JOIN gpu_buckets b ON b.gpu_id = tg.id AND b.bucket_ts >= {GREATEST}(a.start_ts, :since) - :bucket
 AND b.bucket_ts < {LEAST}(COALESCE(a.end_ts, :horizon), :horizon)
WHERE ag.gpu_index IS NULL AND ag.id NOT IN (SELECT allocated_gpu_id FROM _attr)
 AND ((a.source = 'slurm' AND (b.hpc_job = a.external_id
        OR ',' || b.hpc_job || ',' LIKE '%,' || a.external_id || ',%'))
   OR (a.source <> 'slurm' AND b.pod = a.name AND b.namespace = a.account))
 AND """ + _IN_WINDOW + " ORDER BY ag.allocation_id, ag.node, tg.gpu_index, tg.id"

UNRESOLVED = """SELECT ag.id, a.id AS allocation_id, ag.node, ag.slot FROM allocations a
JOIN allocated_gpus ag ON ag.allocation_id = a.id
WHERE ag.id NOT IN (SELECT allocated_gpu_id FROM _attr) AND """ + _IN_WINDOW + \
    " ORDER BY ag.allocation_id, ag.node, ag.slot"

ATTR_REST = """INSERT INTO _attr SELECT ag.id, a.id, NULL, ag.gpu_index, 'unattributed', """ + _CLIP + """,
 ag.share FROM allocations a JOIN allocated_gpus ag ON ag.allocation_id = a.id
WHERE ag.id NOT IN (SELECT allocated_gpu_id FROM _attr) AND """ + _IN_WINDOW

# One pass over the attributed buckets: judge each bucket, then sum seconds per allocated GPU.
JUDGE = """INSERT INTO usage_gpu (run_id, allocated_gpu_id, allocation_id, attribution, gpu_index, gpu_id,
 signal,
 reserved_s, observed_s, idle_s, idle_by_util_s, mirage_s, low_s, working_s, unknown_s, effective_s,
 gpu_util_s, util_observed_s, sm_s, sm_observed_s, tensor_s, dram_s, io_bps_s, max_gpu_mirage_s, peak_fb_mib)
SELECT :run_id, at.allocated_gpu_id, at.allocation_id, at.attribution, at.gpu_index, at.gpu_id,
 CASE WHEN MAX(j.has_sm) = 1 THEN 'sm_active' WHEN MAX(j.has_util) = 1 THEN 'gpu_util' ELSE 'none' END,
 at.share * (at.a_e - at.a_s),
 at.share * COALESCE(SUM(CASE WHEN j.v <> 'u' THEN j.ov END), 0),
 at.share * COALESCE(SUM(CASE WHEN j.v IN ('i', 'f') THEN j.ov END), 0),
 at.share * COALESCE(SUM(CASE WHEN j.v = 'f' THEN j.ov END), 0),
 at.share * COALESCE(SUM(CASE WHEN j.v = 'm' THEN j.ov END), 0),
 at.share * COALESCE(SUM(CASE WHEN j.v = 'l' THEN j.ov END), 0),
 at.share * COALESCE(SUM(CASE WHEN j.v = 'w' THEN j.ov END), 0),
 at.share * ((at.a_e - at.a_s) - COALESCE(SUM(CASE WHEN j.v IN ('i', 'f', 'm', 'l', 'w') THEN j.ov END), 0)),
 at.share * COALESCE(SUM(CASE WHEN j.has_sm = 1 THEN j.ov * j.sm_active END), 0),
 at.share * COALESCE(SUM(j.ov * j.gpu_util), 0),
 at.share * COALESCE(SUM(CASE WHEN j.has_util = 1 THEN j.ov END), 0),
 at.share * COALESCE(SUM(j.ov * j.sm_active), 0),
 at.share * COALESCE(SUM(CASE WHEN j.has_sm = 1 THEN j.ov END), 0),
 at.share * COALESCE(SUM(j.ov * j.tensor_active), 0),
 at.share * COALESCE(SUM(j.ov * j.dram_active), 0),
 at.share * COALESCE(SUM(j.ov * j.io_bps), 0),
 COALESCE(SUM(CASE WHEN j.v = 'm' THEN j.ov END), 0),
 MAX(j.fb_used_mib)
FROM _attr at LEFT JOIN (
 SELECT x.allocated_gpu_id, x.ov, x.samples, x.sm_active, x.gpu_util, x.tensor_active, x.dram_active,
  x.fb_used_mib, x.io_bps,
  CASE WHEN x.sm_active IS NOT NULL AND x.samples > 0 THEN 1 ELSE 0 END AS has_sm,
  CASE WHEN x.gpu_util IS NOT NULL AND x.samples > 0 THEN 1 ELSE 0 END AS has_util,
  CASE WHEN x.samples IS NULL OR x.samples <= 0 THEN 'u'
   WHEN x.sm_active IS NOT NULL THEN
    CASE WHEN x.sm_active < :idle_sm AND COALESCE(x.dram_active, 0) < :idle_dram
          AND COALESCE(x.tensor_active, 0) < :idle_tensor THEN
      CASE WHEN COALESCE(x.gpu_util, 0) >= :mirage_util OR COALESCE(x.gr_engine, 0) >= :mirage_gr
           THEN 'm' ELSE 'i' END
     WHEN x.sm_active >= :working_sm THEN 'w' ELSE 'l' END
   WHEN :fallback = 1 AND x.gpu_util IS NOT NULL AND x.gpu_util < :idle_util
    AND (:idle_power < 0 OR COALESCE(x.power_w, :idle_power + 1) < :idle_power) THEN 'f'
   ELSE 'u' END AS v
 FROM (SELECT t.allocated_gpu_id,
        {LEAST}(b.bucket_ts + b.bucket_s, t.a_e) - {GREATEST}(b.bucket_ts, t.a_s) AS ov,
        b.samples, b.sm_active, b.gpu_util, b.gr_engine, b.tensor_active, b.dram_active, b.power_w,
        b.fb_used_mib, COALESCE(b.pcie_tx_bps, 0) + COALESCE(b.pcie_rx_bps, 0)
          + COALESCE(b.nvlink_tx_bps, 0) + COALESCE(b.nvlink_rx_bps, 0) AS io_bps
       FROM _attr t JOIN gpu_buckets b ON b.gpu_id = t.gpu_id
        AND b.bucket_ts >= t.a_s - :bucket AND b.bucket_ts < t.a_e) x
 WHERE x.ov > 0) j ON j.allocated_gpu_id = at.allocated_gpu_id
GROUP BY at.allocated_gpu_id, at.allocation_id, at.attribution, at.gpu_index, at.gpu_id, at.share,
 at.a_s, at.a_e"""

# SQLite runs JUDGE's logic in two steps (same results, ~3x faster at fleet scale): per allocated GPU, one
# correlated scan of its buckets computes each bucket's verdict once (1 idle, 2 idle-by-util, 3 mirage, 4 low,
# 5 working, 0 no usable signal, -1 no samples) and folds all sums into one JSON array; then a join writes
# usage_gpu (SM-observed time is verdicts 1, 3, 4 and 5: exactly the buckets with samples and SM activity). JUDGE's
# LEFT JOIN of a joined subquery would be materialised (every bucket copied and indexed) by SQLite.
# Keep both in step: tests/test_simulate.py checks they agree.
_VERDICT = """CASE WHEN b.samples <= 0 THEN -1 {working_first}
   WHEN b.sm_active IS NOT NULL THEN
    CASE WHEN b.sm_active < :idle_sm AND COALESCE(b.dram_active, 0) < :idle_dram
          AND COALESCE(b.tensor_active, 0) < :idle_tensor THEN
      CASE WHEN COALESCE(b.gpu_util, 0) >= :mirage_util OR COALESCE(b.gr_engine, 0) >= :mirage_gr
           THEN 3 ELSE 1 END
     WHEN b.sm_active >= :working_sm THEN 5 ELSE 4 END
   WHEN :fallback = 1 AND b.gpu_util IS NOT NULL AND b.gpu_util < :idle_util
    AND (:idle_power < 0 OR COALESCE(b.power_w, :idle_power + 1) < :idle_power) THEN 2
   ELSE 0 END"""
_OV = ("(CASE WHEN b.bucket_ts >= t.a_s AND b.bucket_ts + b.bucket_s <= t.a_e THEN b.bucket_s "
       "ELSE min(b.bucket_ts + b.bucket_s, t.a_e) - max(b.bucket_ts, t.a_s) END)")
JUDGE_SQLITE_DDL = "CREATE TEMPORARY TABLE _judged (allocated_gpu_id INTEGER PRIMARY KEY, r TEXT)"
_SQLITE_SUMS = (*(f"SUM(CASE WHEN j.v = {v} THEN j.ov END)" for v in range(1, 6)),
                "SUM(CASE WHEN j.v > 0 THEN j.ov * j.sm_active END)", "SUM(j.ov * j.gpu_util)",
                "SUM(CASE WHEN j.v >= 0 AND j.gpu_util IS NOT NULL THEN j.ov END)", "SUM(j.ov * j.sm_active)",
                "SUM(j.ov * j.tensor_active)", "SUM(j.ov * j.dram_active)", "SUM(j.ov * j.io_bps)",
                "MAX(j.fb_used_mib)")
# %!.17g: JSON would print reals with 15 digits; 17 round-trip exactly (CAST back in JUDGE_SQLITE_WRITE)
JUDGE_SQLITE_SCAN = """INSERT INTO _judged SELECT t.allocated_gpu_id, (SELECT json_array(""" + ", ".join(
    f"CASE WHEN {a} IS NOT NULL THEN printf('%!.17g', {a}) END" for a in _SQLITE_SUMS) + """)
 FROM (SELECT """ + _OV + """ AS ov, b.sm_active, b.gpu_util, b.tensor_active, b.dram_active,
        b.fb_used_mib, COALESCE(b.pcie_tx_bps, 0) + COALESCE(b.pcie_rx_bps, 0)
          + COALESCE(b.nvlink_tx_bps, 0) + COALESCE(b.nvlink_rx_bps, 0) AS io_bps, {verdict} AS v
       FROM gpu_buckets b WHERE b.gpu_id = t.gpu_id AND b.bucket_ts >= t.a_s - :bucket AND b.bucket_ts < t.a_e
        AND b.bucket_ts + b.bucket_s > t.a_s AND b.bucket_s > 0 AND t.a_e > t.a_s
       LIMIT -1) j)
FROM _attr t ORDER BY t.gpu_id, t.a_s"""


def _j(i: int) -> str:
    return f"COALESCE(CAST(json_extract(j.r, '$[{i}]') AS REAL), 0)"


_SM_SEEN = f"({_j(0)} + {_j(2)} + {_j(3)} + {_j(4)})"
_JUDGED = f"({_SM_SEEN} + {_j(1)})"
JUDGE_SQLITE_WRITE = f"""INSERT INTO usage_gpu (run_id, allocated_gpu_id, allocation_id, attribution, gpu_index,
 gpu_id, signal, reserved_s, observed_s, idle_s, idle_by_util_s, mirage_s, low_s, working_s, unknown_s,
 effective_s, gpu_util_s, util_observed_s, sm_s, sm_observed_s, tensor_s, dram_s, io_bps_s, max_gpu_mirage_s,
 peak_fb_mib)
SELECT :run_id, at.allocated_gpu_id, at.allocation_id, at.attribution, at.gpu_index, at.gpu_id,
 CASE WHEN {_SM_SEEN} > 0 THEN 'sm_active' WHEN {_j(7)} > 0 THEN 'gpu_util' ELSE 'none' END,
 at.share * (at.a_e - at.a_s), at.share * {_JUDGED}, at.share * ({_j(0)} + {_j(1)}), at.share * {_j(1)},
 at.share * {_j(2)}, at.share * {_j(3)}, at.share * {_j(4)}, at.share * ((at.a_e - at.a_s) - {_JUDGED}),
 at.share * {_j(5)}, at.share * {_j(6)}, at.share * {_j(7)}, at.share * {_j(8)}, at.share * {_SM_SEEN},
 at.share * {_j(9)}, at.share * {_j(10)}, at.share * {_j(11)}, {_j(2)}, CAST(json_extract(j.r, '$[12]') AS REAL)
FROM _attr at JOIN _judged j ON j.allocated_gpu_id = at.allocated_gpu_id"""


def judge(conn: Connection, fn: dict[str, str], params: dict[str, Any], th: Thresholds) -> None:
    """Judge every bucket of ``_attr`` into usage_gpu (JUDGE; on SQLite its two-step equivalent)."""
    if conn.dialect.name != "sqlite":
        conn.execute(text(JUDGE.format(**fn)), params)
        return
    # with working_sm >= idle_sm a bucket at or above working_sm cannot be idle: test the common case first
    first = "WHEN b.sm_active >= :working_sm THEN 5" if th.working_sm >= th.idle_sm else ""
    conn.execute(text("DROP TABLE IF EXISTS _judged"))
    conn.execute(text(JUDGE_SQLITE_DDL))
    # walk _attr in (GPU, time) order so the bucket table is read sequentially, not in allocation order
    conn.execute(text("CREATE INDEX temp._attr_gpu_ts ON _attr (gpu_id, a_s, a_e)"))
    conn.execute(text(JUDGE_SQLITE_SCAN.format(verdict=_VERDICT.format(working_first=first))), params)
    conn.execute(text(JUDGE_SQLITE_WRITE), params)
    conn.execute(text("DROP TABLE _judged"))


SUM_COLS = [c for c in schema.usage_allocation.c.keys() if c.endswith("_s")]

PER_ALLOCATION = ("SELECT g.*, a.cluster, a.source, a.external_id, a.name, a.user_name, a.account, a.labels, "
                  "a.gpu_count, a.start_ts, a.end_ts FROM (SELECT u.allocation_id, COUNT(*) AS gpus, "
                  "MAX(u.peak_fb_mib) AS peak_fb_mib, MAX(u.max_gpu_mirage_s) AS max_gpu_mirage_s_max, "
                  + ", ".join(f"SUM(u.{c}) AS {c}" for c in SUM_COLS if c != "max_gpu_mirage_s")
                  + ", MIN(ag.model) AS gpu_model, MIN(ag.mig_profile) AS mig_profile "
                  "FROM usage_gpu u JOIN allocated_gpus ag ON ag.id = u.allocated_gpu_id "
                  "WHERE u.run_id = :run_id GROUP BY u.allocation_id) g "
                  "JOIN allocations a ON a.id = g.allocation_id ORDER BY g.allocation_id")


@dataclass
class AuditResult:
    run_id: int
    since: datetime
    until: datetime
    summary: dict[str, Any] = field(default_factory=dict)


def _params(th: Thresholds, since: int, until: int, horizon: int, bucket: int) -> dict[str, Any]:
    return {"since": since, "until": until, "horizon": horizon, "bucket": bucket,
            "idle_sm": th.idle_sm, "idle_dram": th.idle_dram, "idle_tensor": th.idle_tensor,
            "mirage_util": th.mirage_gpu_util, "mirage_gr": th.mirage_gr_engine, "working_sm": th.working_sm,
            "fallback": 1 if th.util_fallback else 0, "idle_util": th.idle_util,
            "idle_power": th.idle_power_w if th.idle_power_w is not None else -1.0}


def attribute_by_labels(conn: Connection, sql: str, params: dict[str, Any]) -> int:
    """Tie count-only allocated GPUs to telemetry GPUs whose hpc_job/pod labels name the allocation."""
    found: dict[tuple[int, str], list[tuple[int, int]]] = defaultdict(list)
    for r in conn.execute(text(sql), params):
        found[(r.allocation_id, r.node)].append((r.gpu_id, r.gpu_index))
    if not found:
        return 0
    rows = []
    for r in conn.execute(text(UNRESOLVED.format(**_fn(conn), cluster_filter=params["_cf"])), params):
        cands = found.get((r.allocation_id, r.node))
        if cands and r.slot < len(cands):
            rows.append({"g": r.id, "gpu": cands[r.slot][0], "idx": cands[r.slot][1]})
    if rows:
        conn.execute(text(
            "INSERT INTO _attr SELECT ag.id, a.id, :gpu, :idx, 'label', " + _CLIP.format(**_fn(conn))
            + ", ag.share FROM allocated_gpus ag JOIN allocations a ON a.id = ag.allocation_id "
            "WHERE ag.id = :g"), [{"since": params["since"], "horizon": params["horizon"], **r} for r in rows])
    return len(rows)


def run_audit(store: Store, cfg: Config, since: datetime, until: datetime, *,
              thresholds: Thresholds | None = None, clusters: list[str] | None = None,
              what_if: bool = False) -> AuditResult:
    """Judge [since, until) and store usage and findings under a new audit run."""
    from auditor.rules import find_all

    th = thresholds or cfg.thresholds
    s, u = to_epoch(since), to_epoch(until)
    assert s is not None and u is not None
    if u <= s:
        from auditor.errors import GpuAuditError

        raise GpuAuditError(f"empty audit window: until {until.isoformat()} is not after since")
    now = int(utcnow().timestamp())
    horizon = min(u, now)
    params = _params(th, s, u, horizon, cfg.store.bucket_seconds)
    cluster_filter = ""
    if clusters:
        cluster_filter = " AND a.cluster IN (" + ", ".join(f":c{i}" for i in range(len(clusters))) + ")"
        params.update({f"c{i}": c for i, c in enumerate(clusters)})
    params["_cf"] = cluster_filter
    pricing = Pricing(cfg)
    with store.begin() as conn:
        run_id = conn.execute(insert(schema.audit_runs).values(
            started_ts=now, since_ts=s, until_ts=u, status="running", what_if=what_if,
            thresholds=th.model_dump())).inserted_primary_key[0]
    try:
        with store.begin() as conn:
            fn = {**_fn(conn), "cluster_filter": cluster_filter}
            conn.execute(text("DROP TABLE IF EXISTS _attr"))
            conn.execute(text(ATTR_DDL))
            p = {k: v for k, v in params.items() if not k.startswith("_")}
            conn.execute(text(ATTR_BY_INDEX.format(**fn)), p)
            conn.execute(text(ATTR_BY_NODE.format(**fn)), p)
            attribute_by_labels(conn, LABEL_CANDIDATES.format(**fn), {**p, "_cf": cluster_filter})
            conn.execute(text(ATTR_REST.format(**fn)), p)
            judge(conn, fn, {**p, "run_id": run_id}, th)
            # fresh statistics, so the findings' per-allocation lookups use (run_id, allocation_id) and do not
            # scan the whole run once per chunk of allocations
            conn.execute(text("ANALYZE usage_gpu"))
            conn.execute(text("DROP TABLE _attr"))
            per_alloc = [dict(r._mapping) for r in conn.execute(text(PER_ALLOCATION), {"run_id": run_id})]
            per_alloc, refused = pricing.price_rows(per_alloc, [*SUM_COLS, "max_gpu_mirage_s_max", "gpu_count"])
            refuse(conn, run_id, refused, now)
            for i in range(0, len(per_alloc), 5000):  # row dicts a chunk at a time: peak RSS at fleet scale
                rows = []
                for r in per_alloc[i:i + 5000]:
                    rows.append({"run_id": run_id, "allocation_id": r["allocation_id"], "team": r["team"],
                                 "gpu_model": r["gpu_model"], "price_per_gpu_hour": r["price"],
                                 **{c: r[c] for c in SUM_COLS if c != "max_gpu_mirage_s"},
                                 "max_gpu_mirage_s": r["max_gpu_mirage_s_max"], "peak_fb_mib": r["peak_fb_mib"],
                                 "gpus": r["gpus"], "reserved_cost": r["reserved_cost"],
                                 "idle_cost": r["idle_cost"]})
                conn.execute(insert(schema.usage_allocation), rows)
            summary = find_all(conn, run_id, per_alloc, th, cfg, since=s, until=u, horizon=horizon,
                               clusters=clusters)
            if refused:
                summary["refused_allocations"] = len(refused)
            conn.execute(update(schema.audit_runs).where(schema.audit_runs.c.id == run_id).values(
                status="ok", finished_ts=int(utcnow().timestamp()), summary=summary))
    except Exception:
        with store.begin() as conn:
            conn.execute(update(schema.audit_runs).where(schema.audit_runs.c.id == run_id).values(
                status="failed", finished_ts=int(utcnow().timestamp())))
        raise
    return AuditResult(run_id, since, until, summary)


def refuse(conn: Connection, run_id: int, refused: list[tuple[dict[str, Any], str]], now: int) -> None:
    """Allocations whose money is not finite: kept out of this run (no usage, no findings) and listed in
    quarantined_records, so one corrupt row never fails the audit for everyone."""
    if not refused:
        return
    ids = [r["allocation_id"] for r, _ in refused]
    log.warning("audit run %d: %d allocation(s) refused (not finite), e.g. %s: %s", run_id, len(ids),
                refused[0][0].get("external_id"), refused[0][1])
    conn.execute(schema.usage_gpu.delete().where(schema.usage_gpu.c.run_id == run_id,
                                                 schema.usage_gpu.c.allocation_id.in_(ids)))
    conn.execute(insert(schema.quarantined_records), [
        {"collected_ts": now, "cluster": str(r.get("cluster") or "")[:128], "source": f"audit run {run_id}",
         "location": f"allocation {r['allocation_id']} ({r.get('external_id')})"[:255], "reason": why,
         "excerpt": None} for r, why in refused])


def latest_run(store: Store, *, what_if: bool = False) -> int | None:
    t = schema.audit_runs
    with store.engine.connect() as conn:
        return conn.execute(select(t.c.id).where(t.c.status == "ok", t.c.what_if == what_if)
                            .order_by(t.c.id.desc()).limit(1)).scalar()
