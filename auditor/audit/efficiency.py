"""Low efficiency: allocations that worked, but little, with a bottleneck hint."""

from __future__ import annotations

from typing import Any

from auditor.config import Thresholds
from auditor.timeutil import H

# The bottleneck hints' rule constants (docs/definitions.md "low_efficiency"): fixed by what the counters mean on
# every NVIDIA data-center GPU, not by a site's policy (they were `[thresholds]` settings until issue 45).
#: memory-bound: mean DRAM activity at least this (the memory busy 40 % of the time while the SMs are not)
HINT_DRAM_HIGH = 0.4
#: compute-bound (tensor): mean Tensor activity at least this share of mean SM activity
HINT_TENSOR_SHARE = 0.5
#: input/communication wait: PCIe + NVLink bytes/s at least this (1 GB/s: sustained transfers, not control)...
HINT_IO_BPS = 1e9
#: ...while DRAM activity is below this (low: the chip is not busy with its own memory)
HINT_DRAM_LOW = 0.1
#: input wait: mean GPU-Util at least this (kernels run in bursts)...
HINT_UTIL_PULSE_LOW = 0.1
#: ...and below this (a duty cycle under 90 %: the GPU waited between bursts)
HINT_UTIL_PULSE_HIGH = 0.9
#: memory held, no compute: peak memory at least this (MiB: data loaded, more than a bare CUDA context)
HINT_HELD_MIB = 1024.0


def bottleneck(r: dict[str, Any], th: Thresholds | None = None) -> tuple[str, str]:
    """(hint, why) for a low-efficiency allocation, from the means of the other signals."""
    sm_obs = r["sm_observed_s"]
    sm = r["sm_s"] / sm_obs if sm_obs > 0 else 0.0
    dram = r["dram_s"] / sm_obs if sm_obs > 0 else 0.0
    tensor = r["tensor_s"] / sm_obs if sm_obs > 0 else 0.0
    io = r["io_bps_s"] / r["observed_s"] if r["observed_s"] > 0 else 0.0
    util = r["gpu_util_s"] / r["util_observed_s"] if r["util_observed_s"] > 0 else None
    fb = r.get("peak_fb_mib") or 0.0
    th = th or Thresholds()
    pulse = (HINT_UTIL_PULSE_LOW, HINT_UTIL_PULSE_HIGH)
    if dram >= HINT_DRAM_HIGH:
        return "memory-bound", f"DRAM activity {dram:.0%} while SM activity is {sm:.0%}"
    if sm > 0 and tensor >= HINT_TENSOR_SHARE * sm and tensor > 0:
        return "compute-bound (tensor)", (f"Tensor activity {tensor:.0%} is most of SM activity {sm:.0%}: "
                                          "small kernels or batches on a big GPU")
    if io >= HINT_IO_BPS and dram < HINT_DRAM_LOW and (util is None or util >= pulse[1]):
        # (a GPU-Util duty cycle under pulse[1]: idle part of the time, its mean links the working part's)
        return "input/communication wait", (f"PCIe/NVLink {io / 1e9:.1f} GB/s while SM {sm:.0%} and DRAM "
                                            f"{dram:.0%} are low")
    if util is not None and pulse[0] <= util < pulse[1] and dram < HINT_DRAM_LOW:
        return "input wait", (f"all low, GPU-Util pulsing at {util:.0%} duty cycle: the GPU waits for "
                              "input (data loader, host) between bursts")
    if fb >= HINT_HELD_MIB and (util is None or util < pulse[0]):
        return "memory held, no compute", f"{fb:.0f} MiB held with GPU-Util {util or 0:.0%}"
    return "undetermined", f"SM {sm:.0%}, DRAM {dram:.0%}, Tensor {tensor:.0%}: no signal stands out"


def low_efficiency(run_id: int, working: list[dict[str, Any]], th: Thresholds, since: int,
                   horizon: int) -> list[dict[str, Any]]:
    """Mean SM activity < low_efficiency_sm over >= low_efficiency_min_gpu_hours observed GPU-hours."""
    from auditor.audit.evidence import _finding

    out = []
    for r in working:
        obs_h = r["sm_observed_s"] / H
        if obs_h <= 0 or obs_h < th.low_efficiency_min_gpu_hours:
            continue
        mean_sm = r["sm_s"] / r["sm_observed_s"]
        if mean_sm >= th.low_efficiency_sm:
            continue
        hint, why = bottleneck(r, th)
        ev = {"rule": f"mean SM activity {mean_sm:.0%} < {th.low_efficiency_sm:.0%} over {obs_h:.1f} "
                      f"observed GPU-hours", "hint": hint, "hint_reason": why,
              "unused_sm_gpu_hours": (r["sm_observed_s"] - r["sm_s"]) / H,
              "mean_io_bytes_per_s": r["io_bps_s"] / r["observed_s"] if r["observed_s"] > 0 else None}
        out.append(_finding(run_id, "low_efficiency", r, ev, (r["idle_s"] + r["mirage_s"]) / H, since,
                            horizon))
    return out
