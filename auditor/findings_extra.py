"""Findings beyond the per-allocation totals: idle episodes, idle advance reservations, low efficiency with
a bottleneck hint, and the capacity context (GPUs neither allocated nor reserved).

Kept apart from :mod:`auditor.rules` so they can grow without touching the core rules. The time-resolved
ones (episodes, reservations) go back to ``gpu_buckets`` in set-based SQL, but only for the candidates the
per-allocation totals already point at (e.g. allocated GPUs with at least an episode's worth of idle time).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from typing import Any

from sqlalchemy import Connection, text

from auditor import judge, verdict
from auditor.config import Config, Thresholds
from auditor.money import Pricing
from auditor.timeutil import utcnow

H = 3600.0
CHUNK = 500

_IDLE = verdict.in_codes("j.v", verdict.IDLE_CODES)


def episodes_sql(dialect: str, th: Thresholds, ids: str) -> str:
    """Gaps and islands over the idle buckets (idle, idle-by-util or mirage, :mod:`auditor.verdict`) of the
    candidate GPUs: a new island starts where the previous idle bucket of the same GPU ended before this
    one began (a working or missing bucket in between). Seconds are observed seconds."""
    g, le = judge.fns(dialect)
    rows = judge.rows_of(dialect, th, "c", "cc", ["gid", "aid", "gpu_index", "share"])
    return f"""WITH c AS (
  SELECT u.allocated_gpu_id AS gid, u.allocation_id AS aid, u.gpu_id, u.gpu_index, ag.share,
   {g}(a.start_ts, :since) AS a_s, {le}(COALESCE(a.end_ts, :horizon), :horizon) AS a_e, {judge.JOB_KEY} AS jkey,
   tg.has_jobs AS lab
  FROM usage_gpu u JOIN allocated_gpus ag ON ag.id = u.allocated_gpu_id JOIN telemetry_gpus tg ON tg.id = u.gpu_id
  JOIN allocations a ON a.id = u.allocation_id
  WHERE u.run_id = :run AND u.gpu_id IS NOT NULL AND u.allocation_id IN ({ids})
   AND u.idle_s + u.mirage_s >= ag.share * :episode_s
   AND u.idle_s + u.mirage_s < :gpu_frac * u.observed_s),
 i AS (
  SELECT j.gid, j.aid, j.gpu_index, j.share, j.a_s, j.a_e, j.bucket_ts AS t0, j.bucket_ts + j.bucket_s AS t1,
   j.obs AS ov, CASE WHEN j.v = {verdict.MIRAGE} THEN 1 ELSE 0 END AS m
  FROM {rows} WHERE {_IDLE}),
 f AS (SELECT i.*, CASE WHEN LAG(i.t1) OVER (PARTITION BY i.gid ORDER BY i.t0) >= i.t0 THEN 0 ELSE 1 END
        AS brk FROM i),
 g AS (SELECT f.*, SUM(f.brk) OVER (PARTITION BY f.gid ORDER BY f.t0 ROWS UNBOUNDED PRECEDING) AS isl
       FROM f)
SELECT gid, aid, gpu_index, share, {g}(MIN(t0), MIN(a_s)) AS s, {le}(MAX(t1), MIN(a_e)) AS e,
 SUM(ov) AS ov, SUM(m * ov) AS mirage_ov
FROM g GROUP BY gid, aid, gpu_index, share, isl HAVING SUM(ov) >= :episode_s ORDER BY aid, s, gid"""


RESERVATIONS = """SELECT r.id, r.cluster, r.name, r.gpu_count, r.nodes, r.users, r.accounts, r.flags,
 r.start_ts, r.end_ts, {G}(r.start_ts, :since) AS r_s, {L}(r.end_ts, :horizon) AS r_e
FROM reservations r WHERE r.start_ts < :horizon AND r.end_ts > :since ORDER BY r.id"""

_RESV_JOBS = """FROM reservations r JOIN allocations a ON a.cluster = r.cluster AND a.reservation = r.name
 AND a.start_ts IS NOT NULL AND a.start_ts < {L}(r.end_ts, :horizon)
 AND COALESCE(a.end_ts, :horizon) > {G}(r.start_ts, :since)
WHERE r.start_ts < :horizon AND r.end_ts > :since"""

RESV_USED = """SELECT r.id AS rid, COUNT(*) AS jobs,
 SUM(a.gpu_count * ({L}(COALESCE(a.end_ts, :horizon), r.end_ts, :horizon)
                    - {G}(a.start_ts, r.start_ts, :since))) AS used_s
""" + _RESV_JOBS + " GROUP BY r.id"



def resv_idle_sql(dialect: str, th: Thresholds) -> str:
    """Idle (observed, :mod:`auditor.verdict`) GPU-seconds of the jobs inside each reservation."""
    fn = dict(zip(("G", "L"), judge.fns(dialect), strict=True))
    x = ("""SELECT r.id AS rid, u.allocated_gpu_id AS gid, u.gpu_id, ag.share, {G}(a.start_ts, r.start_ts, :since)
       AS a_s, {L}(COALESCE(a.end_ts, :horizon), r.end_ts, :horizon) AS a_e, tg.has_jobs AS lab, """
         + judge.JOB_KEY + " AS jkey "
         + _RESV_JOBS.replace("WHERE", """JOIN usage_gpu u ON u.allocation_id = a.id AND u.run_id = :run
       AND u.gpu_id IS NOT NULL JOIN allocated_gpus ag ON ag.id = u.allocated_gpu_id
       JOIN telemetry_gpus tg ON tg.id = u.gpu_id WHERE""")).format(**fn)
    rows = judge.rows_of(dialect, th, f"({x})", "x", ["rid", "gid", "share"])
    return f"SELECT j.rid, SUM(j.share * j.obs) AS idle_s FROM {rows} WHERE {_IDLE} GROUP BY j.rid"


def _fn(conn: Connection) -> dict[str, str]:
    pg = conn.dialect.name == "postgresql"
    return {"G": "GREATEST" if pg else "max", "L": "LEAST" if pg else "min"}


def whole_idle(r: dict[str, Any], th: Thresholds) -> bool:
    """True when :func:`auditor.rules.classify` already reports the whole allocation (unmonitored, or
    idle/mirage for most of its observed time): an episode or low efficiency would say it twice."""
    from auditor.rules import whole_allocation_finding

    return r["reserved_s"] <= 0 or whole_allocation_finding(r, th) is not None


def extra_findings(conn: Connection, run_id: int, per_alloc: list[dict[str, Any]],
                   per_gpu: dict[int, list[dict[str, Any]]], th: Thresholds, cfg: Config, *,
                   since: int, until: int, horizon: int, flagged: frozenset[int] = frozenset(),
                   clusters: list[str] | None = None) -> list[dict[str, Any]]:
    """idle_episode, low_efficiency and idle_reservation findings of one run (finding-table rows).
    ``flagged``: allocations a core rule already reported (idle GPUs explain a low mean: no low_efficiency)."""
    p = {"since": since, "until": until, "horizon": horizon, "run": run_id}
    working = [r for r in per_alloc if not whole_idle(r, th)]
    out = idle_episodes(conn, run_id, working, th, p)
    out += low_efficiency(run_id, [r for r in working if r["allocation_id"] not in flagged], th, since, horizon)
    out += idle_reservations(conn, run_id, cfg, p, clusters, th)
    return out


def idle_episodes(conn: Connection, run_id: int, working: list[dict[str, Any]], th: Thresholds,
                  p: dict[str, Any]) -> list[dict[str, Any]]:
    """Contiguous idle spans >= episode_hours on a GPU of an allocation that otherwise worked. A GPU idle
    for idle_gpus_fraction of its judged time is no episode (idle_gpus / idle_allocation report it).
    Overlapping spans on several GPUs of one allocation merge into one episode (GPU-hours summed)."""
    from auditor.rules import _finding

    ep_s = th.episode_hours * H
    cands = {r["allocation_id"]: r for r in working
             if r["low_s"] + r["working_s"] + r["busy_unverified_s"] > 0 and r["idle_s"] + r["mirage_s"] > 0}
    spans: dict[int, list[Any]] = defaultdict(list)
    ids = sorted(cands)
    for i in range(0, len(ids), CHUNK):
        sql = episodes_sql(conn.dialect.name, th, ", ".join(str(int(x)) for x in ids[i:i + CHUNK]))
        for s in conn.execute(text(sql), {**p, "episode_s": ep_s, "gpu_frac": th.idle_gpus_fraction}):
            spans[s.aid].append(s)
    out = []
    for aid, rows in spans.items():
        r = cands[aid]
        for group in _merge(sorted(rows, key=lambda s: (s.s, s.e))):
            start, end = int(min(s.s for s in group)), int(max(s.e for s in group))
            idle_h = sum(float(s.share) * float(s.ov) for s in group) / H
            mirage_h = sum(float(s.share) * float(s.mirage_ov or 0) for s in group) / H
            gpus = sorted({s.gpu_index for s in group if s.gpu_index is not None})
            ev = {"rule": f"idle for {(end - start) / H:.1f} h in a row >= {th.episode_hours:g} h "
                          f"inside an allocation that otherwise worked",
                  "episode_hours": (end - start) / H, "episode_gpu_hours": idle_h,
                  "episode_mirage_gpu_hours": mirage_h, "episode_gpu_indices": gpus,
                  "episode_gpus": len({s.gid for s in group}),
                  "ongoing": r["end_ts"] is None and end >= p["horizon"]}
            f = _finding(run_id, "idle_episode", r, ev, idle_h, p["since"], p["horizon"])
            f.update(start_ts=int(start), end_ts=int(end), gpu_hours=idle_h)
            out.append(f)
    return out


def _merge(rows: list[Any]) -> list[list[Any]]:
    """Group time-sorted spans whose intervals overlap or touch."""
    groups: list[list[Any]] = []
    end = None
    for s in rows:
        if groups and end is not None and s.s <= end:
            groups[-1].append(s)
            end = max(end, s.e)
        else:
            groups.append([s])
            end = s.e
    return groups


def bottleneck(r: dict[str, Any], th: Thresholds | None = None) -> tuple[str, str]:
    """(hint, why) for a low-efficiency allocation, from the means of the other signals."""
    sm_obs = r["sm_observed_s"]
    sm = r["sm_s"] / sm_obs if sm_obs > 0 else 0.0
    dram = r["dram_s"] / sm_obs if sm_obs > 0 else 0.0
    tensor = r["tensor_s"] / sm_obs if sm_obs > 0 else 0.0
    io = r["io_bps_s"] / r["observed_s"] if r["observed_s"] > 0 else 0.0
    util = r["gpu_util_s"] / r["util_observed_s"] if r["util_observed_s"] > 0 else None
    fb = r.get("peak_fb_mib") or 0.0
    th = th or Thresholds()
    pulse = (th.hint_util_pulse_low, th.hint_util_pulse_high)
    if dram >= th.hint_dram_high:
        return "memory-bound", f"DRAM activity {dram:.0%} while SM activity is {sm:.0%}"
    if sm > 0 and tensor >= th.hint_tensor_share * sm and tensor > 0:
        return "compute-bound (tensor)", (f"Tensor activity {tensor:.0%} is most of SM activity {sm:.0%}: "
                                          "small kernels or batches on a big GPU")
    if io >= th.hint_io_bps and dram < th.hint_dram_low:
        return "input/communication wait", (f"PCIe/NVLink {io / 1e9:.1f} GB/s while SM {sm:.0%} and DRAM "
                                            f"{dram:.0%} are low")
    if util is not None and pulse[0] <= util < pulse[1] and dram < th.hint_dram_low:
        return "input wait", (f"all low, GPU-Util pulsing at {util:.0%} duty cycle: the GPU waits for "
                              "input (data loader, host) between bursts")
    if fb >= th.hint_held_mib and (util is None or util < pulse[0]):
        return "memory held, no compute", f"{fb:.0f} MiB held with GPU-Util {util or 0:.0%}"
    return "undetermined", f"SM {sm:.0%}, DRAM {dram:.0%}, Tensor {tensor:.0%}: no signal stands out"


def low_efficiency(run_id: int, working: list[dict[str, Any]], th: Thresholds, since: int,
                   horizon: int) -> list[dict[str, Any]]:
    """Mean SM activity < low_efficiency_sm over >= low_efficiency_min_gpu_hours observed GPU-hours."""
    from auditor.rules import _finding

    out = []
    for r in working:
        obs_h = r["sm_observed_s"] / H
        if obs_h <= 0 or obs_h < th.low_efficiency_min_gpu_hours:
            continue
        mean_sm = r["sm_s"] / r["sm_observed_s"]
        if mean_sm >= th.low_efficiency_sm:
            continue
        hint, why = bottleneck(r, th)
        ev = {"rule": f"mean SM activity {mean_sm:.0%} < {th.low_efficiency_sm:.0%} over {obs_h:.1f} "
                      f"observed GPU-hours", "hint": hint, "hint_reason": why,
              "unused_sm_gpu_hours": (r["sm_observed_s"] - r["sm_s"]) / H,
              "mean_io_bytes_per_s": r["io_bps_s"] / r["observed_s"] if r["observed_s"] > 0 else None}
        out.append(_finding(run_id, "low_efficiency", r, ev, (r["idle_s"] + r["mirage_s"]) / H, since,
                            horizon))
    return out


def _json_list(v: Any) -> list[str]:
    if isinstance(v, str):
        v = json.loads(v)
    return [str(x) for x in (v or [])]


def idle_reservations(conn: Connection, run_id: int, cfg: Config, p: dict[str, Any],
                      clusters: list[str] | None = None, th: Thresholds | None = None) -> list[dict[str, Any]]:
    """Per advance reservation overlapping the window: reserved GPU-hours no job used, plus the idle
    GPU-hours of the jobs that ran inside it (sreport counts those as "allocated")."""
    fn = _fn(conn)
    resv = [dict(r._mapping) for r in conn.execute(text(RESERVATIONS.format(**fn)), p)
            if not clusters or r.cluster in clusters]
    if not resv:
        return []
    used = {r.rid: r for r in conn.execute(text(RESV_USED.format(**fn)), p)}
    sql = resv_idle_sql(conn.dialect.name, th or cfg.thresholds)
    idle = {r.rid: r.idle_s or 0.0 for r in conn.execute(text(sql), p)}
    models = _host_models(conn)
    pricing = Pricing(cfg)
    out = []
    for r in resv:
        reserved_s = r["gpu_count"] * max(0, r["r_e"] - r["r_s"])
        u = used.get(r["id"])
        used_s = float(u.used_s or 0.0) if u else 0.0
        unused_s = max(0.0, reserved_s - used_s)
        jobs_idle_s = idle.get(r["id"], 0.0)
        idle_h = (unused_s + jobs_idle_s) / H
        if reserved_s <= 0 or idle_h <= 0:
            continue
        nodes, users, accounts = _json_list(r["nodes"]), _json_list(r["users"]), _json_list(r["accounts"])
        model_counts = Counter(models.get((r["cluster"], n)) for n in nodes if models.get((r["cluster"], n)))
        model = model_counts.most_common(1)[0][0] if model_counts else None
        price = pricing.model_price(model)
        team = pricing.team_of({"account": accounts[0] if accounts else "", "source": "slurm",
                                "user_name": users[0] if users else "", "labels": None})
        ev = {"rule": f"{unused_s / H:.1f} of {reserved_s / H:.1f} reserved GPU-hours used by no job, plus "
                      f"{jobs_idle_s / H:.1f} idle GPU-hours of jobs inside it",
              "reservation": r["name"], "reserved_gpu_hours": reserved_s / H, "used_gpu_hours": used_s / H,
              "unused_gpu_hours": unused_s / H, "jobs_idle_gpu_hours": jobs_idle_s / H,
              "jobs": int(u.jobs) if u else 0, "gpu_count": r["gpu_count"], "nodes": nodes, "users": users,
              "accounts": accounts, "flags": _json_list(r["flags"]), "gpu_model": model,
              "price_per_gpu_hour": price}
        out.append({"run_id": run_id, "kind": "idle_reservation", "cluster": r["cluster"],
                    "allocation_id": None, "reservation_id": r["id"], "account": ",".join(accounts)[:255],
                    "user_name": ",".join(users)[:255], "team": team, "start_ts": int(r["r_s"]),
                    "end_ts": int(r["r_e"]), "gpu_hours": reserved_s / H, "idle_gpu_hours": idle_h,
                    "cost": idle_h * price, "evidence": ev})
    return out


def _host_models(conn: Connection) -> dict[tuple[str, str], str]:
    rows = conn.execute(text("SELECT cluster, host, MIN(model) AS model FROM gpu_inventory "
                             "WHERE model IS NOT NULL GROUP BY cluster, host"))
    return {(r.cluster, r.host): r.model for r in rows}


CAP_ALLOC = """SELECT a.cluster, ag.node AS host, SUM(ag.share * ({L}(COALESCE(a.end_ts, :horizon), :horizon)
  - {G}(a.start_ts, :since))) AS alloc_s
FROM allocations a JOIN allocated_gpus ag ON ag.allocation_id = a.id
WHERE a.start_ts IS NOT NULL AND a.start_ts < :horizon AND COALESCE(a.end_ts, :horizon) > :since
GROUP BY a.cluster, ag.node"""


def capacity(conn: Connection, since: int, until: int, *, horizon: int | None = None) -> list[dict[str, Any]]:
    """Per cluster and GPU model: inventory GPUs and GPU-hours in [since, min(until, now)), the share that
    allocations held, the reserved GPU-hours no job used, and what is left: neither allocated nor reserved.
    Inventory GPUs are taken to exist for the whole window; reservations spread evenly over their nodes.
    ``horizon`` (default now) is where a window reaching into the future stops, as in the audit."""
    horizon = min(until, horizon if horizon is not None else int(utcnow().timestamp()))
    span = max(0, horizon - since)
    p = {"since": since, "until": until, "horizon": horizon}
    fn = _fn(conn)
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
        total_s = n_host * span
        held = min(total_s, per_host.get((cluster, host), 0.0))
        resv = min(total_s - held, resv_host.get((cluster, host), 0.0))
        for model, n in models.items():
            k = out.setdefault((cluster, model), {"gpus": 0, "gpu_s": 0.0, "alloc_s": 0.0, "resv_s": 0.0})
            frac = n / n_host
            k["gpus"] += n
            k["gpu_s"] += n * span
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
