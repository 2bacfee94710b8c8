"""A stock GPU Operator fleet through a REAL Prometheus (issue 42 section 2): dcgm-exporter's default counters
(GR_ENGINE_ACTIVE, PIPE_TENSOR_ACTIVE, DRAM_ACTIVE, GPU_UTIL on; PROF_SM_ACTIVE off: NVIDIA/dcgm-exporter
etc/default-counters.csv) and a MIG instance (the profiling fields per GPU instance, no GPU_UTIL: NVML reports
none in MIG mode). Each bucket counts its samples from the first activity field its GPU reports
(connectors.aliases.ACTIVITY_FIELDS), so both are observed; the audit judges them on the stock counters,
the MIG slice per instance. Backfilled with promtool into a private Prometheus; audited on both engines."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from helpers import gpu_usage, usage

from auditor.audit.run import run_audit
from auditor.config import Config
from auditor.records import AllocatedGpu, Allocation
from connectors import build
from connectors.base import Context, Problems, Window

T0 = (int(time.time()) - 2 * 86400) // 3600 * 3600  # two days ago, a whole hour
STEP, HOURS = 30, 1
POD = 'pod="{pod}",namespace="ml",container="main"'
#: series labels as dcgm-exporter writes them (a MIG instance: GPU_I_ID and GPU_I_PROFILE beside its GPU's)
FULL = 'gpu="0",UUID="GPU-s0",Hostname="node-s",modelName="NVIDIA H100 80GB HBM3",' + POD.format(pod="train-0")
MIG = ('gpu="1",UUID="GPU-s1",Hostname="node-s",modelName="NVIDIA A100-SXM4-40GB",GPU_I_ID="7",'
       'GPU_I_PROFILE="1g.10gb",' + POD.format(pod="nb-0"))
WHOLE = 'gpu="1",UUID="GPU-s1",Hostname="node-s",modelName="NVIDIA A100-SXM4-40GB"'  # the MIG GPU itself
PROF = 'gpu="0",UUID="GPU-p0",Hostname="node-p",modelName="NVIDIA H100 80GB HBM3"'  # SM activity on
SERIES = [  # (metric, labels, value): a sample every 30 s for one hour
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", FULL, 0.9), ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", FULL, 0.0),
    ("DCGM_FI_PROF_DRAM_ACTIVE", FULL, 0.0), ("DCGM_FI_DEV_GPU_UTIL", FULL, 100),  # a spin: engine alone
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", MIG, 0.0), ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", MIG, 0.0),
    ("DCGM_FI_PROF_DRAM_ACTIVE", MIG, 0.0), ("DCGM_FI_DEV_FB_USED", MIG, 300),  # an idle notebook
    ("DCGM_FI_DEV_POWER_USAGE", WHOLE, 80.0),
    ("DCGM_FI_PROF_SM_ACTIVE", PROF, 0.6), ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", PROF, 0.9),
    ("DCGM_FI_PROF_DRAM_ACTIVE", PROF, 0.3), ("DCGM_FI_DEV_GPU_UTIL", PROF, 100),
]


def openmetrics() -> str:
    by_name: dict[str, list[str]] = defaultdict(list)
    for name, labels, v in SERIES:
        by_name[name] += [f"{name}{{{labels}}} {v:g} {T0 + i * STEP}" for i in range(HOURS * 3600 // STEP)]
    return "".join(f"# TYPE {n} gauge\n" + "\n".join(lines) + "\n" for n, lines in by_name.items()) + "# EOF\n"


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from test_infra_prometheus import private_prometheus

    with private_prometheus(tmp_path_factory.mktemp("stock"), openmetrics()) as url:
        yield url


def window() -> Window:
    start = datetime.fromtimestamp(T0, UTC)
    return Window(start, start + timedelta(hours=HOURS), 300)


def pull(url: str) -> list:
    src = build("prometheus", "telemetry", {"url": url, "sample_interval_s": STEP}, Context("k8s"))
    return list(src.collect(window(), Problems()))


@pytest.mark.service
def test_stock_counters_and_mig_instances_are_observed(prom: str) -> None:
    by_gpu = defaultdict(list)
    for b in pull(prom):
        by_gpu[(b.host, b.gpu, b.gpu_instance)].append(b)
    full, mig, prof = by_gpu[("node-s", 0, "")], by_gpu[("node-s", 1, "7")], by_gpu[("node-p", 0, "")]
    assert len(full) == len(mig) == len(prof) == 12
    # 10 samples at 30 s per bucket, counted once (never once per activity field)
    for rows in (full, mig, prof):
        assert all(b.samples == 10 and b.observed_s == 300.0 for b in rows)
    assert all(b.sm_active is None and b.gr_engine == pytest.approx(0.9) and b.gpu_util == 1.0 for b in full)
    assert all(b.gpu_util is None and b.gr_engine == 0.0 and b.pod == "nb-0" and "1g.10gb" in (b.model or "")
               for b in mig)
    # the MIG GPU as a whole reports no activity field: no samples (unknown, never idle)
    assert all(b.samples == 0 for b in by_gpu[("node-s", 1, "")])


@pytest.mark.service
def test_a_stock_fleet_is_judged_on_the_counters_and_mig_per_instance(prom: str, store) -> None:
    start = datetime.fromtimestamp(T0, UTC)

    def pod(name: str, gpu: AllocatedGpu) -> Allocation:
        return Allocation("k8s", "kubernetes", f"uid-{name}", name=name, account="ml", user="u", start=start,
                          end=start + timedelta(hours=HOURS), gpus=[gpu])

    store.ingest([pod("train-0", AllocatedGpu("node-s", 0)),
                  pod("nb-0", AllocatedGpu("node-s", None, model="a100", share=1 / 7, mig_profile="1g.10gb")),
                  *pull(prom)])
    r = run_audit(store, Config(), start - timedelta(hours=1), start + timedelta(hours=2))
    u, g = usage(store, r.run_id), gpu_usage(store, r.run_id)
    assert u["uid-train-0"]["engine_spin_s"] == 3600 and u["uid-train-0"]["idle_s"] == 0
    assert u["uid-nb-0"]["idle_by_counters_s"] == pytest.approx(3600 / 7)
    assert u["uid-nb-0"]["unknown_s"] == pytest.approx(0, abs=1e-6)
    assert g[("uid-nb-0", 1)]["attribution"] == "label" and g[("uid-nb-0", 1)]["signal"] == "counters"
    assert r.summary["tier_gpu_hours"] == pytest.approx({"sm_active": 0.0, "counters": 1 + 1 / 7, "gpu_util": 0.0})
