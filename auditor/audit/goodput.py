"""Training goodput: the reserved GPU-hours thrown away by failures and restarts, and who caused them.

A run of a job that ended in a failure state (Slurm FAILED, OUT_OF_MEMORY, TIMEOUT, NODE_FAIL, BOOT_FAIL,
PREEMPTED, REQUEUED; a Kubernetes pod in phase Failed) produced no result the job kept: its reserved
GPU-hours in the window are *lost*. Each lost run has one cause:

- ``infrastructure``: NODE_FAIL or BOOT_FAIL, or any failure state while one of the job's nodes had a node
  event of a kind in ``thresholds.goodput_infra_events`` (an XID, an ECC error, the node down) during the run;
- ``user``: FAILED, OUT_OF_MEMORY, TIMEOUT (the job's own exit, memory or time limit), no node event;
- ``preempted``: PREEMPTED or REQUEUED (preempted or requeued by the scheduler or an operator), no node event.

Slurm resets a job's submit time when it requeues it, so every run of a requeued job is its own stored
instance of the same job id (``allocations.instance_ts``): the restarts of a job are its instances in the
window minus one, or Slurm's own count (``allocations.restarts``) where that is more. The useful-time
share (reserved minus lost, over reserved) is the figure Meta reports for the Llama 3 run (more than 90 % of
the time doing useful training). Computed once here, from the run's
``usage_allocation`` rows: the report section, the ``failed_restarts`` findings and the chargeback column
``lost_gpu_hours`` all read :func:`lost_runs`. Rules: docs/definitions.md "Goodput".
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import Connection, bindparam, text

from auditor.config import Thresholds
from auditor.timeutil import H

CAUSES = ("infrastructure", "user", "preempted")
#: failure end state -> its cause when no node event says otherwise
LOST_STATES: dict[str, str] = {"NODE_FAIL": "infrastructure", "BOOT_FAIL": "infrastructure",
                               "FAILED": "user", "OUT_OF_MEMORY": "user", "TIMEOUT": "user",
                               "PREEMPTED": "preempted", "REQUEUED": "preempted"}

RUNS = """SELECT a.id AS allocation_id, a.cluster, a.source, a.external_id, a.account, a.user_name, a.name,
a.state, a.start_ts, a.end_ts, u.team, u.reserved_s, u.reserved_cost
FROM usage_allocation u JOIN allocations a ON a.id = u.allocation_id
WHERE u.run_id = :run AND UPPER(a.state) IN :states"""
#: node events on a node the allocation held, overlapping its held interval (an instantaneous XID included)
EVENTS = """SELECT DISTINCT g.allocation_id, e.node, e.kind, e.reason FROM allocated_gpus g
JOIN node_events e ON e.node = g.node AND e.cluster = :cluster
WHERE g.allocation_id = :id AND e.kind IN :kinds AND e.start_ts <= :end AND COALESCE(e.end_ts, :end) >= :start"""
INSTANCES = """SELECT a.cluster, a.source, a.external_id, COUNT(*) AS n, MAX(COALESCE(a.restarts, 0)) AS said
FROM usage_allocation u JOIN allocations a ON a.id = u.allocation_id WHERE u.run_id = :run
GROUP BY a.cluster, a.source, a.external_id HAVING COUNT(*) > 1 OR MAX(COALESCE(a.restarts, 0)) > 0"""


def run_thresholds(th: dict[str, Any], current: Thresholds) -> Thresholds:
    """A stored run's thresholds (``audit_runs.thresholds``) over the current ones: a run stored before a
    goodput setting existed reads the current value."""
    return current.model_copy(update={k: v for k, v in th.items() if k in Thresholds.model_fields})


def lost_runs(conn: Connection, run_id: int, th: Thresholds) -> list[dict[str, Any]]:
    """The run's allocations in a failure state, each with ``lost_s`` (its reserved seconds in the window,
    share-weighted), ``cost`` (their reserved cost), ``cause`` and the node ``events`` that made it
    infrastructure-caused; ordered by allocation id."""
    q = text(RUNS).bindparams(bindparam("states", expanding=True))
    rows = [dict(r._mapping) for r in conn.execute(q, {"run": run_id, "states": list(LOST_STATES)})]
    kinds = list(th.goodput_infra_events)
    for r in rows:
        r["events"] = []
    if rows and kinds:
        ev = text(EVENTS).bindparams(bindparam("kinds", expanding=True))
        for r in rows:  # one query per lost run: failures are few next to the allocations
            end = r["end_ts"] if r["end_ts"] is not None else r["start_ts"]
            if r["start_ts"] is None:
                continue
            r["events"] = [f"{e.node} {e.kind}{': ' + e.reason if e.reason else ''}" for e in conn.execute(
                ev, {"cluster": r["cluster"], "id": r["allocation_id"], "kinds": kinds,
                     "start": r["start_ts"], "end": end})]
    for r in rows:
        r["state"] = r["state"].upper()
        r["cause"] = "infrastructure" if r["events"] else LOST_STATES[r["state"]]
        r["lost_s"] = float(r.pop("reserved_s") or 0.0)
        r["cost"] = float(r.pop("reserved_cost") or 0.0)
    rows.sort(key=lambda r: r["allocation_id"])
    return rows


def restarts(conn: Connection, run_id: int) -> dict[tuple[str, str, str], int]:
    """(cluster, source, job id) -> restarts: its stored runs in the window minus one, or the count Slurm
    reports (``allocations.restarts``) where that is more (earlier runs never collected); only job ids
    with a restart."""
    return {(r.cluster, r.source, r.external_id): max(int(r.n) - 1, int(r.said or 0))
            for r in conn.execute(text(INSTANCES), {"run": run_id})}


def by_team(conn: Connection, run_id: int, lost: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per team: reserved and lost GPU-hours (by cause), the useful-time share and the SM effective share;
    teams with lost hours first, most lost first."""
    acc: dict[str, dict[str, float]] = defaultdict(lambda: {c: 0.0 for c in CAUSES})
    for r in lost:
        acc[r["team"]][r["cause"]] += r["lost_s"]
    out = []
    for t in conn.execute(text("SELECT team, SUM(reserved_s) AS reserved_s, SUM(effective_s) AS effective_s "
                               "FROM usage_allocation WHERE run_id = :run GROUP BY team"), {"run": run_id}):
        reserved = float(t.reserved_s or 0.0)
        if reserved <= 0:
            continue
        by = acc.get(t.team, {c: 0.0 for c in CAUSES})
        lost_s = sum(by.values())
        out.append({"team": t.team or "(unmapped)", "reserved_gpu_hours": reserved / H,
                    "lost_gpu_hours": lost_s / H, **{f"{c}_gpu_hours": by[c] / H for c in CAUSES},
                    "useful_share": (reserved - lost_s) / reserved,
                    "effective_share": float(t.effective_s or 0.0) / reserved})
    out.sort(key=lambda r: (-r["lost_gpu_hours"], r["team"]))
    return out


def section(conn: Connection, run_id: int, th: Thresholds, *, full: bool, top_n: int) -> dict[str, Any]:
    """The report's "Goodput" section: totals, per-team rows (cut at ``top_n`` unless ``full``) and the
    lost runs, most lost first."""
    lost = lost_runs(conn, run_id, th)
    teams = by_team(conn, run_id, lost)
    reserved = sum(t["reserved_gpu_hours"] for t in teams)
    total = {"reserved_gpu_hours": reserved, "lost_gpu_hours": sum(r["lost_s"] for r in lost) / H,
             **{f"{c}_gpu_hours": sum(r["lost_s"] for r in lost if r["cause"] == c) / H for c in CAUSES},
             "lost_cost": sum(r["cost"] for r in lost), "runs": len(lost)}
    total["useful_share"] = (reserved - total["lost_gpu_hours"]) / reserved if reserved > 0 else None
    runs = sorted(lost, key=lambda r: (-r["lost_s"], r["allocation_id"]))
    shown = [{"allocation_id": r["allocation_id"], "cluster": r["cluster"], "job": r["external_id"],
              "name": r["name"], "user": r["user_name"], "team": r["team"], "state": r["state"],
              "cause": r["cause"], "lost_gpu_hours": r["lost_s"] / H, "events": r["events"]}
             for r in (runs if full else runs[:top_n])]
    return {"totals": total, "teams": teams if full else [t for t in teams if t["lost_gpu_hours"] > 0][:top_n],
            "runs": shown, "runs_total": len(runs), "target": th.goodput_target}


def lost_by_allocation(conn: Connection, run_id: int, th: Thresholds) -> dict[int, float]:
    """allocation id -> lost seconds: the chargeback column ``lost_gpu_hours`` sums these."""
    return {r["allocation_id"]: r["lost_s"] for r in lost_runs(conn, run_id, th)}


def restart_findings(conn: Connection, run_id: int, th: Thresholds) -> list[dict[str, Any]]:
    """One ``failed_restarts`` finding per job id requeued or restarted at least ``goodput_min_restarts``
    times in the window, on its latest instance: its GPU-hours are those its failed runs lost."""
    lost = {r["allocation_id"]: r for r in lost_runs(conn, run_id, th)}
    rs = restarts(conn, run_id)
    if not rs:
        return []
    out = []
    q = text("SELECT a.id, a.cluster, a.source, a.external_id, a.name, a.account, a.user_name, a.start_ts, a.end_ts, "
             "u.team FROM usage_allocation u JOIN allocations a ON a.id = u.allocation_id WHERE u.run_id = :run "
             "AND a.external_id IN :ids").bindparams(bindparam("ids", expanding=True))
    inst: dict[tuple[str, str, str], list[Any]] = defaultdict(list)
    for r in conn.execute(q, {"run": run_id, "ids": sorted({k[2] for k in rs})}):
        inst[(r.cluster, r.source, r.external_id)].append(r)
    for key, n in sorted(rs.items()):
        if n < th.goodput_min_restarts:
            continue
        runs = sorted(inst[key], key=lambda r: (r.start_ts or 0, r.id))
        last = runs[-1]  # the latest run: the finding's allocation
        gone = [lost[r.id] for r in runs if r.id in lost]
        lost_h = sum(g["lost_s"] for g in gone) / H
        causes = {c: round(sum(g["lost_s"] for g in gone if g["cause"] == c) / H, 6) for c in CAUSES}
        out.append({"run_id": run_id, "kind": "failed_restarts", "cluster": key[0], "allocation_id": last.id,
                    "reservation_id": None, "account": last.account, "user_name": last.user_name,
                    "team": last.team, "start_ts": runs[0].start_ts, "end_ts": last.end_ts,
                    "gpu_hours": lost_h, "idle_gpu_hours": 0.0, "cost": sum(g["cost"] for g in gone),
                    "evidence": {"recipient": "user", "restarts": n,
                                 "job": {"id": key[2], "name": last.name, "source": key[1]},
                                 "runs": [{"allocation_id": g["allocation_id"], "state": g["state"],
                                           "cause": g["cause"], "lost_gpu_hours": round(g["lost_s"] / H, 6),
                                           "events": g["events"]} for g in gone],
                                 "lost_by_cause": causes,
                                 "rule": f"{n} restarts >= goodput_min_restarts {th.goodput_min_restarts}"}})
    return out
