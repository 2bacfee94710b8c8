"""Report tables of issue 19 §5: right-sizing per team (from the run summary) and Slurm request hygiene per
user (from the run's ``request_hygiene`` findings), cut at ``report.top_n`` with totals over all rows."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Connection, text

OPTION_LABELS = {"model": "smaller model", "mig": "MIG profile", "fewer_gpus": "fewer GPUs"}
HYGIENE_KEYS = ("jobs", "jobs_with_limit", "median_runtime_ratio", "p90_runtime_ratio", "gpus_requested",
                "gpus_seen", "gpus_unused", "unused_share", "flags")


def _cut(rows: list[dict[str, Any]], total: int, totals: dict[str, Any], full: bool, top_n: int) -> dict[str, Any]:
    shown = rows if full else rows[:top_n]
    return {"rows": shown, "total": total, "shown": len(shown), "cut": total > len(shown), "totals": totals}


def right_sizing(summary: dict[str, Any], *, full: bool, top_n: int) -> dict[str, Any]:
    """Per team and recommended option (a smaller model, a MIG profile, fewer GPUs): allocations, GPU-hours,
    GPU-hours freed and money saved (:func:`auditor.audit.rightsize.by_team`)."""
    rows = [{**r, "option_label": OPTION_LABELS.get(r.get("option"), r.get("option"))}
            for r in summary.get("right_sizing") or []]
    totals = {k: sum(float(r.get(k) or 0.0) for r in rows) for k in ("gpu_hours", "freed_gpu_hours", "saving")}
    totals["allocations"] = sum(int(r.get("allocations") or 0) for r in rows)
    return _cut(rows, len(rows), totals, full, top_n)


def request_hygiene(conn: Connection, run_id: int, *, full: bool, top_n: int,
                    teams: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Flagged users (request_hygiene findings), costliest unused GPUs first, with their job statistics; and
    ``teams``, the run's per-team rollup over every judged job (``request_hygiene_by_team``)."""
    base = "FROM findings f WHERE f.run_id = :run AND f.kind = 'request_hygiene'"
    sql = ("SELECT f.cluster, f.user_name, f.team, f.gpu_hours, f.idle_gpu_hours, f.cost, f.evidence " + base
           + " ORDER BY f.cost DESC, f.cluster, f.user_name" + ("" if full else f" LIMIT {int(top_n)}"))
    rows = []
    for r in conn.execute(text(sql), {"run": run_id}):
        ev = json.loads(r.evidence) if isinstance(r.evidence, str) else (r.evidence or {})
        rows.append({"cluster": r.cluster, "user": r.user_name, "team": r.team, "gpu_hours": r.gpu_hours,
                     "unused_gpu_hours": r.idle_gpu_hours, "unused_cost": r.cost, "rule": str(ev.get("rule") or ""),
                     **{k: ev.get(k) for k in HYGIENE_KEYS}})
    agg = conn.execute(text("SELECT COUNT(*) AS n, SUM(f.idle_gpu_hours) AS h, SUM(f.cost) AS c " + base),
                       {"run": run_id}).one()
    return {"rows": rows, "total": int(agg.n or 0), "shown": len(rows), "cut": int(agg.n or 0) > len(rows),
            "totals": {"unused_gpu_hours": agg.h or 0.0, "unused_cost": agg.c or 0.0},
            "teams": _cut(list(teams or []), len(teams or []), {}, full, top_n)}
