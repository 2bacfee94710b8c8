"""Per-team idle budgets (``teams[].idle_budget_gpu_hours``): how many GPU-hours a team may leave idle per
seven days before the weekly report, the web overview and the Prometheus alert ``GpuAuditTeamOverIdleBudget``
(deploy/prometheus-alerts.yml) say it passed its budget.

A budget is per seven days and prorated to the audit window, so a daily audit compares a day's idle hours
with a seventh of it. Idle means what the report's team table calls idle: idle plus mirage GPU-hours (never
unknown, never infrastructure). The report compares the team table's own rows with the budget, and the
metrics endpoint exposes the prorated budget beside the same team figure, so the two surfaces cannot differ.
"""

from __future__ import annotations

from typing import Any

from auditor.config import Config, Team

WEEK_S = 7 * 86400


def budget_gpu_hours(team: Team, window_s: float) -> float | None:
    """The team's idle budget for an audit window of ``window_s`` seconds (None: no budget set)."""
    if team.idle_budget_gpu_hours is None:
        return None
    return team.idle_budget_gpu_hours * window_s / WEEK_S


def team_budgets(cfg: Config, team_rows: list[dict[str, Any]], window_s: float) -> list[dict[str, Any]]:
    """One row per team with a budget, worst first: its idle GPU-hours (from the team table's rows, see
    :func:`auditor.report.context.usage_group_rows`), its budget for this window, the share used and whether
    it passed it. A team with a budget and no allocations in the window is listed at zero."""
    idle = {r["team"]: r["idle_gpu_hours"] for r in team_rows}
    out = []
    for team in cfg.teams:
        budget = budget_gpu_hours(team, window_s)
        if budget is None:
            continue
        used = idle.get(team.name, 0.0)
        out.append({"team": team.name, "idle_gpu_hours": used, "budget_gpu_hours": budget,
                    "share": used / budget if budget > 0 else None, "over": used > budget,
                    "weekly_budget_gpu_hours": team.idle_budget_gpu_hours})
    out.sort(key=lambda r: (-(r["share"] or 0.0), r["team"]))
    return out
