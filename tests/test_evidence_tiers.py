"""Evidence tiers (issue 42 section 2, docs/definitions.md "Evidence tiers"): a GPU without SM activity is judged
on the stock counters the GPU Operator's dcgm-exporter ships (GR engine, Tensor, DRAM) before GPU-Util; MIG
slices of a stock fleet (no GPU-Util on MIG) are judged per instance on the same tiers; the summary, every
report format and chargeback say how many GPU-hours each tier judged. Both engines."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from helpers import gpu_usage, usage

from auditor.audit.run import run_audit
from auditor.config import Config
from auditor.records import AllocatedGpu, Allocation, GpuBucket
from auditor.report import chargeback as cb
from auditor.report import context as report
from auditor.report import render
from auditor.store.engine import Store

T0 = datetime(2026, 11, 20, tzinfo=UTC)
W0, W1 = T0 - timedelta(days=1), T0 + timedelta(days=1)
H = 3600.0
#: what a stock GPU Operator fleet exports (no DCGM_FI_PROF_SM_ACTIVE): per job, its 2 h of buckets
STOCK = {
    "idle": {"gr_engine": 0.0, "tensor_active": 0.0, "dram_active": 0.0, "gpu_util": 0.0},
    "busy": {"gr_engine": 0.95, "tensor_active": 0.4, "dram_active": 0.3, "gpu_util": 1.0},
    "spin": {"gr_engine": 0.9, "tensor_active": 0.0, "dram_active": 0.0, "gpu_util": 1.0},  # a NCCL wait
    "utilonly": {"gpu_util": 0.9},  # an older exporter: GPU-Util alone (low confidence)
    "verified": {"sm_active": 0.7, "gr_engine": 0.9, "tensor_active": 0.0, "dram_active": 0.0, "gpu_util": 1.0},
}


def job(ext: str, gpus: list[AllocatedGpu], source: str = "slurm", **kw) -> Allocation:
    kw.setdefault("account", "acct")
    return Allocation("c", source, ext, user="u", start=T0, end=T0 + timedelta(hours=2), gpus=gpus, **kw)


def series(host: str, gpu: int, instance: str = "", **metrics) -> list[GpuBucket]:
    return [GpuBucket("c", host, gpu, T0 + timedelta(minutes=5 * i), 300, 10, gpu_instance=instance, **metrics)
            for i in range(24)]


def fleet() -> list:
    recs: list = []
    for i, (name, m) in enumerate(STOCK.items()):
        recs += [job(name, [AllocatedGpu("n1", i)]), *series("n1", i, **m)]
    # a MIG node of the stock fleet: two pods on 1g.10gb slices of GPU 0; each instance's series carry the pod
    # (dcgm-exporter's pod mapping), the stock counters and no GPU-Util (NVML reports none on MIG)
    for inst, pod, m in (("7", "mig-idle", {"gr_engine": 0.0, "dram_active": 0.0, "tensor_active": 0.0}),
                         ("8", "mig-busy", {"gr_engine": 0.8, "dram_active": 0.2, "tensor_active": 0.1})):
        recs.append(job(f"uid-{pod}", [AllocatedGpu("m1", None, model="a100", share=1 / 7, mig_profile="1g.10gb")],
                        source="kubernetes", name=pod, account="ml"))
        recs += series("m1", 0, inst, pod=pod, namespace="ml", **m)
    return recs


def test_each_tier_judges_its_buckets(store: Store) -> None:
    store.ingest(fleet())
    r = run_audit(store, Config(), W0, W1)
    u = usage(store, r.run_id)
    g = gpu_usage(store, r.run_id)
    s = 7200.0
    assert (u["idle"]["idle_by_counters_s"], u["idle"]["idle_s"], u["idle"]["idle_by_util_s"]) == (s, s, 0)
    assert (u["busy"]["busy_by_counters_s"], u["busy"]["working_s"], u["busy"]["busy_unverified_s"]) == (s, 0, 0)
    # an engine busy while Tensor and DRAM are idle: a spin or a wait, never verified work, not billed as idle
    assert (u["spin"]["engine_spin_s"], u["spin"]["idle_s"], u["spin"]["mirage_s"]) == (s, 0, 0)
    assert u["spin"]["idle_cost"] == 0 and u["spin"]["effective_s"] == 0
    assert (u["utilonly"]["busy_unverified_s"], u["utilonly"]["busy_by_counters_s"]) == (s, 0)
    assert (u["verified"]["working_s"], u["verified"]["engine_spin_s"]) == (s, 0)
    assert {k: g[(k, i)]["signal"] for i, k in enumerate(STOCK)} == {
        "idle": "counters", "busy": "counters", "spin": "counters", "utilonly": "gpu_util", "verified": "sm_active"}
    # MIG slices judged per instance on the same tiers (share 1/7 of the whole GPU's time)
    assert u["uid-mig-idle"]["idle_by_counters_s"] == pytest.approx(s / 7)
    assert u["uid-mig-busy"]["busy_by_counters_s"] == pytest.approx(s / 7)
    assert u["uid-mig-idle"]["unknown_s"] == pytest.approx(0, abs=1e-6)
    for ext, row in u.items():  # the identity holds with the new verdicts
        parts = (row["idle_s"] + row["mirage_s"] + row["low_s"] + row["working_s"] + row["busy_unverified_s"]
                 + row["busy_by_counters_s"] + row["engine_spin_s"] + row["unknown_s"] + row["infra_s"]
                 + row["input_wait_s"])
        assert parts == pytest.approx(row["reserved_s"]), ext
    t = r.summary["tier_gpu_hours"]
    assert t == pytest.approx({"sm_active": 2.0, "counters": 6.0 + 4 / 7, "gpu_util": 2.0})
    assert (r.summary["engine_spin_gpu_hours"], r.summary["idle_by_counters_gpu_hours"]) == \
        pytest.approx((2.0, 2.0 + 2 / 7))
    assert r.summary["idle_gpu_hours"] == pytest.approx(2.0 + 2 / 7)  # idle-by-counters is idle, spin is not


def test_every_report_format_and_chargeback_say_what_each_tier_judged(store: Store) -> None:
    store.ingest(fleet())
    cfg = Config()
    r = run_audit(store, cfg, W0, W1)
    ctx = report.build_context(store, cfg, r.run_id)
    text_body, md_body, html_body = render.render_text(ctx), render.render_md(ctx), render.render_html(ctx)[0]
    for body in (text_body, md_body, html_body):
        assert "stock counters" in body.lower()
        assert render.fmt_hours(6.0 + 4 / 7) in body  # the counters tier's GPU-hours
        assert "engine spin" in body
    doc = json.loads(render.render_json(ctx))
    assert doc["headline"]["counters_gpu_hours"] == pytest.approx(6.0 + 4 / 7)
    rows = cb.chargeback(store, cfg, W0, W1, "account", run_id=r.run_id)
    tot = cb.totals(rows)
    assert float(tot["counters_gpu_hours"]) == pytest.approx(6.0 + 4 / 7, abs=2e-6)  # rows rounded to 6 places
    assert (tot["verified_gpu_hours"], tot["util_only_gpu_hours"]) == (Decimal("2"), Decimal("2"))
    assert tot["engine_spin_gpu_hours"] == Decimal("2")
    for row in [*rows, tot]:
        assert row["reserved_gpu_hours"] == sum(row[f"{h}_gpu_hours"] for h in (
            "idle", "mirage", "low", "working", "busy_unverified", "busy_by_counters", "engine_spin", "unknown",
            "infra", "input_wait"))
        assert (row["verified_gpu_hours"] + row["counters_gpu_hours"] + row["util_only_gpu_hours"]
                == row["reserved_gpu_hours"] - row["unknown_gpu_hours"] - row["infra_gpu_hours"])
    csv_head = cb.to_csv(rows).splitlines()[0].split(",")
    assert csv_head[-6:] == ["idle_by_counters_gpu_hours", "busy_by_counters_gpu_hours", "engine_spin_gpu_hours",
                             "verified_gpu_hours", "counters_gpu_hours", "util_only_gpu_hours"]


def test_the_web_overview_says_what_the_stock_counters_judged(store: Store) -> None:
    import httpx
    from helpers import web_server

    store.ingest(fleet())
    cfg = Config()
    run_audit(store, cfg, W0, W1)
    with web_server(store, cfg) as base:
        page = httpx.get(base + "/", timeout=30).text
    assert "stock counters (no SM activity): <strong>" + render.fmt_hours(6.0 + 4 / 7) in page
    assert render.fmt_hours(2.0) + " of it engine spin" in page
