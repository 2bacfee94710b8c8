"""The oracle's money and finding rules (definitions "Money" and "Findings"), plain Python; see tests/oracle.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

from auditor.audit.findings import HUNG_GPU_UTIL, HUNG_HELD_MIB, HUNG_MAX_POWER_W
from auditor.audit.ghosts import GHOST_GPU_UTIL, GHOST_MAX_FB_MIB
from auditor.config import PriceCard, Thresholds
from auditor.records import Allocation

if TYPE_CHECKING:
    from oracle import GpuResult

EPS = 1e-9
HOUR = 3600


def lt(v: float, t: float) -> bool:
    return v < t - EPS


def ge(v: float, t: float) -> bool:
    return v >= t - EPS


def price(card: PriceCard, a: Allocation) -> float:
    """Per full-GPU-hour: a listed MIG profile's slice price / share, else the model's price (longest
    case-insensitive substring key), else the default. The generator gives one model/profile/share per job."""
    g = a.gpus[0]
    share = sum(x.share for x in a.gpus) / len(a.gpus)
    mig = {k.lower(): v for k, v in card.mig.items()}
    if g.mig_profile and g.mig_profile.lower() in mig and share > 0:
        return mig[g.mig_profile.lower()] / share
    model = (g.model or "").lower()
    for k, v in sorted(card.models.items(), key=lambda kv: -len(kv[0])):
        if k and k.lower() in model:
            return v
    return card.default


class _Cmp:
    """Threshold comparisons of the finding rules; remembers a value within rounding of its threshold."""

    def __init__(self) -> None:
        self.near = False

    def _n(self, v: float, t: float) -> None:
        if abs(v - t) <= 1e-7 * max(1.0, abs(t)):
            self.near = True

    def ge(self, v: float, t: float) -> bool:
        self._n(v, t)
        return ge(v, t)

    def lt(self, v: float, t: float) -> bool:
        self._n(v, t)
        return lt(v, t)


def findings(tot: dict[str, float], gpus: list[GpuResult], th: Thresholds,
             min_h: float) -> tuple[set[str], bool]:
    """The core finding kinds of one allocation (definitions "Findings"). CHOICE (as the code today):
    unmonitored, idle_allocation (or its util_mirage form) are the only finding when they apply."""
    c = _Cmp()
    kinds = _findings(tot, gpus, th, c)
    if kinds and c.lt(tot["reserved"] / HOUR, min_h):
        kinds = set()
    return kinds, c.near


def _mirage(tot: dict[str, float], gpus: list[GpuResult], th: Thresholds, c: _Cmp) -> str:
    """Which mirage (definitions "Findings": ghost_busy, then hung_collective, else util_mirage)."""
    util = sum(g.mirage_util for g in gpus) / tot["mirage"] if tot["mirage"] > 0 else 0.0
    helds = [g.held for g in gpus if g.held is not None]
    held = max(helds) if helds else None
    # held is a maximum of raw readings (no rounding): compared without the near-threshold guard
    if c.ge(util, GHOST_GPU_UTIL) and held is not None and ge(GHOST_MAX_FB_MIB, held):
        return "ghost_busy"
    p_obs = sum(g.mirage_power_obs for g in gpus)
    power = sum(g.mirage_power for g in gpus) / p_obs if p_obs > 0 else None
    if len(gpus) >= 2 and c.ge(util, HUNG_GPU_UTIL) and power is not None and \
            c.ge(HUNG_MAX_POWER_W, power) and held is not None and ge(held, HUNG_HELD_MIB):
        return "hung_collective"
    return "util_mirage"


def _judged(t: dict[str, float]) -> float:
    return (t["idle"] + t["mirage"] + t["low"] + t["working"] + t["busy_unverified"] + t.get("input_wait", 0.0)
            + t["busy_by_counters"] + t["engine_spin"])


def _findings(tot: dict[str, float], gpus: list[GpuResult], th: Thresholds, c: _Cmp) -> set[str]:
    # infrastructure-affected time is the operator's: coverage is over the rest of the reserved time
    mine = tot["reserved"] - tot.get("infra", 0.0)
    if mine <= 0:
        return set()
    if c.lt(tot["observed"] / mine, th.unmonitored_coverage):
        return {"unmonitored"}
    j = _judged(tot)
    idle_share = (tot["idle"] + tot["mirage"]) / j if j > 0 else 0.0
    max_mirage = max(g.mirage_raw for g in gpus)
    mirage_long = c.ge(max_mirage, th.mirage_min_minutes * 60)
    if c.ge(idle_share, th.idle_allocation_fraction) and c.ge(tot["reserved"] / HOUR,
                                                             th.idle_allocation_min_gpu_hours):
        if mirage_long and tot["mirage"] > tot["idle"]:
            return {_mirage(tot, gpus, th, c)}
        return {"idle_allocation"}
    out = {_mirage(tot, gpus, th, c)} if mirage_long else set()
    if len(gpus) >= 2:
        worked = getattr(th, "idle_gpus_worked_fraction", 0.5)
        idle = busy = 0
        for g in gpus:
            s = g.sums()
            gj = _judged(s)
            g_mine = s["reserved"] - s.get("infra", 0.0)
            if gj <= 0 or c.lt(s["observed"] / g_mine if g_mine > 0 else 0.0, th.unmonitored_coverage):
                continue
            if c.ge((s["idle"] + s["mirage"]) / gj, th.idle_gpus_fraction):
                idle += 1
            elif c.ge((s["low"] + s["working"] + s["busy_unverified"] + s.get("input_wait", 0.0) + s["busy_by_counters"]
                      + s["engine_spin"]) / gj, worked):
                busy += 1
        if idle and busy:
            out.add("idle_gpus")
    return out
