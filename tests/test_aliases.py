"""The one alias table: names, labels, units; and the counters CSV the project ships for dcgm-exporter."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from conftest import FIXTURES

from auditor.records import LABEL_FIELDS, METRIC_FIELDS
from connectors.aliases import (
    LABEL_ALIASES,
    METRIC_ALIASES,
    BadValue,
    host_from_instance,
    names_for,
    normalise,
    pick_label,
)
from connectors.workload import WORKLOAD_FIELDS

ROOT = Path(__file__).resolve().parent.parent


def counters(path: Path) -> dict[str, str]:
    """Enabled fields of a dcgm-exporter counters CSV (comments and blank lines skipped)."""
    rows = csv.reader(line for line in path.read_text().splitlines() if line.strip()
                      and not line.lstrip().startswith("#"))
    return {r[0].strip(): r[1].strip() for r in rows}


def test_every_alias_maps_to_a_bucket_field_and_every_field_has_one() -> None:
    assert {spec.field for spec in METRIC_ALIASES.values()} == set(METRIC_FIELDS)
    for fname in METRIC_FIELDS:
        names = names_for(fname)
        assert names and all(METRIC_ALIASES[n].field == fname for n in names)
    # every label field has its names: hpc_job in the alias table, the workload labels in connectors.workload
    assert set(LABEL_FIELDS) <= set(LABEL_ALIASES) | set(WORKLOAD_FIELDS)


@pytest.mark.parametrize(("name", "field", "raw", "stored"), [
    ("DCGM_FI_DEV_GPU_UTIL", "gpu_util", 99, 0.99),
    ("DCGM_FI_DEV_GPU_UTIL_RATIO", "gpu_util", 40, 0.40),  # DCGM 4.6: still 0-100 despite the name
    ("DCGM_FI_PROF_SM_UTIL_RATIO", "sm_active", 0.25, 0.25),
    ("DCGM_FI_PROF_SM_ACTIVE", "sm_active", 0.03, 0.03),
    ("dcgm_gpu_utilization", "gpu_util", 50, 0.5),  # dcgm-exporter 1.x
    ("nvidia_smi_utilization_gpu_ratio", "gpu_util", 1, 1.0),
    ("nvidia_smi_memory_used_bytes", "fb_used_mib", 2 * 1024 * 1024, 2.0),
    ("DCGM_FI_DEV_BOARD_POWER_WATTS", "power_w", 300.5, 300.5),
    ("DCGM_FI_DEV_FB_USED", "fb_used_mib", 4845, 4845),
    ("DCGM_FI_PROF_NVLINK_TX_BYTES", "nvlink_tx_bps", 1e9, 1e9),
    ("nvidia_gpu_duty_cycle", "gpu_util", 37, 0.37),  # jobstats' exporter: percent
    ("nvidia_gpu_memory_used_bytes", "fb_used_mib", 3 * 1024 * 1024, 3.0),
    ("nvidia_gpu_power_usage_milliwatts", "power_w", 251500, 251.5),
])
def test_names_and_units(name: str, field: str, raw: float, stored: float) -> None:
    spec = METRIC_ALIASES[name]
    assert spec.field == field
    value, clamped = normalise(spec.field, spec.unit, raw)
    assert value == pytest.approx(stored) and not clamped


def test_mig_overshoot_is_clamped_and_garbage_refused() -> None:
    assert normalise("sm_active", "ratio", 1.04) == (1.0, True)
    for bad in (math.nan, math.inf, -0.1, 250.0):
        with pytest.raises(BadValue):
            normalise("sm_active", "ratio", bad)
    assert normalise("power_w", "watts", 700.0) == (700.0, False)  # only ratios are bounded


def test_label_aliases_prefer_in_order_and_skip_empty() -> None:
    assert pick_label({"Hostname": "a", "hostname": "b"}, "host") == "a"
    assert pick_label({"Hostname": "", "hostname": "b", "instance": "c:9400"}, "host") == "b"
    assert pick_label({"uuid": "GPU-x"}, "uuid") == "GPU-x"
    assert pick_label({"GPU_I_ID": "13", "GPU_I_PROFILE": "1g.5gb"}, "gpu_profile") == "1g.5gb"
    assert pick_label({}, "hpc_job") is None
    assert pick_label({"jobid": "51234567"}, "hpc_job") == "51234567"  # jobstats' dcgm-exporter rename
    assert pick_label({"jobId": "7"}, "hpc_job") == "7" and pick_label({"minor_number": "3"}, "gpu") == "3"


@pytest.mark.parametrize(("instance", "host"), [
    ("node1:9400", "node1"), ("10.0.0.5:9400", "10.0.0.5"), ("[fe80::1]:9400", "fe80::1"), ("node1", "node1")])
def test_host_from_instance(instance: str, host: str) -> None:
    assert host_from_instance(instance) == host


def test_shipped_counters_enable_what_the_audit_needs() -> None:
    ours = counters(ROOT / "deploy" / "dcgm-counters.csv")
    needed = {"DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
              "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PIPE_FP64_ACTIVE", "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
              "DCGM_FI_PROF_PIPE_FP16_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES",
              "DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_PROF_NVLINK_RX_BYTES", "DCGM_FI_DEV_GPU_UTIL",
              "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE"}
    assert needed <= set(ours)
    assert {"DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY"}.isdisjoint(
        counters(FIXTURES / "dcgm" / "dcgm-exporter-default-counters.csv"))  # why we ship our own
    upstream_types = {"gauge", "counter", "label"}
    assert set(ours.values()) <= upstream_types
    assert all(name in METRIC_ALIASES for name in needed)
