"""The thresholds of the verdict and the finding rules (``[thresholds]``; docs/definitions.md says what
each one decides). One model, used by every rule and recorded with each audit run."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from auditor.config.base import Strict

#: Node event kinds (:data:`auditor.records.NODE_EVENT_KINDS`)
InfraKind = Literal["xid", "throttle", "ecc_dbe", "row_remap", "drain", "down", "not_ready", "cordoned"]


class Thresholds(Strict):
    """Verdict and finding rules (docs/definitions.md). Comparisons use a 1e-9 tolerance: a value exactly at
    a threshold is not below it, even after a unit conversion."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    idle_sm: float = Field(0.05, ge=0, le=1, description="SM activity below this is idle.")
    idle_dram: float = Field(0.05, ge=0, le=1, description="...and DRAM activity below this.")
    idle_tensor: float = Field(0.01, ge=0, le=1, description="...and Tensor activity below this.")
    mirage_gpu_util: float = Field(0.5, ge=0, le=1, description="An idle bucket whose GPU-Util (0-1) is "
                                   "at least this is a mirage: reads busy, does no work.")
    mirage_gr_engine: float = Field(0.5, ge=0, le=1, description="...or whose GR engine activity is.")
    working_sm: float = Field(0.5, ge=0, le=1, description="SM activity at or above this is working; "
                              "between idle_sm and this is low.")
    util_fallback: bool = Field(True, description="Judge GPUs without profiling fields by GPU-Util "
                                "(low-confidence verdict idle-by-util). Off: such buckets are "
                                "busy_unverified (observed, never idle).")
    idle_util: float = Field(0.05, ge=0, le=1, description="Fallback: GPU-Util below this is idle-by-util.")
    idle_power_w: float | None = Field(None, ge=0, description="Fallback: and power below this (W); "
                                       "unset = power not required.")
    idle_allocation_fraction: float = Field(0.8, ge=0, le=1, description="idle_allocation: share of "
                                            "observed reserved time that is idle or mirage.")
    idle_allocation_min_gpu_hours: float = Field(1.0, ge=0, description="idle_allocation: minimum "
                                                 "reserved GPU-hours.")
    idle_gpus_fraction: float = Field(0.8, ge=0, le=1, description="idle_gpus: a GPU idle this share of "
                                      "its observed time while another GPU of the allocation works.")
    idle_gpus_worked_fraction: float = Field(0.5, ge=0, le=1, description="idle_gpus: a GPU counts as "
                                             "busy when low, working or busy-unverified this share of its "
                                             "observed time.")
    mirage_min_minutes: float = Field(30, ge=0, description="util_mirage (and hung_collective, ghost_busy): "
                                      "minimum mirage minutes of one GPU.")
    hung_gpu_util: float = Field(0.9, ge=0, le=1, description="hung_collective: mean GPU-Util (0-1) over the "
                                 "mirage time at least this...")
    hung_max_power_w: float = Field(150.0, ge=0, description="...mean power over the mirage time at most this "
                                    "(W, near idle; no power reading: not hung)...")
    hung_held_mib: float = Field(1024.0, ge=0, description="...memory held while idle or mirage at least this "
                                 "(MiB), in an allocation of 2 or more GPUs: a hung collective (NCCL).")
    ghost_gpu_util: float = Field(0.9, ge=0, le=1, description="ghost_busy: mean GPU-Util over the mirage time "
                                  "at least this...")
    ghost_max_fb_mib: float = Field(16.0, ge=0, description="...while at most this much memory (MiB) was used "
                                    "in idle and mirage time: no process, a driver or hardware state.")
    unmonitored_coverage: float = Field(0.5, ge=0, le=1, description="unmonitored: observed share of "
                                        "reserved time below this.")
    episode_hours: float = Field(2.0, gt=0, description="idle_episode: minimum contiguous idle span.")
    low_efficiency_sm: float = Field(0.25, ge=0, le=1, description="low_efficiency: mean SM activity "
                                     "below this.")
    low_efficiency_min_gpu_hours: float = Field(4.0, ge=0, description="low_efficiency: minimum observed "
                                                "GPU-hours.")
    queue_min_idle_gpu_hours: float = Field(1.0, ge=0, description="idle_while_queued: minimum idle GPU-hours "
                                            "of an allocation while GPU jobs of its partition waited.")
    idle_quota_min_gpus: float = Field(1.0, ge=0, description="idle_quota: minimum unused GPUs of a quota "
                                       "(quota - average GPUs in use)...")
    idle_quota_fraction: float = Field(0.5, ge=0, le=1, description="...and minimum unused share of the "
                                       "quota.")
    min_finding_gpu_hours: float = Field(0.1, ge=0, description="Findings about fewer reserved GPU-hours "
                                         "than this are not listed (e.g. unmonitored 9-second array tasks).")
    hint_dram_high: float = Field(0.4, ge=0, le=1, description="low_efficiency hint memory-bound: mean DRAM "
                                  "activity at least this.")
    hint_tensor_share: float = Field(0.5, ge=0, description="...compute-bound (tensor): mean Tensor activity "
                                     "at least this share of mean SM activity.")
    hint_io_bps: float = Field(1e9, ge=0, description="...input/communication wait: PCIe + NVLink bytes/s at "
                               "least this while DRAM is below hint_dram_low.")
    hint_dram_low: float = Field(0.1, ge=0, le=1, description="...DRAM activity below this counts as low.")
    hint_util_pulse_low: float = Field(0.1, ge=0, le=1, description="...input wait: mean GPU-Util at least "
                                       "this (kernels in bursts)...")
    hint_util_pulse_high: float = Field(0.9, ge=0, le=1, description="...and below this.")
    hint_held_mib: float = Field(1024.0, ge=0, description="...memory held, no compute: peak memory at least "
                                 "this (MiB) while GPU-Util is below hint_util_pulse_low.")
    # issue 19: ghosts on GPUs nobody held, right-sizing to a smaller model, Slurm request hygiene
    ghost_unallocated_min_minutes: float = Field(30, ge=0, description="ghost_busy on a GPU with no "
                                                 "allocation: minimum minutes of GPU-Util >= ghost_gpu_util "
                                                 "(summed over the window) before it is reported.")
    rightsize_model_max_sm: float = Field(0.5, ge=0, le=1, description="Right-sizing to a smaller model: an "
                                          "allocation whose mean SM activity is at most this (and whose peak "
                                          "memory fits) would have fit the cheapest such model in its cluster.")
    hygiene_min_jobs: int = Field(5, ge=1, description="request_hygiene: a user is judged on at least this "
                                  "many ended Slurm GPU jobs in the window (per cluster).")
    hygiene_runtime_ratio: float = Field(0.25, ge=0, le=1, description="request_hygiene: flagged when the "
                                         "median of runtime / time limit over the user's jobs is below this...")
    hygiene_unused_gpus: float = Field(0.25, ge=0, le=1, description="...or when at least this share of the "
                                       "GPUs the user's jobs requested (and telemetry saw) never worked (no "
                                       "low, working or busy-unverified second).")
    infra_kinds: list[InfraKind] = Field(["xid", "throttle", "ecc_dbe", "row_remap", "drain", "down", "not_ready",
                                          "cordoned"], description="Node event kinds whose intervals are "
                                         "infrastructure-affected (their reserved time is `infra`, never idle "
                                         "and in no user finding); leave one out to judge its time as usual.")
    lemon_min_faults: int = Field(3, ge=1, description="lemon_node: a node with at least this many "
                                  "infrastructure events (of the kinds above, distinct intervals, any of its "
                                  "GPUs) in the audit window.")
    goodput_infra_events: list[InfraKind] = Field(["xid", "ecc_dbe", "row_remap", "down", "not_ready"],
                                                  description="Goodput: a failed run is infrastructure-caused "
                                                  "when a node it held had a node event of these kinds during "
                                                  "the run (throttling and a drain do not kill a job).")
    goodput_min_restarts: int = Field(2, ge=1, description="failed_restarts: a job id with at least this many "
                                      "restarts (stored runs beyond the first: Slurm requeues; a Kubernetes "
                                      "Job's retried failed pods; container restarts) in the audit window.")
    goodput_target: float = Field(0.9, ge=0, le=1, description="Goodput: the useful-time share the report "
                                  "compares each team against (Meta's Llama 3 run: above 90 %).")
    goodput_pod_causes: dict[str, Literal["infrastructure", "user", "preempted"]] = Field(
        {"PreemptionByScheduler": "preempted", "EvictionByEvictionAPI": "preempted",
         "DeletionByTaintManager": "infrastructure", "DeletionByPodGC": "infrastructure",
         "TerminationByKubelet": "infrastructure", "Evicted": "infrastructure"},
        description="Goodput: a failed Kubernetes pod's reason (its DisruptionTarget condition, else "
                    "status.reason, else its container's) -> the cause of its lost GPU-hours when no node event "
                    "says infrastructure; a reason not listed (OOMKilled, Error, DeadlineExceeded) is the user's.")
    # issue 36: inference services (vLLM, TGI)
    batching_concurrency: float = Field(2.0, ge=0, description="batching_headroom: an inference service's pod "
                                        "whose mean requests running is below this, on a chip that is "
                                        "memory-bound (mean DRAM activity >= hint_dram_high) or low (mean SM "
                                        "activity < low_efficiency_sm)...")
    batching_min_gpu_hours: float = Field(1.0, ge=0, description="...over at least this many reserved "
                                          "GPU-hours with inference metrics.")
    # issue 36: where the waiting goes, stragglers of lockstep jobs (docs/definitions.md)
    straggler_peer_sm: float = Field(0.25, ge=0, le=1, description="straggler: in a bucket, the other nodes "
                                     "(or GPUs) of a lockstep job count as waiting when their SM activity is "
                                     "below this (and not idle) while one computes (SM at least working_sm).")
    straggler_min_share: float = Field(0.5, ge=0, le=1, description="straggler: reported when a node (or GPU) "
                                       "held its peers up for at least this share of its observed time...")
    straggler_min_gpu_hours: float = Field(1.0, ge=0, description="...and its peers waited at least this many "
                                           "GPU-hours on it.")
    straggler_link_bps: float = Field(2e10, ge=0, description="straggler: a node (or GPU) whose PCIe + NVLink "
                                      "bytes/s per GPU reach this runs its link saturated: busy, like one that "
                                      "computes, while its peers wait.")
    # issue 36: the host side of where the waiting goes (node telemetry: the node_exporter connector)
    host_iowait_share: float = Field(0.05, ge=0, le=1, description="Input/storage wait: a GPU quiet (SM below "
                                     "working_sm, DRAM and links quiet) while its node's cores in I/O wait are at "
                                     "least this share of the node's cores...")
    host_disk_busy: float = Field(0.8, ge=0, le=1, description="...or the node's busiest local disk had I/O in "
                                  "flight at least this share of the bucket...")
    host_fs_read_bps: float = Field(1e8, ge=0, description="...or the node read at least this many bytes/s from "
                                    "NFS or Lustre...")
    host_nfs_ops: float = Field(1000.0, ge=0, description="...or made at least this many NFS requests/s.")
    host_ib_bps: float = Field(1e9, ge=0, description="Communication wait: a GPU quiet while its node's "
                               "InfiniBand ports move at least this many bytes/s (received + transmitted).")
    host_pegged_per_gpu: float = Field(1.0, ge=0, description="Host-bound: a GPU quiet while its node has at "
                                       "least this many pegged CPU cores (busy >= the connector's "
                                       "pegged_core_busy) per GPU the allocation holds there.")
