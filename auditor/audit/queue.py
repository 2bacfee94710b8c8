"""Opportunity cost (docs/definitions.md "Opportunity cost"): idle GPUs while GPU jobs waited in the same
queue, and GPU quotas held but not used.

* ``idle_while_queued``: the idle seconds (idle, idle-by-util, mirage: :mod:`auditor.audit.verdict`) of an
  allocation's GPUs while at least one GPU job of the same cluster and partition waited (``gpu_waits``;
  Kubernetes pods wait in partition "", the cluster): a bucket's idle seconds count in the share of the
  bucket (clipped to the allocation) that the union of the waits covers. Unknown time is never idle, so it
  never counts.
* ``idle_quota``: per quota (Slurm QOS or account GrpTRES gres/gpu; a Kubernetes queue's GPU quota, matched on
  the allocations' partition, where the connector puts the pod's queue), GPUs held on average by its allocations
  versus GPUs in use (held minus idle; unknown counts as in use): quota - in use is the reclaim candidate.

How it stays set-based at fleet scale: the union of the waits of each queue is cut into cells of
:data:`CELL` seconds (``_queue_u``), so an idle bucket meets the one or two union pieces of its own cells (an
index lookup), never every wait of its partition; the waits behind the counted idle time are found from the
allocation's islands of counted buckets, not bucket by bucket.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from sqlalchemy import Connection, text

from auditor.audit import judging, verdict
from auditor.audit.evidence import _finding
from auditor.audit.verdict import EPS
from auditor.config import Config, Thresholds
from auditor.store.sqlfuncs import greatest_least
from auditor.timeutil import H

# The queue rules' constants (docs/definitions.md; `[thresholds]` settings until issue 45): sizes below which a
# finding would be noise on any site, not a site's policy.
#: idle_while_queued: minimum idle GPU-hours of an allocation while GPU jobs of its partition waited
QUEUE_MIN_IDLE_GPU_HOURS = 1.0
#: idle_quota: minimum unused GPUs of a quota (quota - average GPUs in use): less than one GPU frees no job...
IDLE_QUOTA_MIN_GPUS = 1.0
#: ...and minimum unused share of the quota (half of it: a quota mostly unused, not a busy one's slack)
IDLE_QUOTA_FRACTION = 0.5

CELL = 300
_IDLE = verdict.in_codes("j.v", verdict.IDLE_CODES)

#: waits overlapping the window, clipped to it; an open wait ends at its last sighting
WAITS = """SELECT w.id AS wid, w.cluster, w.partition, w.gpus, {G}(w.eligible_ts, :since) AS w_s,
 {L}(COALESCE(w.end_ts, w.last_seen_ts), :horizon) AS w_e
FROM gpu_waits w WHERE w.gpus > 0 AND w.eligible_ts < :horizon AND COALESCE(w.end_ts, w.last_seen_ts) > :since
 AND COALESCE(w.end_ts, w.last_seen_ts) > w.eligible_ts"""

_TEMP = ("_queue_p", "_queue_x", "_queue_i", "_queue_u", "_queue_w")
_UNION_DDL = "CREATE TEMPORARY TABLE _queue_u (cluster TEXT, part TEXT, cell BIGINT, p_s BIGINT, p_e BIGINT)"


def union_cells(waits: Iterable[Any]) -> Iterator[dict[str, Any]]:
    """The union of the waits of each (cluster, partition), cut into :data:`CELL`-second cells: one row per
    (cell, piece). ``waits`` sorted by cluster, partition, start; only the current union piece is held."""
    def cut(key: tuple[str, str], a: int, b: int) -> Iterator[dict[str, Any]]:
        cell = a - a % CELL
        while cell < b:
            yield {"cluster": key[0], "part": key[1], "cell": cell, "p_s": max(a, cell), "p_e": min(b, cell + CELL)}
            cell += CELL

    cur: tuple[tuple[str, str], int, int] | None = None
    for w in waits:
        key, a, b = (w.cluster, w.partition), int(w.w_s), int(w.w_e)
        if cur is not None and cur[0] == key and a <= cur[2]:
            cur = (key, cur[1], max(cur[2], b))
            continue
        if cur is not None:
            yield from cut(*cur)
        cur = (key, a, b)
    if cur is not None:
        yield from cut(*cur)


def overlap_sql(dialect: str, th: Thresholds) -> str:
    """One row per (idle bucket of an allocated GPU, piece of its queue's wait union in the bucket's cells):
    the allocation, the bucket clipped to the allocation [t0, t1), its idle observed seconds x share, and the
    seconds of [t0, t1) the piece covers (pieces are disjoint: their sum is the union's cover)."""
    g, le = greatest_least(dialect)
    rows = judging.rows_of(dialect, th, "c", "cc", ["aid", "gid", "share", "cluster", "part"])
    return f"""WITH c AS (
  SELECT u.allocated_gpu_id AS gid, u.allocation_id AS aid, u.gpu_id, ag.share, a.cluster, a.partition AS part,
   {g}(a.start_ts, :since) AS a_s, {le}(COALESCE(a.end_ts, :horizon), :horizon) AS a_e, {judging.JOB_KEY} AS jkey,
   tg.has_jobs AS lab
  FROM usage_gpu u JOIN allocated_gpus ag ON ag.id = u.allocated_gpu_id JOIN telemetry_gpus tg ON tg.id = u.gpu_id
  JOIN allocations a ON a.id = u.allocation_id
  WHERE u.run_id = :run AND u.gpu_id IS NOT NULL AND u.idle_s + u.mirage_s > 0
   AND EXISTS (SELECT 1 FROM _queue_w w WHERE w.cluster = a.cluster AND w.partition = a.partition
               AND w.w_s < {le}(COALESCE(a.end_ts, :horizon), :horizon) AND w.w_e > {g}(a.start_ts, :since))),
 i AS (SELECT j.aid, j.gid, j.share, j.cluster, j.part, j.bucket_ts AS b, j.bucket_s AS bs,
        {g}(j.bucket_ts, j.a_s) AS t0, {le}(j.bucket_ts + j.bucket_s, j.a_e) AS t1, j.obs
       FROM {rows} WHERE {_IDLE} AND j.obs > 0)
SELECT i.aid, i.gid, i.cluster, i.part, i.t0, i.t1, i.share * i.obs AS idle_s,
 {le}(u.p_e, i.t1) - {g}(u.p_s, i.t0) AS cover_s
FROM i JOIN _queue_u u ON u.cluster = i.cluster AND u.part = i.part AND u.cell > i.b - {CELL}
 AND u.cell < i.b + i.bs AND u.p_s < i.t1 AND u.p_e > i.t0"""


#: per allocation: idle seconds while waited (each idle bucket once, times the union's cover share)
_IDLE_Q = """SELECT aid, part, SUM(idle_s * frac) AS s FROM (
  SELECT aid, gid, t0, part, MAX(idle_s) AS idle_s,
   CASE WHEN SUM(cover_s) >= t1 - t0 THEN 1.0 ELSE SUM(cover_s) * 1.0 / (t1 - t0) END AS frac
  FROM _queue_x GROUP BY aid, gid, t0, t1, part) b GROUP BY aid, part"""

#: per allocation, its counted idle time as islands [s, e) (buckets of all its GPUs, overlapping or touching)
_ISLANDS = """CREATE TEMPORARY TABLE _queue_i AS SELECT aid, cluster, part, MIN(t0) AS s, MAX(t1) AS e FROM (
  SELECT f.*, SUM(brk) OVER (PARTITION BY aid ORDER BY t0, t1 ROWS UNBOUNDED PRECEDING) AS isl FROM (
    SELECT d.*, CASE WHEN MAX(t1) OVER (PARTITION BY aid ORDER BY t0, t1 ROWS BETWEEN UNBOUNDED PRECEDING
     AND 1 PRECEDING) >= t0 THEN 0 ELSE 1 END AS brk
    FROM (SELECT DISTINCT aid, cluster, part, t0, t1 FROM _queue_x) d) f) g GROUP BY aid, cluster, part, isl"""

#: the distinct (allocation, wait) pairs behind the counted idle time: a wait overlapping one of its islands
_PAIRS = """CREATE TEMPORARY TABLE _queue_p AS SELECT DISTINCT q.aid, w.wid FROM _queue_i q
JOIN _queue_w w ON w.cluster = q.cluster AND w.partition = q.part AND w.w_s < q.e AND w.w_e > q.s"""

#: per group: N distinct waits and M, their GPU-seconds waited in the window
_WAITED = """SELECT {keys}, COUNT(*) AS n, SUM(w.gpus * (w.w_e - w.w_s)) AS m_s FROM (
  SELECT DISTINCT {inner}, p.wid FROM _queue_p p JOIN allocations a ON a.id = p.aid
  JOIN usage_allocation u ON u.run_id = :run AND u.allocation_id = p.aid) d
JOIN _queue_w w ON w.wid = d.wid GROUP BY {keys}"""
_GROUPS = {"aid": ("d.aid", "p.aid AS aid"), "cluster": ("d.cluster", "a.cluster AS cluster"),
           "team": ("d.cluster, d.team", "a.cluster AS cluster, u.team AS team")}


def _drop(conn: Connection) -> None:
    for t in _TEMP:
        conn.execute(text(f"DROP TABLE IF EXISTS {t}"))


def idle_while_queued(conn: Connection, run_id: int, rows_of: Callable[[Iterable[int]], dict[int, dict[str, Any]]],
                      th: Thresholds, p: dict[str, Any], clusters: list[str] | None = None
                      ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(findings, summary): per allocation, idle GPU-hours while jobs waited; per team and cluster, "idle
    GPU-hours while N jobs waited for M GPU-hours". Pairs stay in temporary tables: only per-allocation and
    per-group sums reach Python, and the per-allocation rows (``rows_of``:
    :meth:`auditor.audit.totals.AllocationRows.get`) of the allocations idle while jobs waited."""
    g, le = greatest_least(conn.dialect.name)
    _drop(conn)
    conn.execute(text("CREATE TEMPORARY TABLE _queue_w AS " + WAITS.format(G=g, L=le)), p)
    if clusters:
        names = {f"qc{i}": c for i, c in enumerate(clusters)}
        conn.execute(text(f"DELETE FROM _queue_w WHERE cluster NOT IN ({', '.join(':' + k for k in names)})"), names)
    conn.execute(text("CREATE INDEX ix_queue_w ON _queue_w (cluster, partition, w_s)"))
    total = conn.execute(text("SELECT COUNT(*) AS n, SUM(gpus * (w_e - w_s)) AS m_s FROM _queue_w")).one()
    summary: dict[str, Any] = {"by_cluster": [], "by_team": [], "waiting_jobs": int(total.n or 0),
                               "waiting_gpu_hours": float(total.m_s or 0) / H}
    idle: dict[int, tuple[float, str]] = {}
    waited: dict[str, dict[tuple, tuple[int, float]]] = {k: {} for k in _GROUPS}
    if total.n:
        conn.execute(text(_UNION_DDL))
        ordered = conn.execute(text("SELECT cluster, partition, w_s, w_e FROM _queue_w "
                                    "ORDER BY cluster, partition, w_s"))
        batch: list[dict[str, Any]] = []
        for row in union_cells(ordered.fetchall()):
            batch.append(row)
            if len(batch) >= 5000:
                conn.execute(text("INSERT INTO _queue_u VALUES (:cluster, :part, :cell, :p_s, :p_e)"), batch)
                batch = []
        if batch:
            conn.execute(text("INSERT INTO _queue_u VALUES (:cluster, :part, :cell, :p_s, :p_e)"), batch)
        conn.execute(text("CREATE INDEX ix_queue_u ON _queue_u (cluster, part, cell)"))
        conn.execute(text("CREATE TEMPORARY TABLE _queue_x AS " + overlap_sql(conn.dialect.name, th)), p)
        idle = {int(r.aid): (float(r.s or 0), r.part) for r in conn.execute(text(_IDLE_Q))}
        conn.execute(text(_ISLANDS))
        conn.execute(text(_PAIRS))
        for group, (keys, inner) in _GROUPS.items():
            sql = _WAITED.format(keys=keys, inner=inner)
            waited[group] = {tuple(r[:-2]): (int(r.n), float(r.m_s or 0) / H) for r in conn.execute(text(sql), p)}
    _drop(conn)
    by_id = rows_of(idle)
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
        if h + EPS < QUEUE_MIN_IDLE_GPU_HOURS:
            continue
        n, m = waited["aid"].get((aid,), (0, 0.0))
        ev = {"rule": f"{h:.1f} idle GPU-hours while {n} GPU job(s) waited for {m:.1f} GPU-hours in partition "
                      f"{part or '(cluster)'} (>= {QUEUE_MIN_IDLE_GPU_HOURS:g} h)",
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


QUOTA_USE = """SELECT q.cluster, q.kind, q.name, q.gpus, q.reserved_gpus, SUM(x.reserved_s) AS held_s,
 SUM(x.idle_s + x.mirage_s) AS idle_s, SUM(x.unknown_s) AS unknown_s, COUNT(x.cluster) AS allocations
FROM gpu_quotas q LEFT JOIN (
  SELECT a.cluster, a.qos, a.account, a.partition, u.reserved_s, u.idle_s, u.mirage_s, u.unknown_s
  FROM usage_allocation u JOIN allocations a ON a.id = u.allocation_id WHERE u.run_id = :run) x
 ON x.cluster = q.cluster AND ((q.kind = 'qos' AND x.qos = q.name) OR (q.kind = 'account' AND x.account = q.name)
  OR (q.kind = 'queue' AND x.partition = q.name))
WHERE q.last_seen_ts >= :since
GROUP BY q.cluster, q.kind, q.name, q.gpus, q.reserved_gpus ORDER BY q.cluster, q.kind, q.name"""


def idle_quota(conn: Connection, run_id: int, th: Thresholds, cfg: Config, p: dict[str, Any],
               team_of: Any, clusters: list[str] | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(findings, table): per GPU quota seen in the window, the average GPUs held, idle and in use over
    [since, horizon); a quota whose unused part (quota - in use) is at least ``idle_quota_min_gpus`` and
    ``idle_quota_fraction`` of the quota is a reclaim candidate. Where the queueing system says what it reserved
    for admitted workloads (Kueue ``flavorsUsage``, latest sighting), the reserved part not in use is shown
    beside it: quota others cannot have (borrowed from the cohort included) that does no work."""
    span = max(1, p["horizon"] - p["since"])
    table, findings = [], []
    for r in conn.execute(text(QUOTA_USE), p):
        if clusters and r.cluster not in clusters:
            continue
        held, idle = float(r.held_s or 0) / span, float(r.idle_s or 0) / span
        in_use = max(0.0, held - idle)  # unknown time counts as in use: never reclaimed on no evidence
        unused = max(0.0, float(r.gpus) - in_use)
        reserved = None if r.reserved_gpus is None else float(r.reserved_gpus)
        reserved_unused = None if reserved is None else max(0.0, reserved - in_use)
        team = team_of({"account": r.name, "source": "slurm"}) if r.kind == "account" else ""
        row = {"cluster": r.cluster, "kind": r.kind, "name": r.name, "team": team, "quota_gpus": float(r.gpus),
               "held_gpus": held, "idle_gpus": idle, "in_use_gpus": in_use,
               "unknown_gpus": float(r.unknown_s or 0) / span,
               "unused_gpus": unused, "reserved_gpus": reserved, "reserved_unused_gpus": reserved_unused,
               "allocations": int(r.allocations or 0),
               "reclaim": unused + EPS >= IDLE_QUOTA_MIN_GPUS
               and unused + EPS >= IDLE_QUOTA_FRACTION * float(r.gpus)}
        table.append(row)
        if row["reclaim"]:
            ev = {"rule": f"{r.kind} {r.name}: quota {float(r.gpus):g} GPUs, {in_use:.1f} in use on average "
                          f"({held:.1f} held, {idle:.1f} idle): {unused:.1f} GPUs unused "
                          f"(>= {IDLE_QUOTA_MIN_GPUS:g} and >= {IDLE_QUOTA_FRACTION:.0%} of the quota)"
                          + ("" if reserved is None else f"; {reserved:g} reserved for admitted workloads when last "
                             f"seen, {reserved_unused:.1f} of them reserved but unused"),
                  "quota": row, "recipient": "operations"}
            findings.append({"run_id": run_id, "kind": "idle_quota", "cluster": r.cluster, "allocation_id": None,
                             "reservation_id": None, "account": r.name if r.kind == "account" else "",
                             "user_name": "", "team": team, "start_ts": p["since"], "end_ts": p["horizon"],
                             "gpu_hours": unused * span / H, "idle_gpu_hours": 0.0, "cost": 0.0, "evidence": ev})
    return findings, table
