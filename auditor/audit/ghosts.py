"""ghost_busy on GPUs nobody held (issue 19 §1): GPU-Util high on a GPU with no allocation.

A GPU that no job or pod held reads GPU-Util busy: no user's job can be the cause, so it is a driver or
hardware state (or a process outside the scheduler) for operations. Unallocated time is not reserved: these
findings carry 0 idle GPU-hours and no cost, and change no reserved, idle or chargeback total.

A bucket counts when it is observed (samples > 0), GPU-Util >= ``GHOST_GPU_UTIL``, no telemetry
row of that bucket names a job, and it lies wholly in time no allocation held the GPU: by scheduler index,
by the audit run's attribution (``usage_gpu.gpu_id``), or an allocation on the node whose GPU the audit could
not tie to a telemetry GPU (count-only, unattributed: it may have been this one). Set-based: the held
intervals per GPU, the holes between them (gaps and islands, a window function), and a range scan of the
bucket key per hole, so allocated time is never read bucket by bucket. Buckets of one GPU are summed;
a GPU is reported when those seconds reach ``GHOST_UNALLOCATED_MIN_MINUTES``. A GPU without
samples is never a ghost (unknown is not busy).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, text

from auditor.audit import verdict
from auditor.audit.evidence import _fn
from auditor.audit.verdict import EPS
from auditor.config import Thresholds
from auditor.timeutil import H

# ghost_busy's rule constants (docs/definitions.md): a GPU that reads busy with no process on it, a driver or
# hardware state on any site (they were `[thresholds]` settings until issue 45).
#: mean GPU-Util over the mirage time (or a bucket's, on a GPU nobody held) at least this...
GHOST_GPU_UTIL = 0.9
#: ...while at most this much memory (MiB) was used: no process holds the GPU (a CUDA context takes more)
GHOST_MAX_FB_MIB = 16.0
#: a GPU nobody held is reported after this many minutes of such buckets in the window (one 30-minute spell is
#: not a passing reading)
GHOST_UNALLOCATED_MIN_MINUTES = 30

# Time each telemetry GPU was held in [since, horizon), in a temporary table (with statistics: a plan that
# guesses them paired every telemetry GPU with every allocation of its cluster): the run's attribution
# (index, whole node, labels), scheduler indices directly (also of an allocation the run refused), and
# every GPU of a node where an allocated GPU could not be attributed (it may have been any of them: first
# the node, then its GPUs). CROSS JOIN keeps SQLite's join order, from the allocated GPUs.
HELD_DDL = "CREATE TEMPORARY TABLE _held (gpu_id INTEGER, cluster TEXT, host TEXT, s INTEGER, e INTEGER)"
HELD = (
    """INSERT INTO _held SELECT u.gpu_id, NULL, NULL, a.start_ts, COALESCE(a.end_ts, :horizon) FROM usage_gpu u
 JOIN allocations a ON a.id = u.allocation_id WHERE u.run_id = :run AND u.gpu_id IS NOT NULL""",
    """INSERT INTO _held SELECT tg.id, NULL, NULL, a.start_ts, COALESCE(a.end_ts, :horizon)
 FROM allocated_gpus ag CROSS JOIN allocations a CROSS JOIN telemetry_gpus tg
 WHERE ag.gpu_index IS NOT NULL AND a.id = ag.allocation_id AND tg.cluster = a.cluster AND tg.host = ag.node
 AND tg.gpu_index = ag.gpu_index AND tg.gpu_instance = ''
 AND a.start_ts IS NOT NULL AND a.start_ts < :horizon AND COALESCE(a.end_ts, :horizon) > :since""",
    """INSERT INTO _held SELECT NULL, a.cluster, ag.node, a.start_ts, COALESCE(a.end_ts, :horizon) FROM usage_gpu u
 JOIN allocations a ON a.id = u.allocation_id JOIN allocated_gpus ag ON ag.id = u.allocated_gpu_id
 WHERE u.run_id = :run AND u.gpu_id IS NULL""",
    """INSERT INTO _held SELECT tg.id, NULL, NULL, h.s, h.e FROM _held h CROSS JOIN telemetry_gpus tg
 WHERE h.gpu_id IS NULL AND tg.cluster = h.cluster AND tg.host = h.host AND tg.gpu_instance = ''""",
)

# The holes between held intervals (gaps and islands: an interval starts a hole when it begins after the
# latest end before it), the tail after the last one, and the whole window of GPUs never held; then the
# busy buckets that lie wholly inside a hole (a range scan of the bucket key per hole)
GHOSTS = """WITH h AS (SELECT gpu_id, {G}(s, :since) AS s, {L}(e, :horizon) AS e FROM _held
  WHERE gpu_id IS NOT NULL AND e > :since AND s < :horizon),
o AS (SELECT gpu_id, s, MAX(e) OVER (PARTITION BY gpu_id ORDER BY s, e ROWS BETWEEN UNBOUNDED PRECEDING
  AND 1 PRECEDING) AS prev_end FROM h),
holes AS (SELECT gpu_id, COALESCE(prev_end, :since) AS hs, s AS he FROM o WHERE s > COALESCE(prev_end, :since)
  UNION ALL SELECT gpu_id, MAX(e), :horizon FROM h GROUP BY gpu_id HAVING MAX(e) < :horizon
  UNION ALL SELECT tg.id, :since, :horizon FROM telemetry_gpus tg WHERE tg.gpu_instance = ''
   AND NOT EXISTS (SELECT 1 FROM h WHERE h.gpu_id = tg.id))
SELECT tg.cluster, tg.host, tg.gpu_index, tg.uuid, tg.model, COUNT(*) AS buckets,
 SUM({obs}) AS ghost_s, SUM({obs} * b.gpu_util) AS util_s, MAX(b.fb_used_mib) AS peak_fb,
 SUM(CASE WHEN b.sm_active IS NOT NULL THEN {obs} * b.sm_active END) AS sm_s,
 SUM(CASE WHEN b.sm_active IS NOT NULL THEN {obs} END) AS sm_obs,
 SUM(CASE WHEN b.power_w IS NOT NULL THEN {obs} * b.power_w END) AS power_s,
 SUM(CASE WHEN b.power_w IS NOT NULL THEN {obs} END) AS power_obs,
 MIN(b.bucket_ts) AS first_ts, MAX(b.bucket_ts + b.bucket_s) AS last_ts
FROM holes x JOIN telemetry_gpus tg ON tg.id = x.gpu_id AND tg.gpu_instance = ''
JOIN gpu_buckets b ON b.gpu_id = x.gpu_id AND b.bucket_ts >= x.hs AND b.bucket_ts < x.he
WHERE b.bucket_ts + b.bucket_s <= x.he AND b.samples > 0 AND b.observed_s > 0 AND b.job = '' AND {busy}
 {cluster_filter}
 AND NOT EXISTS (SELECT 1 FROM gpu_buckets s WHERE s.gpu_id = b.gpu_id AND s.bucket_ts = b.bucket_ts
  AND s.job <> '')
GROUP BY tg.cluster, tg.host, tg.gpu_index, tg.uuid, tg.model
ORDER BY tg.cluster, tg.host, tg.gpu_index"""


_RANGE_JOIN = "JOIN gpu_buckets b ON b.gpu_id = x.gpu_id AND b.bucket_ts >= x.hs AND b.bucket_ts < x.he"
# PostgreSQL: each hole's buckets by an index range scan (OFFSET 0 keeps the planner from flattening it).
# Joined plainly, it estimated one busy bucket after the job anti-join and paired every busy bucket with
# every hole in a nested loop: the 1,024-GPU week ran for minutes instead of a second.
_RANGE_LATERAL = ("CROSS JOIN LATERAL (SELECT * FROM gpu_buckets b WHERE b.gpu_id = x.gpu_id AND b.bucket_ts >= x.hs"
                  " AND b.bucket_ts < x.he OFFSET 0) b")


def ghost_sql(conn: Connection, th: Thresholds, clusters: list[str] | None) -> str:
    fn = _fn(conn)
    obs = f"{fn['L']}(b.observed_s, b.bucket_s)"
    cf = (" AND tg.cluster IN (" + ", ".join(f":gc{i}" for i in range(len(clusters))) + ")") if clusters else ""
    sql = GHOSTS.format(obs=obs, busy=verdict.at_least("b.gpu_util", GHOST_GPU_UTIL), cluster_filter=cf, **fn)
    if conn.dialect.name == "postgresql":
        assert _RANGE_JOIN in sql
        sql = sql.replace(_RANGE_JOIN, _RANGE_LATERAL)
    return sql


def _ratio(a: Any, b: Any) -> float | None:
    return float(a) / float(b) if a is not None and b else None


def unallocated_ghosts(conn: Connection, run_id: int, th: Thresholds, p: dict[str, Any],
                       clusters: list[str] | None = None) -> list[dict[str, Any]]:
    """ghost_busy findings (finding-table rows, no allocation) of the GPUs nobody held in [since, horizon)."""
    params = {"since": p["since"], "horizon": p["horizon"], "run": run_id,
              **{f"gc{i}": c for i, c in enumerate(clusters or [])}}
    conn.execute(text("DROP TABLE IF EXISTS _held"))
    conn.execute(text(HELD_DDL))
    for sql in HELD:
        conn.execute(text(sql), params)
    if conn.dialect.name == "postgresql":
        conn.execute(text("ANALYZE _held"))
    out = []
    rows = conn.execute(text(ghost_sql(conn, th, clusters)), params).fetchall()
    conn.execute(text("DROP TABLE _held"))
    for r in rows:
        ghost_s = float(r.ghost_s or 0.0)
        if ghost_s <= 0 or ghost_s < GHOST_UNALLOCATED_MIN_MINUTES * 60 - EPS:
            continue
        util = _ratio(r.util_s, ghost_s) or 0.0
        fb = float(r.peak_fb) if r.peak_fb is not None else None
        where = f"{r.host} GPU {r.gpu_index}"
        held = (f"{fb:.0f} MiB used: a process outside the scheduler" if fb is not None and
                fb > GHOST_MAX_FB_MIB + EPS else "no process: a driver or hardware state")
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
