"""Capacity context: GPUs neither allocated nor reserved, per node and model, counted from when a
node was first seen."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from sqlalchemy import Connection, text

from auditor.audit.evidence import _fn
from auditor.audit.reservations import RESERVATIONS, RESV_USED, _json_list
from auditor.timeutil import H, utcnow

CAP_ALLOC = """SELECT a.cluster, ag.node AS host, SUM(ag.share * ({L}(COALESCE(a.end_ts, :horizon), :horizon)
  - {G}(a.start_ts, :since))) AS alloc_s
FROM allocations a JOIN allocated_gpus ag ON ag.allocation_id = a.id
WHERE a.start_ts IS NOT NULL AND a.start_ts < :horizon AND COALESCE(a.end_ts, :horizon) > :since
GROUP BY a.cluster, ag.node"""


# When each node was first seen: its inventory rows, its first telemetry bucket (per GPU through the
# primary key, not a scan), the first allocation that held a GPU there
NODE_FIRST_SEEN = """SELECT cluster, host, MIN(t) AS first_ts FROM (
  SELECT cluster, host, first_seen_ts AS t FROM gpu_inventory
  UNION ALL SELECT tg.cluster, tg.host, (SELECT MIN(b.bucket_ts) FROM gpu_buckets b WHERE b.gpu_id = tg.id)
   FROM telemetry_gpus tg
  UNION ALL SELECT a.cluster, ag.node, a.start_ts FROM allocations a
   JOIN allocated_gpus ag ON ag.allocation_id = a.id WHERE a.start_ts IS NOT NULL AND a.start_ts < :horizon
) x WHERE t IS NOT NULL GROUP BY cluster, host"""


def capacity(conn: Connection, since: int, until: int, *, horizon: int | None = None) -> list[dict[str, Any]]:
    """Per cluster and GPU model: inventory GPUs and GPU-hours in [since, min(until, now)), the share that
    allocations held, the reserved GPU-hours no job used, and what is left: neither allocated nor reserved.
    A node's GPUs count from when the node was first seen (inventory, telemetry or an allocation on it, the
    earliest), not for the whole window: a node added on day 20 adds no free GPU-hours to days 1-19.
    Reservations spread evenly over their nodes. ``horizon`` (default now) is where a window reaching into
    the future stops, as in the audit."""
    horizon = min(until, horizon if horizon is not None else int(utcnow().timestamp()))
    span = max(0, horizon - since)
    p = {"since": since, "until": until, "horizon": horizon}
    fn = _fn(conn)
    first = {(r.cluster, r.host): int(r.first_ts) for r in conn.execute(text(NODE_FIRST_SEEN), p)}
    inv: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for r in conn.execute(text("SELECT cluster, host, COALESCE(model, '') AS model, COUNT(*) AS n "
                               "FROM gpu_inventory GROUP BY cluster, host, COALESCE(model, '')")):
        inv[(r.cluster, r.host)][r.model] += int(r.n)
    per_host = {(r.cluster, r.host): float(r.alloc_s or 0) for r in conn.execute(text(CAP_ALLOC.format(**fn)), p)}
    resv_host: dict[tuple[str, str], float] = defaultdict(float)
    used = {r.rid: float(r.used_s or 0) for r in conn.execute(text(RESV_USED.format(**fn)), p)}
    for r in conn.execute(text(RESERVATIONS.format(**fn)), p):
        nodes = _json_list(r.nodes)
        unused = max(0.0, r.gpu_count * max(0, r.r_e - r.r_s) - used.get(r.id, 0.0))
        for n in nodes:
            resv_host[(r.cluster, n)] += unused / len(nodes)
    out: dict[tuple[str, str], dict[str, float]] = {}
    for (cluster, host), models in inv.items():
        n_host = sum(models.values())
        seen_s = max(0, horizon - max(since, first.get((cluster, host), since)))
        total_s = n_host * seen_s
        held = min(total_s, per_host.get((cluster, host), 0.0))
        resv = min(total_s - held, resv_host.get((cluster, host), 0.0))
        for model, n in models.items():
            k = out.setdefault((cluster, model), {"gpus": 0, "gpu_s": 0.0, "alloc_s": 0.0, "resv_s": 0.0})
            frac = n / n_host
            k["gpus"] += n
            k["gpu_s"] += n * seen_s
            k["alloc_s"] += held * frac
            k["resv_s"] += resv * frac
    rows = []
    for (cluster, model), k in sorted(out.items()):
        free_s = max(0.0, k["gpu_s"] - k["alloc_s"] - k["resv_s"])
        rows.append({"cluster": cluster, "model": model or None, "gpus": int(k["gpus"]),
                     "gpu_hours": k["gpu_s"] / H, "allocated_gpu_hours": k["alloc_s"] / H,
                     "reserved_unused_gpu_hours": k["resv_s"] / H, "free_gpu_hours": free_s / H,
                     "mean_free_gpus": free_s / span if span else 0.0})
    return rows
