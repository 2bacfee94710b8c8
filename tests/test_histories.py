"""Issue 13 section 3 and issue 14 section 1 on real-shaped histories, on SQLite AND PostgreSQL, each with
numbers computed by hand in the comments (docs/definitions.md is the rule book).

Every test here was seen failing against the code before the fix (or with the fix broken on purpose).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from helpers import usage
from sqlalchemy import text
from storecheck import checksum

from auditor.audit.run import run_audit
from auditor.config import Config, StoreConfig, Thresholds
from auditor.errors import StoreError
from auditor.records import AllocatedGpu, Allocation, GpuBucket
from auditor.store.engine import Store
from auditor.store.retention import prune
from connectors import build
from connectors.base import Context, Problems, Window

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)  # a Monday 10:00, aligned to the hour
W0, W1 = T0 - timedelta(days=1), T0 + timedelta(days=1)
M = timedelta(minutes=1)


def job(ext: str, gpus: list[AllocatedGpu], start: datetime = T0, minutes: float = 120, **kw) -> Allocation:
    kw.setdefault("account", "acct")
    return Allocation("c", "slurm", ext, user="u", start=start, end=start + minutes * M, gpus=gpus, **kw)


def b5(host: str, gpu: int, at: datetime, samples: int = 10, **kw) -> GpuBucket:
    """One 5-minute bucket."""
    return GpuBucket("c", host, gpu, at, 300, samples, **kw)


def audit(store: Store, cfg: Config | None = None) -> dict[str, dict]:
    return usage(store, run_audit(store, cfg or Config(), W0, W1).run_id)


def parts(u: dict) -> float:
    return (u["idle_s"] + u["mirage_s"] + u["low_s"] + u["working_s"] + u["busy_unverified_s"]
            + u["unknown_s"])


# -- several telemetry sources for one GPU -------------------------------------------------------------

@pytest.mark.parametrize("order", ["profiling first", "power first"])
def test_two_sources_merge_field_by_field(store: Store, order: str) -> None:
    """Source A: SM 0.01 and DRAM 0.0 at 30 s (10 samples a bucket); source B: GPU-Util 0.9 and power
    at 15 s (20 samples). Merged: SM 0.01 (only A has it), GPU-Util 0.9 (only B) -> idle by SM while
    GPU-Util reads busy = mirage, all 24 buckets: mirage 24 x 300 = 7200 s, in either order. Before: the
    row with more samples replaced the other's fields (SM lost -> no SM verdict)."""
    a = [b5("n1", 0, T0 + i * 5 * M, 10, sm_active=0.01, dram_active=0.0) for i in range(24)]
    b = [b5("n1", 0, T0 + i * 5 * M, 20, gpu_util=0.9, power_w=250.0) for i in range(24)]
    store.ingest([job("1", [AllocatedGpu("n1", 0)])])
    for part in ((a, b) if order == "profiling first" else (b, a)):
        store.ingest(part)
    before = checksum(store)["gpu_buckets"]
    store.ingest(a + b)  # the same rows again change nothing
    assert checksum(store)["gpu_buckets"] == before
    with store.engine.connect() as conn:
        row = conn.execute(text("SELECT samples, sm_active, gpu_util, power_w FROM gpu_buckets "
                                "ORDER BY bucket_ts LIMIT 1")).one()
    assert tuple(row) == (20, 0.01, 0.9, 250.0)
    u = audit(store)["1"]
    assert u["mirage_s"] == pytest.approx(7200) and u["unknown_s"] == pytest.approx(0)


# -- changing store.bucket_seconds ---------------------------------------------------------------------

def test_bucket_width_change_is_refused(store: Store, tmp_path: Path) -> None:
    """5-minute rows stored: 10-minute rows would cover the same time twice. Refused, one line naming the
    stored width, nothing stored; a collection configured with 600 s is refused before reading anything."""
    from auditor.collect import collect

    store.ingest([b5("n1", 0, T0, 10, sm_active=0.5)])
    with pytest.raises(StoreError, match=r"^the store holds telemetry in 300-second buckets; "
                                         r"store.bucket_seconds = 600"):
        store.ingest([GpuBucket("c", "n1", 0, T0 + 10 * M, 600, 10, sm_active=0.5)])
    assert store.count("gpu_buckets") == 1
    cfg = Config(store=StoreConfig(url=str(store.engine.url), bucket_seconds=600))
    with pytest.raises(StoreError, match="300-second"):
        collect(store, cfg, base_dir=tmp_path)
    store.ingest([b5("n1", 0, T0 + 5 * M, 10, sm_active=0.5)])  # the stored width is still welcome
    assert store.count("gpu_buckets") == 2


# -- pruned (rolled-up) history, backfill after prune --------------------------------------------------

def _prune(store: Store) -> None:
    res = prune(store, now=int((T0 + timedelta(days=8)).timestamp()), keep_weeks=1)
    assert res.hourly_rows_written > 0


def test_rollup_keeps_observed_seconds_and_backfill_does_not_double_count(store: Store) -> None:
    """Job 10:00-12:00 idle (SM 0.0); samples only in the second 5-minute bucket of each hour.
    Fine: observed 2 x 300 = 600 s idle, unknown 7200 - 600 = 6600. Rolled up to hourly rows: the same
    (each hour observed 300 s, span 10:05-10:10 / 11:05-11:10), not a whole idle hour each (before: idle
    7200). Backfilling the same fine rows after the prune is dropped: still 600 / 6600 (before: the
    10:05 rows sat beside the hourly rows and counted again)."""
    fine = [b5("n1", 0, T0 + h * 60 * M + 5 * M, 10, sm_active=0.0) for h in range(2)]
    store.ingest([job("1", [AllocatedGpu("n1", 0)]), *fine])
    want = {"idle_s": 600, "unknown_s": 6600, "observed_s": 600}
    u = audit(store)["1"]
    assert {k: u[k] for k in want} == pytest.approx(want)
    _prune(store)
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT bucket_s, observed_s, span_start, span_end FROM gpu_buckets "
                                 "ORDER BY bucket_ts")).all()
    t0 = int(T0.timestamp())
    assert [tuple(r) for r in rows] == [(3600, 300, t0 + 300, t0 + 600), (3600, 300, t0 + 3900, t0 + 4200)]
    u = audit(store)["1"]
    assert {k: u[k] for k in want} == pytest.approx(want)
    store.ingest(fine)  # backfill after the prune
    assert store.count("gpu_buckets") == 2
    u = audit(store)["1"]
    assert {k: u[k] for k in want} == pytest.approx(want)


def test_rolled_up_span_starts_at_the_first_sample(store: Store) -> None:
    """(Found by the reference oracle.) 10:00 and 10:05 rows have no samples, 10:10-10:55 ten idle rows do.
    Job 10:00-10:10: before the roll-up 600 s unknown. The hourly row: observed 10 x 300 = 3000 s, span
    [10:10, 11:00) (rows without samples have no sample times), so the job's [10:00, 10:10) meets no span:
    still 600 s unknown and 0 idle (before: the hull started at 10:00 and 600 s read idle)."""
    recs = [job("1", [AllocatedGpu("n1", 0)], minutes=10), b5("n1", 0, T0, 0), b5("n1", 0, T0 + 5 * M, 0),
            *(b5("n1", 0, T0 + k * 5 * M, 10, sm_active=0.0) for k in range(2, 12))]
    store.ingest(recs)
    u = audit(store)["1"]
    assert (u["idle_s"], u["unknown_s"]) == (0, pytest.approx(600))
    _prune(store)
    u = audit(store)["1"]
    assert (u["idle_s"], u["unknown_s"]) == (0, pytest.approx(600))


def test_hourly_rows_found_by_their_own_width(store: Store) -> None:
    """Fully sampled working hours 10:00-12:00, rolled up; job 10:30-11:30. Hour 10 overlaps 1800 s, hour
    11 1800 s, both fully observed: working 3600 = reserved, unknown 0 (before: the 10:00 hourly row
    starts more than one 5-minute bucket before the job and was not found: 1800 unknown)."""
    fine = [b5("n1", 0, T0 + i * 5 * M, 10, sm_active=0.9) for i in range(24)]
    store.ingest([job("1", [AllocatedGpu("n1", 0)], start=T0 + 30 * M, minutes=60), *fine])
    _prune(store)
    u = audit(store)["1"]
    assert u["working_s"] == pytest.approx(3600) and u["unknown_s"] == pytest.approx(0)


# -- partial buckets, samples after release, consecutive jobs in one bucket ----------------------------

def test_one_minute_of_samples_in_twenty_minutes_is_five_percent(store: Store, tmp_path: Path) -> None:
    """A long CSV with samples every 30 s, job 7 labelled, only 10:00:00 and 10:00:30: interval 30 s, so
    the bucket is 2 x 30 = 60 s observed, span 10:00-10:01. Job 7 holds the GPU 10:00-10:20: coverage
    60 / 1200 = 5 % (before: the bucket counted whole, 300 / 1200 = 25 %). Idle 60 s, unknown 1140 s; it is
    flagged unmonitored (5 % < 50 %)."""
    csv = tmp_path / "t.csv"
    lines = ["timestamp,host,gpu,uuid,metric,value,hpc_job"]
    for s in (0, 30):
        ts = (T0 + timedelta(seconds=s)).isoformat()
        lines += [f"{ts},n1,0,GPU-1,sm_active,0.0,7", f"{ts},n1,0,GPU-1,gpu_util,0.0,7"]
    csv.write_text("\n".join(lines) + "\n")
    src = build("file", "telemetry", {"paths": ["t.csv"]}, Context("c", tmp_path))
    buckets = list(src.collect(Window(W0, W1, 300), Problems()))
    assert [(b.samples, b.observed_s, b.job) for b in buckets] == [(2, 60.0, "7")]
    store.ingest([job("7", [AllocatedGpu("n1", 0)], minutes=20), *buckets])
    r = run_audit(store, Config(), W0, W1)
    u = usage(store, r.run_id)["7"]
    assert u["observed_s"] / u["reserved_s"] == pytest.approx(0.05)
    assert u["idle_s"] == pytest.approx(60) and u["unknown_s"] == pytest.approx(1140)
    assert r.summary["findings"].get("unmonitored") == 1


def test_consecutive_jobs_in_one_bucket_keep_their_own_minutes(store: Store) -> None:
    """Job A (idle, SM 0.0) 10:00-10:07, job B (working, SM 0.9) 10:07-10:20 on one GPU; the exporter
    labels each job's series, and an unlabelled series keeps reporting busy after A left. Bucket 10:05
    holds three sub-rows: A (4 samples, 120 s, span 10:05-10:07), B (6 samples, 180 s, 10:07-10:10), ''
    (busy). A: 300 s idle (10:00) + 120 s idle (10:05) = 420 = all its reserved time, idle 100 %.
    B: 180 (10:05) + 300 + 300 = 780 s working = its reserved time. Before, the copies were merged by
    maximum and A's last two minutes read working (idle 300 of 420)."""
    t = T0
    recs = [job("A", [AllocatedGpu("n1", 0)], minutes=7), job("B", [AllocatedGpu("n1", 0)], start=t + 7 * M,
                                                              minutes=13),
            b5("n1", 0, t, 10, sm_active=0.0, hpc_job="A"),
            GpuBucket("c", "n1", 0, t + 5 * M, 300, 4, sm_active=0.0, hpc_job="A", observed_s=120,
                      span_start=t + 5 * M, span_end=t + 7 * M),
            GpuBucket("c", "n1", 0, t + 5 * M, 300, 6, sm_active=0.9, hpc_job="B", observed_s=180,
                      span_start=t + 7 * M, span_end=t + 10 * M),
            GpuBucket("c", "n1", 0, t + 5 * M, 300, 10, sm_active=0.9, gpu_util=1.0),
            b5("n1", 0, t + 10 * M, 10, sm_active=0.9, hpc_job="B"),
            b5("n1", 0, t + 15 * M, 10, sm_active=0.9, hpc_job="B")]
    store.ingest(recs)
    u = audit(store)
    assert u["A"]["idle_s"] == pytest.approx(420) and u["A"]["working_s"] == pytest.approx(0)
    assert u["B"]["working_s"] == pytest.approx(780) and u["B"]["unknown_s"] == pytest.approx(0)
    assert parts(u["A"]) == pytest.approx(420) and parts(u["B"]) == pytest.approx(780)


def test_samples_after_release_do_not_judge_the_last_bucket(store: Store) -> None:
    """Job 10:00-10:07 (unlabelled exporter). Its GPU's samples stop at 10:07 (span 10:05-10:07, 120 s
    observed). Reserved 420 s: 300 + min(|10:05-10:07|, 120) = 420 observed. Then a second bucket whose
    samples only start at 10:08 (after release): span 10:08-10:10 -> 0 s of the job's time is observed
    there, so for a job 10:00-10:08:30 the last bucket counts 30 s observed, not its 300."""
    t = T0
    store.ingest([job("1", [AllocatedGpu("n1", 0)], minutes=7),
                  job("2", [AllocatedGpu("n2", 0)], minutes=8.5),
                  b5("n1", 0, t, 10, sm_active=0.0),
                  GpuBucket("c", "n1", 0, t + 5 * M, 300, 4, sm_active=0.0, observed_s=120, span_start=t + 5 * M,
                            span_end=t + 7 * M),
                  b5("n2", 0, t, 10, sm_active=0.0),
                  GpuBucket("c", "n2", 0, t + 5 * M, 300, 4, sm_active=0.9, observed_s=120, span_start=t + 8 * M,
                            span_end=t + 10 * M)])
    u = audit(store)
    assert u["1"]["idle_s"] == pytest.approx(420) and u["1"]["unknown_s"] == pytest.approx(0)
    # job 2: 300 idle (10:00) + |[10:05, 10:08:30) n [10:08, 10:10)| = 30 s working; unknown 510 - 330 = 180
    assert u["2"]["idle_s"] == pytest.approx(300) and u["2"]["working_s"] == pytest.approx(30)
    assert u["2"]["unknown_s"] == pytest.approx(180)


# -- exact label matching ------------------------------------------------------------------------------

def test_label_matching_is_exact(store: Store) -> None:
    """Array task 123_4 (count-only, 1 GPU on n1, whose 2 GPUs do not make it a whole node): GPU 0 carries
    job 12314 (idle), GPU 1 carries "5,123_4" (working). Exact match -> GPU 1: working 7200 s. Before, the
    SQL LIKE wildcard '_' matched 12314 and took GPU 0 (idle). Task 99 by index on GPU 0, whose rows name
    only 12314: those rows are another job's, so 7200 s unknown, not idle."""
    recs = [job("123_4", [AllocatedGpu("n1", None)]), job("12314", [AllocatedGpu("n1", 0)]),
            job("99", [AllocatedGpu("n1", 0)])]
    recs += [b5("n1", 0, T0 + i * 5 * M, 10, sm_active=0.0, hpc_job="12314") for i in range(24)]
    recs += [b5("n1", 1, T0 + i * 5 * M, 10, sm_active=0.9, hpc_job="5,123_4") for i in range(24)]
    store.ingest(recs)
    u = audit(store)
    assert u["123_4"]["working_s"] == pytest.approx(7200) and u["123_4"]["idle_s"] == 0
    assert u["12314"]["idle_s"] == pytest.approx(7200)
    assert u["99"]["unknown_s"] == pytest.approx(7200) and u["99"]["idle_s"] == 0


# -- the verdict's boundaries and GPU-Util-only telemetry ----------------------------------------------

@pytest.mark.parametrize("util, verdict", [
    (5 / 100, "busy_unverified_s"),       # 5 % GPU-Util read as 0.05: not "< 5 %"
    (0.05 - 1e-10, "busy_unverified_s"),  # within the 1e-9 tolerance: still at the threshold
    (0.05 - 1e-8, "idle_by_util_s"),      # clearly below
    (0.9, "busy_unverified_s"),           # busy by GPU-Util: observed, never unknown (issue 14)
])
def test_util_only_boundary_and_busy_unverified(store: Store, util: float, verdict: str) -> None:
    """2 h of GPU-Util-only buckets: all 7200 s observed (coverage 100 %), in exactly one verdict."""
    store.ingest([job("1", [AllocatedGpu("n1", 0)]),
                  *[b5("n1", 0, T0 + i * 5 * M, 10, gpu_util=util) for i in range(24)]])
    r = run_audit(store, Config(thresholds=Thresholds(idle_power_w=None)), W0, W1)
    u = usage(store, r.run_id)["1"]
    assert u[verdict] == pytest.approx(7200) and u["unknown_s"] == 0 and u["observed_s"] == pytest.approx(7200)
    assert "unmonitored" not in r.summary["findings"]


# -- small things users hit (issue 14 section 4, audit side) -------------------------------------------

def test_idle_gpus_names_node_and_index_and_memory_held(store: Store) -> None:
    """Job across two nodes, each with a GPU 2: n01 GPU 2 works (SM 0.9), n02 GPU 2 is idle (SM 0.0) and
    holds 41 GiB (41,984 MiB), n02 GPU 3 works. The finding names "n02 GPU 2 idle 100%, held 41 GiB while
    idle" in its evidence and in every report format; idle GPU-hours 2.0 (one GPU x 2 h)."""
    from auditor.report import context as report
    from auditor.report import render

    gpus = [AllocatedGpu("n01", 2), AllocatedGpu("n02", 2), AllocatedGpu("n02", 3)]
    recs: list = [job("ddp", gpus)]
    for host, idx, sm in (("n01", 2, 0.9), ("n02", 2, 0.0), ("n02", 3, 0.9)):
        recs += [b5(host, idx, T0 + i * 5 * M, 10, sm_active=sm, fb_used_mib=41984.0 if sm == 0 else 70000.0)
                 for i in range(24)]
    store.ingest(recs)
    r = run_audit(store, Config(), W0, W1)
    with store.engine.connect() as conn:
        (f,) = conn.execute(text("SELECT idle_gpu_hours, evidence FROM findings WHERE run_id = :r AND kind = "
                                 "'idle_gpus'"), {"r": r.run_id}).all()
    ev = f.evidence if isinstance(f.evidence, dict) else __import__("json").loads(f.evidence)
    want = "n02 GPU 2 idle 100%, held 41 GiB while idle"
    assert ev["idle_gpu_names"] == [want] and f.idle_gpu_hours == pytest.approx(2.0)
    assert ev["idle_gpu_list"][0]["held_while_idle_mib"] == 41984.0
    ctx = report.build_context(Store(store.engine), Config(), r.run_id)
    for body in (render.render_html(ctx)[0], render.render_text(ctx), render.render_md(ctx)):
        assert want in body


@pytest.mark.parametrize("minimum, listed", [(0.1, False), (0.0, True)])
def test_findings_below_the_minimum_size_are_not_listed(store: Store, minimum: float, listed: bool) -> None:
    """A 9-second array task without telemetry: 9 / 3600 = 0.0025 reserved GPU-hours, coverage 0 ->
    unmonitored, but below min_finding_gpu_hours 0.1 it is not listed (listed with a minimum of 0)."""
    store.ingest([job("5_1", [AllocatedGpu("n1", 0)], minutes=9 / 60)])
    r = run_audit(store, Config(thresholds=Thresholds(min_finding_gpu_hours=minimum)), W0, W1)
    assert (r.summary["findings"].get("unmonitored") == 1) is listed
    assert usage(store, r.run_id)["5_1"]["reserved_s"] == pytest.approx(9)
