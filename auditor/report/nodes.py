"""The "nodes that cost us" section of the report: nodes with infrastructure events (a GPU fault, a
drained, down, NotReady or cordoned node), the reserved time those made infrastructure-affected and what it
cost; lemon nodes (repeated faults) flagged. Read from the run's summary (:mod:`auditor.audit.infra`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from auditor.audit.infra import LEMON_MIN_FAULTS

KIND_WORDS = {"xid": "XID error", "throttle": "fault throttling", "ecc_dbe": "ECC double-bit error",
              "row_remap": "row remapping", "drain": "drained", "down": "down", "not_ready": "NotReady",
              "cordoned": "cordoned"}


def nodes_section(summary: dict[str, Any], th: dict[str, Any], when: Callable[[int | None], str | None], *,
                  full: bool, top_n: int) -> dict[str, Any]:
    """Rows most expensive first, cut at ``top_n`` (``full``: all), with totals over all of them."""
    every = list(summary.get("infra_nodes") or [])
    rows = []
    for r in every if full else every[:top_n]:
        rows.append({**r, "start": when(r.get("start_ts")), "end": when(r.get("end_ts")),
                     "kinds": ", ".join(f"{n} x {KIND_WORDS.get(k, k)}" for k, n in r["faults_by_kind"].items())})
    totals = {"faults": sum(r["faults"] for r in every), "lemons": sum(1 for r in every if r["lemon"]),
              "infra_gpu_hours": sum(r["infra_gpu_hours"] for r in every), "cost": sum(r["cost"] for r in every)}
    return {"rows": rows, "total": len(every), "shown": len(rows), "cut": len(every) > len(rows), "totals": totals,
            "lemon_min_faults": LEMON_MIN_FAULTS}
