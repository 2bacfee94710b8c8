"""Opportunity cost (docs/definitions.md "Opportunity cost"): idle GPUs while GPU jobs waited in the same
queue, and GPU quotas held but not used.

* ``idle_while_queued``: the idle seconds (idle, idle-by-util, mirage: :mod:`auditor.audit.verdict`) of an
  allocation's GPUs in buckets during which at least one GPU job of the same cluster and partition waited
  (``gpu_waits``; Kubernetes pods wait in partition "", the cluster). A bucket's idle seconds count in the
  share of the bucket (clipped to the allocation) that the longest-overlapping wait covers: a lower bound
  of the union of the waits, exact when one wait covers the others.
  Unknown time is never idle, so it never counts.
* ``idle_quota``: per quota (Slurm QOS or account GrpTRES gres/gpu), GPUs held on average by its allocations
  versus GPUs in use (held minus idle; unknown counts as in use): quota - in use is the reclaim candidate.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import Connection, text

from auditor.audit import judge, verdict
from auditor.audit.evidence import _finding
from auditor.config import Config, Thresholds

H = 3600.0
_IDLE = verdict.in_codes("j.v", verdict.IDLE_CODES)

#: waits overlapping the window, clipped to it; an open wait ends at its last sighting
WAITS = """SELECT w.id AS wid, w.cluster, w.partition, w.gpus, {G}(w.eligible_ts, :since) AS w_s,
 {L}(COALESCE(w.end_ts, w.last_seen_ts), :horizon) AS w_e
FROM gpu_waits w WHERE w.gpus > 0 AND w.eligible_ts < :horizon AND COALESCE(w.end_ts, w.last_seen_ts) > :since
 AND COALESCE(w.end_ts, w.last_seen_ts) > w.eligible_ts"""


def overlap_sql(dialect: str, th: Thresholds) -> str:
    """One row per (idle bucket of an allocated GPU, wait overlapping it in the same cluster and partition):
    the allocation, the bucket clipped to the allocation [t0, t1), its idle observed seconds x share, and the
    seconds of [t0, t1) the wait covers."""
    g, le = judge.fns(dialect)
    waits = WAITS.format(G=g, L=le)
    rows = judge.rows_of(dialect, th, "c", "cc", ["aid", "gid", "share", "cluster", "part"])
    return f"""WITH w AS ({waits}),
 c AS (
  SELECT u.allocated_gpu_id AS gid, u.allocation_id AS aid, u.gpu_id, ag.share, a.cluster, a.partition AS part,
   {g}(a.start_ts, :since) AS a_s, {le}(COALESCE(a.end_ts, :horizon), :horizon) AS a_e, {judge.JOB_KEY} AS jkey,
   tg.has_jobs AS lab
  FROM usage_gpu u JOIN allocated_gpus ag ON ag.id = u.allocated_gpu_id JOIN telemetry_gpus tg ON tg.id = u.gpu_id
  JOIN allocations a ON a.id = u.allocation_id
  WHERE u.run_id = :run AND u.gpu_id IS NOT NULL AND u.idle_s + u.mirage_s > 0
   AND EXISTS (SELECT 1 FROM w WHERE w.cluster = a.cluster AND w.partition = a.partition
               AND w.w_s < {le}(COALESCE(a.end_ts, :horizon), :horizon) AND w.w_e > {g}(a.start_ts, :since))),
 i AS (SELECT j.aid, j.gid, j.share, j.cluster, j.part, {g}(j.bucket_ts, j.a_s) AS t0,
        {le}(j.bucket_ts + j.bucket_s, j.a_e) AS t1, j.obs FROM {rows} WHERE {_IDLE} AND j.obs > 0)
SELECT i.aid, i.gid, i.part, i.t0, i.t1, i.share * i.obs AS idle_s, w.wid,
 {le}(w.w_e, i.t1) - {g}(w.w_s, i.t0) AS cover_s
FROM i JOIN w ON w.cluster = i.cluster AND w.partition = i.part AND w.w_s < i.t1 AND w.w_e > i.t0"""


#: per allocation: idle seconds while waited (each idle bucket once, times the longest wait's cover share)
_IDLE_Q = """SELECT aid, part, SUM(idle_s * frac) AS s FROM (
  SELECT aid, gid, t0, part, MAX(idle_s) AS idle_s,
   CASE WHEN MAX(cover_s) >= t1 - t0 THEN 1.0 ELSE MAX(cover_s) * 1.0 / (t1 - t0) END AS frac
  FROM _queue_x GROUP BY aid, gid, t0, t1, part) b GROUP BY aid, part"""

#: distinct waits behind the counted idle time, per group: N and M (GPU-seconds waited in the window)
_WAITED = """SELECT {keys}, COUNT(*) AS n, SUM(w.gpus * (w.w_e - w.w_s)) AS m_s FROM (
  SELECT DISTINCT {inner}, q.wid FROM _queue_x q JOIN allocations a ON a.id = q.aid
  JOIN usage_allocation u ON u.run_id = :run AND u.allocation_id = q.aid) d
JOIN ({waits}) w ON w.wid = d.wid GROUP BY {keys}"""
_GROUPS = {"aid": ("d.aid", "q.aid AS aid"), "cluster": ("d.cluster", "a.cluster AS cluster"),
           "team": ("d.cluster, d.team", "a.cluster AS cluster, u.team AS team")}


def idle_while_queued(conn: Connection, run_id: int, per_alloc: list[dict[str, Any]], th: Thresholds,
                      p: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(findings, summary): per allocation, idle GPU-hours while jobs waited; per team and cluster, "idle
    GPU-hours while N jobs waited for M GPU-hours". The (idle bucket, wait) pairs stay in a temporary table:
    only per-allocation and per-group sums reach Python."""
    g, le = judge.fns(conn.dialect.name)
    waits = WAITS.format(G=g, L=le)
    total = conn.execute(text(f"SELECT COUNT(*) AS n, SUM(gpus * (w_e - w_s)) AS m_s FROM ({waits}) w"), p).one()
    summary: dict[str, Any] = {"by_cluster": [], "by_team": [], "waiting_jobs": int(total.n or 0),
                               "waiting_gpu_hours": float(total.m_s or 0) / H}
    if not total.n:
        return [], summary
    conn.execute(text("DROP TABLE IF EXISTS _queue_x"))
    conn.execute(text("CREATE TEMPORARY TABLE _queue_x AS " + overlap_sql(conn.dialect.name, th)), p)
    idle = {int(r.aid): (float(r.s or 0), r.part) for r in conn.execute(text(_IDLE_Q))}
    waited = {}
    for group, (keys, inner) in _GROUPS.items():
        sql = _WAITED.format(keys=keys, inner=inner, waits=waits)
        waited[group] = {tuple(r[:-2]): (int(r.n), float(r.m_s or 0) / H) for r in conn.execute(text(sql), p)}
    conn.execute(text("DROP TABLE _queue_x"))
    by_id = {r["allocation_id"]: r for r in per_alloc}
    findings: list[dict[str, Any]] = []
    sums: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0])  # group key -> [idle seconds, cost]
    for aid, (s, part) in sorted(idle.items()):
        r = by_id.get(aid)
        if r is None or s <= 0:
            continue
        h = s / H
        for key in (("cluster", r["cluster"]), ("team", r["cluster"], r["team"])):
            sums[key][0] += s
            sums[key][1] += h * r["price"]
        if h + 1e-9 < th.queue_min_idle_gpu_hours:
            continue
        n, m = waited["aid"].get((aid,), (0, 0.0))
        ev = {"rule": f"{h:.1f} idle GPU-hours while {n} GPU job(s) waited for {m:.1f} GPU-hours in partition "
                      f"{part or '(cluster)'} (>= {th.queue_min_idle_gpu_hours:g} h)",
              "idle_while_queued_gpu_hours": h, "waiting_jobs": n, "waiting_gpu_hours": m, "partition": part}
        f = _finding(run_id, "idle_while_queued", r, ev, h, p["since"], p["horizon"])
        f["gpu_hours"] = h
        findings.append(f)
    for (group, *key), (s, cost) in sorted(sums.items()):
        n, m = waited[group].get(tuple(key), (0, 0.0))
        names = ("cluster",) if group == "cluster" else ("cluster", "team")
        summary["by_cluster" if group == "cluster" else "by_team"].append(
            {**dict(zip(names, key, strict=True)), "idle_gpu_hours": s / H, "waiting_jobs": n,
             "waiting_gpu_hours": m, "idle_cost": cost})
    return findings, summary


QUOTA_USE = """SELECT q.cluster, q.kind, q.name, q.gpus, SUM(x.reserved_s) AS held_s,
 SUM(x.idle_s + x.mirage_s) AS idle_s, SUM(x.unknown_s) AS unknown_s, COUNT(x.cluster) AS allocations
FROM gpu_quotas q LEFT JOIN (
  SELECT a.cluster, a.qos, a.account, u.reserved_s, u.idle_s, u.mirage_s, u.unknown_s
  FROM usage_allocation u JOIN allocations a ON a.id = u.allocation_id WHERE u.run_id = :run) x
 ON x.cluster = q.cluster AND ((q.kind = 'qos' AND x.qos = q.name) OR (q.kind = 'account' AND x.account = q.name))
WHERE q.last_seen_ts >= :since
GROUP BY q.cluster, q.kind, q.name, q.gpus ORDER BY q.cluster, q.kind, q.name"""


def idle_quota(conn: Connection, run_id: int, th: Thresholds, cfg: Config, p: dict[str, Any],
               team_of: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(findings, table): per GPU quota seen in the window, the average GPUs held, idle and in use over
    [since, horizon); a quota whose unused part (quota - in use) is at least ``idle_quota_min_gpus`` and
    ``idle_quota_fraction`` of the quota is a reclaim candidate."""
    span = max(1, p["horizon"] - p["since"])
    table, findings = [], []
    for r in conn.execute(text(QUOTA_USE), p):
        held, idle = float(r.held_s or 0) / span, float(r.idle_s or 0) / span
        in_use = max(0.0, held - idle)  # unknown time counts as in use: never reclaimed on no evidence
        unused = max(0.0, float(r.gpus) - in_use)
        team = team_of({"account": r.name, "source": "slurm"}) if r.kind == "account" else ""
        row = {"cluster": r.cluster, "kind": r.kind, "name": r.name, "team": team, "quota_gpus": float(r.gpus),
               "held_gpus": held, "idle_gpus": idle, "in_use_gpus": in_use,
               "unknown_gpus": float(r.unknown_s or 0) / span,
               "unused_gpus": unused, "allocations": int(r.allocations or 0),
               "reclaim": unused + 1e-9 >= th.idle_quota_min_gpus
               and unused + 1e-9 >= th.idle_quota_fraction * float(r.gpus)}
        table.append(row)
        if row["reclaim"]:
            ev = {"rule": f"{r.kind} {r.name}: quota {float(r.gpus):g} GPUs, {in_use:.1f} in use on average "
                          f"({held:.1f} held, {idle:.1f} idle): {unused:.1f} GPUs unused "
                          f"(>= {th.idle_quota_min_gpus:g} and >= {th.idle_quota_fraction:.0%} of the quota)",
                  "quota": row, "recipient": "operations"}
            findings.append({"run_id": run_id, "kind": "idle_quota", "cluster": r.cluster, "allocation_id": None,
                             "reservation_id": None, "account": r.name if r.kind == "account" else "",
                             "user_name": "", "team": team, "start_ts": p["since"], "end_ts": p["horizon"],
                             "gpu_hours": unused * span / H, "idle_gpu_hours": 0.0, "cost": 0.0, "evidence": ev})
    return findings, table
