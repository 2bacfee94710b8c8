"""The report's words: advice per finding kind, the definitions, and how a run judged, in sentences.

Kept apart from :mod:`auditor.report.context` (which reads the store) so the text is in one place.
"""

from __future__ import annotations

from typing import Any

from auditor.config import Thresholds

ADVICE = {
    "idle_allocation": "Release the GPUs when the job is not computing (scancel / delete the pod); "
                       "for interactive work request a short time limit.",
    "util_mirage": "GPU-Util reads busy but the SMs do no work: look for a process spinning or waiting on "
                   "input, fix it or release the GPUs.",
    "hung_collective": "The job is stuck, not slow: GPU-Util reads busy at idle power with memory held on "
                       "several GPUs, the signature of a hung NCCL collective. Cancel it, and run with "
                       "NCCL_DEBUG=INFO and a collective timeout (e.g. TORCH_NCCL_ASYNC_ERROR_HANDLING=1).",
    "ghost_busy": "For operations: GPU-Util reads busy with no memory in use, so no process holds the GPU; "
                  "a driver or hardware state. Check nvidia-smi and the XID log, reset or drain the GPU; "
                  "the user is not at fault.",
    "idle_gpus": "Right-size: request only the GPUs the job actually uses.",
    "idle_episode": "Checkpoint and release the GPUs during long pauses instead of holding them.",
    "low_efficiency": "Use a MIG slice or fewer GPUs, or profile the input pipeline.",
    "idle_reservation": "Shrink or cancel the reservation, or let other jobs use it.",
    "unmonitored": "Fix the GPU exporter on these nodes: without samples the time cannot be judged.",
    "request_hygiene": "Request time limits close to the runtime (shorter jobs start sooner through backfill) "
                       "and only the GPUs the job uses.",
    "idle_while_queued": "Other GPU jobs waited in this partition while these GPUs were idle: release them "
                         "when not computing, so the queue moves.",
    "idle_quota": "For operations: the quota holds more GPUs than its jobs use; lower it or lend the rest.",
    "lemon_node": "For operations: this node faulted again and again (XID errors, throttling, ECC or row "
                  "remapping, drains): take it out for repair or RMA; its users are not billed for that time.",
    "failed_restarts": "This job failed and was requeued again and again: read the cause of each run (a node "
                       "fault is for operations; an exit, out-of-memory or time limit is the job's) and "
                       "checkpoint often enough that a restart keeps its work.",
    "batching_headroom": "The server ran about one request at a time on a chip waiting on memory: raise the "
                         "batch (vLLM --max-num-seqs, TGI --max-batch-total-tokens), route more traffic to fewer "
                         "replicas, or serve it from a smaller GPU.",
    "straggler": "For operations: one node or GPU of this lockstep job computed while the others waited on "
                 "it; check that node's GPUs, clocks and links (a slow or throttled GPU, a degraded NVLink or "
                 "network port) or an uneven data shard.",
}

DEFINITIONS = {
    "idle": "A reserved GPU is idle in a time bucket when DCGM SM activity is below {idle_sm:.0%}, DRAM "
            "activity below {idle_dram:.0%} and Tensor activity below {idle_tensor:.0%}. When GPU-Util "
            "still reads {mirage_gpu_util:.0%} or more it is a mirage: the dashboard says busy, the chip "
            "does no work. Idle GPU-hours count idle and mirage time. Without profiling fields GPU-Util judges: "
            "below {idle_util:.0%} is idle-by-util (low confidence), otherwise busy-unverified (observed, "
            "work not verifiable, never idle). Time without samples is unknown, never idle, and never billed "
            "as idle.",
    "effective": "Effective GPU-hours are the reserved GPU-hours weighted by SM activity (an hour at 30% "
                 "SM activity is 0.3 effective GPU-hours): the work actually done. Cost per effective "
                 "GPU-hour is the reserved cost divided by them; with perfect use it equals the price.",
}


def judged_in_words(th: dict[str, Any]) -> list[str]:
    """How the run judged, as sentences a manager reads (the report's "How this was judged")."""
    d = Thresholds().model_dump()

    def g(k: str) -> Any:
        return th.get(k, d[k]) if th.get(k) is not None else d[k]

    def p(k: str) -> str:
        return f"{g(k):.0%}"

    def n(k: str, unit: str) -> str:  # "1 GPU-hour", "4 GPU-hours"
        v = g(k)
        return f"{v:g} {unit}{'' if v == 1 else 's'}"

    out = [f"A reserved GPU counts as idle while its SMs are active less than {p('idle_sm')} of the time, "
           f"memory bandwidth is below {p('idle_dram')} and the Tensor cores below {p('idle_tensor')}.",
           f"If the dashboard's GPU-Util still reads {p('mirage_gpu_util')} or more at such a time, the idle time "
           "is a mirage: nvidia-smi says busy, the chip does no work. Mirage time counts as idle.",
           f"Between {p('idle_sm')} and {p('working_sm')} SM activity a GPU is in low use; from "
           f"{p('working_sm')} it is working."]
    if g("util_fallback"):
        out.append(f"GPUs that report only GPU-Util are judged by it, with low confidence: below {p('idle_util')} "
                   "is idle" + (f" when power is also under {g('idle_power_w'):g} W." if th.get("idle_power_w")
                                 else "."))
    else:
        out.append("GPUs that report only GPU-Util are not judged: their time is unknown.")
    out += [f"A job is an idle allocation when at least {p('idle_allocation_fraction')} of its observed time "
            f"was idle and it reserved at least {n('idle_allocation_min_gpu_hours', 'GPU-hour')}.",
            f"One GPU of a multi-GPU job is reported when it was idle {p('idle_gpus_fraction')} of its time while "
            "another GPU of the job worked.",
            f"A GPU-Util mirage is reported once it lasts {n('mirage_min_minutes', 'minute')}.",
            f"Idle spells of {n('episode_hours', 'hour')} or more inside otherwise working jobs are idle episodes.",
            f"Jobs averaging under {p('low_efficiency_sm')} SM activity over at least "
            f"{n('low_efficiency_min_gpu_hours', 'observed GPU-hour')} are low efficiency.",
            f"A GPU with telemetry for less than {p('unmonitored_coverage')} of its reserved time is unmonitored: "
            "its time is unknown and never billed as idle."]
    return out
