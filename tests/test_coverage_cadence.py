"""Observed seconds at bucket edges on real scrapes replayed at cadences that do not divide the 5-minute
bucket (57 s, 15 s, 30 s with dropped scrapes, 60 s with +-2 s jitter), through the scrape connector, the
store and the audit, on SQLite and PostgreSQL: coverage equals the sample-covered time.

The sample-covered time is computed in each test from the instants alone (docs/definitions.md "Observed
seconds from samples": sample t covers [t, min(next, t + interval)), interval = the median gap), never
from bucket rows."""

from __future__ import annotations

import random
import statistics
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES
from sqlalchemy import text

from auditor.audit.run import run_audit
from auditor.config import Config
from auditor.records import AllocatedGpu, Allocation
from auditor.store.engine import Store
from connectors import build
from connectors.base import Context, Problems, Window
from connectors.prometheus import carried

T4 = FIXTURES / "dcgm" / "t4-gke-k8s-prof.prom"  # real GKE scrape: GPU 0 runs pod default/triton-..., GPU 1 free
HOST = "gke-test-dcgm-default-pool-fed1e979-tt7p"
POD = ("default", "triton-84d57987c9-kks4k")
T0 = 1_795_705_200  # 2026-11-26T15:00Z, a whole hour
EVER = Window(datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC))


def replay(tmp: Path, instants: list[float]) -> Path:
    """The real scrape's sample lines once per instant, each with its millisecond timestamp."""
    lines = [ln for ln in T4.read_text(encoding="utf-8").splitlines() if ln and not ln.startswith("#")]
    out = tmp / "trace.prom"
    with out.open("w", encoding="utf-8") as f:
        for t in instants:
            ms = round(t * 1000)
            f.writelines(f"{ln} {ms}\n" for ln in lines)
    return out


def cadence(kind: str, seed: int = 7) -> list[float]:
    """About 3 hours of instants from T0 + 13 s."""
    rng = random.Random(seed)
    step = {"57": 57, "15": 15, "30drop": 30, "60jitter": 60}[kind]
    out = []
    for k in range(3 * 3600 // step):
        t = T0 + 13 + k * step
        if kind == "30drop" and rng.random() < 0.15:
            continue
        out.append(round(t + rng.uniform(-2, 2), 3) if kind == "60jitter" else float(t))
    return out


def sample_covered(instants: list[float], lo: float, hi: float) -> float:
    """Seconds of [lo, hi) the instants cover: each until the next, at most the median gap."""
    ts = sorted(instants)
    iv = statistics.median(b - a for a, b in zip(ts, ts[1:], strict=False))
    ends = [min(ts[i + 1], t + iv) if i + 1 < len(ts) else t + iv for i, t in enumerate(ts)]
    return sum(max(0.0, min(e, hi) - max(t, lo)) for t, e in zip(ts, ends, strict=True))


def audit(store: Store, buckets: list[Any], allocs: list[Allocation]) -> dict[str, dict[str, float]]:
    store.ingest([*allocs, *buckets])
    since, until = datetime.fromtimestamp(T0 - 3600, UTC), datetime.fromtimestamp(T0 + 5 * 3600, UTC)
    rid = run_audit(store, Config(), since, until).run_id
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT a.external_id, u.reserved_s, u.observed_s, u.unknown_s, u.idle_s "
                                 "FROM usage_allocation u JOIN allocations a ON a.id = u.allocation_id "
                                 "WHERE u.run_id = :r"), {"r": rid})
        return {r[0]: {"reserved": r[1], "observed": r[2], "unknown": r[3], "idle": r[4]} for r in rows}


def collect(path: Path) -> list[Any]:
    src = build("scrape", "telemetry", {"paths": [str(path)]}, Context("c1", path.parent))
    problems = Problems()
    out = list(src.collect(EVER, problems))
    assert problems.total == 0
    return out


@pytest.mark.parametrize("kind", ["57", "15", "30drop", "60jitter"])
def test_coverage_is_the_sample_covered_time(store: Store, tmp_path: Path, kind: str) -> None:
    """A Slurm job on the free GPU 1 and the pod on GPU 0, both starting before the first sample and ending
    at an instant that is no bucket edge: observed = the sample-covered part of the reservation to 1e-3
    (before the fix a 57 s trace read 91 % of it: every bucket lost its head to the previous bucket)."""
    ts = cadence(kind)
    if kind == "57":  # an outage of two scrapes inside the trace
        ts = [t for i, t in enumerate(ts) if i not in (60, 61)]
    a_s, a_e = T0 - 100, T0 + 2 * 3600 + 4321
    job = Allocation("c1", "slurm", "4242", name="train", user="u", account="acct",
                     start=datetime.fromtimestamp(a_s, UTC), end=datetime.fromtimestamp(a_e, UTC),
                     gpus=[AllocatedGpu(HOST, 1)])
    pod = Allocation("c1", "kubernetes", "uid-1", name=POD[1], user="u", account=POD[0],
                     start=datetime.fromtimestamp(a_s, UTC), end=datetime.fromtimestamp(a_e, UTC),
                     gpus=[AllocatedGpu(HOST, 0)])
    got = audit(store, collect(replay(tmp_path, ts)), [job, pod])
    want = sample_covered(ts, a_s, a_e)
    reserved = float(a_e - a_s)
    for ext in ("4242", "uid-1"):
        r = got[ext]
        assert r["reserved"] == pytest.approx(reserved)
        assert r["observed"] / reserved == pytest.approx(want / reserved, abs=1e-3), (kind, ext, r, want)
        assert r["unknown"] == pytest.approx(reserved - r["observed"])


def test_one_early_scrape_does_not_shrink_the_interval(store: Store, tmp_path: Path) -> None:
    """A gap-free 60 s series with one scrape 1 s early (a 59 s gap): still all observed (7,026 of 7,200 s
    before the fix, with the smallest gap as the interval: 5 x 59 s per bucket)."""
    ts = [float(T0 + k * 60) for k in range(120)]
    ts[50] -= 1
    a_s, a_e = T0, T0 + 120 * 60
    job = Allocation("c1", "slurm", "7", name="j", user="u", account="a", start=datetime.fromtimestamp(a_s, UTC),
                     end=datetime.fromtimestamp(a_e, UTC), gpus=[AllocatedGpu(HOST, 1)])
    got = audit(store, collect(replay(tmp_path, ts)), [job])["7"]
    assert got["observed"] == pytest.approx(a_e - a_s, abs=1.0), got  # hand: 7,200 s, every second covered


def _ended_job(store: Store, tmp_path: Path, drop: set[int]) -> tuple[dict[str, float], float]:
    """A job on the free GPU 1 for [T0, T0 + 1000 s), ending mid-bucket; the exporter (no job labels) keeps
    sampling the GPU every 30 s until T0 + 3000 s, less the instants in ``drop``."""
    ts = [float(T0 + k * 30) for k in range(100) if T0 + k * 30 not in drop]
    job = Allocation("c1", "slurm", "9", name="j", user="u", account="a", start=datetime.fromtimestamp(T0, UTC),
                     end=datetime.fromtimestamp(T0 + 1000, UTC), gpus=[AllocatedGpu(HOST, 1)])
    return audit(store, collect(replay(tmp_path, ts)), [job])["9"], sample_covered(ts, T0, T0 + 1000)


def test_samples_after_the_job_ended_are_not_its_idle_time(store: Store, tmp_path: Path) -> None:
    """Hand: the job reserved 1,000 s, every second covered; the 2,000 s of samples after it are not its."""
    got, want = _ended_job(store, tmp_path, set())
    assert want == 1000.0 and got["reserved"] == pytest.approx(1000.0)
    assert got["observed"] == pytest.approx(1000.0) and got["idle"] == pytest.approx(1000.0)


def test_a_hole_before_the_job_ended_is_not_filled_by_samples_after_it(store: Store, tmp_path: Path) -> None:
    """Hand: scrapes at T0+930 and T0+960 dropped: [T0+930, T0+990) uncovered, 940 of the 1,000 s observed.
    The edge bucket [T0+900, T0+1200) covers 240 s over the hull [T0+900, T0+1200); 200 s of it lie after the
    end, so 240 - 200 = 40 s must lie inside (before the edge clipping: min(100, 240) = 100 s, 1,000 in all)."""
    got, want = _ended_job(store, tmp_path, {T0 + 930, T0 + 960})
    assert want == 940.0
    assert got["observed"] == pytest.approx(940.0) and got["idle"] == pytest.approx(940.0)


def test_prometheus_sample_counts_carry_over_bucket_edges() -> None:
    """Prometheus gives counts per bucket, not instants. Hand: a 57 s series from t = 0 has 6 samples in
    [0, 300) (342 s of cover: 42 s into the next bucket), 5 in [300, 600) (285 + 42 >= 300), ...: every
    bucket but the last is covered whole, configured (57 s) or estimated (the median of 300/5 and 300/6:
    60 s). Without the carry, buckets of 5 samples read 285 s (95 %). A 30 s series with one scrape lost
    in a bucket: 9 samples, 270 s."""
    counts = Counter(k * 57 // 300 * 300 for k in range(527))  # t = 0 .. 29,982 s
    rows = [(s, "101", n) for s, n in sorted(counts.items())]
    last = max(counts)
    for interval in (57.0, None):
        got = carried(300, rows, interval)
        assert {v for (s, _j), v in got.items() if s != last} == {300.0}, interval
    lost = [(s, "", 9 if s == 3000 else 10) for s in range(0, 6000, 300)]
    got = carried(300, lost, None)
    assert got[(3000, "")] == 270.0 and got[(2700, "")] == got[(3300, "")] == 300.0


def test_a_util_only_job_next_to_the_free_gpus_profiling_series(store: Store, tmp_path: Path) -> None:
    """A job-following exporter: while GPU 1 is free it exports SM activity and GPU-Util unlabelled, every
    30 s from T0 + 7 s; the job (hpc_job 77, [T0 + 130, T0 + 3130): 50 minutes) gets GPU-Util only, every
    30 s from its start. Hand: the job's 100 samples cover its 3,000 s, all busy-unverified (GPU-Util 100 %);
    its first and last buckets, shared with the free series, are no less observed."""
    uuid = "GPU-4812b59b-1f1a-430f-d8a4-69d2ee8c18bb"
    base = f'gpu="1",UUID="{uuid}",device="nvidia1",modelName="Tesla T4",Hostname="{HOST}"'
    lines = []
    for k in range(150):
        t = T0 + 7 + k * 30
        if not T0 + 130 <= t < T0 + 3130:
            lines += [f"DCGM_FI_PROF_SM_ACTIVE{{{base}}} 0 {t * 1000}", f"DCGM_FI_DEV_GPU_UTIL{{{base}}} 0 {t * 1000}"]
    lines += [f'DCGM_FI_DEV_GPU_UTIL{{{base},hpc_job="77"}} 100 {(T0 + 130 + k * 30) * 1000}' for k in range(100)]
    path = tmp_path / "follow.prom"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    job = Allocation("c1", "slurm", "77", name="j", user="u", account="a",
                     start=datetime.fromtimestamp(T0 + 130, UTC), end=datetime.fromtimestamp(T0 + 3130, UTC),
                     gpus=[AllocatedGpu(HOST, 1)])
    store.ingest([job, *collect(path)])
    rid = run_audit(store, Config(), datetime.fromtimestamp(T0 - 3600, UTC),
                    datetime.fromtimestamp(T0 + 5 * 3600, UTC)).run_id
    with store.engine.connect() as conn:
        got = conn.execute(text("SELECT u.observed_s, u.busy_unverified_s, u.unknown_s FROM usage_allocation u "
                                "WHERE u.run_id = :r"), {"r": rid}).one()
    assert tuple(got) == pytest.approx((3000.0, 3000.0, 0.0)), tuple(got)
