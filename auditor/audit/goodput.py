"""Training goodput: the reserved GPU-hours thrown away by failures and restarts, and who caused them.

A run of a job that ended in a failure state (Slurm FAILED, OUT_OF_MEMORY, TIMEOUT, NODE_FAIL, BOOT_FAIL,
PREEMPTED, REQUEUED; a Kubernetes pod in phase Failed) produced no result the job kept: its reserved
GPU-hours in the window are *lost*. Each lost run has one cause:

- ``infrastructure``: NODE_FAIL or BOOT_FAIL, or any failure state while one of the job's nodes had a node
  event of a kind in ``GOODPUT_INFRA_EVENTS`` (an XID, an ECC error, the node down) during the run;
- ``user``: FAILED, OUT_OF_MEMORY, TIMEOUT (the job's own exit, memory or time limit), no node event;
- ``preempted``: PREEMPTED or REQUEUED (preempted or requeued by the scheduler or an operator), no node event.

A failed Kubernetes pod says why it failed (its ``DisruptionTarget`` condition, else ``status.reason``, else
its container's: connectors/k8s_resources.py ``failure_reason``), and ``GOODPUT_POD_CAUSES`` maps
the reason to a cause: by default preempted by the scheduler or evicted through the eviction API (a drain)
is ``preempted``; deleted by the taint manager (its node NotReady), by the pod garbage collector (its node
gone) or by the kubelet (node shutdown, node-pressure eviction) is ``infrastructure``; a reason not listed
(OOMKilled, an error exit, DeadlineExceeded) the user's.

Slurm resets a job's submit time when it requeues it, so every run of a requeued job is its own stored
instance of the same job id (``allocations.instance_ts``): the restarts of a job are its instances in the
window minus one, or Slurm's own count (``allocations.restarts``) where that is more. A Kubernetes Job's
runs are its pods (``allocations.job_uid``: the connector reads it from the pod's label ``controller-uid``):
its restarts are its failed pods that were retried under its ``backoffLimit`` (:func:`kube_restarts`) plus
its pods' container restarts; a bare pod's are its container restarts. The useful-time share (reserved minus
lost, over reserved) is the figure Meta reports for the
Llama 3 run (more than 90 % of the time doing useful training). Computed once here, from the run's
``usage_allocation`` rows: the report section, the ``failed_restarts`` findings and the chargeback column
``lost_gpu_hours`` all read :func:`lost_runs`.

Beside it, per team and allocation, Tensor-pipe activity as an MFU proxy (:func:`tensor_proxy`): the mean
DCGM Tensor pipe activity over SM-observed time (``usage_allocation.tensor_s / sm_observed_s``, the figure
the low-efficiency evidence calls mean Tensor activity), shown next to the published model FLOPs
utilisation of large training runs (:data:`PUBLISHED_MFU`). It is a proxy, not MFU: a Tensor pipe counts as
active for any cycle it issues, at any precision and fill. Rules: docs/definitions.md "Goodput".
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Connection, bindparam, text

from auditor.audit import verdict
from auditor.config import Thresholds
from auditor.timeutil import H

# Goodput's rule constants (docs/definitions.md; `[thresholds]` settings until issue 45): what kills a job is
# fixed by the hardware and by Kubernetes' reasons, not by a site.
#: a failed run is infrastructure-caused when a node it held had a node event of these kinds during the run
#: (throttling and a drain do not kill a job)
GOODPUT_INFRA_EVENTS = ("xid", "ecc_dbe", "row_remap", "down", "not_ready")
#: failed_restarts: a job id with at least this many restarts (stored runs beyond the first: Slurm requeues; a
#: Kubernetes Job's retried failed pods; container restarts) in the audit window (one retry is normal)
GOODPUT_MIN_RESTARTS = 2
#: a failed Kubernetes pod's reason (its DisruptionTarget condition, else status.reason, else its container's)
#: -> the cause of its lost GPU-hours when no node event says infrastructure; a reason not listed (OOMKilled,
#: Error, DeadlineExceeded) is the user's. The keys are Kubernetes' own reason names.
GOODPUT_POD_CAUSES = {"PreemptionByScheduler": "preempted", "EvictionByEvictionAPI": "preempted",
                      "DeletionByTaintManager": "infrastructure", "DeletionByPodGC": "infrastructure",
                      "TerminationByKubelet": "infrastructure", "Evicted": "infrastructure"}

CAUSES = ("infrastructure", "user", "preempted")
#: failure end state -> its cause when no node event says otherwise
LOST_STATES: dict[str, str] = {"NODE_FAIL": "infrastructure", "BOOT_FAIL": "infrastructure",
                               "FAILED": "user", "OUT_OF_MEMORY": "user", "TIMEOUT": "user",
                               "PREEMPTED": "preempted", "REQUEUED": "preempted"}
#: published model FLOPs utilisation of large training runs, for the Tensor-pipe proxy to stand beside:
#: (run, low, high) as shares of the chips' peak math
PUBLISHED_MFU: tuple[tuple[str, float, float], ...] = (("Meta Llama 3 405B (16,384 H100)", 0.38, 0.43),
                                                      ("Google PaLM 540B (6,144 TPU v4)", 0.46, 0.46))
#: pods of a Kubernetes Job (the top of its owner chain a Job, or a CronJob that made the Job)
JOB_POD = "a.source = 'kubernetes' AND (a.owner_workload LIKE 'Job/%' OR a.owner_workload LIKE 'CronJob/%')"

RUNS = """SELECT a.id AS allocation_id, a.cluster, a.source, a.external_id, a.account, a.user_name, a.name,
a.state, a.start_ts, a.end_ts, a.failure_reason, u.team, u.reserved_s, u.reserved_cost
FROM usage_allocation u JOIN allocations a ON a.id = u.allocation_id
WHERE u.run_id = :run AND UPPER(a.state) IN :states"""
#: node events that touched the allocation, overlapping its held interval (an instantaneous XID included): a
#: node-wide event (gpu_index -1) of a node it held, or a GPU event of a GPU it held (the scheduler's index,
#: else the one the audit attributed; neither known: any GPU of the node may be its own). Another job's GPU
#: faulting on the same node never makes this run's loss "infrastructure" (issue 44)
EVENTS = """SELECT DISTINCT g.allocation_id, e.node, e.kind, e.reason FROM allocated_gpus g
JOIN node_events e ON e.node = g.node AND e.cluster = :cluster
LEFT JOIN usage_gpu u ON u.allocated_gpu_id = g.id AND u.run_id = :run
WHERE g.allocation_id = :id AND e.kind IN :kinds AND e.start_ts <= :end AND COALESCE(e.end_ts, :end) >= :start
 AND (e.gpu_index = -1 OR COALESCE(g.gpu_index, u.gpu_index) IS NULL
      OR e.gpu_index = COALESCE(g.gpu_index, u.gpu_index))"""
#: one job's runs: its instances of one id, user and account (:data:`CHAIN`); a reused id is another job
CHAIN = ("a.cluster", "a.source", "a.external_id", "COALESCE(a.user_name, '')", "COALESCE(a.account, '')")
INSTANCES = f"""SELECT {', '.join(CHAIN)}, COUNT(*) AS n, MAX(COALESCE(a.restarts, 0)) AS said
FROM usage_allocation u JOIN allocations a ON a.id = u.allocation_id WHERE u.run_id = :run AND NOT ({JOB_POD})
GROUP BY {', '.join(CHAIN)} HAVING COUNT(*) > 1 OR MAX(COALESCE(a.restarts, 0)) > 0"""
#: the pods of Kubernetes Jobs in the run (grouped by their Job in :func:`kube_restarts`)
JOB_PODS = f"""SELECT a.id, a.cluster, a.source, a.external_id, a.name, a.account, a.user_name, a.state, a.start_ts,
a.end_ts, a.owner_workload, a.job_uid, a.restarts, u.team FROM usage_allocation u JOIN allocations a
ON a.id = u.allocation_id WHERE u.run_id = :run AND {JOB_POD}"""


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
    kinds = list(GOODPUT_INFRA_EVENTS)
    for r in rows:
        r["events"] = []
    if rows and kinds:
        ev = text(EVENTS).bindparams(bindparam("kinds", expanding=True))
        for r in rows:  # one query per lost run: failures are few next to the allocations
            end = r["end_ts"] if r["end_ts"] is not None else r["start_ts"]
            if r["start_ts"] is None:
                continue
            r["events"] = [f"{e.node} {e.kind}{': ' + e.reason if e.reason else ''}" for e in conn.execute(
                ev, {"cluster": r["cluster"], "id": r["allocation_id"], "kinds": kinds, "run": run_id,
                     "start": r["start_ts"], "end": end})]
    for r in rows:
        r["state"] = r["state"].upper()
        why = (r.pop("failure_reason") or "") if r["source"] == "kubernetes" else ""
        r["cause"] = "infrastructure" if r["events"] else GOODPUT_POD_CAUSES.get(why) or LOST_STATES[r["state"]]
        if why:
            r["reason"] = why
        r["lost_s"] = float(r.pop("reserved_s") or 0.0)
        r["cost"] = float(r.pop("reserved_cost") or 0.0)
    rows.sort(key=lambda r: r["allocation_id"])
    return rows


def json_object(value: Any) -> dict[str, Any]:
    """A stored JSON object (``audit_runs.thresholds``) as a dict (SQLite hands the JSON text back, PostgreSQL
    the decoded object); {} when it is not one."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


def restarts(conn: Connection, run_id: int) -> dict[tuple[str, str, str, str, str], int]:
    """(cluster, source, job id, user, account) -> restarts: the job's stored runs in the window minus one, or
    the count Slurm reports (``allocations.restarts``) where that is more (earlier runs never collected); only
    jobs with a restart. A restart chain is one job's runs: Slurm gives a requeued run a new submit time but
    keeps its id, user and account, so runs of a reused id by another user (or account) are another job's,
    never this one's restarts (issue 44). Pods of Kubernetes Jobs are counted per Job (:func:`kube_restarts`),
    not here."""
    return {(r[0], r[1], r[2], r[3], r[4]): max(int(r.n) - 1, int(r.said or 0))
            for r in conn.execute(text(INSTANCES), {"run": run_id})}


def kube_restarts(conn: Connection, run_id: int) -> dict[tuple[str, str], dict[str, Any]]:
    """(cluster, Job uid) -> the Job's pods in the run (``runs``, oldest first) and its ``restarts``: the
    failed pods that were retried (a failed pod followed by a later pod of the Job, or, where the Job's
    record says more, ``kube_jobs.failed`` less the last failure of a Job that gave up), plus its pods'
    container restarts (``allocations.restarts``). ``unseen_failed``: failed pods the Job counts that the
    store never held (deleted before a collection saw them): restarts, their GPU time not measured. Only
    Jobs with a restart."""
    groups: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for r in conn.execute(text(JOB_PODS), {"run": run_id}):
        uid = r.job_uid or ""
        groups[(r.cluster, uid or f"{r.account}/{r.owner_workload}")].append(r)
    if not groups:
        return {}
    jobs = {(j.cluster, j.uid): j for j in conn.execute(text(
        "SELECT cluster, uid, namespace, name, backoff_limit, failed, succeeded, active, state, reason "
        "FROM kube_jobs WHERE uid IN :uids").bindparams(bindparam("uids", expanding=True)),
        {"uids": sorted({k[1] for k in groups})})}
    out = {}
    for key, pods in groups.items():
        runs = sorted(pods, key=lambda r: (r.start_ts or 0, r.id))
        failed = [r for r in runs if (r.state or "").upper() == "FAILED"]
        retried = sum(1 for r in failed if any((o.start_ts or 0) > (r.start_ts or 0) for o in runs))
        job = jobs.get(key)
        counted = max(len(failed), int(job.failed)) if job is not None else len(failed)
        if job is not None:
            retried = max(retried, counted - (1 if job.state == "Failed" else 0))
        container = sum(int(r.restarts or 0) for r in runs)
        if retried + container <= 0:
            continue
        out[key] = {"runs": runs, "restarts": retried + container, "pod_retries": retried,
                    "container_restarts": container, "unseen_failed": max(0, counted - len(failed)),
                    "job": None if job is None else {
                        "namespace": job.namespace, "name": job.name, "uid": job.uid, "state": job.state,
                        "reason": job.reason, "backoff_limit": job.backoff_limit, "failed": int(job.failed),
                        "succeeded": int(job.succeeded)}}
    return out


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


def tensor_share(tensor_s: float | None, sm_observed_s: float | None) -> float | None:
    """Mean Tensor pipe activity over SM-observed time; None when nothing was observed, or no Tensor activity
    was (a GPU whose telemetry lacks the Tensor field reads 0: shown as not measured, never as 0 %)."""
    t, o = float(tensor_s or 0.0), float(sm_observed_s or 0.0)
    return t / o if t > 0 and o > 0 else None


TENSOR_ROWS = """SELECT a.id, a.cluster, a.external_id, a.name, a.user_name, u.team, u.tensor_s, u.sm_observed_s
FROM usage_allocation u JOIN allocations a ON a.id = u.allocation_id WHERE u.run_id = :run AND u.sm_observed_s > 0
ORDER BY u.sm_observed_s DESC, a.id"""


def tensor_rows(conn: Connection, run_id: int, limit: int | None = None) -> Iterator[dict[str, Any]]:
    """Per allocation with SM-observed time, most SM-observed GPU-hours first: its Tensor-pipe proxy;
    streamed from the server (the JSON export writes every allocation's without holding them)."""
    sql = text(TENSOR_ROWS + ("" if limit is None else f" LIMIT {int(limit)}")).execution_options(
        stream_results=True, yield_per=5000)
    for r in conn.execute(sql, {"run": run_id}):
        yield {"allocation_id": r.id, "cluster": r.cluster, "job": r.external_id, "name": r.name,
               "user": r.user_name, "team": r.team, "observed_gpu_hours": float(r.sm_observed_s) / H,
               "tensor_share": tensor_share(r.tensor_s, r.sm_observed_s)}


def tensor_proxy(conn: Connection, run_id: int, *, full: bool, top_n: int, rows: bool = True) -> dict[str, Any]:
    """Tensor-pipe activity as an MFU proxy from the run's usage rows: overall, per team (most SM-observed
    GPU-hours first) and per allocation (a table of the ``top_n`` with the most SM-observed GPU-hours unless
    ``full``; ``rows`` False leaves its rows to the caller: :func:`tensor_rows`), beside
    :data:`PUBLISHED_MFU`."""
    teams = [{"team": t.team or "(unmapped)", "observed_gpu_hours": float(t.obs or 0.0) / H,
              "tensor_share": tensor_share(t.te, t.obs)} for t in conn.execute(text(
                  "SELECT team, SUM(tensor_s) AS te, SUM(sm_observed_s) AS obs FROM usage_allocation "
                  "WHERE run_id = :run GROUP BY team HAVING SUM(sm_observed_s) > 0 ORDER BY SUM(sm_observed_s) "
                  "DESC, team"), {"run": run_id})]
    tot = conn.execute(text("SELECT SUM(tensor_s), SUM(sm_observed_s), COUNT(*) FROM usage_allocation "
                            "WHERE run_id = :run AND sm_observed_s > 0"), {"run": run_id}).one()
    allocs = list(tensor_rows(conn, run_id, None if full else top_n)) if rows else []
    n = int(tot[2] or 0)
    return {"tensor_share": tensor_share(tot[0], tot[1]), "observed_gpu_hours": float(tot[1] or 0.0) / H,
            "teams": teams if full else teams[:top_n],
            "allocations": {"rows": allocs, "total": n, "shown": len(allocs), "cut": n > len(allocs), "totals": {}},
            "published": [{"run": r, "low": lo, "high": hi} for r, lo, hi in PUBLISHED_MFU]}


def section(conn: Connection, run_id: int, th: Thresholds, *, full: bool, top_n: int,
            tensor_rows: bool = True) -> dict[str, Any]:
    """The report's "Goodput" section: totals, per-team rows (cut at ``top_n`` unless ``full``), the lost
    runs, most lost first, and the Tensor-pipe MFU proxy (:func:`tensor_proxy`; ``tensor_rows`` False: its
    per-allocation rows left to the caller)."""
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
              "cause": r["cause"], "lost_gpu_hours": r["lost_s"] / H, "events": r["events"],
              "reason": r.get("reason", "")}
             for r in (runs if full else runs[:top_n])]
    since, until = conn.execute(text("SELECT since_ts, until_ts FROM audit_runs WHERE id = :run"),
                                {"run": run_id}).one()
    back = recovery(conn, run_id, th, int(since), int(until), {t["team"]: t["useful_share"] for t in teams})
    if not full:
        back = {**back, "jobs": back["jobs"][:top_n], "teams": back["teams"][:top_n]}
    return {"totals": total, "teams": teams if full else [t for t in teams if t["lost_gpu_hours"] > 0][:top_n],
            "recovery": back, "runs": shown, "runs_total": len(runs), "target": th.goodput_target,
            "tensor": tensor_proxy(conn, run_id, full=full, top_n=top_n, rows=tensor_rows)}


def lost_by_allocation(conn: Connection, run_id: int, th: Thresholds) -> dict[int, float]:
    """allocation id -> lost seconds: the chargeback column ``lost_gpu_hours`` sums these."""
    return {r["allocation_id"]: r["lost_s"] for r in lost_runs(conn, run_id, th)}


def restart_findings(conn: Connection, run_id: int, th: Thresholds) -> list[dict[str, Any]]:
    """One ``failed_restarts`` finding per job (:func:`restarts`: its id, user and account; Slurm: requeues;
    a Kubernetes Job: its retried pods and container restarts; a bare pod: its container restarts) restarted
    at least ``goodput_min_restarts`` times in the window, on its latest run: its GPU-hours are those its
    failed runs lost."""
    lost = {r["allocation_id"]: r for r in lost_runs(conn, run_id, th)}
    out = []
    rs = {k: n for k, n in restarts(conn, run_id).items() if n >= GOODPUT_MIN_RESTARTS}
    if rs:
        q = text("SELECT a.id, a.cluster, a.source, a.external_id, a.name, a.account, a.user_name, a.start_ts, "
                 "a.end_ts, u.team FROM usage_allocation u JOIN allocations a ON a.id = u.allocation_id WHERE "
                 "u.run_id = :run AND a.external_id IN :ids").bindparams(bindparam("ids", expanding=True))
        inst: dict[tuple[str, str, str, str, str], list[Any]] = defaultdict(list)
        for r in conn.execute(q, {"run": run_id, "ids": sorted({k[2] for k in rs})}):
            inst[(r.cluster, r.source, r.external_id, r.user_name or "", r.account or "")].append(r)
        for key, n in sorted(rs.items()):
            runs = sorted(inst[key], key=lambda r: (r.start_ts or 0, r.id))
            out.append(_restart_finding(run_id, th, key[0], runs, lost, n,
                                        {"id": key[2], "name": runs[-1].name, "source": key[1]}, {}))
    for (cluster, _uid), kj in sorted(kube_restarts(conn, run_id).items()):
        if kj["restarts"] < GOODPUT_MIN_RESTARTS:
            continue
        runs, job = kj["runs"], kj["job"]
        name = job["name"] if job else runs[-1].owner_workload.split("/", 1)[-1]
        extra = {"pod_retries": kj["pod_retries"], "container_restarts": kj["container_restarts"],
                 "unseen_failed_pods": kj["unseen_failed"]}
        if job:
            extra["kubernetes_job"] = {k: job[k] for k in ("state", "reason", "backoff_limit", "failed",
                                                            "succeeded")}
        out.append(_restart_finding(run_id, th, cluster, runs, lost, kj["restarts"],
                                    {"id": f"{runs[-1].account}/{name}", "name": name, "source": "kubernetes",
                                     **({"uid": job["uid"]} if job else {})}, extra))
    return out


def _restart_finding(run_id: int, th: Thresholds, cluster: str, runs: list[Any], lost: dict[int, dict[str, Any]],
                     n: int, job: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """The ``failed_restarts`` finding of one job's ``runs`` (oldest first; the latest one is the finding's
    allocation) restarted ``n`` times."""
    last = runs[-1]
    gone = [lost[r.id] for r in runs if r.id in lost]
    lost_h = sum(g["lost_s"] for g in gone) / H
    causes = {c: round(sum(g["lost_s"] for g in gone if g["cause"] == c) / H, 6) for c in CAUSES}
    return {"run_id": run_id, "kind": "failed_restarts", "cluster": cluster, "allocation_id": last.id,
            "reservation_id": None, "account": last.account, "user_name": last.user_name, "team": last.team,
            "start_ts": runs[0].start_ts, "end_ts": last.end_ts, "gpu_hours": lost_h, "idle_gpu_hours": 0.0,
            "cost": sum(g["cost"] for g in gone),
            "evidence": {"recipient": "user", "restarts": n, "job": job,
                         "runs": [{"allocation_id": g["allocation_id"], "state": g["state"], "cause": g["cause"],
                                   "lost_gpu_hours": round(g["lost_s"] / H, 6), "events": g["events"],
                                   **({"reason": g["reason"]} if g.get("reason") else {})} for g in gone],
                         "lost_by_cause": causes, **extra,
                         "rule": f"{n} restarts >= goodput_min_restarts {GOODPUT_MIN_RESTARTS}"}}


# -- How fast training comes back (issue 48 §5) -------------------------------------------------------------
#: the run's allocations (each with its restart-chain key, :data:`CHAIN`, or its Kubernetes Job), oldest first
CHAIN_RUNS = f"""SELECT a.id, a.cluster, a.source, a.external_id, a.name, a.user_name, a.account, a.state,
a.start_ts, a.end_ts, a.owner_workload, a.job_uid, u.team, {', '.join(CHAIN)} FROM usage_allocation u
JOIN allocations a ON a.id = u.allocation_id WHERE u.run_id = :run AND a.start_ts IS NOT NULL"""
#: verdicts that say the GPU computed: SM activity >= working_sm, or (stock counters) Tensor or DRAM busy
COMPUTING = f"({verdict.WORKING}, {verdict.BUSY_BY_COUNTERS})"


def first_working(conn: Connection, run_id: int, th: Thresholds, ids: list[int], since: int, until: int
                  ) -> dict[int, int]:
    """allocation id -> the start of its first bucket in which one of its GPUs computed (the judged row's
    verdict working, or busy by counters), clipped to its start; allocations that never computed in
    [since, until) are absent. Reads the same applicable rows as the judging (:func:`auditor.audit.judging.rows_of`)."""
    from auditor.audit import judging
    from auditor.store.sqlfuncs import greatest_least

    if not ids:
        return {}
    g, le = greatest_least(conn.dialect.name)
    rows = judging.rows_of(conn.dialect.name, th, "c", "cc", ["aid"])
    sql = f"""WITH c AS (
  SELECT u.allocation_id AS aid, u.gpu_id, {g}(a.start_ts, :since) AS a_s,
   {le}(COALESCE(a.end_ts, :until), :until) AS a_e, {judging.JOB_KEY} AS jkey, tg.has_jobs AS lab
  FROM usage_gpu u JOIN telemetry_gpus tg ON tg.id = u.gpu_id JOIN allocations a ON a.id = u.allocation_id
  WHERE u.run_id = :run AND u.gpu_id IS NOT NULL AND u.allocation_id IN ({', '.join(str(int(i)) for i in ids)}))
SELECT j.aid, MIN({g}(j.bucket_ts, j.a_s)) AS back FROM {rows} WHERE j.obs > 0 AND j.v IN {COMPUTING}
GROUP BY j.aid"""
    return {int(r.aid): int(r.back) for r in conn.execute(text(sql), {"run": run_id, "since": since,
                                                                      "until": until})}


def _median(xs: list[float]) -> float | None:
    s = sorted(xs)
    n = len(s)
    return None if n == 0 else (s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2)


def recovery(conn: Connection, run_id: int, th: Thresholds, since: int, until: int,
             useful: dict[str, float | None] | None = None) -> dict[str, Any]:
    """How fast training comes back (docs/definitions.md "Goodput"): per interruption of a job (a run of its
    restart chain that ended in a failure state, followed by a later run of the same chain: Slurm's
    instances of one id, user and account; a Kubernetes Job's pods) the hours from the failure (the failed
    run's end) to the job computing again (the next run's first working bucket, :func:`first_working`),
    split into waiting to start again (failure to the next run's start) and starting up (its start to its
    first working bucket). A next run that never computed in the window is "not back" (no figure). Per
    job and per team (the team of the job's latest run, with its useful-time share from ``useful``)."""
    chains: dict[tuple[Any, ...], list[Any]] = defaultdict(list)
    for r in conn.execute(text(CHAIN_RUNS), {"run": run_id}):
        if r.source == "kubernetes" and (r.owner_workload or "").split("/")[0] in ("Job", "CronJob"):
            uid = r.job_uid or ""
            chains[(r.cluster, "kubernetes-job", uid or f"{r.account}/{r.owner_workload}")].append(r)
        else:
            chains[(r[13], r[14], r[15], r[16], r[17])].append(r)
    pairs = []
    for runs in chains.values():
        if len(runs) < 2:
            continue
        runs.sort(key=lambda r: (r.start_ts, r.id))
        for prev, nxt in zip(runs, runs[1:], strict=False):
            if (prev.state or "").upper() in LOST_STATES and prev.end_ts is not None and nxt.start_ts >= prev.end_ts:
                pairs.append((prev, nxt, runs[-1]))
    back = first_working(conn, run_id, th, sorted({n.id for _p, n, _l in pairs}), since, until)
    jobs: dict[tuple[Any, ...], dict[str, Any]] = {}
    for prev, nxt, last in pairs:
        key = (last.cluster, last.source, last.external_id if last.source != "kubernetes" else
               (last.owner_workload or last.name), last.account or "", last.user_name or "")
        j = jobs.setdefault(key, {"cluster": last.cluster, "job": key[2], "name": last.name, "user": last.user_name,
                                  "team": last.team or "(unmapped)", "interruptions": []})
        b = back.get(nxt.id)
        j["interruptions"].append({
            "failed_allocation_id": prev.id, "state": (prev.state or "").upper(),
            "cause": LOST_STATES[(prev.state or "").upper()], "next_allocation_id": nxt.id,
            "failed_ts": prev.end_ts, "restarted_ts": nxt.start_ts, "working_ts": b,
            "wait_hours": (nxt.start_ts - prev.end_ts) / H,
            "startup_hours": (b - nxt.start_ts) / H if b is not None else None,
            "recovery_hours": (b - prev.end_ts) / H if b is not None else None})
    out_jobs = []
    for j in jobs.values():
        hs = [i["recovery_hours"] for i in j["interruptions"] if i["recovery_hours"] is not None]
        out_jobs.append({**j, "count": len(j["interruptions"]), "back": len(hs),
                         "mean_recovery_hours": sum(hs) / len(hs) if hs else None,
                         "median_recovery_hours": _median(hs), "max_recovery_hours": max(hs) if hs else None,
                         "recovery_hours": sum(hs)})
    out_jobs.sort(key=lambda j: (-(j["max_recovery_hours"] or 0.0), j["cluster"], j["job"]))
    teams: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for j in out_jobs:
        teams[j["team"]].extend(j["interruptions"])
    out_teams = []
    for team, its in teams.items():
        hs = [i["recovery_hours"] for i in its if i["recovery_hours"] is not None]
        out_teams.append({"team": team, "interruptions": len(its), "back": len(hs),
                          "jobs": sum(1 for j in out_jobs if j["team"] == team),
                          "mean_recovery_hours": sum(hs) / len(hs) if hs else None,
                          "median_recovery_hours": _median(hs), "max_recovery_hours": max(hs) if hs else None,
                          "recovery_hours": sum(hs), "useful_share": (useful or {}).get(team)})
    out_teams.sort(key=lambda t: (-t["recovery_hours"], t["team"]))
    every = [i["recovery_hours"] for j in out_jobs for i in j["interruptions"] if i["recovery_hours"] is not None]
    return {"interruptions": sum(j["count"] for j in out_jobs), "back": len(every),
            "mean_recovery_hours": sum(every) / len(every) if every else None,
            "median_recovery_hours": _median(every), "teams": out_teams, "jobs": out_jobs}
