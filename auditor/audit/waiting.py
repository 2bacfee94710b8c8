"""Where the waiting goes (docs/definitions.md "Where the waiting goes"): every reserved second of an allocation
in one class, and the rules of the straggler of a lockstep job (:mod:`auditor.audit.stragglers` compares its
units bucket by bucket).

The classes of one observed bucket, first match wins (the verdict is :mod:`auditor.audit.verdict`'s):

- ``idle``: idle, idle by GPU-Util or mirage;
- ``compute``: compute-bound, SM activity >= working_sm (the verdict "working");
- ``memory``: memory-bound, SM below working_sm and DRAM activity >= hint_dram_high;
- ``communication``: SM below working_sm, DRAM not high, PCIe + NVLink bytes/s >= hint_io_bps, GPU-Util (where
  measured) >= hint_util_pulse_high (a lower duty cycle: the GPU was idle part of the bucket);
- then, SM below working_sm with DRAM and the links measured and quiet, the GPU waits on its host
  (:func:`class_case` says ``starved``), and the node's host bucket (node telemetry, :func:`node_join`,
  :func:`host_case`) says on what: ``storage`` (input/storage wait: I/O wait, a saturated disk, NFS or Lustre
  reads high), ``communication`` (InfiniBand busy), ``host`` (host-bound: a pegged CPU core per GPU), else
  ``starved`` (other host/input wait: no node bucket, or its counters show none of these; never guessed);
- ``not_measured``: a counter the rule needs is absent (no SM activity, or SM low while DRAM or the link
  counters are missing), or no samples at all: never guessed.

The GPU-side classes are judged with the verdicts, bucket by bucket, and summed with them (:data:`SUMMED`,
kept in the judged aggregate and in usage_gpu); the host side refines only the starved seconds
(:mod:`auditor.audit.hostwait`), because its host-bound rule needs the allocation's GPUs on the node.
Reserved time less infrastructure-affected time less the classified seconds is ``not_measured`` too.
The audit computes it once per run into the run summary (``waiting``); every surface reads it there.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

from sqlalchemy import Connection, text

from auditor.audit import verdict
from auditor.audit.efficiency import HINT_DRAM_HIGH, HINT_IO_BPS, HINT_UTIL_PULSE_HIGH
from auditor.config import Thresholds
from auditor.timeutil import H

# Where the waiting goes: the rule constants (docs/definitions.md; `[thresholds]` settings until issue 45), fixed
# by what the counters mean on any node, not by a site's policy.
#: straggler: the other nodes (or GPUs) of a lockstep job count as waiting when their SM activity is below this
#: (and not idle) while one computes (SM at least working_sm)
STRAGGLER_PEER_SM = 0.25
#: straggler: a node (or GPU) whose PCIe + NVLink bytes/s per GPU reach this (20 GB/s) runs its link
#: saturated: busy, like one that computes, while its peers wait
STRAGGLER_LINK_BPS = 2e10
#: input/storage wait: a quiet GPU's node has at least this share of its cores in I/O wait...
HOST_IOWAIT_SHARE = 0.05
#: ...or its busiest local disk had I/O in flight at least this share of the bucket...
HOST_DISK_BUSY = 0.8
#: ...or it read at least this many bytes/s from NFS or Lustre (100 MB/s)...
HOST_FS_READ_BPS = 1e8
#: ...or made at least this many NFS requests/s
HOST_NFS_OPS = 1000.0
#: communication wait: the node's InfiniBand ports move at least this many bytes/s (received + transmitted)
HOST_IB_BPS = 1e9
#: host-bound: the node has at least this many pegged CPU cores per GPU the allocation holds there (a data
#: loader core per GPU, all busy)
HOST_PEGGED_PER_GPU = 1.0

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
#: A waiting class of a job at least this many GPU-hours names it among the jobs that waited most
WAIT_LISTED = 0.05

#: The classes kept as sums of the judged aggregate and columns ``<class>_s`` of usage_gpu (migration
#: 0023_judged_classes); idle and compute are verdict sums (idle + idle-by-util + mirage, working) and
#: not_measured is what is left of the reserved time.
SUMMED = ("memory", "communication", "starved")


def class_case(th: Thresholds, c: verdict.Col, *, observed: str, io: str, io_measured: str) -> str:
    """The class of one judged row (the table in the module docstring) as an SQL CASE: ``c`` names its
    columns, ``observed`` is true when it has observed seconds, ``io`` is its PCIe + NVLink bytes/s and
    ``io_measured`` is 1 when it read any link counter. The judging (:func:`auditor.audit.judging._judged_cols`)
    gives every row judged its class, and the classes of :data:`SUMMED` are summed with the verdict sums."""
    v = verdict.case(th, c, observed=observed)
    sm, dram, util = c("sm_active"), c("dram_active"), c("gpu_util")
    # a bucket whose GPU-Util duty cycle is under hint_util_pulse_high was idle part of the time: its mean
    # link traffic is the working part's, never a communication wait (issue 44: a half-idle, half-working
    # bucket read as one); it waits on its host (starved) when DRAM and the links are measured
    return (f"CASE WHEN NOT ({observed}) THEN 'not_measured'"
            f" WHEN {verdict.in_codes(f'({v})', verdict.IDLE_CODES)} THEN 'idle'"
            f" WHEN {sm} IS NULL THEN 'not_measured'"
            f" WHEN {verdict.at_least(sm, th.working_sm)} THEN 'compute'"
            f" WHEN {dram} IS NOT NULL AND {verdict.at_least(dram, HINT_DRAM_HIGH)} THEN 'memory'"
            f" WHEN {io_measured} = 1 AND {verdict.at_least(io, HINT_IO_BPS)} AND ({util} IS NULL"
            f" OR {verdict.at_least(util, HINT_UTIL_PULSE_HIGH)}) THEN 'communication'"
            f" WHEN {dram} IS NOT NULL AND {io_measured} = 1 THEN 'starved'"
            " ELSE 'not_measured' END")


def host_case(th: Thresholds, n: str = "n", node_gpus: str = "c.node_gpus") -> str:
    """What a quiet GPU waits on, from its node's host row ``n`` (NULL columns: that counter not measured, so
    that cause is never concluded): 'storage', 'communication' (InfiniBand), 'host', else 'starved'.
    ``node_gpus``: the GPUs the allocation holds on the node (the host-bound rule's per-GPU cores)."""
    storage = " OR ".join([
        verdict.at_least(f"{n}.cpu_iowait / NULLIF({n}.cpus, 0)", HOST_IOWAIT_SHARE),
        verdict.at_least(f"{n}.disk_busy", HOST_DISK_BUSY),
        verdict.at_least(f"{n}.nfs_read_bps", HOST_FS_READ_BPS),
        verdict.at_least(f"{n}.lustre_read_bps", HOST_FS_READ_BPS),
        verdict.at_least(f"{n}.nfs_ops", HOST_NFS_OPS)])
    ib = verdict.at_least(f"(COALESCE({n}.ib_rx_bps, 0) + COALESCE({n}.ib_tx_bps, 0))", HOST_IB_BPS)
    pegged = verdict.at_least(f"{n}.cpu_pegged / NULLIF({node_gpus}, 0)", HOST_PEGGED_PER_GPU)
    return (f"CASE WHEN {storage} THEN 'storage' WHEN {ib} THEN 'communication' WHEN {pegged} THEN 'host'"
            " ELSE 'starved' END")


def node_join(b: str = "b", cluster: str = "c.cluster", node: str = "c.node", n: str = "n") -> str:
    """The one join of a GPU bucket row ``b`` to its node's host row ``n`` (node_buckets): same cluster and
    node, same bucket start and length (a rolled-up hour meets a rolled-up hour). LEFT: no host row leaves
    ``n``'s columns NULL, which no host rule concludes from."""
    return (f" LEFT JOIN node_buckets {n} ON {n}.cluster = {cluster} AND {n}.node = {node}"
            f" AND {n}.start_ts = {b}.bucket_ts AND {n}.seconds = {b}.bucket_s")


def busy(th: Thresholds, sm: str, io: str) -> str:
    """A straggler's unit (or one GPU's row) is busy: it computes (SM activity >= working_sm, the verdict's
    "working") or runs its link saturated (PCIe + NVLink bytes/s >= straggler_link_bps)."""
    return f"({verdict.at_least(sm, th.working_sm)} OR {verdict.at_least(io, STRAGGLER_LINK_BPS)})"


def waitable(th: Thresholds, sm: str) -> str:
    """SM activity below straggler_peer_sm: a node waits only where one of its GPUs reads so."""
    return verdict.below(sm, STRAGGLER_PEER_SM)


def waits(th: Thresholds, sm: str, io: str) -> str:
    """A straggler's unit (or one GPU's row) waits: not busy, SM activity below straggler_peer_sm and at least
    idle_sm (an idle GPU waits on nothing; idle_gpus reports it)."""
    return f"(NOT {busy(th, sm, io)} AND {waitable(th, sm)} AND {verdict.at_least(sm, th.idle_sm)})"


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
    # the jobs that waited (a class of WAIT_CLASSES at the report's 0.05 GPU-h or more): how many and their
    # waiting GPU-hours, so a report listing the TOP_ALLOCATIONS kept can say how many it leaves out
    waited = {"jobs": 0, "gpu_hours": 0.0}

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
            waits = [h[k] for k in WAIT_CLASSES if h[k] >= WAIT_LISTED]
            if waits:
                waited["jobs"] += 1
                waited["gpu_hours"] += sum(waits)
            yield {"allocation_id": r["allocation_id"], "cluster": r["cluster"], "team": r["team"],
                   "job_id": r["external_id"], "name": r["name"], "reserved_gpu_hours": r["reserved_s"] / H,
                   "gpu_hours": h}

    allocs = heapq.nsmallest(TOP_ALLOCATIONS, each(), key=_most_waiting)  # only the top ones kept
    return {"classes": list(CLASSES), "total": total,
            "by_cluster": [{"cluster": c, "gpu_hours": v} for c, v in sorted(by_cluster.items())],
            "by_team": [{"cluster": c, "team": t, "gpu_hours": v} for (c, t), v in sorted(by_team.items())],
            "allocations": allocs, "waited_jobs": waited["jobs"], "waited_gpu_hours": waited["gpu_hours"]}


def class_seconds(conn: Connection, run_id: int, allocation_id: int | None = None) -> dict[int, dict[str, float]]:
    """allocation id -> class -> seconds (times share), as the judging summed them into usage_gpu (every
    class but not_measured, which :func:`breakdown` computes; ``storage`` holds only the starved GPUs'
    input wait so far, :func:`auditor.audit.hostwait.refine` adds the quiet GPUs' to it)."""
    cols = ", ".join(f"SUM(u.{k}_s)" for k in SUMMED)
    one = " AND u.allocation_id = :aid" if allocation_id is not None else ""  # one job (its view)
    sql = (f"SELECT u.allocation_id, SUM(u.idle_s + u.mirage_s), SUM(u.working_s), {cols}, SUM(u.input_wait_s) "
           f"FROM usage_gpu u WHERE u.run_id = :run{one} GROUP BY u.allocation_id")
    # a GPU its own job's input starved (auditor.audit.starved: SM ~0, the job's storage or input cores busy
    # on a node it held whole) is input/storage wait, never idle
    names = ("idle", "compute", *SUMMED, "storage")
    return {r[0]: {k: float(v or 0.0) for k, v in zip(names, r[1:], strict=True)}
            for r in conn.execute(text(sql), {"run": run_id, "aid": allocation_id})}


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
            "allocations": heapq.nsmallest(TOP_ALLOCATIONS, a["allocations"] + b["allocations"], key=_most_waiting),
            "waited_jobs": a.get("waited_jobs", 0) + b.get("waited_jobs", 0),
            "waited_gpu_hours": a.get("waited_gpu_hours", 0.0) + b.get("waited_gpu_hours", 0.0)}
