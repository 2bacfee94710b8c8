"""The oracle on hand-computed cases (so the reference itself is checked against arithmetic in comments),
and the minimal examples where the differential test found the code wrong, as regression tests (xfail,
strict, while the code is still wrong: when it is fixed they pass, and the xfail must go)."""

from __future__ import annotations

from datetime import UTC, datetime
from unittest import mock

import pytest
from oracle import Oracle
from oracle_fleets import T0, make_bucket

from auditor.audit.run import run_audit
from auditor.config import Config, PriceCard, Thresholds
from auditor.records import AllocatedGpu, Allocation, GpuBucket
from auditor.store.engine import Store
from auditor.store.retention import prune

H = 3600.0
PRICES = PriceCard(default=2.0, models={"h100": 4.0}, mig={"1g.10gb": 0.75})


def t(s: float) -> datetime:
    return datetime.fromtimestamp(T0 + s, UTC)


def job(ext: str, gpus: list[AllocatedGpu], s: float, e: float | None, source: str = "slurm",
        **kw: str) -> Allocation:
    return Allocation("c", source, ext, start=t(s), end=None if e is None else t(e), gpus=gpus, **kw)


def bucket(host: str, gpu: int, s: float, samples: int = 20, width: int = 300, **kw: object) -> GpuBucket:
    return GpuBucket("c", host, gpu, t(s), width, samples, **kw)  # type: ignore[arg-type]


def oracle(records: list, since: float = 0, until: float = 7200, now: float = 10 ** 6,
           th: Thresholds | None = None, prune_at: float | None = None) -> dict:
    o = Oracle()
    o.ingest(records)
    if prune_at is not None:
        o.prune(T0 + prune_at, 0.0)
    res = o.audit(th or Thresholds(), PRICES, T0 + since, T0 + until, T0 + now)
    return {k[2]: r for k, r in res.items()}


def test_consecutive_jobs_in_one_bucket_keep_their_own_sub_rows() -> None:
    # A holds n0:0 [0, 120), B [120, 600). Bucket [0, 300) has a sub-row per job: A idle (span [0, 120),
    # 120 s observed), B working (span [120, 300), 180 s). Bucket [300, 600): B working, 300 s.
    # A: reserved 120, idle 120, unknown 0. B: working 180 + 300 = 480 = reserved.
    recs = [job("A", [AllocatedGpu("n0", 0)], 0, 120), job("B", [AllocatedGpu("n0", 0)], 120, 600),
            bucket("n0", 0, 0, 8, hpc_job="A", job="A", sm_active=0.0, observed_s=120.0, span_start=t(0),
                   span_end=t(120)),
            bucket("n0", 0, 0, 12, hpc_job="B", job="B", sm_active=0.9, observed_s=180.0, span_start=t(120),
                   span_end=t(300)),
            bucket("n0", 0, 300, 20, hpc_job="B", job="B", sm_active=0.9)]
    r = oracle(recs)
    assert r["A"].totals["idle"] == 120 and r["A"].totals["working"] == 0 and r["A"].totals["unknown"] == 0
    assert r["B"].totals["working"] == 480 and r["B"].totals["idle"] == 0
    assert r["B"].totals["effective"] == pytest.approx(480 * 0.9)


def test_array_label_matches_exactly_and_labelled_buckets_exclude_the_unlabelled_row() -> None:
    # count-only job 123_4 on n0 (2 GPUs): GPU 1 carries label 123_4, GPU 0 carries 12314 (another job).
    # Label attribution ties its slot 0 to GPU 1, never GPU 0. In bucket [0, 300) of GPU 1 an extra
    # unlabelled row (sm 0.9) is ignored because a labelled one exists: 300 s idle, then [300, 600) has no
    # row: unknown 300.
    recs = [job("123_4", [AllocatedGpu("n0", None)], 0, 600),
            bucket("n0", 0, 0, hpc_job="12314", job="12314", sm_active=0.9),
            bucket("n0", 1, 0, hpc_job="123_4", job="123_4", sm_active=0.0),
            bucket("n0", 1, 0, job="", sm_active=0.9)]
    (g,) = oracle(recs)["123_4"].gpus
    assert g.tied == ("c", "n0", 1, "") and g.attribution == "label"
    assert g.sums()["idle"] == 300 and g.sums()["unknown"] == 300 and g.sums()["working"] == 0


def test_one_minute_of_samples_in_twenty_is_five_percent_covered() -> None:
    # 20 min job, four 5-min buckets, one of which has 60 s of samples (observed_s 60): coverage 60/1200.
    recs = [job("7", [AllocatedGpu("n0", 0)], 0, 1200),
            bucket("n0", 0, 0, 4, sm_active=0.0, observed_s=60.0, span_start=t(0), span_end=t(60))]
    r = oracle(recs)["7"]
    assert r.totals["observed"] == 60 and r.totals["unknown"] == 1140
    assert r.findings == {"unmonitored"} or r.totals["reserved"] / H < 0.1


def test_gpu_util_exactly_at_the_threshold_is_not_below_it_and_missing_dram_does_not_block_idle() -> None:
    # util-only bucket at 0.05 (5 %, also as 0.05 - 1e-12): not < 0.05 -> busy_unverified, observed.
    # SM 0.0 with DRAM/Tensor missing: idle.
    recs = [job("1", [AllocatedGpu("n0", 0)], 0, 600),
            bucket("n0", 0, 0, gpu_util=0.05), bucket("n0", 0, 300, gpu_util=0.05 - 1e-12),
            job("2", [AllocatedGpu("n1", 0)], 0, 300), bucket("n1", 0, 0, sm_active=0.0)]
    r = oracle(recs)
    assert r["1"].totals["busy_unverified"] == 600 and r["1"].totals["idle"] == 0
    assert r["1"].totals["unknown"] == 0
    assert r["2"].totals["idle"] == 300


def test_two_sources_merge_field_by_field() -> None:
    # Source 1: SM 0.0 (10 samples); source 2: GPU-Util 0.9, power (30 samples). Merged: SM 0.0 with
    # GPU-Util 0.9 -> mirage, whichever is ingested first.
    for order in (0, 1):
        a = bucket("n0", 0, 0, 10, sm_active=0.0)
        b = bucket("n0", 0, 0, 30, gpu_util=0.9, power_w=250.0)
        recs = [job("1", [AllocatedGpu("n0", 0)], 0, 300), *((a, b) if order == 0 else (b, a))]
        assert oracle(recs)["1"].totals["mirage"] == 300


def test_rolled_up_hour_counts_only_its_observed_seconds() -> None:
    # One 5-min bucket of samples (idle) in the hour [0, 3600), rolled up: observed 300 s of the hour,
    # span [0, 300). A job [0, 3600) is 300 s idle and 3300 s unknown, never a whole idle hour.
    recs = [job("1", [AllocatedGpu("n0", 0)], 0, 3600), bucket("n0", 0, 0, sm_active=0.0)]
    r = oracle(recs, prune_at=3600 + 1800)["1"]
    assert r.totals["idle"] == 300 and r.totals["unknown"] == 3300


def test_mig_slice_price_and_share() -> None:
    # 1/7 slice for 7 h: reserved 1 GPU-hour-equivalent; 1g.10gb costs 0.75 per slice-hour -> 5.25.
    recs = [job("1", [AllocatedGpu("n0", 0, share=1 / 7, mig_profile="1g.10gb", model="h100")], 0, 7 * H)]
    r = oracle(recs, until=8 * H)["1"]
    assert r.totals["reserved"] == pytest.approx(H) and r.reserved_cost == pytest.approx(5.25)
    assert r.totals["unknown"] == pytest.approx(H)


def _audit(store: Store, records: list, prune_at: float | None, since: float, until: float) -> dict:
    store.ingest(records, seen_at_ts=T0)
    if prune_at is not None:
        prune(store, now=T0 + prune_at, keep_weeks=0.0, keep_runs_days=10_000)
    with mock.patch("auditor.audit.run.utcnow", return_value=t(10 ** 6)):
        rid = run_audit(store, Config(prices=PRICES), t(since), t(until)).run_id
    from sqlalchemy import text

    with store.engine.connect() as conn:
        return {r.external_id: dict(r._mapping) for r in conn.execute(text(
            "SELECT a.external_id, u.* FROM usage_allocation u JOIN allocations a ON a.id = u.allocation_id "
            "WHERE u.run_id = :r"), {"r": rid})}


def test_rolled_up_hour_span_starts_at_its_first_sample(store: Store) -> None:
    # n1:0 has no samples in [0, 600) (two rows with samples 0), then 10 idle buckets of 20 samples.
    # Job 1000 holds it [0, 600). Before the roll-up: 600 s unknown. Rolled up (cutoff T0+3600): the hour's
    # first sample is at 600, span [600, 3600), observed 3000 s; the job's reserved [0, 600) does not meet the
    # span: observed 0, unknown 600 s, idle 0 (missing data is never idle).
    recs = [job("1000", [AllocatedGpu("n1", 0)], 0, 600), bucket("n1", 0, 0, 0), bucket("n1", 0, 300, 0),
            *(bucket("n1", 0, 300 * k, 20, sm_active=0.0) for k in range(2, 12))]
    want = oracle(recs, prune_at=3600 + 1800, until=3600)["1000"].totals
    assert (want["idle"], want["unknown"]) == (0, 600)
    got = _audit(store, recs, 3600 + 1800, 0, 3600)["1000"]
    assert (got["idle_s"], got["unknown_s"]) == (0, 600)


def test_make_bucket_builds_the_record_fields_this_version_has() -> None:
    b = make_bucket("n0", 1, T0, samples=3, metrics={"sm_active": 0.5, "gpu_util": None}, jobs=[],
                    observed_s=45.0, span=(T0, T0 + 45), label="9_1")
    assert b.sm_active == 0.5 and b.gpu_util is None and b.hpc_job == "9_1" and b.samples == 3
    assert getattr(b, "observed_s", 45.0) == 45.0


def test_reused_job_id_keeps_both_jobs(store: Store) -> None:
    # Slurm job 1000 ran [0, 120) and, after an id wrap-around, another job 1000 ran [304, 560), both on
    # n0:0 without telemetry: two allocations, 120 + 256 = 376 reserved GPU-seconds, all unknown.
    recs = [job("1000", [AllocatedGpu("n0", 0)], 0, 120, name="job0"),
            job("1000", [AllocatedGpu("n0", 0)], 304, 560, name="job2")]
    o = Oracle()
    o.ingest(recs)
    assert sorted(r.totals["reserved"] for r in o.audit(Thresholds(), PRICES, T0, T0 + 1801, T0 + 10 ** 6).values()) \
        == [120.0, 256.0]
    from sqlalchemy import text

    _audit(store, recs, None, 0, 1801)
    with store.engine.connect() as conn:
        got = sorted(r[0] for r in conn.execute(text("SELECT reserved_s FROM usage_allocation")))
    assert got == [120.0, 256.0]


def test_attribution_order_whole_node_before_labels_and_slots_by_index() -> None:
    # n0 has 2 GPUs (inventory). Job W holds 2 count-only GPUs on n0 [0, 300): whole node, slot k -> GPU k,
    # even though GPU 0 carries W's label only on GPU 1 (exact attribution first). Job L holds 1 count-only
    # GPU on n1 (3 GPUs) [0, 300); its label is on GPUs 2 and 1 -> candidates by index [1, 2], slot 0 -> 1.
    # Job U holds 1 count-only GPU on n2 (2 GPUs report) with no label anywhere: not the whole node, no label:
    # unattributed, all 300 s unknown.
    from auditor.records import GpuInventory

    recs = [job("W", [AllocatedGpu("n0", None), AllocatedGpu("n0", None)], 0, 300),
            job("L", [AllocatedGpu("n1", None)], 0, 300), job("U", [AllocatedGpu("n2", None)], 0, 300),
            GpuInventory("c", "n0", 0), GpuInventory("c", "n0", 1),
            bucket("n0", 0, 0, sm_active=0.9), bucket("n0", 1, 0, hpc_job="W", job="W", sm_active=0.0),
            bucket("n1", 0, 0, sm_active=0.9), bucket("n1", 1, 0, hpc_job="L", job="L", sm_active=0.0),
            bucket("n1", 2, 0, hpc_job="L", job="L", sm_active=0.0), bucket("n2", 0, 0, sm_active=0.0),
            bucket("n2", 1, 0, sm_active=0.0)]
    r = oracle(recs)
    assert [(g.attribution, g.tied) for g in r["W"].gpus] == [("node", ("c", "n0", 0, "")),
                                                             ("node", ("c", "n0", 1, ""))]
    # GPU 0's unlabelled row judges slot 0 (working 300 s); GPU 1's labelled row names W (idle 300 s)
    assert r["W"].totals["working"] == 300 and r["W"].totals["idle"] == 300
    assert [(g.attribution, g.tied) for g in r["L"].gpus] == [("label", ("c", "n1", 1, ""))]
    assert [(g.attribution, g.tied) for g in r["U"].gpus] == [("unattributed", None)]
    assert r["U"].totals["unknown"] == 300 and r["U"].findings == set()  # 300 s < 0.1 GPU-h: not listed


def test_finding_rules_with_their_thresholds() -> None:
    # 2 GPUs for 2 h (4 GPU-h): GPU 0 idle (SM 0), GPU 1 working. idle share 2/4 = 0.5 < 0.8: no
    # idle_allocation; GPU 0 idle 100 % >= 0.8 and GPU 1 worked 100 % >= 0.5: idle_gpus.
    gpus = [AllocatedGpu("n0", 0), AllocatedGpu("n0", 1)]
    recs = [job("G", gpus, 0, 7200), *(bucket("n0", 0, 300 * k, sm_active=0.0) for k in range(24)),
            *(bucket("n0", 1, 300 * k, sm_active=0.9) for k in range(24))]
    assert oracle(recs)["G"].findings == {"idle_gpus"}
    # 1 GPU for 2 h, SM 0 with GPU-Util 0.9 for 40 min (mirage) and SM 0 plain for 80 min: idle share 1.0
    # >= 0.8 and 2 GPU-h >= 1: idle_allocation (mirage 40 min >= 30 but mirage 40 < idle 80: not util_mirage)
    recs = [job("M", [AllocatedGpu("n0", 0)], 0, 7200),
            *(bucket("n0", 0, 300 * k, sm_active=0.0, gpu_util=0.9 if k < 8 else 0.0) for k in range(24))]
    assert oracle(recs)["M"].findings == {"idle_allocation"}
    # the same with 80 min mirage and 40 min idle: util_mirage
    recs = [job("M", [AllocatedGpu("n0", 0)], 0, 7200),
            *(bucket("n0", 0, 300 * k, sm_active=0.0, gpu_util=0.9 if k < 16 else 0.0) for k in range(24))]
    assert oracle(recs)["M"].findings == {"util_mirage"}
    # 1 h with samples in only 25 min of it: coverage 25/60 < 0.5: unmonitored (only that)
    recs = [job("D", [AllocatedGpu("n0", 0)], 0, 3600), *(bucket("n0", 0, 300 * k, sm_active=0.0) for k in range(5))]
    assert oracle(recs)["D"].findings == {"unmonitored"}


def test_mirage_split_in_the_oracle() -> None:
    # 2 GPUs x 2 h, SM 0 with GPU-Util 0.95 everywhere: mirage 14400 s, mean GPU-Util 0.95 >= 0.9.
    def two(power: float | None, fb: float | None, n: int = 2) -> list:
        gpus = [AllocatedGpu("n0", g) for g in range(n)]
        return [job("X", gpus, 0, 7200), *(bucket("n0", g, 300 * k, sm_active=0.0, gpu_util=0.95, power_w=power,
                                                 fb_used_mib=fb) for g in range(n) for k in range(24))]
    # 80 W <= 150, 30000 MiB >= 1024, 2 GPUs: hung_collective
    assert oracle(two(80.0, 30000.0))["X"].findings == {"hung_collective"}
    # 0 MiB <= 16: ghost_busy (checked first, power irrelevant)
    assert oracle(two(300.0, 0.0))["X"].findings == {"ghost_busy"}
    # 300 W > 150, or no power reading, or a single GPU: util_mirage
    assert oracle(two(300.0, 30000.0))["X"].findings == {"util_mirage"}
    assert oracle(two(None, 30000.0))["X"].findings == {"util_mirage"}
    assert oracle(two(80.0, 30000.0, n=1))["X"].findings == {"util_mirage"}


def test_window_cut_and_running_allocation_stop_at_the_horizon() -> None:
    # running job from -1 h; window [0, 2 h), now = 30 min: reserved [0, 1800) only; no telemetry: unknown.
    r = oracle([job("R", [AllocatedGpu("n0", 0)], -3600, None)], since=0, until=7200, now=1800)["R"]
    assert r.totals["reserved"] == 1800 and r.totals["unknown"] == 1800


def test_free_gpu_samples_at_the_edges_are_clipped_to_the_allocation(store: Store) -> None:
    # Issue 44, site trial: free-GPU samples before a job started (or after it ended), in a bucket without a
    # span (a source that counts samples: Prometheus), were counted as the job's first (last) seconds.
    # Job 1 holds n0:0 [150, 1650), no job labels. Bucket [0, 300): 150 s observed, SM 0 (the free GPU before
    # the job), no span: the job holds the bucket's last 150 s, so 150 - 150 = 0 observed seconds must be its
    # own. Buckets [300, 1500): SM 0.9, whole: 1,200 s working. Bucket [1500, 1800): 200 s observed, SM 0.9, no
    # span: the job holds its first 150 s, so at least 200 - 150 = 50 s are its own: 50 s working.
    # Reserved 1,500 s = working 1,250 + idle 0 + unknown 250. (Before the fix: idle 150, working 1,350,
    # unknown 0.) Job 2 holds n1:0 [150, 450) whose rows carry its label: its own 150 s of [0, 300) count.
    recs = [job("1", [AllocatedGpu("n0", 0)], 150, 1650),
            bucket("n0", 0, 0, 10, sm_active=0.0, observed_s=150.0),
            *(bucket("n0", 0, 300 * k, sm_active=0.9) for k in range(1, 5)),
            bucket("n0", 0, 1500, 14, sm_active=0.9, observed_s=200.0),
            job("2", [AllocatedGpu("n1", 0)], 150, 450),
            bucket("n1", 0, 0, 10, hpc_job="2", job="2", sm_active=0.0, observed_s=150.0),
            bucket("n1", 0, 300, 10, hpc_job="2", job="2", sm_active=0.0, observed_s=150.0)]
    want = oracle(recs)
    assert (want["1"].totals["working"], want["1"].totals["idle"], want["1"].totals["unknown"]) == (1250, 0, 250)
    # job 2's own labelled rows: 150 s in each bucket inside its reservation, 300 s idle, nothing unknown
    assert (want["2"].totals["idle"], want["2"].totals["unknown"]) == (300, 0)
    got = _audit(store, recs, None, 0, 7200)
    assert (got["1"]["working_s"], got["1"]["idle_s"], got["1"]["unknown_s"]) == (1250, 0, 250), got["1"]
    assert (got["2"]["idle_s"], got["2"]["unknown_s"]) == (300, 0)
