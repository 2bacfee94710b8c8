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

#: gpu_buckets columns beside the metrics: how a metric was measured
EXACT_COMMENTS = {
    "sm_exact": "Share of the row's SM activity taken from DCGM 4.x's SM cycle counters (exact: their increase over "
                "the bucket) instead of sampled SM_ACTIVE readings: 1 or 0 as collected, the observed-seconds "
                "weighted share in a rolled-up hour; NULL without SM activity.",
}

#: Per-GPU and per-allocation sums of an audit run (usage_gpu, usage_allocation)
HOURS = {
    "reserved_s": "Reserved GPU-seconds in the window (times share).",
    "observed_s": "Reserved GPU-seconds covered by samples (coverage = observed/reserved); SM-verified "
                  "(sm_observed_s) plus stock counters (idle_by_counters_s + busy_by_counters_s + engine_spin_s) "
                  "plus GPU-Util-only (idle_by_util_s + busy_unverified_s).",
    "idle_s": "GPU-seconds judged idle (idle-by-util and idle-by-counters included).",
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
    "sm_exact_s": "Of sm_observed_s, the seconds whose SM activity is exact: taken from DCGM 4.x's SM cycle "
                  "counters, not sampled (times share).",
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
    "idle_by_counters_s": "Of idle_s, judged on the stock counters (no SM activity): GR engine, Tensor and DRAM "
                          "activity all below their idle thresholds.",
    "busy_by_counters_s": "GPU-seconds judged busy on the stock counters (no SM activity): Tensor or DRAM "
                          "activity at or above its idle threshold.",
    "engine_spin_s": "GPU-seconds judged an engine spin on the stock counters (no SM activity): GR engine busy, "
                     "Tensor and DRAM idle; a spin or a wait, never verified work, not billed as idle.",
    "infra_s": "Infrastructure-affected GPU-seconds: reserved time inside a node event (XID error, fault "
               "throttling, ECC/row-remap fault, drained/down/NotReady/cordoned node); judged by no other "
               "class, never idle, billed in its own column.",
}

#: The HOURS columns a migration added to usage_gpu and usage_allocation after 0001 (0005, 0007, 0008, 0033,
#: 0036): they carry the server default 0 the migration gave them (for the rows already there), so a store
#: created from the models is the same as one built by the migrations (tests/test_store_create.py)
HOURS_ADDED = frozenset({
    "busy_unverified_s", "mirage_util_s", "mirage_power_s", "mirage_power_observed_s", "energy_s",
    "power_observed_s", "idle_energy_s", "idle_power_observed_s", "infra_s", "sm_exact_s", "idle_by_counters_s",
    "busy_by_counters_s", "engine_spin_s"})

#: usage_gpu and usage_allocation columns of the starved-GPU pass (auditor.audit.starved, migration
#: 0035_starved_gpus): written after the judging, so the INSERT of the judging leaves them at their server default
STARVED = {
    "input_wait_s": "GPU-seconds SM-idle while the job's own input was busy (input/storage wait, GPU starved): "
                    "the node's host read storage busy or pegged cores and the evidence is the job's own (it held "
                    "the whole node). Reserved time that did no math, never idle: taken out of idle_s (times share).",
    "host_busy_idle_s": "Of idle_s, GPU-seconds SM-idle while the node's host read its input busy on a node the "
                        "job shared (the activity could be another job's): still idle, never acted on (times "
                        "share).",
}

#: The verdict sums of one judged_hours row (auditor.audit.judging.SUMS; seconds are not yet times share)
JUDGED_SUMS = {
    "idle": "Observed seconds judged idle (SM-verified).",
    "idle_by_util": "Observed seconds judged idle by the GPU-Util fallback.",
    "mirage": "Observed seconds judged mirage.",
    "low": "Observed seconds judged low.",
    "working": "Observed seconds judged working.",
    "busy_unverified": "Observed seconds judged busy-unverified (no SM activity, not idle by GPU-Util).",
    "idle_by_counters": "Observed seconds judged idle on the stock counters (GR engine, Tensor, DRAM idle).",
    "busy_by_counters": "Observed seconds judged busy on the stock counters (Tensor or DRAM active).",
    "engine_spin": "Observed seconds judged an engine spin on the stock counters (GR engine busy, Tensor and DRAM "
                   "idle).",
    "gpu_util": "Sum of observed seconds x GPU-Util.",
    "util_observed": "Observed seconds of rows that had GPU-Util.",
    "sm": "Sum of observed seconds x SM activity.",
    "sm_observed": "Observed seconds of rows that had SM activity.",
    "sm_exact": "Of sm_observed, the seconds whose SM activity came from DCGM 4.x's SM cycle counters (exact).",
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
