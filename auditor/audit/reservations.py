"""Idle advance reservations: reserved nodes nobody ran on."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from typing import Any

from sqlalchemy import Connection, bindparam, text

from auditor.audit import infra, judging
from auditor.audit.episodes import _IDLE
from auditor.audit.evidence import _fn
from auditor.audit.money import UNMAPPED, Pricing
from auditor.config import Config, Thresholds
from auditor.store.sqlfuncs import sql_names
from auditor.timeutil import H

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


def resv_idle_sql(dialect: str, th: Thresholds, skip: str = "") -> str:
    """Idle (observed, :mod:`auditor.audit.verdict`) GPU-seconds of the jobs inside each reservation
    (``skip``: infrastructure-affected buckets left out, :mod:`auditor.audit.infra`)."""
    fn = sql_names(dialect)
    x = ("""SELECT r.id AS rid, u.allocated_gpu_id AS gid, u.gpu_id, ag.share, {G}(a.start_ts, r.start_ts, :since)
       AS a_s, {L}(COALESCE(a.end_ts, :horizon), r.end_ts, :horizon) AS a_e, tg.has_jobs AS lab, """
         + judging.JOB_KEY + " AS jkey "
         + _RESV_JOBS.replace("WHERE", """JOIN usage_gpu u ON u.allocation_id = a.id AND u.run_id = :run
       AND u.gpu_id IS NOT NULL JOIN allocated_gpus ag ON ag.id = u.allocated_gpu_id
       JOIN telemetry_gpus tg ON tg.id = u.gpu_id WHERE""")).format(**fn)
    rows = judging.rows_of(dialect, th, f"({x})", "x", ["rid", "gid", "share"], skip)
    return f"SELECT j.rid, SUM(j.share * j.obs) AS idle_s FROM {rows} WHERE {_IDLE} GROUP BY j.rid"


# GPU-seconds on a reservation's nodes, inside it, held by jobs that are not in it (running when an
# IGNORE_JOBS reservation took the nodes, or beside a partial reservation): not idle reserved capacity
RESV_OTHER_JOBS = """SELECT SUM(ag.share * ({L}(COALESCE(a.end_ts, :horizon), :r_e) - {G}(a.start_ts, :r_s))) AS s
FROM allocations a JOIN allocated_gpus ag ON ag.allocation_id = a.id
WHERE a.cluster = :cluster AND a.reservation <> :name AND ag.node IN :nodes AND a.start_ts IS NOT NULL
 AND a.start_ts < :r_e AND COALESCE(a.end_ts, :horizon) > :r_s"""


# team of the jobs inside each reservation, by GPU-hours (when its users and accounts map to no team)
RESV_JOB_TEAMS = """SELECT r.id AS rid, u.team, SUM(u.reserved_s) AS s
""" + _RESV_JOBS.replace("WHERE", "JOIN usage_allocation u ON u.allocation_id = a.id AND u.run_id = :run WHERE") + """
GROUP BY r.id, u.team"""


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
    sql = resv_idle_sql(conn.dialect.name, th or cfg.thresholds, infra.skip(conn))
    idle = {r.rid: r.idle_s or 0.0 for r in conn.execute(text(sql), p)}
    job_teams: dict[int, Counter] = defaultdict(Counter)
    for t in conn.execute(text(RESV_JOB_TEAMS.format(**fn)), p):
        job_teams[t.rid][t.team] += float(t.s or 0.0)
    models = _host_models(conn)
    host_gpus = _host_gpus(conn)
    pricing = Pricing(cfg)
    out = []
    for r in resv:
        reserved_s = r["gpu_count"] * max(0, r["r_e"] - r["r_s"])
        u = used.get(r["id"])
        used_s = float(u.used_s or 0.0) if u else 0.0
        nodes, users, accounts = _json_list(r["nodes"]), _json_list(r["users"]), _json_list(r["accounts"])
        other_s = _other_jobs_s(conn, fn, r, nodes, host_gpus, reserved_s, p["horizon"])
        unused_s = max(0.0, reserved_s - used_s - other_s)
        jobs_idle_s = idle.get(r["id"], 0.0)
        idle_h = (unused_s + jobs_idle_s) / H
        if reserved_s <= 0 or idle_h <= 0:
            continue
        model_counts = Counter(models.get((r["cluster"], n)) for n in nodes if models.get((r["cluster"], n)))
        model = model_counts.most_common(1)[0][0] if model_counts else None
        price = pricing.model_price(model)
        team = pricing.team_of_reservation(users, accounts)
        if team == UNMAPPED and job_teams.get(r["id"]):
            team = job_teams[r["id"]].most_common(1)[0][0] or UNMAPPED
        ev = {"rule": f"{unused_s / H:.1f} of {reserved_s / H:.1f} reserved GPU-hours used by no job, plus "
                      f"{jobs_idle_s / H:.1f} idle GPU-hours of jobs inside it",
              "reservation": r["name"], "reserved_gpu_hours": reserved_s / H, "used_gpu_hours": used_s / H,
              "other_jobs_gpu_hours": other_s / H,
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


def _host_gpus(conn: Connection) -> dict[tuple[str, str], int]:
    rows = conn.execute(text("SELECT cluster, host, COUNT(*) AS n FROM gpu_inventory GROUP BY cluster, host"))
    return {(r.cluster, r.host): int(r.n) for r in rows}


def _other_jobs_s(conn: Connection, fn: dict[str, str], r: dict[str, Any], nodes: list[str],
                  host_gpus: dict[tuple[str, str], int], reserved_s: float, horizon: int) -> float:
    """GPU-seconds that jobs outside the reservation held on its nodes inside it, beyond what the nodes'
    unreserved GPUs (a GPU-TRES reservation of part of a node) could hold."""
    if not nodes or r["r_e"] <= r["r_s"]:
        return 0.0
    stmt = text(RESV_OTHER_JOBS.format(**fn)).bindparams(bindparam("nodes", expanding=True))
    held = conn.execute(stmt, {"cluster": r["cluster"], "name": r["name"], "nodes": nodes, "r_s": r["r_s"],
                               "r_e": r["r_e"], "horizon": horizon}).scalar() or 0.0
    node_s = sum(host_gpus.get((r["cluster"], n), 0) for n in nodes) * (r["r_e"] - r["r_s"])
    return max(0.0, float(held) - max(0.0, node_s - reserved_s))


def _host_models(conn: Connection) -> dict[tuple[str, str], str]:
    rows = conn.execute(text("SELECT cluster, host, MIN(model) AS model FROM gpu_inventory "
                             "WHERE model IS NOT NULL GROUP BY cluster, host"))
    return {(r.cluster, r.host): r.model for r in rows}
