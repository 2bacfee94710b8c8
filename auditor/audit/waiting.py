"""Where the waiting goes (docs/definitions.md "Where the waiting goes", "Stragglers"): every reserved second
of an allocation in one class, from its GPU buckets and its node's host buckets, and the straggler of a
lockstep job.

The classes of one observed bucket, first match wins (the verdict is :mod:`auditor.audit.verdict`'s):

- ``idle``: idle, idle by GPU-Util or mirage;
- ``compute``: compute-bound, SM activity >= working_sm (the verdict "working");
- ``memory``: memory-bound, SM below working_sm and DRAM activity >= hint_dram_high;
- ``communication``: SM below working_sm, DRAM not high, PCIe + NVLink bytes/s >= hint_io_bps;
- then, SM below working_sm with DRAM and the links measured and quiet, the GPU waits on its host, and the
  node's host bucket (node telemetry, :func:`node_join`) says on what:
  ``storage`` (input/storage wait: I/O wait, a saturated disk, NFS or Lustre reads high),
  ``communication`` (InfiniBand busy), ``host`` (host-bound: a pegged CPU core per GPU), else ``starved``
  (other host/input wait: no node bucket, or its counters show none of these; never guessed);
- ``not_measured``: a counter the rule needs is absent (no SM activity, or SM low while DRAM or the link
  counters are missing), or no samples at all: never guessed.

Reserved time less infrastructure-affected time less the classified seconds is ``not_measured`` too.
The audit computes it once per run into the run summary (``waiting``); every surface reads it there.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from sqlalchemy import Connection, text

from auditor.audit import infra, judge, verdict
from auditor.config import Thresholds
from auditor.store.sqlfuncs import greatest_least
from auditor.timeutil import H

#: The classes in report order, with the report's column words (docs/definitions.md says each rule).
CLASSES: dict[str, str] = {
    "compute": "Compute-bound",
    "memory": "Memory-bound",
    "communication": "Communication wait",
    "storage": "Input/storage wait",
    "host": "Host-bound",
    "starved": "Other host/input wait",
    "idle": "Idle",
    "not_measured": "Not measured",
    "infra": "Infrastructure",
}
#: The classes where a reserved, working GPU waited on something (not compute, idle, unknown or infrastructure)
WAIT_CLASSES = ("memory", "communication", "storage", "host", "starved")
#: Allocations listed in the summary (the most waiting hours first, then the most non-compute hours)
TOP_ALLOCATIONS = 20

_IO = ("(COALESCE(b.pcie_tx_bps, 0) + COALESCE(b.pcie_rx_bps, 0) + COALESCE(b.nvlink_tx_bps, 0)"
       " + COALESCE(b.nvlink_rx_bps, 0))")
_IO_MEASURED = ("(b.pcie_tx_bps IS NOT NULL OR b.pcie_rx_bps IS NOT NULL OR b.nvlink_tx_bps IS NOT NULL"
                " OR b.nvlink_rx_bps IS NOT NULL)")


_MULTI = (" AND u.allocation_id IN (SELECT m.allocation_id FROM usage_gpu m WHERE m.run_id = :run"
          " GROUP BY m.allocation_id HAVING COUNT(*) >= 2)")


def host_case(th: Thresholds, n: str = "n", node_gpus: str = "c.node_gpus") -> str:
    """What a quiet GPU waits on, from its node's host row ``n`` (NULL columns: that counter not measured, so
    that cause is never concluded): 'storage', 'communication' (InfiniBand), 'host', else 'starved'.
    ``node_gpus``: the GPUs the allocation holds on the node (the host-bound rule's per-GPU cores)."""
    storage = " OR ".join([
        verdict.at_least(f"{n}.cpu_iowait / NULLIF({n}.cpus, 0)", th.host_iowait_share),
        verdict.at_least(f"{n}.disk_busy", th.host_disk_busy),
        verdict.at_least(f"{n}.nfs_read_bps", th.host_fs_read_bps),
        verdict.at_least(f"{n}.lustre_read_bps", th.host_fs_read_bps),
        verdict.at_least(f"{n}.nfs_ops", th.host_nfs_ops)])
    ib = verdict.at_least(f"(COALESCE({n}.ib_rx_bps, 0) + COALESCE({n}.ib_tx_bps, 0))", th.host_ib_bps)
    pegged = verdict.at_least(f"{n}.cpu_pegged / NULLIF({node_gpus}, 0)", th.host_pegged_per_gpu)
    return (f"CASE WHEN {storage} THEN 'storage' WHEN {ib} THEN 'communication' WHEN {pegged} THEN 'host'"
            " ELSE 'starved' END")


def class_case(th: Thresholds, node: str | None = "n", node_gpus: str = "c.node_gpus") -> str:
    """The class of one bucket row ``b`` as an SQL CASE (the table in the module docstring). ``node``: the
    alias of its node's host row (:func:`node_join`), None where no host row is joined (a quiet GPU is then
    ``starved``); ``node_gpus``: the allocation's GPUs on that node."""
    b = verdict.prefixed("b")
    v = verdict.case(th, b, observed="b.observed_s > 0")
    dram_high = verdict.at_least("b.dram_active", th.hint_dram_high)
    io_high = verdict.at_least(_IO, th.hint_io_bps)
    quiet = host_case(th, node, node_gpus) if node else "'starved'"
    return (f"CASE WHEN NOT b.observed_s > 0 THEN 'not_measured'"
            f" WHEN {verdict.in_codes(f'({v})', verdict.IDLE_CODES)} THEN 'idle'"
            f" WHEN b.sm_active IS NULL THEN 'not_measured'"
            f" WHEN {verdict.at_least('b.sm_active', th.working_sm)} THEN 'compute'"
            f" WHEN b.dram_active IS NOT NULL AND {dram_high} THEN 'memory'"
            f" WHEN {_IO_MEASURED} AND {io_high} THEN 'communication'"
            f" WHEN b.dram_active IS NOT NULL AND {_IO_MEASURED} THEN {quiet}"
            " ELSE 'not_measured' END")


def node_join(b: str = "b", cluster: str = "c.cluster", node: str = "c.node", n: str = "n") -> str:
    """The one join of a GPU bucket row ``b`` to its node's host row ``n`` (node_buckets): same cluster and
    node, same bucket start and length (a rolled-up hour meets a rolled-up hour). LEFT: no host row leaves
    ``n``'s columns NULL, which no host rule concludes from."""
    return (f" LEFT JOIN node_buckets {n} ON {n}.cluster = {cluster} AND {n}.node = {node}"
            f" AND {n}.start_ts = {b}.bucket_ts AND {n}.seconds = {b}.bucket_s")


def rows_sql(dialect: str, th: Thresholds, skip: str = "", *, multi: bool = False) -> str:
    """Per (allocated GPU of the run, applicable bucket row, joined to its node's host row): its class,
    observed seconds inside the reserved interval, SM activity and PCIe + NVLink bytes/s. The applicable rows
    are judge's: the row naming the job where the bucket has labelled rows, else the unlabelled row.
    ``multi``: only allocations of 2+ GPUs."""
    g, le = greatest_least(dialect)
    obs = (f"CASE WHEN b.observed_s > 0 THEN {le}({g}(0, {le}(COALESCE(b.span_end, b.bucket_ts + b.bucket_s), c.a_e)"
           f" - {g}(COALESCE(b.span_start, b.bucket_ts), c.a_s)), b.observed_s) ELSE 0 END")
    applies = (f"((b.job = '' AND (c.lab = 0 OR NOT EXISTS (SELECT 1 FROM gpu_buckets s WHERE s.gpu_id = b.gpu_id"
               f" AND s.bucket_ts = b.bucket_ts AND s.job <> ''))) OR (c.lab = 1 AND "
               f"{judge.job_match(dialect, 'b.job', 'c.jkey')}))")
    return f"""WITH c AS (
  SELECT u.allocation_id AS aid, u.allocated_gpu_id AS gid, u.gpu_id, ag.share, ag.node, u.gpu_index, a.cluster,
   COUNT(*) OVER (PARTITION BY u.allocation_id, ag.node) AS node_gpus,
   {g}(a.start_ts, :since) AS a_s, {le}(COALESCE(a.end_ts, :horizon), :horizon) AS a_e, {judge.JOB_KEY} AS jkey,
   tg.has_jobs AS lab
  FROM usage_gpu u JOIN allocated_gpus ag ON ag.id = u.allocated_gpu_id JOIN telemetry_gpus tg ON tg.id = u.gpu_id
  JOIN allocations a ON a.id = u.allocation_id
  WHERE u.run_id = :run AND u.gpu_id IS NOT NULL{_MULTI if multi else ""})
SELECT c.aid, c.gid, c.share, c.node, c.gpu_index, b.bucket_ts, {obs} AS obs, {class_case(th)} AS cls,
 b.sm_active AS sm, {_IO} AS io
FROM c JOIN gpu_buckets b ON b.gpu_id = c.gpu_id AND b.bucket_ts >= c.a_s - {judge.LOOKBACK}
 AND b.bucket_ts < c.a_e AND b.bucket_ts + b.bucket_s > c.a_s{infra.clip(skip, dialect, 'c')}{node_join()}
WHERE {applies}"""


def classes_sql(dialect: str, th: Thresholds, skip: str = "") -> str:
    """Seconds (times share) per allocation and class."""
    return (f"SELECT r.aid, r.cls, SUM(r.share * r.obs) AS s FROM ({rows_sql(dialect, th, skip)}) r "
            "GROUP BY r.aid, r.cls")


def straggler_sql(dialect: str, th: Thresholds, skip: str = "") -> str:
    """Per unit of a lockstep allocation (a node when the allocation spans 2+ nodes, else a GPU): the seconds
    it led and what its peers did meanwhile. A unit is busy in a bucket when it computes (mean SM >=
    working_sm) or its link runs saturated (mean PCIe + NVLink bytes/s per GPU >= straggler_link_bps); it
    leads when it is the one busy unit and every other unit waits (SM below straggler_peer_sm, yet not idle:
    idle GPUs wait on nothing, idle_gpus reports them). Units are compared bucket by bucket, over buckets
    where 2+ units reported SM."""
    unit = "CASE WHEN n.nodes >= 2 THEN r.node ELSE r.node || ':' || CAST(r.gpu_index AS TEXT) END"
    computes = verdict.at_least("s.sm", th.working_sm)  # the verdict's "working" (one definition, verdict.py)
    busy = f"({computes} OR {verdict.at_least('s.io', th.straggler_link_bps)})"
    waits = (f"(NOT {busy} AND {verdict.below('s.sm', th.straggler_peer_sm)}"
             f" AND {verdict.at_least('s.sm', th.idle_sm)})")
    lead = "(t.is_busy = 1 AND t.busy = 1 AND t.waiting = t.units - 1)"
    return f"""WITH r AS ({rows_sql(dialect, th, skip, multi=True)}),
 n AS (SELECT aid, COUNT(DISTINCT node) AS nodes, COUNT(DISTINCT gid) AS gpus FROM r GROUP BY aid),
 s AS (SELECT r.aid, {unit} AS unit, r.bucket_ts, SUM(r.obs * r.sm) / NULLIF(SUM(r.obs), 0) AS sm,
        SUM(r.obs * r.io) / NULLIF(SUM(r.obs), 0) AS io, SUM(r.share * r.obs) AS obs,
        SUM(r.share * r.obs * r.sm) AS smo
       FROM r JOIN n ON n.aid = r.aid WHERE n.gpus >= 2 AND r.sm IS NOT NULL AND r.obs > 0
       GROUP BY r.aid, {unit}, r.bucket_ts),
 f AS (SELECT s.*, CASE WHEN {busy} THEN 1 ELSE 0 END AS is_busy, CASE WHEN {waits} THEN 1 ELSE 0 END AS is_waiting,
        CASE WHEN {computes} THEN 0 ELSE 1 END AS by_link FROM s),
 t AS (SELECT f.*, COUNT(*) OVER w AS units, SUM(f.is_busy) OVER w AS busy, SUM(f.is_waiting) OVER w AS waiting,
        SUM(f.obs) OVER w AS all_obs, SUM(f.smo) OVER w AS all_smo
       FROM f WINDOW w AS (PARTITION BY f.aid, f.bucket_ts))
SELECT t.aid, t.unit, SUM(t.obs) AS unit_obs, SUM(CASE WHEN {lead} THEN t.obs ELSE 0 END) AS lead_obs,
 SUM(CASE WHEN {lead} AND t.by_link = 1 THEN t.obs ELSE 0 END) AS link_obs,
 SUM(CASE WHEN {lead} THEN t.all_obs - t.obs ELSE 0 END) AS held_obs,
 SUM(CASE WHEN {lead} THEN t.smo ELSE 0 END) AS lead_smo,
 SUM(CASE WHEN {lead} THEN t.all_smo - t.smo ELSE 0 END) AS held_smo
FROM t WHERE t.units >= 2 GROUP BY t.aid, t.unit ORDER BY t.aid, t.unit"""


def _blank() -> dict[str, float]:
    return {k: 0.0 for k in CLASSES}


def _most_waiting(a: dict[str, Any]) -> tuple[float, float, int]:
    """The order of the allocations that waited most (:data:`WAIT_CLASSES`), then with the most non-compute
    time (most first, then by id)."""
    h = a["gpu_hours"]
    return -sum(h[k] for k in WAIT_CLASSES), -(sum(h.values()) - h["compute"]), a["allocation_id"]


def breakdown(per_alloc: Iterable[dict[str, Any]], seconds: dict[int, dict[str, float]]) -> dict[str, Any]:
    """The run summary's ``waiting``: GPU-hours per class for the fleet, per cluster, per team and for the
    allocations that waited most (:data:`WAIT_CLASSES`; then the most non-compute time). An allocation's
    not-measured hours are its reserved time less infrastructure time less its classified seconds (never
    below 0)."""
    total, by_cluster, by_team = _blank(), defaultdict(_blank), defaultdict(_blank)

    def each() -> Iterator[dict[str, Any]]:  # one allocation's classes, summed as they pass
        for r in per_alloc:
            got = seconds.get(r["allocation_id"], {})
            h = _blank()
            for k, s in got.items():
                h[k] += s / H
            h["infra"] = (r.get("infra_s") or 0.0) / H
            classified = sum(v for k, v in h.items() if k != "not_measured")
            h["not_measured"] += max(0.0, r["reserved_s"] / H - classified - h["not_measured"])
            for acc in (total, by_cluster[r["cluster"]], by_team[(r["cluster"], r["team"])]):
                for k, v in h.items():
                    acc[k] += v
            yield {"allocation_id": r["allocation_id"], "cluster": r["cluster"], "team": r["team"],
                   "job_id": r["external_id"], "name": r["name"], "reserved_gpu_hours": r["reserved_s"] / H,
                   "gpu_hours": h}

    allocs = heapq.nsmallest(TOP_ALLOCATIONS, each(), key=_most_waiting)  # only the top ones kept
    return {"classes": list(CLASSES), "total": total,
            "by_cluster": [{"cluster": c, "gpu_hours": v} for c, v in sorted(by_cluster.items())],
            "by_team": [{"cluster": c, "team": t, "gpu_hours": v} for (c, t), v in sorted(by_team.items())],
            "allocations": allocs}


def class_seconds(conn: Connection, run_id: int, th: Thresholds, p: dict[str, Any]) -> dict[int, dict[str, float]]:
    """allocation id -> class -> seconds (times share), from the buckets (set-based, one query)."""
    out: dict[int, dict[str, float]] = defaultdict(dict)
    sql = classes_sql(conn.dialect.name, th, infra.skip(conn))
    for aid, cls, s in conn.execute(text(sql), {**p, "run": run_id}):
        out[aid][cls] = float(s or 0.0)
    return out


def stragglers(conn: Connection, run_id: int, rows_of: Callable[[Iterable[int]], dict[int, dict[str, Any]]],
               th: Thresholds, p: dict[str, Any]) -> list[dict[str, Any]]:
    """straggler findings (for operations): a unit that led >= straggler_min_share of its observed time in a
    lockstep allocation and held its peers up for >= straggler_min_gpu_hours GPU-hours."""
    from auditor.audit.evidence import _finding

    rows: dict[int, list[Any]] = defaultdict(list)
    for x in conn.execute(text(straggler_sql(conn.dialect.name, th, infra.skip(conn))), {**p, "run": run_id}):
        rows[x.aid].append(x)
    if not rows:
        return []
    gpus: dict[int, list[tuple[str, int | None]]] = defaultdict(list)
    ids = ", ".join(str(int(a)) for a in sorted(rows))
    for aid, node, idx in conn.execute(text(
            f"SELECT u.allocation_id, ag.node, u.gpu_index FROM usage_gpu u JOIN allocated_gpus ag ON ag.id = "
            f"u.allocated_gpu_id WHERE u.run_id = :run AND u.allocation_id IN ({ids}) ORDER BY u.allocation_id, "
            "ag.node, u.gpu_index"), {"run": run_id}):
        gpus[aid].append((node, idx))
    by_id = rows_of(rows)
    out = []
    for aid, units in rows.items():
        r = by_id.get(aid)
        if r is None:
            continue
        for x in units:
            unit_obs, lead = float(x.unit_obs or 0.0), float(x.lead_obs or 0.0)
            held_h = float(x.held_obs or 0.0) / H
            if unit_obs <= 0 or lead / unit_obs < th.straggler_min_share - verdict.EPS:
                continue
            if held_h < th.straggler_min_gpu_hours - verdict.EPS:
                continue
            node, _, gpu = str(x.unit).partition(":")
            mine = [(n, i) for n, i in gpus[aid] if n == node and (not gpu or str(i) == gpu)]
            peers = [(n, i) for n, i in gpus[aid] if (n, i) not in mine]
            lead_sm = float(x.lead_smo or 0.0) / lead
            held_sm = float(x.held_smo or 0.0) / float(x.held_obs) if x.held_obs else 0.0
            what = f"node {node}" if not gpu else _name((node, gpu))
            link = float(x.link_obs or 0.0)
            doing = (f"computed (SM {lead_sm:.0%})" if link <= 0 else
                     f"computed or ran its link saturated (SM {lead_sm:.0%}; link saturated {link / lead:.0%} "
                     "of that time)")
            held = ", ".join(_name(g) for g in peers[:8]) + (f" and {len(peers) - 8} more" if len(peers) > 8 else "")
            ev = {"rule": (f"{what} {doing} while its {len(peers)} peer GPUs ({held}) waited (SM "
                           f"{held_sm:.0%}) for {lead / unit_obs:.0%} of its observed time: {held_h:.1f} GPU-hours "
                           "held up"),
                  "straggler_node": node, "straggler_gpus": [_name(g) for g in mine],
                  "held_up_gpus": [_name(g) for g in peers], "lead_share": lead / unit_obs,
                  "lead_gpu_hours": lead / H, "held_up_gpu_hours": held_h, "straggler_mean_sm": lead_sm,
                  "held_up_mean_sm": held_sm, "held_up_cost": held_h * r["price"], "link_saturated_share": link / lead}
            out.append(_finding(run_id, "straggler", r, ev, 0.0, p["since"], p["horizon"]))
    return out


def _name(g: tuple[str, Any]) -> str:
    """ "node GPU i" (i unknown: "?")."""
    return f"{g[0]} GPU {g[1] if g[1] is not None else '?'}"


def analyse(conn: Connection, run_id: int, per_alloc: Iterable[dict[str, Any]],
            rows_of: Callable[[Iterable[int]], dict[int, dict[str, Any]]], th: Thresholds,
            p: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the run summary's ``waiting``, straggler findings) of one run: ``per_alloc`` streams its
    per-allocation rows, ``rows_of`` reads those of some ids (:class:`auditor.audit.totals.AllocationRows`)."""
    return breakdown(per_alloc, class_seconds(conn, run_id, th, p)), stragglers(conn, run_id, rows_of, th, p)


def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The ``waiting`` of two disjoint sets of clusters (per-cluster audit processes): sums added, the
    allocations with the most waiting taken again from both parts' first ones."""
    def add(x: dict[str, float], y: dict[str, float]) -> dict[str, float]:
        return {k: x.get(k, 0.0) + y.get(k, 0.0) for k in CLASSES}

    teams: dict[tuple[str, str], dict[str, float]] = {}
    for t in a["by_team"] + b["by_team"]:
        k = (t["cluster"], t["team"])
        teams[k] = add(teams.get(k, _blank()), t["gpu_hours"])
    return {"classes": list(CLASSES), "total": add(a["total"], b["total"]),
            "by_cluster": sorted(a["by_cluster"] + b["by_cluster"], key=lambda c: c["cluster"]),
            "by_team": [{"cluster": c, "team": t, "gpu_hours": v} for (c, t), v in sorted(teams.items())],
            "allocations": heapq.nsmallest(TOP_ALLOCATIONS, a["allocations"] + b["allocations"], key=_most_waiting)}
