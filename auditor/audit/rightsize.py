"""Right-sizing hint (issue 19 §5): what the allocation's peak memory and mean SM activity would have fit
in, and the money that would have saved. Evidence on its findings, never a finding of its own.

A whole GPU whose peak memory fits a MIG profile's memory and whose mean SM activity fits its compute share
(g of 7 slices) -> the smallest such profile; an allocation of 2+ GPUs whose SM work (mean SM activity x
GPUs) fits fewer GPUs filled to ``thresholds.working_sm`` -> that many GPUs. Means hide bursts: a hint,
not a verdict. GPU memory comes from the model name ("... 80GB ..."); no size in the name: no MIG hint.
"""

from __future__ import annotations

import math
import re
from typing import Any

from auditor.config import PriceCard, Thresholds

H = 3600.0
#: MIG profiles of the A100/H100 families: compute slices of 7, share of the GPU's memory
PROFILES = ((1, 1 / 8), (2, 1 / 4), (3, 1 / 2), (4, 1 / 2))
_GB = re.compile(r"(\d+)\s*GB", re.IGNORECASE)


def model_mib(model: str | None) -> float | None:
    """GPU memory (MiB) from a model name such as "NVIDIA H100 80GB HBM3"; None when it does not say."""
    m = _GB.search(model or "")
    return float(m.group(1)) * 1024 if m else None


def hint(r: dict[str, Any], th: Thresholds, prices: PriceCard) -> dict[str, Any] | None:
    """The right-sizing evidence of one allocation (per_alloc row with its price), or None."""
    if r["sm_observed_s"] <= 0 or r["reserved_s"] <= 0 or r.get("mig_profile") or r.get("peak_fb_mib") is None:
        return None
    sm = r["sm_s"] / r["sm_observed_s"]
    peak = float(r["peak_fb_mib"])
    cost = r["reserved_s"] / H * r["price"]
    out: dict[str, Any] = {"peak_fb_mib": peak, "mean_sm_active": sm}
    mem = model_mib(r.get("gpu_model"))
    if mem is not None:
        for g, frac in PROFILES:
            if peak <= mem * frac + 1e-9 and sm <= g / 7 + 1e-9:
                name = f"{g}g.{round(mem * frac / 1024)}gb"
                mig = {k.lower(): v for k, v in prices.mig.items()}.get(name)
                new = r["reserved_s"] / H * (mig if mig is not None else r["price"] * g / 7)
                out["mig_profile"] = name
                out["mig_saving"] = max(0.0, cost - new)
                break
    n = int(r["gpus"])
    if n >= 2:
        need = max(1, math.ceil(sm * n / th.working_sm - 1e-9))
        if need < n:
            out["fewer_gpus"] = need
            out["fewer_gpus_saving"] = cost * (n - need) / n
    return out if ("mig_profile" in out or "fewer_gpus" in out) else None
