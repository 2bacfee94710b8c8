"""The one alias table for metric and label names, and the one place that normalises units.

Every telemetry reader (scrape files, long CSV, Prometheus) maps what it sees through here, so a renamed
DCGM field or label is fixed in one line. Stored units: ratios 0-1, memory MiB, power W, bytes/s.
The names of Princeton jobstats' exporter (``nvidia_gpu_duty_cycle`` 0-100, ``nvidia_gpu_memory_used_bytes``,
``nvidia_gpu_power_usage_milliwatts``; labels ``minor_number``, ``uuid``, ``jobid``/``jobId``) are here too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Unit = Literal["ratio", "percent", "mib", "bytes", "watts", "milliwatts", "bytes_per_s", "mb_per_s"]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """How one exported metric name maps onto a bucket field, and in what unit the exporter sends it."""

    field: str
    unit: Unit


def _specs(field: str, unit: Unit, *names: str) -> dict[str, MetricSpec]:
    return {name: MetricSpec(field, unit) for name in names}


#: Exported metric name -> bucket field and source unit. DCGM names are those NVIDIA/DCGM's
#: dcgmlib/dcgm_fields.h defines (@ 72fa3fe, 2026-07-06, DCGM 4.x: tests/fixtures/dcgm/PROVENANCE.md): each
#: field under its DCGM 4.x name and under the deprecated name the header keeps as an alias of the same field
#: id (what dcgm-exporter emits when its counters file names it); tests/test_dcgm_names.py checks every name.
#: DCGM profiling fields (the profiling group, field ids 1001 and up) are 0-1 ratios even where help text
#: says "%"; GPU_UTIL is 0-100, also under its 4.x name DCGM_FI_DEV_GPU_UTIL_RATIO (the same field, 203).
METRIC_ALIASES: dict[str, MetricSpec] = {
    **_specs("gpu_util", "percent", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL_RATIO",
             "dcgm_gpu_utilization", "nvidia_gpu_utilization", "gpu_util",
             # Princeton jobstats' exporter (a fork of nvidia_gpu_prometheus_exporter): duty cycle 0-100
             "nvidia_gpu_duty_cycle"),
    **_specs("gpu_util", "ratio", "nvidia_smi_utilization_gpu_ratio"),
    **_specs("gr_engine", "ratio", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO",
             "gr_engine"),
    **_specs("sm_active", "ratio", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_UTIL_RATIO", "sm_active"),
    **_specs("sm_active", "percent", "gpm_sm_util", "nvidia_gpm_sm_utilization"),
    **_specs("sm_occupancy", "ratio", "DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_SM_OCCUPANCY_RATIO",
             "sm_occupancy"),
    **_specs("sm_occupancy", "percent", "gpm_sm_occupancy", "nvidia_gpm_sm_occupancy"),
    **_specs("tensor_active", "ratio", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_TENSOR_UTIL_RATIO",
             "tensor_active"),
    **_specs("tensor_active", "percent", "gpm_any_tensor_util", "nvidia_gpm_any_tensor_utilization"),
    **_specs("dram_active", "ratio", "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_DRAM_UTIL_RATIO", "dram_active"),
    **_specs("dram_active", "percent", "gpm_dram_bw_util", "nvidia_gpm_dram_bandwidth_utilization"),
    **_specs("fp64_active", "ratio", "DCGM_FI_PROF_PIPE_FP64_ACTIVE", "DCGM_FI_PROF_FP64_UTIL_RATIO",
             "fp64_active"),
    **_specs("fp32_active", "ratio", "DCGM_FI_PROF_PIPE_FP32_ACTIVE", "DCGM_FI_PROF_FP32_UTIL_RATIO",
             "fp32_active"),
    **_specs("fp16_active", "ratio", "DCGM_FI_PROF_PIPE_FP16_ACTIVE", "DCGM_FI_PROF_FP16_UTIL_RATIO",
             "fp16_active"),
    **_specs("fb_used_mib", "mib", "DCGM_FI_DEV_FB_USED", "dcgm_fb_used", "fb_used_mib"),
    **_specs("fb_used_mib", "bytes", "nvidia_smi_memory_used_bytes", "nvidia_gpu_memory_used_bytes"),
    **_specs("power_w", "watts", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_BOARD_POWER_WATTS",
             "dcgm_power_usage", "nvidia_smi_power_draw_watts", "power_w"),
    **_specs("power_w", "milliwatts", "nvidia_gpu_power_usage_milliwatts"),
    # the PROF PCIE and NVLINK TX and RX BYTES fields keep their names in DCGM 4.x (fields 1009-1012)
    **_specs("pcie_tx_bps", "bytes_per_s", "DCGM_FI_PROF_PCIE_TX_BYTES", "pcie_tx_bps"),
    **_specs("pcie_rx_bps", "bytes_per_s", "DCGM_FI_PROF_PCIE_RX_BYTES", "pcie_rx_bps"),
    **_specs("nvlink_tx_bps", "bytes_per_s", "DCGM_FI_PROF_NVLINK_TX_BYTES", "nvlink_tx_bps"),
    **_specs("nvlink_rx_bps", "bytes_per_s", "DCGM_FI_PROF_NVLINK_RX_BYTES", "nvlink_rx_bps"),
}

#: DCGM 4.x cumulative SM cycle counters (dcgm_fields.h @ 72fa3fe, fields 1085 and 1084: "raw monotonic
#: counter of GPU SM cycles where at least one warp was active" / "... SM cycles elapsed"). Where a GPU exports
#: both, a bucket's SM activity is the increase of the first over that of the second (:mod:`connectors._cycles`):
#: exact, read before the sampled SM_ACTIVE / SM_UTIL_RATIO gauge.
SM_CYCLES_ACTIVE = "DCGM_FI_PROF_SM_CYCLES_ACTIVE_TOTAL"
SM_CYCLES_ELAPSED = "DCGM_FI_PROF_SM_CYCLES_ELAPSED_TOTAL"
CYCLE_COUNTERS: frozenset[str] = frozenset({SM_CYCLES_ACTIVE, SM_CYCLES_ELAPSED})

#: GPU metrics that are recognised but deliberately not stored (no bucket field): a source that has only
#: these is not "unsupported", and messages can say so.
KNOWN_UNSTORED: frozenset[str] = frozenset({
    "nvidia_gpu_memory_total_bytes", "nvidia_smi_memory_total_bytes", "DCGM_FI_DEV_FB_FREE",
    "nvidia_gpu_temperature_celsius", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_TEMP_CELSIUS",
    "nvidia_gpu_num_devices", "nvidia_gpu_jobUid",
    # DCGM 4.x's other cumulative counters (fields 1086-1096): per-pipe cycles and PCIe bytes, not read yet
    "DCGM_FI_PROF_MMA_CYCLES_ACTIVE_TOTAL", "DCGM_FI_PROF_DMMA_CYCLES_ACTIVE_TOTAL",
    "DCGM_FI_PROF_HMMA_CYCLES_ACTIVE_TOTAL", "DCGM_FI_PROF_IMMA_CYCLES_ACTIVE_TOTAL",
    "DCGM_FI_PROF_DFMA_CYCLES_ACTIVE_TOTAL", "DCGM_FI_PROF_INT_CYCLES_ACTIVE_TOTAL",
    "DCGM_FI_PROF_FP64_CYCLES_ACTIVE_TOTAL", "DCGM_FI_PROF_FP32_CYCLES_ACTIVE_TOTAL",
    "DCGM_FI_PROF_FP16_CYCLES_ACTIVE_TOTAL", "DCGM_FI_PROF_PCIE_TX_BYTES_TOTAL", "DCGM_FI_PROF_PCIE_RX_BYTES_TOTAL",
})

#: How a GPU fault shows in a metric (README "Infrastructure-affected time"): ``code`` a gauge holding the
#: last error code, a fault when it changes to a new non-zero value; ``nonzero`` a 0/1 flag; ``increase`` a
#: counter, a fault when it grows (a reset is not one); ``bits`` a clock-event bitmask, a fault when one of
#: :data:`THROTTLE_FAULT_BITS` is set.
FaultRule = Literal["code", "nonzero", "increase", "bits"]


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """An exported metric that reports GPU faults: the node event kind, the rule, and how to name it."""

    kind: str
    rule: FaultRule
    what: str


def _faults(kind: str, rule: FaultRule, what: str, *names: str) -> dict[str, FaultSpec]:
    return {name: FaultSpec(kind, rule, what) for name in names}


#: NVML clocks event (throttle) reasons that are faults: the hardware or its cooling, not the workload or
#: a setting (GPU idle 0x1, application clocks 0x2, SW power cap 0x4, sync boost 0x10 and display clocks
#: 0x100 are not). Values: nvml.h ``nvmlClocksEventReason*`` (= the deprecated ``nvmlClocksThrottleReason*``),
#: the bits of DCGM_FI_DEV_CLOCK_THROTTLE_REASONS / DCGM_FI_DEV_CLOCKS_EVENT_REASONS.
THROTTLE_FAULT_BITS: dict[int, str] = {0x8: "HW slowdown", 0x20: "SW thermal slowdown",
                                       0x40: "HW thermal slowdown", 0x80: "HW power brake slowdown"}

#: Exported metric name -> the GPU fault it reports (dcgm-exporter's names from its default counters CSV;
#: nvidia_gpu_exporter's nvidia-smi clocks_event_reasons).
FAULT_ALIASES: dict[str, FaultSpec] = {
    **_faults("xid", "code", "XID", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_XID_ERROR"),  # 4.x: ..._ERROR
    **_faults("xid", "increase", "XID errors", "DCGM_EXP_XID_ERRORS_COUNT"),
    **_faults("throttle", "bits", "throttle", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
              "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "nvidia_smi_clocks_event_reasons_active",
              "nvidia_smi_clocks_throttle_reasons_active"),
    **_faults("throttle", "nonzero", "HW slowdown", "nvidia_smi_clocks_event_reasons_hw_slowdown",
              "nvidia_smi_clocks_throttle_reasons_hw_slowdown"),
    **_faults("throttle", "nonzero", "HW thermal slowdown", "nvidia_smi_clocks_event_reasons_hw_thermal_slowdown",
              "nvidia_smi_clocks_throttle_reasons_hw_thermal_slowdown"),
    **_faults("throttle", "nonzero", "HW power brake slowdown",
              "nvidia_smi_clocks_event_reasons_hw_power_brake_slowdown",
              "nvidia_smi_clocks_throttle_reasons_hw_power_brake_slowdown"),
    **_faults("throttle", "nonzero", "SW thermal slowdown", "nvidia_smi_clocks_event_reasons_sw_thermal_slowdown",
              "nvidia_smi_clocks_throttle_reasons_sw_thermal_slowdown"),
    **_faults("ecc_dbe", "increase", "ECC double-bit errors", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
              "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"),
    **_faults("row_remap", "increase", "uncorrectable remapped rows", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
              "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL"),
    **_faults("row_remap", "nonzero", "row remap failure", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
              "DCGM_FI_DEV_ROW_REMAP_FAILED"),
}

#: jobstats' exporter publishes the job holding a GPU as a *metric* whose value is the Slurm job id
#: (``nvidia_gpu_jobId{minor_number="0",uuid=...} 1234567``, 0 = no job), not as a label.
JOB_ID_METRICS: frozenset[str] = frozenset({"nvidia_gpu_jobId"})


#: Field -> the metric names a Prometheus query should ask for (canonical first).
def names_for(field: str) -> list[str]:
    return [name for name, spec in METRIC_ALIASES.items() if spec.field == field]


#: The activity fields a bucket's samples are counted from (docs/definitions.md "Evidence tiers"), strongest
#: evidence first: a GPU (or MIG instance) counts the samples of the first of these it reports, so a GPU of a
#: stock GPU Operator fleet (dcgm-exporter's default counters: GR_ENGINE_ACTIVE, PIPE_TENSOR_ACTIVE,
#: DRAM_ACTIVE and GPU_UTIL on, PROF_SM_ACTIVE off; NVIDIA/dcgm-exporter etc/default-counters.csv) and a MIG
#: instance (no GPU_UTIL: NVML reports none in MIG mode) are observed. The Prometheus connector's count queries
#: and the recording rules' count series both come from this one tuple.
ACTIVITY_FIELDS: tuple[str, ...] = ("sm_active", "gr_engine", "tensor_active", "dram_active", "gpu_util")


#: Canonical label -> the names exporters have used for it, in order of preference. The workload labels
#: (pod, namespace, container) are resolved by :mod:`connectors.workload` (exported_*, label map, exporters).
LABEL_ALIASES: dict[str, tuple[str, ...]] = {
    "host": ("Hostname", "hostname", "node", "kubernetes_node", "instance"),
    "gpu": ("gpu", "GPU", "minor_number", "index"),
    "uuid": ("UUID", "uuid"),
    "model": ("modelName", "model_name", "name"),
    "gpu_instance": ("GPU_I_ID", "gpu_instance_id"),
    "gpu_profile": ("GPU_I_PROFILE", "gpu_instance_profile"),
    "hpc_job": ("hpc_job", "jobid", "jobId"),  # jobid/jobId: jobstats-style exporters
}


def pick_label(labels: dict[str, str], canonical: str) -> str | None:
    """First non-empty value among the aliases of ``canonical`` (empty strings mean "not set")."""
    for name in LABEL_ALIASES[canonical]:
        value = labels.get(name)
        if value:
            return value
    return None


def host_from_instance(instance: str) -> str:
    """``instance`` is host:port; the node key is the host part."""
    if instance.startswith("["):
        return instance[1:].split("]", 1)[0]
    return instance.rsplit(":", 1)[0] if instance.count(":") == 1 else instance


RATIO_FIELDS = frozenset({"gpu_util", "gr_engine", "sm_active", "sm_occupancy", "tensor_active",
                          "dram_active", "fp64_active", "fp32_active", "fp16_active"})


class BadValue(ValueError):
    """A metric value that cannot be stored (NaN, infinite, negative, absurd)."""


def normalise(field: str, unit: Unit, value: float) -> tuple[float, bool]:
    """Convert ``value`` from ``unit`` to the stored unit of ``field``.

    Returns (value, clamped). Ratios above 1 (MIG SM_ACTIVE is seen at 1.0x) are clamped to 1 and reported
    as clamped; NaN, infinities and negative values raise :class:`BadValue` so the caller can quarantine.
    """
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        raise BadValue(f"{field}: not a number: {value!r}")
    v = float(value)
    if math.isnan(v) or math.isinf(v):
        raise BadValue(f"{field}: {v} is not a finite number")
    if v < 0:
        raise BadValue(f"{field}: negative value {v}")
    if unit == "percent":
        v /= 100.0
    elif unit == "milliwatts":
        v /= 1000.0
    elif unit == "bytes":
        v /= 1024.0 * 1024.0
    elif unit == "mb_per_s":
        v *= 1_000_000.0
    if field in RATIO_FIELDS:
        if v > 2.0:
            raise BadValue(f"{field}: {value} is out of range for a {unit} value")
        if v > 1.0:
            return 1.0, True
    return v, False


# --- inference servers (docs/inference.md "What is read") ------------------------------------------------


@dataclass(frozen=True, slots=True)
class InferenceRead:
    """One series an inference figure is read from: Prometheus computes ``fn`` over exactly one bucket
    (``increase`` of a counter, ``avg_over_time`` of a gauge); ``matchers`` pick the engine's series where
    another engine exports the same name (PromQL, without braces)."""

    fn: Literal["increase", "avg_over_time"]
    name: str
    matchers: str = ""


def _read(fn: Literal["increase", "avg_over_time"], name: str, matchers: str = "") -> InferenceRead:
    return InferenceRead(fn, name, matchers)


#: SGLang exports one series per tensor- and pipeline-parallel rank of the same batch (labels ``tp_rank``,
#: ``pp_rank``: python/sglang/srt/managers/scheduler_metrics_mixin.py): rank 0 (or no rank label) is read;
#: data-parallel ranks (``dp_rank``) run batches of their own and add up
_SGLANG_RANK0 = 'tp_rank=~"|0",pp_rank=~"|0"'

#: Engine -> inference bucket field -> the series it is read from. Several series of one pod add up: vLLM's
#: data-parallel ``engine`` label, Triton's several models, the two queues Triton keeps (its scheduler's
#: pending requests and the TensorRT-LLM batcher's waiting ones). Names, types and labels are the engines'
#: own (tests/fixtures/inference/PROVENANCE.md). Where an engine reports no batch size, the requests running
#: are the batch (continuous batching: vLLM, SGLang).
INFERENCE_ALIASES: dict[str, dict[str, tuple[InferenceRead, ...]]] = {
    # native vLLM: labels model_name, engine; Triton's vLLM backend exports the same token counter with the
    # labels model and version instead, so the version label tells them apart
    "vllm": {"generated_tokens": (_read("increase", "vllm:generation_tokens_total", 'version=""'),),
             "running_mean": (_read("avg_over_time", "vllm:num_requests_running"),),
             "waiting_mean": (_read("avg_over_time", "vllm:num_requests_waiting"),),
             # prefix caching: tokens looked up and found (counters; 0 looked up: caching off)
             "cache_queries": (_read("increase", "vllm:prefix_cache_queries_total", 'version=""'),),
             "cache_hits": (_read("increase", "vllm:prefix_cache_hits_total", 'version=""'),)},
    # TGI's router: tokens are the sum of a per-request histogram; its running requests are its batch
    "tgi": {"generated_tokens": (_read("increase", "tgi_request_generated_tokens_sum"),),
            "running_mean": (_read("avg_over_time", "tgi_batch_current_size"),),
            "waiting_mean": (_read("avg_over_time", "tgi_queue_size"),),
            "batch_mean": (_read("avg_over_time", "tgi_batch_current_size"),)},
    "sglang": {"generated_tokens": (_read("increase", "sglang:generation_tokens_total", _SGLANG_RANK0),),
               "running_mean": (_read("avg_over_time", "sglang:num_running_reqs", _SGLANG_RANK0),),
               "waiting_mean": (_read("avg_over_time", "sglang:num_queue_reqs", _SGLANG_RANK0),),
               # its radix cache exports only a hit rate (a gauge, 0-1), no counts
               "cache_hit_rate": (_read("avg_over_time", "sglang:cache_hit_rate", _SGLANG_RANK0),)},
    # Triton: the TensorRT-LLM backend's inflight batcher (active requests, the requests of this iteration's
    # batch, waiting ones, output tokens) and the vLLM backend's token counter; Triton's own per-model
    # scheduler queue adds to the waiting
    "triton": {"generated_tokens": (_read("increase", "nv_llm_output_token_len_sum",
                                          'response_metric_type="total_output_tokens"'),
                                    _read("increase", "vllm:generation_tokens_total", 'version!=""')),
               "running_mean": (_read("avg_over_time", "nv_trt_llm_request_metrics", 'request_type="active"'),),
               "waiting_mean": (_read("avg_over_time", "nv_trt_llm_request_metrics", 'request_type="waiting"'),
                                _read("avg_over_time", "nv_inference_pending_request_count")),
               "batch_mean": (_read("avg_over_time", "nv_trt_llm_request_metrics",
                                    'request_type="scheduled"'),)},
}

#: Labels naming the model an inference series serves (vLLM, SGLang: model_name; Triton: model)
INFERENCE_MODEL_LABELS: tuple[str, ...] = ("model_name", "model")
