"""Column comments shared by several tables (kept apart so :mod:`auditor.store.schema` stays readable)."""

from __future__ import annotations

METRIC_COMMENTS = {
    "gpu_util": "NVML GPU-Util as a 0-1 ratio: share of time any kernel ran (the misleading one).",
    "gr_engine": "DCGM GR engine activity, 0-1 (time-based like GPU-Util).",
    "sm_active": "DCGM SM activity, 0-1: share of cycles with a warp resident, averaged over all SMs.",
    "sm_occupancy": "DCGM SM occupancy, 0-1.",
    "tensor_active": "DCGM Tensor pipe activity, 0-1.",
    "dram_active": "DCGM DRAM activity (memory bandwidth busy), 0-1.",
    "fp64_active": "DCGM FP64 pipe activity, 0-1.",
    "fp32_active": "DCGM FP32 pipe activity, 0-1.",
    "fp16_active": "DCGM FP16 pipe activity, 0-1.",
    "fb_used_mib": "Frame buffer memory used, MiB (bucket maximum).",
    "power_w": "Board power draw, W.",
    "pcie_tx_bps": "PCIe transmit, bytes/s.",
    "pcie_rx_bps": "PCIe receive, bytes/s.",
    "nvlink_tx_bps": "NVLink transmit, bytes/s.",
    "nvlink_rx_bps": "NVLink receive, bytes/s.",
}

#: Per-GPU and per-allocation sums of an audit run (usage_gpu, usage_allocation)
HOURS = {
    "reserved_s": "Reserved GPU-seconds in the window (times share).",
    "observed_s": "Reserved GPU-seconds covered by samples (coverage = observed/reserved); SM-verified "
                  "(sm_observed_s) plus GPU-Util-only (idle_by_util_s + busy_unverified_s).",
    "idle_s": "GPU-seconds judged idle (idle-by-util included).",
    "idle_by_util_s": "Of idle_s, judged by the low-confidence GPU-Util fallback.",
    "mirage_s": "GPU-seconds judged mirage: GPU-Util busy, SM activity idle.",
    "low_s": "GPU-seconds judged low (idle_sm <= SM activity < working_sm).",
    "working_s": "GPU-seconds judged working.",
    "busy_unverified_s": "Observed GPU-seconds without SM activity that GPU-Util does not call idle: busy by "
                         "GPU-Util (or no utilization field), work not verifiable.",
    "unknown_s": "GPU-seconds without samples (or unattributed): reserved - observed - infra. Never idle.",
    "effective_s": "Sum of observed seconds x SM activity x share: GPU-seconds of real work.",
    "gpu_util_s": "Sum of observed seconds x GPU-Util (for the mean the dashboard shows).",
    "util_observed_s": "Observed seconds of buckets that had GPU-Util.",
    "sm_s": "Sum of observed seconds x SM activity over buckets that had it.",
    "sm_observed_s": "Observed seconds verified by SM activity (idle + mirage + low + working).",
    "tensor_s": "Sum of observed seconds x Tensor activity.",
    "dram_s": "Sum of observed seconds x DRAM activity.",
    "io_bps_s": "Sum of observed seconds x (PCIe + NVLink bytes/s), for the input/communication-wait hint.",
    "max_gpu_mirage_s": "Longest mirage time of any single GPU (seconds, not share-weighted).",
    "mirage_util_s": "Sum over mirage buckets of observed seconds x GPU-Util (mean GPU-Util while mirage; "
                     "hung_collective, ghost_busy).",
    "mirage_power_s": "Sum over mirage buckets with power of observed seconds x power (W): joules.",
    "mirage_power_observed_s": "Observed mirage seconds that had a power reading.",
    "energy_s": "Sum of observed seconds x power (W) x share: measured joules.",
    "power_observed_s": "Observed seconds that had a power reading (the rest of reserved time is estimated "
                        "from the model's idle power).",
    "idle_energy_s": "Sum over idle, idle-by-util and mirage buckets of observed seconds x power: joules.",
    "idle_power_observed_s": "Idle, idle-by-util and mirage seconds that had a power reading.",
    "infra_s": "Infrastructure-affected GPU-seconds: reserved time inside a node event (XID error, fault "
               "throttling, ECC/row-remap fault, drained/down/NotReady/cordoned node); judged by no other "
               "class, never idle, billed in its own column.",
}

#: The verdict sums of one judged_hours row (auditor.audit.judge.SUMS; seconds are not yet times share)
JUDGED_SUMS = {
    "idle": "Observed seconds judged idle (SM-verified).",
    "idle_by_util": "Observed seconds judged idle by the GPU-Util fallback.",
    "mirage": "Observed seconds judged mirage.",
    "low": "Observed seconds judged low.",
    "working": "Observed seconds judged working.",
    "busy_unverified": "Observed seconds judged busy-unverified (no SM activity, not idle by GPU-Util).",
    "gpu_util": "Sum of observed seconds x GPU-Util.",
    "util_observed": "Observed seconds of rows that had GPU-Util.",
    "sm": "Sum of observed seconds x SM activity.",
    "sm_observed": "Observed seconds of rows that had SM activity.",
    "tensor": "Sum of observed seconds x Tensor activity.",
    "dram": "Sum of observed seconds x DRAM activity.",
    "io_bps": "Sum of observed seconds x (PCIe + NVLink bytes/s).",
    "peak_fb": "Peak frame buffer used in observed rows, MiB.",
    "idle_fb": "Peak frame buffer used in idle, idle-by-util or mirage rows, MiB.",
    "mirage_util": "Sum over mirage rows of observed seconds x GPU-Util.",
    "mirage_power": "Sum over mirage rows of observed seconds x power (W).",
    "mirage_power_observed": "Observed mirage seconds with a power reading.",
    "energy": "Sum of observed seconds x power (W): joules.",
    "power_observed": "Observed seconds with a power reading.",
    "idle_energy": "Sum over idle, idle-by-util and mirage rows of observed seconds x power (W).",
    "idle_power_observed": "Idle, idle-by-util and mirage seconds with a power reading.",
    "memory": "Observed seconds in the class memory-bound (where the waiting goes).",
    "communication": "Observed seconds in the class communication wait (where the waiting goes).",
    "starved": "Observed seconds in the class host/input wait (where the waiting goes).",
    "lead": "Observed seconds of rows with SM activity that computed (SM >= working_sm) or ran the link saturated "
            "(PCIe + NVLink >= straggler_link_bps): when the GPU could lead its lockstep peers (stragglers).",
    "waitable": "Observed seconds of rows with SM activity below straggler_peer_sm (stragglers).",
    "waits": "Observed seconds of rows that wait on a lockstep peer: not computing nor running the link saturated, "
             "idle_sm <= SM activity < straggler_peer_sm (stragglers).",
}

#: usage_gpu columns that usage_allocation does not have: the classes of "where the waiting goes" that are not
#: verdict sums (auditor.audit.waiting.SUMMED; idle and compute are the verdicts' idle, mirage and working
#: seconds) and the straggler rule's candidates (auditor.audit.stragglers.CANDIDATES)
GPU_ONLY = {
    "memory_s": "GPU-seconds memory-bound: SM below working_sm, DRAM activity >= hint_dram_high (times share).",
    "communication_s": "GPU-seconds waiting on communication: SM below working_sm, DRAM not high, PCIe + NVLink "
                       ">= hint_io_bps (times share).",
    "starved_s": "GPU-seconds waiting on the host: SM below working_sm, DRAM and links measured and quiet "
                 "(times share).",
    "lead_s": "GPU-seconds the GPU computed (SM >= working_sm) or ran its link saturated (PCIe + NVLink >= "
              "straggler_link_bps): when it could lead its lockstep peers (times share).",
    "waitable_s": "GPU-seconds with SM activity below straggler_peer_sm (times share).",
    "waits_s": "GPU-seconds the GPU waited on a lockstep peer: not computing nor running its link saturated, "
               "idle_sm <= SM activity < straggler_peer_sm (times share).",
}
