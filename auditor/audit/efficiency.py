"""Low efficiency: allocations that worked, but little, with a bottleneck hint."""

from __future__ import annotations

from typing import Any

from auditor.config import Thresholds
from auditor.timeutil import H


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
    pulse = (th.hint_util_pulse_low, th.hint_util_pulse_high)
    if dram >= th.hint_dram_high:
        return "memory-bound", f"DRAM activity {dram:.0%} while SM activity is {sm:.0%}"
    if sm > 0 and tensor >= th.hint_tensor_share * sm and tensor > 0:
        return "compute-bound (tensor)", (f"Tensor activity {tensor:.0%} is most of SM activity {sm:.0%}: "
                                          "small kernels or batches on a big GPU")
    if io >= th.hint_io_bps and dram < th.hint_dram_low:
        return "input/communication wait", (f"PCIe/NVLink {io / 1e9:.1f} GB/s while SM {sm:.0%} and DRAM "
                                            f"{dram:.0%} are low")
    if util is not None and pulse[0] <= util < pulse[1] and dram < th.hint_dram_low:
        return "input wait", (f"all low, GPU-Util pulsing at {util:.0%} duty cycle: the GPU waits for "
                              "input (data loader, host) between bursts")
    if fb >= th.hint_held_mib and (util is None or util < pulse[0]):
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
