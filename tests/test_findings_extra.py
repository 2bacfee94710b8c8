"""idle_episode, idle_reservation, low_efficiency (with bottleneck hints) and capacity, on hand-computed
telemetry: 5-minute buckets, so 12 buckets are one hour."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from helpers import migrated_store
from sqlalchemy import text

from auditor.audit.capacity import capacity
from auditor.audit.run import run_audit
from auditor.config import Config, PriceCard, Thresholds
from auditor.records import AllocatedGpu, Allocation, GpuBucket, GpuInventory, Reservation
from auditor.store.engine import Store

T0 = datetime(2026, 11, 16, tzinfo=UTC)
W0, W1 = T0 - timedelta(days=1), T0 + timedelta(days=1)


def job(ext: str, gpus: list[AllocatedGpu], hours: float, start: datetime = T0, **kw: Any) -> Allocation:
    kw.setdefault("account", "acct")
    kw.setdefault("user", "u")
    return Allocation("c", "slurm", ext, start=start, end=start + timedelta(hours=hours), gpus=gpus,
                      **kw)


def run(host: str, gpu: int, first: int, n: int, **metrics: Any) -> list[GpuBucket]:
    """Buckets ``first`` .. ``first + n - 1`` (5 min each from T0) of one GPU with the same metrics."""
    samples = metrics.pop("samples", 10)
    return [GpuBucket("c", host, gpu, T0 + timedelta(minutes=5 * i), 300, samples, **metrics)
            for i in range(first, first + n)]


WORK = {"sm_active": 0.8, "gpu_util": 1.0}
IDLE = {"sm_active": 0.0, "gpu_util": 0.0}


def findings(store: Store, run_id: int, kind: str) -> dict[str, list[dict[str, Any]]]:
    """Findings of one kind keyed by job id (or reservation name)."""
    sql = ("SELECT f.*, a.external_id, r.name AS rname FROM findings f LEFT JOIN allocations a ON "
           "a.id = f.allocation_id LEFT JOIN reservations r ON r.id = f.reservation_id "
           "WHERE f.run_id = :r AND f.kind = :k ORDER BY f.start_ts")
    out: dict[str, list[dict[str, Any]]] = {}
    with store.engine.connect() as conn:
        for row in conn.execute(text(sql), {"r": run_id, "k": kind}):
            d = dict(row._mapping)
            if isinstance(d["evidence"], str):
                d["evidence"] = json.loads(d["evidence"])
            out.setdefault(d["external_id"] or d["rname"], []).append(d)
    return out


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.service)])
def store(request: pytest.FixtureRequest, tmp_path) -> Iterator[Store]:
    """The same tests on the embedded SQLite store and on a real PostgreSQL."""
    with migrated_store(request.param, tmp_path, "t_money") as s:
        yield s


def test_idle_episode_at_and_around_threshold(store: Store) -> None:
    recs: list[Any] = []
    # gpu index = idle buckets in the middle of 6 h of work: 24 (2 h, at threshold), 23 (1 h 55), 24 with
    # a missing bucket inside (two islands), 24 mirage buckets, and a job idle all along (idle_allocation)
    for idx, (idle_n, metrics) in enumerate([(24, IDLE), (23, IDLE), (24, None),
                                             (24, {"sm_active": 0.02, "gpu_util": 1.0})]):
        recs.append(job(f"j{idx}", [AllocatedGpu("n1", idx)], hours=6))
        recs += run("n1", idx, 0, 24, **WORK) + run("n1", idx, 24 + idle_n, 72 - 24 - idle_n, **WORK)
        if metrics is None:  # 12 idle buckets, one without samples, 11 idle
            recs += run("n1", idx, 24, 12, **IDLE) + run("n1", idx, 36, 1, samples=0) + run("n1", idx, 37, 11, **IDLE)
        else:
            recs += run("n1", idx, 24, idle_n, **metrics)
    recs += [job("allidle", [AllocatedGpu("n1", 7)], hours=6), *run("n1", 7, 0, 72, **IDLE)]
    store.ingest(recs)
    r = run_audit(store, Config(), W0, W1)
    eps = findings(store, r.run_id, "idle_episode")
    assert set(eps) == {"j0", "j3"}
    (e0,), (e3,) = eps["j0"], eps["j3"]
    assert (e0["start_ts"], e0["end_ts"]) == (int((T0 + timedelta(hours=2)).timestamp()),
                                              int((T0 + timedelta(hours=4)).timestamp()))
    assert e0["gpu_hours"] == pytest.approx(2.0) and e0["idle_gpu_hours"] == pytest.approx(2.0)
    assert e0["cost"] == pytest.approx(2.0 * 2.0)  # default price 2/GPU-hour
    assert e0["evidence"]["episode_mirage_gpu_hours"] == 0
    assert e3["evidence"]["episode_mirage_gpu_hours"] == pytest.approx(2.0)
    # a lower threshold catches the 1 h 55 episode and both 1-hour islands around the missing bucket
    r2 = run_audit(store, Config(thresholds=Thresholds(episode_hours=0.9)), W0, W1, what_if=True)
    eps2 = findings(store, r2.run_id, "idle_episode")
    assert eps2["j1"][0]["gpu_hours"] == pytest.approx(23 / 12)
    assert [e["gpu_hours"] for e in eps2["j2"]] == [pytest.approx(1.0), pytest.approx(11 / 12)]
    assert "allidle" not in eps2


def test_idle_episode_merges_gpus_and_weights_share(store: Store) -> None:
    two = job("two", [AllocatedGpu("n1", 0), AllocatedGpu("n1", 1)], hours=5)
    half = job("half", [AllocatedGpu("n2", 0, share=0.5)], hours=5)
    recs: list[Any] = [two, half]
    for host, idx in (("n1", 0), ("n2", 0)):
        recs += run(host, idx, 0, 12, **WORK) + run(host, idx, 12, 30, **IDLE) + run(host, idx, 42, 18, **WORK)
    # the second GPU's idle span starts 10 minutes later: one merged episode, GPU-hours summed (written
    # as its own series: a re-ingested bucket with as many samples no longer replaces the stored one)
    recs += run("n1", 1, 0, 14, **WORK) + run("n1", 1, 14, 28, **IDLE) + run("n1", 1, 42, 18, **WORK)
    store.ingest(recs)
    r = run_audit(store, Config(), W0, W1)
    eps = findings(store, r.run_id, "idle_episode")
    (e,) = eps["two"]
    assert e["evidence"]["episode_gpus"] == 2 and e["evidence"]["episode_gpu_indices"] == [0, 1]
    assert e["gpu_hours"] == pytest.approx(2.5 + 28 / 12)
    assert e["end_ts"] - e["start_ts"] == 150 * 60
    assert eps["half"][0]["gpu_hours"] == pytest.approx(0.5 * 2.5)


def test_low_efficiency_threshold_and_hints(store: Store) -> None:
    cases = {
        "memory": {"sm_active": 0.2, "dram_active": 0.5},
        "tensor": {"sm_active": 0.2, "tensor_active": 0.15, "dram_active": 0.1},
        "io": {"sm_active": 0.1, "dram_active": 0.02, "pcie_rx_bps": 2e9},
        "pulse": {"sm_active": 0.1, "dram_active": 0.02, "gpu_util": 0.5},
        "held": {"sm_active": 0.06, "gpu_util": 0.02, "fb_used_mib": 30000.0},
        "none": {"sm_active": 0.1, "dram_active": 0.2, "gpu_util": 1.0},
        "at-sm": {"sm_active": 0.25},          # not below the threshold
        "short": {"sm_active": 0.1},           # 3 h 55 observed < 4 GPU-hours
        "idle": {"sm_active": 0.01},           # already idle_allocation
    }
    recs: list[Any] = []
    for idx, (name, m) in enumerate(cases.items()):
        n = 47 if name == "short" else 48
        recs += [job(name, [AllocatedGpu("n1", idx)], hours=n / 12), *run("n1", idx, 0, n, **m)]
    store.ingest(recs)
    r = run_audit(store, Config(), W0, W1)
    low = findings(store, r.run_id, "low_efficiency")
    assert {k: v[0]["evidence"]["hint"] for k, v in low.items()} == {
        "memory": "memory-bound", "tensor": "compute-bound (tensor)", "io": "input/communication wait",
        "pulse": "input wait", "held": "memory held, no compute", "none": "undetermined"}
    ev = low["memory"][0]["evidence"]
    assert ev["mean_sm_active"] == pytest.approx(0.2) and ev["unused_sm_gpu_hours"] == pytest.approx(3.2)
    assert low["memory"][0]["gpu_hours"] == pytest.approx(4.0)
    # a lower bar for the hours flags the short one; a lower SM threshold flags fewer
    r2 = run_audit(store, Config(thresholds=Thresholds(low_efficiency_min_gpu_hours=3.9,
                                                       low_efficiency_sm=0.15)), W0, W1, what_if=True)
    assert set(findings(store, r2.run_id, "low_efficiency")) == {"io", "pulse", "held", "none", "short"}


def test_idle_reservation(store: Store) -> None:
    resv = Reservation("c", "maint", T0, T0 + timedelta(hours=10), nodes=["n9"], gpu_count=2,
                       users=["alice"], accounts=["physics"])
    inside = job("in", [AllocatedGpu("n9", 0, model="h100")], hours=4, start=T0 + timedelta(hours=1),
                 reservation="maint")
    # same name, but after the reservation ended: not part of it
    later = job("later", [AllocatedGpu("n9", 1)], hours=1, start=T0 + timedelta(hours=11), reservation="maint")
    recs: list[Any] = [resv, inside, later, *[GpuInventory("c", "n9", g, model="H100-SXM") for g in range(4)]]
    recs += run("n9", 0, 12, 12, **IDLE) + run("n9", 0, 24, 36, **WORK) + run("n9", 1, 132, 12, **IDLE)
    store.ingest(recs)
    cfg = Config(prices=PriceCard(models={"h100": 3.0}))
    r = run_audit(store, cfg, W0, W1)
    (f,) = findings(store, r.run_id, "idle_reservation")["maint"]
    ev = f["evidence"]
    assert ev["reserved_gpu_hours"] == 20 and ev["used_gpu_hours"] == 4 and ev["jobs"] == 1
    assert ev["unused_gpu_hours"] == 16 and ev["jobs_idle_gpu_hours"] == pytest.approx(1.0)
    assert f["idle_gpu_hours"] == pytest.approx(17.0) and f["cost"] == pytest.approx(17 * 3.0)
    assert f["team"] == "(unmapped)" and f["account"] == "physics" and f["allocation_id"] is None
    # the window cuts the reservation: [T0+2h, ...) -> 16 reserved, 3 used, the idle hour is outside
    r2 = run_audit(store, cfg, T0 + timedelta(hours=2), W1, what_if=True)
    (g,) = findings(store, r2.run_id, "idle_reservation")["maint"]
    assert (g["gpu_hours"], g["evidence"]["used_gpu_hours"], g["idle_gpu_hours"]) == (16, 3, 13)


def test_capacity_neither_allocated_nor_reserved(store: Store) -> None:
    recs: list[Any] = [GpuInventory("c", "n9", g, model="h100") for g in range(4)]
    recs += [GpuInventory("c", "m1", g, model="a100") for g in range(2)]
    recs += [Reservation("c", "r", T0, T0 + timedelta(hours=10), nodes=["n9"], gpu_count=2),
             job("in", [AllocatedGpu("n9", 0)], hours=4, reservation="r"),
             job("out", [AllocatedGpu("m1", 0, share=0.5)], hours=10)]
    store.ingest(recs)
    with store.engine.connect() as conn:
        rows = {r["model"]: r for r in capacity(conn, int(T0.timestamp()),
                                                int((T0 + timedelta(hours=10)).timestamp()))}
    h, a = rows["h100"], rows["a100"]
    assert (h["gpus"], h["gpu_hours"], h["allocated_gpu_hours"], h["reserved_unused_gpu_hours"]) == (4, 40, 4, 16)
    assert h["free_gpu_hours"] == 20 and h["mean_free_gpus"] == 2
    assert (a["gpus"], a["allocated_gpu_hours"], a["free_gpu_hours"]) == (2, 5, 15)
