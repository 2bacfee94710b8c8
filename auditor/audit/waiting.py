"""Where the waiting goes (docs/definitions.md "Where the waiting goes"): every reserved second of an allocation
in one class, judged with the verdicts (the judging sums :data:`SUMMED`), and the rules of the straggler of a
lockstep job (:mod:`auditor.audit.stragglers` compares its units bucket by bucket).

The classes of one observed bucket, first match wins (the verdict is :mod:`auditor.audit.verdict`'s):

- ``idle``: idle, idle by GPU-Util or mirage;
- ``compute``: compute-bound, SM activity >= working_sm (the verdict "working");
- ``memory``: memory-bound, SM below working_sm and DRAM activity >= hint_dram_high;
- ``communication``: SM below working_sm, DRAM not high, PCIe + NVLink bytes/s >= hint_io_bps;
- ``starved``: SM below working_sm with DRAM and both links measured and quiet: the GPU waits on its host
  (input pipeline, storage, a CPU core); node telemetry would tell which, and is not stored;
- ``not_measured``: a counter the rule needs is absent (no SM activity, or SM low while DRAM or the link
  counters are missing), or no samples at all: never guessed.

Reserved time less infrastructure-affected time less the classified seconds is ``not_measured`` too.
The audit computes it once per run into the run summary (``waiting``); every surface reads it there.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import Connection, text

from auditor.audit import verdict
from auditor.config import Thresholds
from auditor.timeutil import H

#: The classes in report order, with the report's column words (docs/definitions.md says each rule).
CLASSES: dict[str, str] = {
    "compute": "Compute-bound",
    "memory": "Memory-bound",
    "communication": "Communication wait",
    "starved": "Host/input wait",
    "idle": "Idle",
    "not_measured": "Not measured",
    "infra": "Infrastructure",
}
#: Allocations listed in the summary (the most non-compute hours first)
TOP_ALLOCATIONS = 20

#: The classes kept as sums of the judged aggregate and columns ``<class>_s`` of usage_gpu (migration
#: 0020_judged_classes); idle and compute are verdict sums (idle + idle-by-util + mirage, working) and
#: not_measured is what is left of the reserved time.
SUMMED = ("memory", "communication", "starved")

def class_case(th: Thresholds, c: verdict.Col, *, observed: str, io: str, io_measured: str) -> str:
    """The class of one judged row (the table in the module docstring) as an SQL CASE: ``c`` names its
    columns, ``observed`` is true when it has observed seconds, ``io`` is its PCIe + NVLink bytes/s and
    ``io_measured`` is 1 when it read any link counter. The judging (:func:`auditor.audit.judge._judged_cols`)
    gives every row judged its class, and the classes of :data:`SUMMED` are summed with the verdict sums."""
    v = verdict.case(th, c, observed=observed)
    sm, dram = c("sm_active"), c("dram_active")
    return (f"CASE WHEN NOT ({observed}) THEN 'not_measured'"
            f" WHEN {verdict.in_codes(f'({v})', verdict.IDLE_CODES)} THEN 'idle'"
            f" WHEN {sm} IS NULL THEN 'not_measured'"
            f" WHEN {verdict.at_least(sm, th.working_sm)} THEN 'compute'"
            f" WHEN {dram} IS NOT NULL AND {verdict.at_least(dram, th.hint_dram_high)} THEN 'memory'"
            f" WHEN {io_measured} = 1 AND {verdict.at_least(io, th.hint_io_bps)} THEN 'communication'"
            f" WHEN {dram} IS NOT NULL AND {io_measured} = 1 THEN 'starved'"
            " ELSE 'not_measured' END")


def busy(th: Thresholds, sm: str, io: str) -> str:
    """A straggler's unit (or one GPU's row) is busy: it computes (SM activity >= working_sm, the verdict's
    "working") or runs its link saturated (PCIe + NVLink bytes/s >= straggler_link_bps)."""
    return f"({verdict.at_least(sm, th.working_sm)} OR {verdict.at_least(io, th.straggler_link_bps)})"


def waitable(th: Thresholds, sm: str) -> str:
    """SM activity below straggler_peer_sm: a node waits only where one of its GPUs reads so."""
    return verdict.below(sm, th.straggler_peer_sm)


def waits(th: Thresholds, sm: str, io: str) -> str:
    """A straggler's unit (or one GPU's row) waits: not busy, SM activity below straggler_peer_sm and at least
    idle_sm (an idle GPU waits on nothing; idle_gpus reports it)."""
    return f"(NOT {busy(th, sm, io)} AND {waitable(th, sm)} AND {verdict.at_least(sm, th.idle_sm)})"


def _blank() -> dict[str, float]:
    return {k: 0.0 for k in CLASSES}


def breakdown(per_alloc: list[dict[str, Any]], seconds: dict[int, dict[str, float]]) -> dict[str, Any]:
    """The run summary's ``waiting``: GPU-hours per class for the fleet, per cluster, per team and for the
    allocations with the most non-compute time. An allocation's not-measured hours are its reserved time
    less infrastructure time less its classified seconds (never below 0)."""
    total, by_cluster, by_team = _blank(), defaultdict(_blank), defaultdict(_blank)
    allocs = []
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
        allocs.append({"allocation_id": r["allocation_id"], "cluster": r["cluster"], "team": r["team"],
                       "job_id": r["external_id"], "name": r["name"], "reserved_gpu_hours": r["reserved_s"] / H,
                       "gpu_hours": h})
    allocs.sort(key=lambda a: (-(sum(a["gpu_hours"].values()) - a["gpu_hours"]["compute"]), a["allocation_id"]))
    return {"classes": list(CLASSES), "total": total,
            "by_cluster": [{"cluster": c, "gpu_hours": v} for c, v in sorted(by_cluster.items())],
            "by_team": [{"cluster": c, "team": t, "gpu_hours": v} for (c, t), v in sorted(by_team.items())],
            "allocations": allocs[:TOP_ALLOCATIONS]}


def class_seconds(conn: Connection, run_id: int) -> dict[int, dict[str, float]]:
    """allocation id -> class -> seconds (times share), as the judging summed them into usage_gpu (every
    class but not_measured, which :func:`breakdown` computes)."""
    cols = ", ".join(f"SUM(u.{k}_s)" for k in SUMMED)
    sql = (f"SELECT u.allocation_id, SUM(u.idle_s + u.mirage_s), SUM(u.working_s), {cols} FROM usage_gpu u "
           "WHERE u.run_id = :run GROUP BY u.allocation_id")
    names = ("idle", "compute", *SUMMED)
    return {r[0]: {k: float(v or 0.0) for k, v in zip(names, r[1:], strict=True)}
            for r in conn.execute(text(sql), {"run": run_id})}
