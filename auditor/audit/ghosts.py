"""ghost_busy on GPUs nobody held (issue 19 §1): GPU-Util high on a GPU with no allocation.

A GPU that no job or pod held reads GPU-Util busy: no user's job can be the cause, so it is a driver or
hardware state (or a process outside the scheduler) for operations. Unallocated time is not reserved: these
findings carry 0 idle GPU-hours and no cost, and change no reserved, idle or chargeback total.

A bucket counts when it is observed (samples > 0), GPU-Util >= ``thresholds.ghost_gpu_util``, no telemetry
row of that bucket names a job, and no allocation overlapping it held the GPU: by scheduler index, by the
audit run's attribution (``usage_gpu.gpu_id``), or an allocation on the node whose GPU the audit could not
tie to a telemetry GPU (count-only, unattributed: it may have been this one). Buckets of one GPU are summed;
a GPU is reported when those seconds reach ``thresholds.ghost_unallocated_min_minutes``. A GPU without
samples is never a ghost (unknown is not busy).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, text

from auditor.audit import verdict
from auditor.audit.evidence import _fn
from auditor.config import Thresholds

H = 3600.0

GHOSTS = """SELECT tg.cluster, tg.host, tg.gpu_index, tg.uuid, tg.model, COUNT(*) AS buckets,
 SUM({obs}) AS ghost_s, SUM({obs} * b.gpu_util) AS util_s, MAX(b.fb_used_mib) AS peak_fb,
 SUM(CASE WHEN b.sm_active IS NOT NULL THEN {obs} * b.sm_active END) AS sm_s,
 SUM(CASE WHEN b.sm_active IS NOT NULL THEN {obs} END) AS sm_obs,
 SUM(CASE WHEN b.power_w IS NOT NULL THEN {obs} * b.power_w END) AS power_s,
 SUM(CASE WHEN b.power_w IS NOT NULL THEN {obs} END) AS power_obs,
 MIN(b.bucket_ts) AS first_ts, MAX(b.bucket_ts + b.bucket_s) AS last_ts
FROM telemetry_gpus tg JOIN gpu_buckets b ON b.gpu_id = tg.id
WHERE tg.gpu_instance = '' AND b.bucket_ts >= :since AND b.bucket_ts < :horizon AND b.samples > 0
 AND b.observed_s > 0 AND b.job = '' AND {busy} {cluster_filter}
 AND NOT EXISTS (SELECT 1 FROM gpu_buckets s WHERE s.gpu_id = b.gpu_id AND s.bucket_ts = b.bucket_ts
  AND s.job <> '')
 AND NOT EXISTS (SELECT 1 FROM allocated_gpus ag JOIN allocations a ON a.id = ag.allocation_id
  LEFT JOIN usage_gpu u ON u.run_id = :run AND u.allocated_gpu_id = ag.id
  WHERE ag.node = tg.host AND a.cluster = tg.cluster AND a.start_ts IS NOT NULL
  AND a.start_ts < b.bucket_ts + b.bucket_s AND COALESCE(a.end_ts, :horizon) > b.bucket_ts
  AND (ag.gpu_index = tg.gpu_index OR u.gpu_id = tg.id OR (ag.gpu_index IS NULL AND u.gpu_id IS NULL)))
GROUP BY tg.cluster, tg.host, tg.gpu_index, tg.uuid, tg.model
ORDER BY tg.cluster, tg.host, tg.gpu_index"""


def ghost_sql(conn: Connection, th: Thresholds, clusters: list[str] | None) -> str:
    obs = f"{_fn(conn)['L']}(b.observed_s, b.bucket_s)"
    cf = (" AND tg.cluster IN (" + ", ".join(f":gc{i}" for i in range(len(clusters))) + ")") if clusters else ""
    return GHOSTS.format(obs=obs, busy=verdict.at_least("b.gpu_util", th.ghost_gpu_util), cluster_filter=cf)


def _ratio(a: Any, b: Any) -> float | None:
    return float(a) / float(b) if a is not None and b else None


def unallocated_ghosts(conn: Connection, run_id: int, th: Thresholds, p: dict[str, Any],
                       clusters: list[str] | None = None) -> list[dict[str, Any]]:
    """ghost_busy findings (finding-table rows, no allocation) of the GPUs nobody held in [since, horizon)."""
    params = {"since": p["since"], "horizon": p["horizon"], "run": run_id,
              **{f"gc{i}": c for i, c in enumerate(clusters or [])}}
    out = []
    for r in conn.execute(text(ghost_sql(conn, th, clusters)), params):
        ghost_s = float(r.ghost_s or 0.0)
        if ghost_s <= 0 or ghost_s < th.ghost_unallocated_min_minutes * 60 - 1e-9:
            continue
        util = _ratio(r.util_s, ghost_s) or 0.0
        fb = float(r.peak_fb) if r.peak_fb is not None else None
        where = f"{r.host} GPU {r.gpu_index}"
        held = (f"{fb:.0f} MiB used: a process outside the scheduler" if fb is not None and
                fb > th.ghost_max_fb_mib + 1e-9 else "no process: a driver or hardware state")
        ev = {"rule": f"{where} read GPU-Util {util:.0%} for {ghost_s / H:.1f} h with no allocation; {held}",
              "recipient": "operations", "unallocated": True, "node": r.host, "gpu_index": r.gpu_index,
              "uuid": r.uuid, "gpu_model": r.model, "ghost_gpu_hours": ghost_s / H, "buckets": int(r.buckets),
              "mean_gpu_util": util, "peak_fb_mib": fb, "mean_sm_active": _ratio(r.sm_s, r.sm_obs),
              "mean_power_w": _ratio(r.power_s, r.power_obs)}
        out.append({"run_id": run_id, "kind": "ghost_busy", "cluster": r.cluster, "allocation_id": None,
                    "reservation_id": None, "account": "", "user_name": "", "team": "",
                    "start_ts": int(r.first_ts), "end_ts": int(r.last_ts), "gpu_hours": ghost_s / H,
                    "idle_gpu_hours": 0.0, "cost": 0.0, "evidence": ev})
    return out
