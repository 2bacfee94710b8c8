"""Energy and carbon of reserved GPU time (issue 19 §4), from the audit's power sums.

Measured: the sum of observed seconds x board power (usage ``energy_s``, joules). Reserved time without a
power reading (no samples, unattributed, or an exporter without the power field) is *estimated* at the
GPU model's idle power (``[energy] idle_power_w``), and the estimate is reported on its own, never mixed
silently into the measured figure. Idle energy is the same for idle, idle-by-util and mirage time. Carbon
= kWh x the cluster's grid intensity (``[energy] grid_gco2_per_kwh``); no intensity configured: no carbon.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

J_PER_KWH = 3.6e6
Watts = Annotated[float, Field(ge=0, le=100_000, allow_inf_nan=False)]
Intensity = Annotated[float, Field(ge=0, le=10_000, allow_inf_nan=False)]
#: per allocation / row: the figures, in this order (chargeback columns, run summary)
KEYS = ("energy_kwh", "energy_estimated_kwh", "idle_energy_kwh", "idle_energy_estimated_kwh", "co2_kg",
        "idle_co2_kg")


class EnergyConfig(BaseModel):
    """Idle power per GPU model (for reserved time without a power reading) and grid carbon intensity."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    idle_power_w: dict[str, Watts] = Field(default_factory=dict, description="Idle board power (W) per GPU "
                                           "model; the key is matched case-insensitively as a substring of "
                                           "the model name, longest first (e.g. {\"H100\" = 70}).")
    default_idle_power_w: Watts = Field(60.0, description="Idle power (W) of a model not listed.")
    grid_gco2_per_kwh: dict[str, Intensity] = Field(default_factory=dict, description="Grid carbon "
                                                    "intensity (gCO2/kWh) per cluster name.")
    default_grid_gco2_per_kwh: Intensity | None = Field(None, description="Intensity of a cluster not "
                                                        "listed; unset = no carbon figure for it.")


def idle_watts(cfg: EnergyConfig, model: str | None) -> float:
    """The configured idle power of ``model`` (longest matching key), else the default."""
    m = (model or "").lower()
    for k, v in sorted(cfg.idle_power_w.items(), key=lambda kv: -len(kv[0])):
        if k and k.lower() in m:
            return v
    return cfg.default_idle_power_w


def intensity(cfg: EnergyConfig, cluster: str) -> float | None:
    return cfg.grid_gco2_per_kwh.get(cluster, cfg.default_grid_gco2_per_kwh)


def energy(r: Mapping[str, Any], cfg: EnergyConfig, model: str | None, cluster: str,
           watts: float | None = None) -> dict[str, float | None]:
    """kWh (measured + estimated) of all reserved and of idle (incl. mirage) time, and kg CO2, of one
    allocation (or a group of one model and cluster) from its usage sums (seconds x share). ``watts``: the
    model's :func:`idle_watts`, where the caller looked it up once for many allocations."""
    w = idle_watts(cfg, model) if watts is None else watts
    est_s = max(0.0, float(r["reserved_s"] or 0) - float(r["power_observed_s"] or 0))
    idle_est_s = max(0.0, float(r["idle_s"] or 0) + float(r["mirage_s"] or 0) - float(r["idle_power_observed_s"] or 0))
    out: dict[str, float | None] = {
        "energy_kwh": (float(r["energy_s"] or 0) + est_s * w) / J_PER_KWH,
        "energy_estimated_kwh": est_s * w / J_PER_KWH,
        "idle_energy_kwh": (float(r["idle_energy_s"] or 0) + idle_est_s * w) / J_PER_KWH,
        "idle_energy_estimated_kwh": idle_est_s * w / J_PER_KWH}
    g = intensity(cfg, cluster)
    out["co2_kg"] = None if g is None else out["energy_kwh"] * g / 1000.0  # type: ignore[operator]
    out["idle_co2_kg"] = None if g is None else out["idle_energy_kwh"] * g / 1000.0  # type: ignore[operator]
    return out


def add(into: dict[str, float | None], part: Mapping[str, float | None]) -> None:
    """Sum ``part`` into ``into``; a carbon figure missing in any part leaves the sum missing (None)."""
    for k in KEYS:
        a, b = into.get(k, 0.0), part[k]
        into[k] = None if a is None or b is None else a + b


class Tally:
    """Run totals and per cluster of :func:`energy`, summed as the rows stream by (:func:`summary`); two tallies
    of disjoint clusters merge into the tally of both (:meth:`merge`)."""

    def __init__(self, cfg: EnergyConfig) -> None:
        self.cfg = cfg
        self.tot: dict[str, float | None] = dict.fromkeys(KEYS, 0.0)
        self.by: dict[str, dict[str, float | None]] = defaultdict(lambda: dict.fromkeys(KEYS, 0.0))
        self.watts: dict[str | None, float] = {}  # per model: idle_watts sorts the table at every call

    def add(self, r: Mapping[str, Any]) -> None:
        model = r.get("gpu_model")
        w = self.watts.get(model)
        if w is None:
            w = self.watts[model] = idle_watts(self.cfg, model)
        e = energy(r, self.cfg, model, r["cluster"], w)
        add(self.tot, e)
        add(self.by[r["cluster"]], e)

    def merge(self, other: Tally) -> None:
        add(self.tot, other.tot)
        for c, v in other.by.items():
            add(self.by[c], v)

    def result(self) -> dict[str, Any]:
        return {**self.tot, "by_cluster": [{"cluster": c, "grid_gco2_per_kwh": intensity(self.cfg, c), **v}
                                           for c, v in sorted(self.by.items())]}

    def __getstate__(self) -> dict[str, Any]:  # picklable (a per-cluster audit process hands it back)
        return {"cfg": self.cfg, "tot": self.tot, "by": dict(self.by), "watts": self.watts}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["cfg"])  # type: ignore[misc]
        self.tot, self.watts = state["tot"], state["watts"]
        self.by.update(state["by"])


def summary(rows: Iterable[Mapping[str, Any]], cfg: EnergyConfig) -> dict[str, Any]:
    """Run totals and per cluster (the run summary and the report's energy section)."""
    t = Tally(cfg)
    for r in rows:
        t.add(r)
    return t.result()
