"""Settings that became named constants (issue 45: settings as few as a site decides). A config file that still
sets one is told so in one line naming the key and the constant: an error when its value differs from the
constant (the site meant something the code no longer reads: it must not silently change meaning), a warning
when it is the same (the key is dropped and changes nothing). docs/configuration.md "Retired settings" lists
them.

The constants live in their rules' modules, above this layer, so they are named here by their dotted path and
read only when a retired key is found (tests/test_config.py checks that every one exists)."""

from __future__ import annotations

import copy
import importlib
from typing import Any

_T = "auditor.audit"
#: retired key path (``[]``: every table of that list; ``<kind>.<option>``: a connector's option) ->
#: ``module:CONSTANT`` that holds its value now
RETIRED: dict[str, str] = {
    "thresholds.hint_dram_high": f"{_T}.efficiency:HINT_DRAM_HIGH",
    "thresholds.hint_tensor_share": f"{_T}.efficiency:HINT_TENSOR_SHARE",
    "thresholds.hint_io_bps": f"{_T}.efficiency:HINT_IO_BPS",
    "thresholds.hint_dram_low": f"{_T}.efficiency:HINT_DRAM_LOW",
    "thresholds.hint_util_pulse_low": f"{_T}.efficiency:HINT_UTIL_PULSE_LOW",
    "thresholds.hint_util_pulse_high": f"{_T}.efficiency:HINT_UTIL_PULSE_HIGH",
    "thresholds.hint_held_mib": f"{_T}.efficiency:HINT_HELD_MIB",
    "thresholds.hung_gpu_util": f"{_T}.findings:HUNG_GPU_UTIL",
    "thresholds.hung_max_power_w": f"{_T}.findings:HUNG_MAX_POWER_W",
    "thresholds.hung_held_mib": f"{_T}.findings:HUNG_HELD_MIB",
    "thresholds.ghost_gpu_util": f"{_T}.ghosts:GHOST_GPU_UTIL",
    "thresholds.ghost_max_fb_mib": f"{_T}.ghosts:GHOST_MAX_FB_MIB",
    "thresholds.ghost_unallocated_min_minutes": f"{_T}.ghosts:GHOST_UNALLOCATED_MIN_MINUTES",
    "thresholds.queue_min_idle_gpu_hours": f"{_T}.queue:QUEUE_MIN_IDLE_GPU_HOURS",
    "thresholds.idle_quota_min_gpus": f"{_T}.queue:IDLE_QUOTA_MIN_GPUS",
    "thresholds.idle_quota_fraction": f"{_T}.queue:IDLE_QUOTA_FRACTION",
    "thresholds.rightsize_model_max_sm": f"{_T}.rightsize:RIGHTSIZE_MODEL_MAX_SM",
    "thresholds.hygiene_min_jobs": f"{_T}.hygiene:HYGIENE_MIN_JOBS",
    "thresholds.hygiene_runtime_ratio": f"{_T}.hygiene:HYGIENE_RUNTIME_RATIO",
    "thresholds.hygiene_unused_gpus": f"{_T}.hygiene:HYGIENE_UNUSED_GPUS",
    "thresholds.lemon_min_faults": f"{_T}.infra:LEMON_MIN_FAULTS",
    "thresholds.goodput_infra_events": f"{_T}.goodput:GOODPUT_INFRA_EVENTS",
    "thresholds.goodput_min_restarts": f"{_T}.goodput:GOODPUT_MIN_RESTARTS",
    "thresholds.goodput_pod_causes": f"{_T}.goodput:GOODPUT_POD_CAUSES",
    "thresholds.batching_concurrency": f"{_T}.inference:BATCHING_CONCURRENCY",
    "thresholds.batching_min_gpu_hours": f"{_T}.inference:BATCHING_MIN_GPU_HOURS",
    "thresholds.straggler_peer_sm": f"{_T}.waiting:STRAGGLER_PEER_SM",
    "thresholds.straggler_link_bps": f"{_T}.waiting:STRAGGLER_LINK_BPS",
    "thresholds.straggler_min_share": f"{_T}.stragglers:STRAGGLER_MIN_SHARE",
    "thresholds.straggler_min_gpu_hours": f"{_T}.stragglers:STRAGGLER_MIN_GPU_HOURS",
    "thresholds.host_iowait_share": f"{_T}.waiting:HOST_IOWAIT_SHARE",
    "thresholds.host_disk_busy": f"{_T}.waiting:HOST_DISK_BUSY",
    "thresholds.host_fs_read_bps": f"{_T}.waiting:HOST_FS_READ_BPS",
    "thresholds.host_nfs_ops": f"{_T}.waiting:HOST_NFS_OPS",
    "thresholds.host_ib_bps": f"{_T}.waiting:HOST_IB_BPS",
    "thresholds.host_pegged_per_gpu": f"{_T}.waiting:HOST_PEGGED_PER_GPU",
    "clusters[].overlap_minutes": "auditor.collect:OVERLAP_MINUTES",
    "schedule.misfire_grace_s": "auditor.daemon.schedule:MISFIRE_GRACE_S",
    "email.timeout_s": "auditor.report.mailparts:SMTP_TIMEOUT_S",
    "channels[].timeout_s": "auditor.report.channels:CHANNEL_TIMEOUT_S",
    "enforce.exempt_annotation": f"{_T}.exempt:EXEMPT_ANNOTATION",
    "enforce.exempt_reason_annotation": f"{_T}.exempt:EXEMPT_REASON_ANNOTATION",
    "enforce.infra_node_states": "connectors.actions.slurm:INFRA_NODE_STATES",
    "kubernetes.watch_s": "connectors.kubernetes:WATCH_S",
    "kubernetes.page_size": "connectors.kubernetes:PAGE_SIZE",
    "prometheus.concurrency": "connectors.prometheus:CONCURRENCY",
    "prometheus.backoff_s": "connectors.retry:BACKOFF_S",
    "inference.backoff_s": "connectors.retry:BACKOFF_S",
    "node_exporter.backoff_s": "connectors.retry:BACKOFF_S",
    "node_exporter.pegged_core_busy": "connectors.node_exporter:PEGGED_CORE_BUSY",
    "node_exporter.disk_exclude": "connectors.node_exporter:DISK_EXCLUDE",
    "scrape.max_bytes": "connectors.scrape:MAX_BYTES",
    "web.page_rows": "auditor.web.data:PAGE_ROWS",
}


def constant(key: str) -> tuple[str, Any]:
    """(``module.CONSTANT``, its value) of a retired key."""
    module, name = RETIRED[key].split(":")
    return f"{module}.{name}", getattr(importlib.import_module(module), name)


def _same(given: Any, value: Any) -> bool:
    if isinstance(value, tuple | list) and isinstance(given, list):
        return [_norm(x) for x in given] == [_norm(x) for x in value]
    return _norm(given) == _norm(value)


def _norm(v: Any) -> Any:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else v


def _found(key: str, where: str, given: Any, errors: list[str], warnings: list[str]) -> None:
    name, value = constant(key)
    said = f"{where}: no longer a setting: it is the constant {name} = {value!r}"
    if _same(given, value):
        warnings.append(f"{said}; the value given is the same, remove the key")
    else:
        errors.append(f"{said} (the value given, {given!r}, is not used any more): remove the key")


def retire(data: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[str]]:
    """``data`` (a config file's TOML document) without its retired keys, the errors (a retired key whose value
    differs from its constant) and the warnings (one whose value is the constant's), each ``key.path: ...``."""
    errors: list[str] = []
    warnings: list[str] = []
    text = repr(data)
    if not isinstance(data, dict) or not any(k.rpartition(".")[2] in text for k in RETIRED):
        return data, errors, warnings
    data = copy.deepcopy(data)
    for key in RETIRED:
        head, _, leaf = key.rpartition(".")
        if head.endswith("[]"):
            tables = data.get(head[:-2])
            for i, t in enumerate(tables if isinstance(tables, list) else []):
                if isinstance(t, dict) and leaf in t:
                    _found(key, f"{head[:-2]}[{i}].{leaf}", t.pop(leaf), errors, warnings)
        elif head in data and isinstance(data[head], dict) and leaf in data[head]:
            _found(key, key, data[head].pop(leaf), errors, warnings)
        else:
            for ci, cluster in enumerate(data.get("clusters") or [] if isinstance(data.get("clusters"), list) else []):
                for role in ("allocations", "telemetry"):
                    srcs = cluster.get(role) if isinstance(cluster, dict) else None
                    for si, src in enumerate(srcs if isinstance(srcs, list) else []):
                        if isinstance(src, dict) and src.get("kind") == head and leaf in src:
                            _found(key, f"clusters[{ci}].{role}[{si}].{leaf}", src.pop(leaf), errors, warnings)
    return data, errors, warnings

