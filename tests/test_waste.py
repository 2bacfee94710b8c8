"""Issue 19 §1: the mirage split (hung_collective, ghost_busy, util_mirage) and §4 energy, on both engines.

Every expected number is worked out by hand in the comments (2-hour jobs, 24 buckets of 300 s)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from helpers import usage
from sqlalchemy import text

from auditor.audit.run import run_audit
from auditor.config import Config
from auditor.records import AllocatedGpu, Allocation, GpuBucket
from auditor.store.engine import Store

T0 = datetime(2026, 11, 20, tzinfo=UTC)
W0, W1 = T0 - timedelta(days=1), T0 + timedelta(days=1)
SPLIT = ("util_mirage", "hung_collective", "ghost_busy", "idle_allocation")


def job(ext: str, node: str, idx: list[int]) -> Allocation:
    return Allocation("c", "slurm", ext, user="u", account="acct", start=T0, end=T0 + timedelta(hours=2),
                      gpus=[AllocatedGpu(node, i) for i in idx])


def series(host: str, gpu: int, n: int = 24, first: int = 0, **metrics) -> list[GpuBucket]:
    return [GpuBucket("c", host, gpu, T0 + timedelta(minutes=5 * (first + i)), 300, 10, **metrics)
            for i in range(n)]


MIRAGE = {"sm_active": 0.01, "gpu_util": 1.0}


def fleet() -> list:
    recs: list = []
    # hung: 2 GPUs spinning at 100 % GPU-Util, 80 W, 30000 MiB held -> hung_collective
    recs += [job("hung", "n1", [0, 1]), *series("n1", 0, **MIRAGE, power_w=80.0, fb_used_mib=30000.0),
             *series("n1", 1, **MIRAGE, power_w=80.0, fb_used_mib=30000.0)]
    # ghost: 100 % GPU-Util, 0 MiB used -> ghost_busy (one GPU is enough)
    recs += [job("ghost", "n2", [0]), *series("n2", 0, **MIRAGE, power_w=70.0, fb_used_mib=0.0)]
    # ghost16: exactly at ghost_max_fb_mib (16 <= 16) -> ghost_busy; fb17: 17 > 16 -> util_mirage
    recs += [job("ghost16", "n2", [1]), *series("n2", 1, **MIRAGE, fb_used_mib=16.0)]
    recs += [job("fb17", "n2", [2]), *series("n2", 2, **MIRAGE, fb_used_mib=17.0)]
    # spin: the hung signature on one GPU: a process spinning, not a collective -> util_mirage
    recs += [job("spin", "n2", [3]), *series("n2", 3, **MIRAGE, power_w=80.0, fb_used_mib=30000.0)]
    # hot: 2 GPUs but 300 W > 150 W -> util_mirage
    recs += [job("hot", "n3", [0, 1]), *series("n3", 0, **MIRAGE, power_w=300.0, fb_used_mib=30000.0),
             *series("n3", 1, **MIRAGE, power_w=300.0, fb_used_mib=30000.0)]
    # nopower: no power reading is no evidence of idle power -> util_mirage
    recs += [job("nopower", "n3", [2, 3]), *series("n3", 2, **MIRAGE, fb_used_mib=30000.0),
             *series("n3", 3, **MIRAGE, fb_used_mib=30000.0)]
    # halfutil: GPU-Util 0.6 (a mirage, >= 0.5) but mean 0.6 < 0.9 -> util_mirage
    recs += [job("halfutil", "n4", [0, 1]),
             *series("n4", 0, sm_active=0.01, gpu_util=0.6, power_w=80.0, fb_used_mib=30000.0),
             *series("n4", 1, sm_active=0.01, gpu_util=0.6, power_w=80.0, fb_used_mib=30000.0)]
    # mixed power: 12 buckets at 100 W, 12 at 250 W on both GPUs: mean (100 + 250) / 2 = 175 W > 150 -> util_mirage
    # (every bucket alone below or above: the rule reads the mean, not a maximum or a minimum)
    recs += [job("mixed", "n5", [0, 1])]
    for g in (0, 1):
        recs += [*series("n5", g, n=12, **MIRAGE, power_w=100.0, fb_used_mib=30000.0),
                 *series("n5", g, n=12, first=12, **MIRAGE, power_w=250.0, fb_used_mib=30000.0)]
    # mixed140: 12 at 130 W + 12 at 150 W: mean 140 <= 150 -> hung_collective
    recs += [job("mixed140", "n6", [0, 1])]
    for g in (0, 1):
        recs += [*series("n6", g, n=12, **MIRAGE, power_w=130.0, fb_used_mib=30000.0),
                 *series("n6", g, n=12, first=12, **MIRAGE, power_w=150.0, fb_used_mib=30000.0)]
    # hungwork: 20 mirage buckets at 80 W then 4 working ones (SM 0.9) at 400 W on both GPUs: idle share
    # 2 x 6000 / 14400 = 83 % >= 80 %; the power while mirage is 80 W (the working 400 W do not count) -> hung
    recs += [job("hungwork", "n7", [0, 1])]
    for g in (0, 1):
        recs += [*series("n7", g, n=20, **MIRAGE, power_w=80.0, fb_used_mib=30000.0),
                 *series("n7", g, n=4, first=20, sm_active=0.9, gpu_util=1.0, power_w=400.0, fb_used_mib=30000.0)]
    return recs


def findings(store: Store, run_id: int) -> dict[str, dict[str, dict]]:
    out: dict[str, dict[str, dict]] = {}
    with store.engine.connect() as conn:
        for r in conn.execute(text("SELECT a.external_id, f.kind, f.evidence FROM findings f JOIN allocations a "
                                   "ON a.id = f.allocation_id WHERE f.run_id = :r"), {"r": run_id}):
            if r.kind in SPLIT:
                ev = json.loads(r.evidence) if isinstance(r.evidence, str) else r.evidence
                out.setdefault(r.external_id, {})[r.kind] = ev
    return out


def test_mirage_split(store: Store) -> None:
    store.ingest(fleet())
    run = run_audit(store, Config(), W0, W1)
    got = findings(store, run.run_id)
    assert {k: sorted(v) for k, v in got.items()} == {
        "hung": ["hung_collective"], "ghost": ["ghost_busy"], "ghost16": ["ghost_busy"], "fb17": ["util_mirage"],
        "spin": ["util_mirage"], "hot": ["util_mirage"], "nopower": ["util_mirage"], "halfutil": ["util_mirage"],
        "mixed": ["util_mirage"], "mixed140": ["hung_collective"], "hungwork": ["hung_collective"]}
    hung = got["hung"]["hung_collective"]
    # 2 GPUs x 7200 s mirage at GPU-Util 1.0 and 80 W
    assert hung["recipient"] == "user" and "stuck, not slow" in hung["rule"]
    assert hung["mirage_mean_gpu_util"] == pytest.approx(1.0) and hung["mirage_mean_power_w"] == pytest.approx(80.0)
    assert got["ghost"]["ghost_busy"]["recipient"] == "operations"
    assert got["mixed"]["util_mirage"]["mirage_mean_power_w"] == pytest.approx(175.0)
    assert got["mixed140"]["hung_collective"]["mirage_mean_power_w"] == pytest.approx(140.0)
    u = usage(store, run.run_id)
    # hung: mirage_util = 2 x 7200 x 1.0 = 14400; power: 14400 s x 80 W = 1,152,000 J, all of it idle (mirage)
    assert u["hung"]["mirage_util_s"] == pytest.approx(14400.0)
    assert u["hung"]["mirage_power_s"] == pytest.approx(1_152_000.0)
    assert u["hung"]["mirage_power_observed_s"] == pytest.approx(14400.0)
    assert u["hung"]["energy_s"] == pytest.approx(1_152_000.0) == u["hung"]["idle_energy_s"]
    # halfutil: 14400 s x 0.6 = 8640
    assert u["halfutil"]["mirage_util_s"] == pytest.approx(8640.0)
    # nopower: no reading, nothing summed
    assert u["nopower"]["power_observed_s"] == 0 and u["nopower"]["energy_s"] == 0
    # mixed: 2 GPUs x (3600 s x 100 W + 3600 s x 250 W) = 2,520,000 J
    assert u["mixed"]["energy_s"] == pytest.approx(2_520_000.0)
    # hungwork: 2 x 6000 s x 80 W = 960,000 J idle (mirage); + 2 x 1200 s x 400 W = 960,000 J working
    assert u["hungwork"]["idle_energy_s"] == pytest.approx(960_000.0)
    assert u["hungwork"]["energy_s"] == pytest.approx(1_920_000.0)
    assert u["hungwork"]["idle_power_observed_s"] == pytest.approx(12000.0)


def energy_fleet() -> list:
    def alloc(ext: str, user: str, node: str, model: str) -> Allocation:
        return Allocation("c", "slurm", ext, user=user, account="acct", start=T0, end=T0 + timedelta(hours=2),
                          gpus=[AllocatedGpu(node, 0, model=model)])
    return [
        # e1 (H100): 1 h working at 400 W, 1 h idle at 70 W: 3600 x 400 + 3600 x 70 = 1,692,000 J = 0.47 kWh,
        # idle 252,000 J = 0.07 kWh; all measured
        alloc("e1", "u1", "n1", "NVIDIA H100 80GB HBM3"),
        *series("n1", 0, n=12, sm_active=0.9, gpu_util=1.0, power_w=400.0),
        *series("n1", 0, n=12, first=12, sm_active=0.0, gpu_util=0.0, power_w=70.0),
        # e2 (A100, idle power 50 W configured): 1 h idle without a power field, 1 h no telemetry: all 7200 s
        # estimated: 7200 x 50 = 360,000 J = 0.1 kWh; idle 3600 x 50 = 180,000 J = 0.05 kWh, estimated
        alloc("e2", "u2", "n2", "NVIDIA A100-SXM4-40GB"),
        *series("n2", 0, n=12, sm_active=0.0, gpu_util=0.0),
    ]


def test_energy_and_carbon(store: Store) -> None:
    from auditor.config import parse
    from auditor.report import chargeback

    cfg = parse({"energy": {"idle_power_w": {"A100": 50.0, "H100": 70.0}, "grid_gco2_per_kwh": {"c": 400.0}}})
    store.ingest(energy_fleet())
    run = run_audit(store, cfg, W0, W1)
    e = run.summary["energy"]
    # 0.47 + 0.1 = 0.57 kWh (0.1 estimated); idle 0.07 + 0.05 = 0.12 (0.05 estimated); x 400 g/kWh:
    # 0.57 x 0.4 = 0.228 kg, idle 0.12 x 0.4 = 0.048 kg
    assert (e["energy_kwh"], e["energy_estimated_kwh"]) == (pytest.approx(0.57), pytest.approx(0.1))
    assert (e["idle_energy_kwh"], e["idle_energy_estimated_kwh"]) == (pytest.approx(0.12), pytest.approx(0.05))
    assert (e["co2_kg"], e["idle_co2_kg"]) == (pytest.approx(0.228), pytest.approx(0.048))
    assert e["by_cluster"][0]["grid_gco2_per_kwh"] == 400.0
    rows = {r["owner"]: r for r in chargeback.chargeback(store, cfg, W0, W1, "user", run_id=run.run_id)}
    from decimal import Decimal as D

    assert [rows["u1"][k] for k in ("energy_kwh", "energy_estimated_kwh", "idle_energy_kwh",
                                    "idle_energy_estimated_kwh", "co2_kg", "idle_co2_kg")] == \
        [D("0.47"), D("0"), D("0.07"), D("0"), D("0.188"), D("0.028")]
    assert [rows["u2"][k] for k in ("energy_kwh", "energy_estimated_kwh", "idle_energy_kwh",
                                    "idle_energy_estimated_kwh", "co2_kg", "idle_co2_kg")] == \
        [D("0.1"), D("0.1"), D("0.05"), D("0.05"), D("0.04"), D("0.02")]
    # no intensity configured: no carbon figure (empty in CSV), energy unchanged
    plain = parse({"energy": {"idle_power_w": {"A100": 50.0}}})
    rows2 = chargeback.chargeback(store, plain, W0, W1, "user", run_id=run.run_id)
    assert {r["co2_kg"] for r in rows2} == {None} and chargeback.totals(rows2)["co2_kg"] is None
    assert sum(r["energy_kwh"] for r in rows2) == D("0.57")
    csv_text = chargeback.to_csv(rows2)
    assert csv_text.splitlines()[1].count(",,") >= 1


def test_right_size_hint(store: Store) -> None:
    from auditor.config import parse

    h100 = "NVIDIA H100 80GB HBM3"

    def alloc(ext: str, node: str, n: int, model: str) -> Allocation:
        return Allocation("c", "slurm", ext, user="u", account="acct", start=T0, end=T0 + timedelta(hours=5),
                          gpus=[AllocatedGpu(node, i, model=model) for i in range(n)])
    low = {"gpu_util": 0.5, "power_w": 100.0}
    recs = [alloc("small", "n1", 1, h100), *series("n1", 0, n=60, sm_active=0.1, fb_used_mib=8000.0, **low),
            alloc("wide", "n2", 4, h100),
            *(b for g in range(4) for b in series("n2", g, n=60, sm_active=0.2, fb_used_mib=30000.0, **low)),
            alloc("nosize", "n3", 1, "Tesla T4"), *series("n3", 0, n=60, sm_active=0.1, fb_used_mib=8000.0, **low)]
    store.ingest(recs)
    cfg = parse({"prices": {"default": 2.0, "mig": {"1g.10gb": 0.5}}})
    run = run_audit(store, cfg, W0, W1)
    with store.engine.connect() as conn:
        ev = {r.external_id: (json.loads(r.evidence) if isinstance(r.evidence, str) else r.evidence)["right_size"]
              for r in conn.execute(text("SELECT a.external_id, f.evidence FROM findings f JOIN allocations a ON "
                                         "a.id = f.allocation_id WHERE f.run_id = :r AND f.kind = 'low_efficiency'"),
                                    {"r": run.run_id})}
    assert set(ev) == {"small", "wide", "nosize"}
    # small: peak 8000 MiB <= 80 GiB / 8 = 10240 and SM 0.1 <= 1/7: 1g.10gb; 5 h x 2.0 = 10.0 reserved,
    # 5 h x 0.5 (the configured MIG price) = 2.5: saves 7.5
    assert ev["small"]["mig_profile"] == "1g.10gb" and ev["small"]["mig_saving"] == pytest.approx(7.5)
    assert "fewer_gpus" not in ev["small"]
    # wide: 30000 MiB > 20480 (2g), <= 40960 (3g) and SM 0.2 <= 3/7: 3g.40gb at 2.0 x 3/7 per hour:
    # 20 GPU-h x 2.0 = 40.0 - 20 x 6/7 = 17.142857 -> saves 22.857143; SM work 0.2 x 4 = 0.8 GPUs at 50 % fill
    # = ceil(1.6) = 2 GPUs: saves 40 x 2/4 = 20.0
    assert ev["wide"]["mig_profile"] == "3g.40gb" and ev["wide"]["mig_saving"] == pytest.approx(40 - 120 / 7)
    assert ev["wide"]["fewer_gpus"] == 2 and ev["wide"]["fewer_gpus_saving"] == pytest.approx(20.0)
    # nosize: the model name does not say its memory and it is one GPU: no hint
    assert ev["nosize"] is None
