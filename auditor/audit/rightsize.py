"""Right-sizing hint (issue 19 §5): what the allocation's peak memory and mean SM activity would have fit
in, and the money that would have saved. Evidence on its findings, never a finding of its own.

A whole GPU whose peak memory fits a MIG profile's memory and whose mean SM activity fits its compute share
(g of 7 slices) -> the smallest such profile; an allocation of 2+ GPUs whose SM work (mean SM activity x
GPUs) fits fewer GPUs filled to ``thresholds.working_sm`` -> that many GPUs. Means hide bursts: a hint,
not a verdict. GPU memory comes from the model name ("... 80GB ..."), else from :data:`MODEL_MEMORY_GB`;
unknown size: no MIG or model hint; a model without MIG (``mig`` False in the table): no MIG hint.

A smaller model from the site's inventory: the GPU models present in the allocation's cluster
(``gpu_inventory`` and ``telemetry_gpus``), priced by the price card; an allocation of whole GPUs whose mean
SM activity is at most ``RIGHTSIZE_MODEL_MAX_SM`` and whose peak memory fits a model cheaper than
its own -> the cheapest such model, saving its GPU-hours x the price difference. :func:`by_team` rolls the
best option of every allocation that did work up per team (the report's right-sizing table).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from sqlalchemy import Connection, text

from auditor.audit.evidence import whole_idle
from auditor.audit.money import Pricing
from auditor.audit.verdict import EPS
from auditor.config import PriceCard, Thresholds
from auditor.timeutil import H

#: Right-sizing to a smaller model: an allocation whose mean SM activity is at most this (half: it would still
#: fit a GPU with half the SMs) and whose peak memory fits would have fit the cheapest such model in its cluster
#: (docs/definitions.md; a `[thresholds]` setting until issue 45)
RIGHTSIZE_MODEL_MAX_SM = 0.5

#: MIG profiles of the A100/H100 families: compute slices of 7, share of the GPU's memory
PROFILES = ((1, 1 / 8), (2, 1 / 4), (3, 1 / 2), (4, 1 / 2))
_GB = re.compile(r"(\d+)\s*GB", re.IGNORECASE)

#: GPU memory (GB, as NVIDIA's data sheets state it) of models whose name does not say its size, matched as
#: a case-insensitive substring of the model name with spaces, dashes and underscores removed, not followed
#: by a digit ("a10" is not "a100"), longest key first. One definition (docs/definitions.md, right-sizing).
#: Models sold in two sizes (A100 40/80 GB, V100 16/32 GB, A800) are not listed: only a name stating the
#: size is read. Sources: nvidia.com data sheets of B200 (180 GB, DGX B200), H200 (141 GB), H100 SXM/PCIe
#: (80 GB), H100 NVL (94 GB), H20 (96 GB), L40S (48 GB), L40 (48 GB), L4 (24 GB), A40 (48 GB), A30 (24 GB),
#: A10 (24 GB), A16 (16 GB per GPU), A2 (16 GB), T4 (16 GB), RTX 6000 Ada (48 GB), RTX A6000 (48 GB).
MODEL_MEMORY_GB: dict[str, float] = {
    "b200": 180, "h200": 141, "h100nvl": 94, "h100": 80, "h20": 96, "l40s": 48, "l40": 48, "l4": 24, "a40": 48,
    "a30": 24, "a10": 24, "a16": 16, "a2": 16, "t4": 16, "rtx6000ada": 48, "rtxa6000": 48,
}
_KEYS = sorted(MODEL_MEMORY_GB, key=lambda k: -len(k))
#: Families with MIG (NVIDIA MIG user guide: A100, A30, H100, H200, H20, B200, GH200, GB200); others get no
#: MIG hint
_MIG_FAMILIES = ("a100", "a30", "h100", "h200", "h20", "b200", "gh200", "gb200")


def _squash(model: str | None) -> str:
    return re.sub(r"[\s_-]+", "", (model or "").lower())


@lru_cache(maxsize=1024)
def model_mib(model: str | None) -> float | None:
    """GPU memory (MiB) of a model: the size its name states ("NVIDIA H100 80GB HBM3"), else
    :data:`MODEL_MEMORY_GB`; None when neither says. Cached: a site has a handful of model names and the
    audit asks once per allocation."""
    m = _GB.search(model or "")
    if m:
        return float(m.group(1)) * 1024
    name = _squash(model)
    key = next((k for k in _KEYS if re.search(re.escape(k) + r"(?!\d)", name)), None)  # "a10" not in "a100"
    return MODEL_MEMORY_GB[key] * 1024 if key else None


@lru_cache(maxsize=1024)
def has_mig(model: str | None) -> bool:
    """Whether the model supports MIG (A100, A30, H100, H200, H20, B200 families)."""
    name = _squash(model)
    return any(f in name for f in _MIG_FAMILIES)


Option = tuple[str, float, float]  # (model name, memory MiB, price per GPU-hour)


def cluster_models(conn: Connection, pricing: Pricing) -> dict[str, list[Option]]:
    """The site's inventory per cluster: every GPU model gpu_inventory or telemetry_gpus names there whose
    memory is known, with its price-card price."""
    sql = ("SELECT DISTINCT cluster, model FROM gpu_inventory WHERE model IS NOT NULL AND model <> '' UNION "
           "SELECT DISTINCT cluster, model FROM telemetry_gpus WHERE model IS NOT NULL AND model <> ''")
    out: dict[str, list[Option]] = {}
    for r in conn.execute(text(sql)):
        mib = model_mib(r.model)
        if mib is not None:
            out.setdefault(r.cluster, []).append((r.model, mib, pricing.model_price(r.model)))
    return {c: sorted(v, key=lambda o: (o[2], -o[1], o[0])) for c, v in out.items()}


def hint(r: dict[str, Any], th: Thresholds, prices: PriceCard,
         models: list[Option] | None = None) -> dict[str, Any] | None:
    """The right-sizing evidence of one allocation (per_alloc row with its price), or None. ``models``: the
    cluster's inventory (:func:`cluster_models`), cheapest first."""
    if r["sm_observed_s"] <= 0 or r["reserved_s"] <= 0 or r.get("mig_profile") or r.get("peak_fb_mib") is None:
        return None
    sm = r["sm_s"] / r["sm_observed_s"]
    peak = float(r["peak_fb_mib"])
    hours = r["reserved_s"] / H
    cost = hours * r["price"]
    out: dict[str, Any] = {"peak_fb_mib": peak, "mean_sm_active": sm}
    options: list[tuple[float, str, str, float]] = []  # (saving, option, target, freed GPU-hours)
    mem = model_mib(r.get("gpu_model"))
    if mem is not None and has_mig(r.get("gpu_model")):
        for g, frac in PROFILES:
            if peak <= mem * frac + EPS and sm <= g / 7 + EPS:
                name = f"{g}g.{round(mem * frac / 1024)}gb"
                mig = {k.lower(): v for k, v in prices.mig.items()}.get(name)
                new = hours * (mig if mig is not None else r["price"] * g / 7)
                out["mig_profile"] = name
                out["mig_saving"] = max(0.0, cost - new)
                options.append((out["mig_saving"], "mig", name, hours * (1 - g / 7)))
                break
    n = int(r["gpus"])
    if n >= 2:
        need = max(1, math.ceil(sm * n / th.working_sm - EPS))
        if need < n:
            out["fewer_gpus"] = need
            out["fewer_gpus_saving"] = cost * (n - need) / n
            options.append((out["fewer_gpus_saving"], "fewer_gpus", f"{need} of {n} GPUs", hours * (n - need) / n))
    whole = (r.get("gpu_count") or 0) >= n - EPS
    if models and whole and sm <= RIGHTSIZE_MODEL_MAX_SM + EPS:
        fit = [m for m in models if peak <= m[1] + EPS and m[2] < r["price"] - EPS]
        if fit:
            name, _mib, price = fit[0]  # cheapest first
            out["model"] = name
            out["model_saving"] = hours * (r["price"] - price)
            options.append((out["model_saving"], "model", name, hours))
    if not options:
        return None
    saving, option, target, freed = max(options, key=lambda o: (o[0], o[1]))
    out["best"] = {"option": option, "target": target, "saving": saving, "freed_gpu_hours": freed}
    return out


class TeamSizing:
    """:func:`by_team` summed as the rows stream by; two of disjoint allocations merge (:meth:`merge`)."""

    def __init__(self, th: Thresholds, prices: PriceCard, models: dict[str, list[Option]]) -> None:
        self.th, self.prices, self.models = th, prices, models
        self.rows: dict[tuple[str, str, str], dict[str, Any]] = {}

    def add(self, r: dict[str, Any], h: dict[str, Any] | None = None) -> None:
        """One allocation that did work (not reported idle or unmonitored as a whole); ``h``: its
        :func:`hint`, where already known."""
        h = h if h is not None else hint(r, self.th, self.prices, self.models.get(r["cluster"]))
        if h is None:
            return
        b = h["best"]
        k = self.rows.setdefault((r["team"], b["option"], b["target"]), {
            "team": r["team"], "option": b["option"], "recommended": b["target"], "allocations": 0,
            "gpu_hours": 0.0, "freed_gpu_hours": 0.0, "saving": 0.0})
        k["allocations"] += 1
        k["gpu_hours"] += r["reserved_s"] / H
        k["freed_gpu_hours"] += b["freed_gpu_hours"]
        k["saving"] += b["saving"]

    def merge(self, other: TeamSizing) -> None:
        for key, v in other.rows.items():
            k = self.rows.setdefault(key, {**v, "allocations": 0, "gpu_hours": 0.0, "freed_gpu_hours": 0.0,
                                           "saving": 0.0})
            for f in ("allocations", "gpu_hours", "freed_gpu_hours", "saving"):
                k[f] += v[f]

    def result(self) -> list[dict[str, Any]]:
        return sorted(self.rows.values(), key=lambda x: (-x["saving"], x["team"], x["option"], x["recommended"]))


def by_team(per_alloc: Iterable[dict[str, Any]], th: Thresholds, prices: PriceCard,
            models: dict[str, list[Option]], *, working: bool = False) -> list[dict[str, Any]]:
    """Per team and recommended option: the allocations that did work (not reported idle or unmonitored as a
    whole) whose best right-sizing option (largest saving) it is, their reserved GPU-hours, the GPU-hours
    of the current model they would free, and the money saved. Costliest first. ``working``: the rows are
    already only those (:func:`auditor.audit.evidence.whole_idle` was asked once per allocation)."""
    t = TeamSizing(th, prices, models)
    for r in per_alloc:
        if working or not whole_idle(r, th):
            t.add(r)
    return t.result()
