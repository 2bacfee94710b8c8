"""dcgm-exporter's per-pod values under ``--kubernetes-virtual-gpus`` (issue 42 §4).

PROVENANCE: the series are shaped as NVIDIA/dcgm-exporter at commit d5e5f510a1b6b393f39a43293ccd9dc985defc79
emits them with that flag: internal/pkg/transformation/kubernetes.go ``PodMapper.Process`` copies every
device-level series once per pod sharing the GPU, with ``pod``/``namespace``/``container`` and ``vgpu`` (the
replica of a time-sliced device ID ``<uuid>::<n>``, const.go ``vgpuAttribute``), the whole GPU's value; for the
per-process fields (process_metrics.go ``isPerProcessMetric``: DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_FB_USED) it keeps
the device-level series and adds one per pod with ``pod_uid`` and the pod's own value (its processes' NVML
utilization summed, 0 for a pod without a process: ``buildIdlePodValues``). Written by hand, not recorded (no
GPU here).

One H100 time-sliced between ml/train-a (computing) and research/nb-b (a notebook that runs nothing), each
holding half of it (a count-only device-plugin replica): GR engine 0.9, Tensor 0.6, DRAM 0.5 (the GPU's, on
both pods' series), GPU-Util 95 % for the GPU and train-a, 0 % for nb-b."""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from helpers import usage
from sqlalchemy import text

from auditor.audit.run import run_audit
from auditor.collect import collect
from auditor.config import Config
from auditor.records import AllocatedGpu, Allocation
from connectors import build
from connectors.base import Context, Problems, Window

T = int(datetime(2026, 11, 2, 10, 0, tzinfo=UTC).timestamp())
PODS = {"train-a": ("ml", "uid-a", "0", 95), "nb-b": ("research", "uid-b", "1", 0)}


def page() -> str:
    lines = []
    gpu = 'gpu="0",UUID="GPU-0f0e",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="node-s"'
    for i in range(10):
        ts = (T + 30 * i) * 1000
        lines.append(f"DCGM_FI_DEV_GPU_UTIL{{{gpu}}} 95 {ts}")  # the device-level series, kept
        for pod, (ns, uid, vgpu, util) in PODS.items():
            who = f'{gpu},container="main",namespace="{ns}",pod="{pod}",vgpu="{vgpu}"'
            for name, v in (("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.9), ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.6),
                            ("DCGM_FI_PROF_DRAM_ACTIVE", 0.5)):
                lines.append(f"{name}{{{who}}} {v} {ts}")  # the whole GPU's value, copied per pod
            lines.append(f'DCGM_FI_DEV_GPU_UTIL{{{who},pod_uid="{uid}"}} {util} {ts}')  # the pod's own
    return "\n".join(lines) + "\n"


def test_sharing_pods_are_judged_on_their_own_values(store: Any, store_url: str, tmp_path: Path) -> None:
    """Both engines. By hand: nb-b's own GPU-Util is 0 in all 10 samples: idle by GPU-Util for its observed
    time, though the GPU's engine, Tensor and DRAM (on its series too) are busy; train-a's own 95 % is busy
    (GPU-Util only, unverified). Before the fix both pods' rows took the copied counters: nb-b was judged busy
    by counters (0 idle seconds)."""
    (tmp_path / "m.prom").write_text(page())
    start = datetime.fromtimestamp(T - 600, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    (tmp_path / "pods.csv").write_text(
        "id,name,account,user,start,gpus,share,source\n"
        + "".join(f"{uid},{pod},{ns},u,{start},node-s:*1,0.5,kubernetes\n" for pod, (ns, uid, _v, _u) in PODS.items()))
    cfg = Config.model_validate({"store": {"url": store_url}, "clusters": [{
        "name": "k8s", "allocations": [{"kind": "file", "paths": ["pods.csv"]}],
        "telemetry": [{"kind": "scrape", "paths": ["m.prom"]}]}]})
    until = datetime.fromtimestamp(T + 300, UTC)
    summary = collect(store, cfg, base_dir=tmp_path, since=datetime.fromtimestamp(T, UTC), until=until, now=until)
    assert all(r.ok for r in summary.results), [r.error for r in summary.results]
    rid = run_audit(store, cfg, datetime.fromtimestamp(T, UTC), until).run_id
    with store.engine.connect() as conn:
        use = {r.name: r for r in conn.execute(text(
            "SELECT a.name, u.observed_s, u.idle_s, u.idle_by_util_s, u.busy_unverified_s, u.busy_by_counters_s "
            "FROM usage_allocation u JOIN allocations a ON a.id = u.allocation_id WHERE u.run_id = :r"), {"r": rid})}
    nb, tr = use["nb-b"], use["train-a"]
    assert nb.observed_s > 0 and nb.idle_by_util_s == pytest.approx(nb.observed_s) and nb.busy_by_counters_s == 0
    assert tr.observed_s > 0 and tr.busy_unverified_s == pytest.approx(tr.observed_s) and tr.idle_s == 0


P0 = (int(time.time()) - 2 * 86400) // 3600 * 3600  # two days ago, a whole hour (promtool backfill)


def openmetrics() -> str:
    """The same page, an hour of it every 30 s, as promtool backfills it into a private Prometheus."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for line in page().splitlines():
        series, value, ts = line.rsplit(" ", 2)
        name = series.split("{", 1)[0]
        if int(ts) // 1000 != T:
            continue  # one sample of each series; repeated below
        by_name[name] += [f"{series} {value} {P0 + i * 30}" for i in range(120)]
    return "".join(f"# TYPE {n} gauge\n" + "\n".join(lines) + "\n" for n, lines in by_name.items()) + "# EOF\n"


@pytest.mark.service
def test_sharing_pods_through_prometheus(store: Any, tmp_path: Path) -> None:
    """Both engines, the page in a real Prometheus (the prometheus connector's server-side buckets): each pod's
    row keeps its own GPU-Util (train-a 0.95, nb-b 0) and its samples, not the copied engine/Tensor/DRAM values;
    nb-b is idle by GPU-Util for its half GPU-hour (3600 s x 0.5), train-a busy (unverified). Before: nb-b's rows
    carried GR engine 0.9 (busy by counters)."""
    from test_infra_prometheus import private_prometheus

    start = datetime.fromtimestamp(P0, UTC)
    with private_prometheus(tmp_path, openmetrics()) as url:
        src = build("prometheus", "telemetry", {"url": url, "sample_interval_s": 30}, Context("k8s"))
        rows = list(src.collect(Window(start, start + timedelta(hours=1), 300), Problems()))
    pods = {(b.pod, b.gr_engine, b.tensor_active, round(b.gpu_util, 6), b.samples) for b in rows if b.pod}
    assert pods == {("train-a", None, None, 0.95, 10), ("nb-b", None, None, 0.0, 10)}
    store.ingest([Allocation("k8s", "kubernetes", uid, name=pod, account=ns, user="u", start=start,
                             end=start + timedelta(hours=1), gpus=[AllocatedGpu("node-s", None, share=0.5)])
                  for pod, (ns, uid, _v, _u) in PODS.items()] + rows)
    u = usage(store, run_audit(store, Config(), start, start + timedelta(hours=1)).run_id)
    assert u["uid-b"]["idle_by_util_s"] == pytest.approx(1800) and u["uid-b"]["busy_by_counters_s"] == 0
    assert u["uid-a"]["busy_unverified_s"] == pytest.approx(1800)
