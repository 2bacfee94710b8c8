"""The numbers every finding shows and the finding row itself, shared by the core rules
(:mod:`auditor.audit.findings`) and the finding families."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from auditor.audit import kinds
from auditor.config import Thresholds
from auditor.store.sqlfuncs import sql_names
from auditor.timeutil import H


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def judged(r: dict[str, Any]) -> float:
    """Observed seconds with a verdict: idle (incl. idle-by-util and idle-by-counters), mirage, low, working,
    busy-unverified, busy-by-counters, engine spin, and the SM-idle seconds its own input starved
    (input/storage wait, :mod:`auditor.audit.starved`: not idle)."""
    return (r["idle_s"] + r["mirage_s"] + r["low_s"] + r["working_s"] + r["busy_unverified_s"]
            + r.get("busy_by_counters_s", 0.0) + r.get("engine_spin_s", 0.0) + (r.get("input_wait_s") or 0.0))


def verified(r: dict[str, Any]) -> float:
    """Observed seconds verified by SM activity (idle + mirage + low + working + input wait, idle-by-util and
    idle-by-counters excluded)."""
    return (r["idle_s"] - r["idle_by_util_s"] - r.get("idle_by_counters_s", 0.0) + r["mirage_s"] + r["low_s"]
            + r["working_s"] + (r.get("input_wait_s") or 0.0))


def counters(r: dict[str, Any]) -> float:
    """Observed seconds judged on the stock counters (no SM activity; GR engine with Tensor or DRAM):
    idle-by-counters + busy-by-counters + engine spin."""
    return r.get("idle_by_counters_s", 0.0) + r.get("busy_by_counters_s", 0.0) + r.get("engine_spin_s", 0.0)


def util_only(r: dict[str, Any]) -> float:
    """Observed seconds judged by GPU-Util alone (no profiling fields): idle-by-util + busy-unverified."""
    return r["idle_by_util_s"] + r["busy_unverified_s"]


def tiers(r: dict[str, Any]) -> dict[str, float]:
    """GPU-hours judged on each evidence tier (docs/definitions.md "Evidence tiers"), strongest first."""
    return {"sm_active": verified(r) / H, "counters": counters(r) / H, "gpu_util": util_only(r) / H}


def accountable(r: dict[str, Any]) -> float:
    """Reserved seconds the user answers for: reserved less infrastructure-affected time (a drained node, a
    GPU fault: :mod:`auditor.audit.infra`), which is neither observed nor unknown to them."""
    return r["reserved_s"] - (r.get("infra_s") or 0.0)


def effective(r: dict[str, Any]) -> float:
    """Effective seconds (SM-verified observed seconds x SM activity) of a per-allocation row: the SM sum by
    definition (:func:`auditor.audit.judging.usage_columns`), which the audit's rows carry alone
    (:class:`auditor.audit.totals.AllocationRows`)."""
    return r["sm_s"]


def metrics(r: dict[str, Any]) -> dict[str, Any]:
    """The numbers every finding shows: what the dashboard said next to what SM activity says."""
    return {"reserved_gpu_hours": r["reserved_s"] / H, "observed_gpu_hours": r["observed_s"] / H,
            "coverage": _ratio(r["observed_s"], accountable(r)),
            "infra_gpu_hours": (r.get("infra_s") or 0.0) / H,
            "idle_gpu_hours": r["idle_s"] / H, "idle_by_util_gpu_hours": r["idle_by_util_s"] / H,
            "mirage_gpu_hours": r["mirage_s"] / H, "low_gpu_hours": r["low_s"] / H,
            "working_gpu_hours": r["working_s"] / H, "busy_unverified_gpu_hours": r["busy_unverified_s"] / H,
            "unknown_gpu_hours": r["unknown_s"] / H, "verified_gpu_hours": verified(r) / H,
            "util_only_gpu_hours": util_only(r) / H, "effective_gpu_hours": effective(r) / H,
            "counters_gpu_hours": counters(r) / H,
            "idle_by_counters_gpu_hours": r.get("idle_by_counters_s", 0.0) / H,
            "busy_by_counters_gpu_hours": r.get("busy_by_counters_s", 0.0) / H,
            "engine_spin_gpu_hours": r.get("engine_spin_s", 0.0) / H,
            "mean_gpu_util": _ratio(r["gpu_util_s"], r["util_observed_s"]),
            "mean_sm_active": _ratio(r["sm_s"], r["sm_observed_s"]),
            # the share of it read from DCGM 4.x's SM cycle counters (exact), the rest from sampled SM_ACTIVE
            "sm_exact_share": _ratio(r.get("sm_exact_s") or 0.0, r["sm_observed_s"]),
            "mean_tensor_active": _ratio(r["tensor_s"], r["sm_observed_s"]),
            "mean_dram_active": _ratio(r["dram_s"], r["sm_observed_s"]),
            "peak_fb_mib": r["peak_fb_mib"], "held_while_idle_mib": r.get("idle_peak_fb_mib"),
            "mirage_mean_gpu_util": _ratio(r.get("mirage_util_s") or 0.0, r["mirage_s"]),
            "mirage_mean_power_w": _ratio(r.get("mirage_power_s") or 0.0, r.get("mirage_power_observed_s") or 0.0),
            "gpus": r["gpus"], "gpu_count": r["gpu_count"],
            "low_confidence": r["idle_by_util_s"] > 0 and r["sm_observed_s"] == 0 and counters(r) == 0}


def whole_allocation_finding(r: dict[str, Any], th: Thresholds) -> tuple[str, str] | None:
    """The finding about the whole allocation, if any: ("unmonitored", why) when too little of its reserved
    time had samples, or ("idle", why) when it was idle or mirage most of its observed time. Idle episodes
    and low efficiency skip these allocations (they are already reported)."""
    if accountable(r) <= 0:
        return None  # all of it infrastructure-affected: nothing to say to the user
    coverage = _ratio(r["observed_s"], accountable(r)) or 0.0
    if coverage < th.unmonitored_coverage:
        return "unmonitored", f"coverage {coverage:.0%} < {th.unmonitored_coverage:.0%} (reserved time with samples)"
    idle_frac = _ratio(r["idle_s"] + r["mirage_s"], judged(r)) or 0.0
    if idle_frac >= th.idle_allocation_fraction and r["reserved_s"] / H >= th.idle_allocation_min_gpu_hours:
        return "idle", f"{idle_frac:.0%}"
    return None


def _finding(run_id: int, kind: str, r: dict[str, Any], ev: dict[str, Any], idle_h: float, since: int,
             horizon: int) -> dict[str, Any]:
    start = max(r["start_ts"], since)
    end = min(r["end_ts"] if r["end_ts"] is not None else horizon, horizon)
    return {"run_id": run_id, "kind": kind, "cluster": r["cluster"], "allocation_id": r["allocation_id"],
            "reservation_id": None, "account": r["account"], "user_name": r["user_name"], "team": r["team"],
            "start_ts": start, "end_ts": end, "gpu_hours": r["reserved_s"] / H, "idle_gpu_hours": idle_h,
            "cost": idle_h * r["price"],
            "evidence": {**ev, **metrics(r), "recipient": kinds.audience(kind),
                         "job": {"id": r["external_id"], "name": r["name"],
                                                     "source": r["source"]}}}


def _fn(conn: Connection) -> dict[str, str]:
    return sql_names(conn.dialect.name)


def whole_idle(r: dict[str, Any], th: Thresholds) -> bool:
    """True when :func:`auditor.audit.findings.classify` already reports the whole allocation (unmonitored, or
    idle/mirage for most of its observed time): an episode or low efficiency would say it twice."""
    return accountable(r) <= 0 or whole_allocation_finding(r, th) is not None
