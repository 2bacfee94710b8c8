"""Verdicts and attribution on hand-computed cases. Unknown is never idle."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from helpers import usage
from sqlalchemy import text

from auditor.audit.run import run_audit
from auditor.config import Config, Thresholds
from auditor.records import AllocatedGpu, Allocation, GpuBucket, GpuInventory
from auditor.store.engine import Store

T0 = datetime(2026, 11, 20, tzinfo=UTC)
W0, W1 = T0 - timedelta(days=1), T0 + timedelta(days=1)


def job(ext: str, gpus: list[AllocatedGpu], hours: float = 2, source: str = "slurm", **kw) -> Allocation:
    kw.setdefault("account", "acct")
    return Allocation("c", source, ext, user="u", start=T0, end=T0 + timedelta(hours=hours), gpus=gpus, **kw)


def series(host: str, gpu: int, hours: float = 2, **metrics) -> list[GpuBucket]:
    samples = metrics.pop("samples", 10)
    return [GpuBucket("c", host, gpu, T0 + timedelta(minutes=5 * i), 300, samples, **metrics)
            for i in range(int(hours * 12))]


CORE = ("idle_allocation", "idle_gpus", "util_mirage", "unmonitored")


def kinds(store: Store, run_id: int) -> dict[str, list[str]]:
    """The core per-allocation findings (episodes and efficiency are tested in test_findings_extra)."""
    out: dict[str, list[str]] = {}
    with store.engine.connect() as conn:
        for r in conn.execute(text("SELECT a.external_id, f.kind FROM findings f JOIN allocations a ON "
                                   "a.id = f.allocation_id WHERE f.run_id = :r ORDER BY f.kind"), {"r": run_id}):
            if r.kind not in CORE:
                continue
            out.setdefault(r.external_id, []).append(r.kind)
    return out


@pytest.fixture
def sqlite_store(tmp_path) -> Store:
    s = Store.open(f"sqlite:///{tmp_path / 'a.db'}")
    s.upgrade()
    return s


@pytest.mark.parametrize("metrics, verdict", [
    ({"sm_active": 0.049, "gpu_util": 0.0}, "idle_s"),
    ({"sm_active": 0.05, "gpu_util": 0.0}, "low_s"),
    ({"sm_active": 0.01, "dram_active": 0.2}, "low_s"),
    ({"sm_active": 0.01, "tensor_active": 0.02}, "low_s"),
    ({"sm_active": 0.03, "gpu_util": 0.99}, "mirage_s"),
    ({"sm_active": 0.03, "gr_engine": 0.6}, "mirage_s"),
    ({"sm_active": 0.49}, "low_s"),
    ({"sm_active": 0.5}, "working_s"),
    ({"gpu_util": 0.02}, "idle_s"),             # fallback: idle-by-util
    ({"gpu_util": 0.9}, "busy_unverified_s"),   # observed; GPU-Util cannot prove work (issue 14)
    ({"fb_used_mib": 100.0}, "busy_unverified_s"),  # samples, no utilization field: observed
    ({"sm_active": 0.0, "samples": 0}, "unknown_s"),  # no samples: unknown, never idle
])
def test_bucket_verdicts(sqlite_store: Store, metrics: dict, verdict: str) -> None:
    sqlite_store.ingest([job("1", [AllocatedGpu("n1", 0)]), *series("n1", 0, **metrics)])
    r = run_audit(sqlite_store, Config(), W0, W1)
    u = usage(sqlite_store, r.run_id)["1"]
    assert u["reserved_s"] == 7200
    assert u[verdict] == pytest.approx(7200)
    # unknown on its own (not the remainder): the whole 2 h when the buckets have no samples, else none
    assert u["unknown_s"] == (7200 if verdict == "unknown_s" else 0)


def test_fallback_off_makes_util_only_buckets_busy_unverified(sqlite_store: Store) -> None:
    # definitions.md: with the fallback off a GPU-Util-only bucket is observed but never idle
    # (busy_unverified), not unknown: 24 buckets x 300 s = 7200 s observed, 0 unknown
    sqlite_store.ingest([job("1", [AllocatedGpu("n1", 0)]), *series("n1", 0, gpu_util=0.0)])
    cfg = Config(thresholds=Thresholds(util_fallback=False))
    u = usage(sqlite_store, run_audit(sqlite_store, cfg, W0, W1).run_id)["1"]
    assert u["busy_unverified_s"] == 7200 and u["unknown_s"] == 0 and u["idle_s"] == 0


def test_telemetry_gap_is_unknown_and_never_idle(sqlite_store: Store) -> None:
    data = [b for b in series("n1", 0, hours=4, sm_active=0.0) if not
            (T0 + timedelta(hours=1) <= b.start < T0 + timedelta(hours=3))]
    sqlite_store.ingest([job("1", [AllocatedGpu("n1", 0)], hours=4), *data])
    r = run_audit(sqlite_store, Config(), W0, W1)
    u = usage(sqlite_store, r.run_id)["1"]
    assert u["idle_s"] == 7200 and u["unknown_s"] == 7200
    assert r.summary["unknown_gpu_hours"] == 2.0 and r.summary["idle_gpu_hours"] == 2.0


def test_unattributed_gpu_is_unknown_and_flagged_unmonitored(sqlite_store: Store) -> None:
    sqlite_store.ingest([job("1", [AllocatedGpu("n9", None)]), *series("n1", 0, sm_active=0.0)])
    r = run_audit(sqlite_store, Config(), W0, W1)
    u = usage(sqlite_store, r.run_id)["1"]
    assert u["unknown_s"] == 7200 and u["idle_s"] == 0 and u["idle_cost"] == 0
    assert kinds(sqlite_store, r.run_id) == {"1": ["unmonitored"]}


def test_attribution_by_index_node_and_labels(sqlite_store: Store) -> None:
    recs = [job("idx", [AllocatedGpu("n1", 1)]),
            job("node", [AllocatedGpu("n2", None), AllocatedGpu("n2", None)]),
            job("lbl", [AllocatedGpu("n3", None)]),
            job("pod-uid", [AllocatedGpu("n3", None)], source="kubernetes", name="nb-0", account="research"),
            GpuInventory("c", "n2", 0), GpuInventory("c", "n2", 1),
            *series("n1", 1, sm_active=0.9), *series("n2", 0, sm_active=0.6), *series("n2", 1, sm_active=0.0),
            *series("n3", 0, sm_active=0.3, hpc_job="lbl"), *series("n3", 1, sm_active=0.0, pod="nb-0",
                                                                   namespace="research"),
            *series("n3", 2, sm_active=0.9)]
    sqlite_store.ingest(recs)
    r = run_audit(sqlite_store, Config(), W0, W1)
    with sqlite_store.engine.connect() as conn:
        att = {(x.external_id, x.gpu_index): x.attribution for x in conn.execute(text(
            "SELECT a.external_id, u.gpu_index, u.attribution FROM usage_gpu u JOIN allocations a ON "
            "a.id = u.allocation_id WHERE u.run_id = :r"), {"r": r.run_id})}
    assert att == {("idx", 1): "index", ("node", 0): "node", ("node", 1): "node", ("lbl", 0): "label",
                   ("pod-uid", 1): "label"}
    u = usage(sqlite_store, r.run_id)
    assert u["lbl"]["low_s"] == 7200
    assert u["pod-uid"]["idle_s"] == 7200
    assert u["node"]["effective_s"] == pytest.approx(0.6 * 7200)


def test_partial_node_without_indices_is_not_whole_node(sqlite_store: Store) -> None:
    recs = [job("1", [AllocatedGpu("n2", None)]), GpuInventory("c", "n2", 0), GpuInventory("c", "n2", 1),
            *series("n2", 0, sm_active=0.0)]
    sqlite_store.ingest(recs)
    r = run_audit(sqlite_store, Config(), W0, W1)
    assert usage(sqlite_store, r.run_id)["1"]["unknown_s"] == 7200


def test_window_clips_and_running_jobs_end_at_now(sqlite_store: Store) -> None:
    straddle = Allocation("c", "slurm", "s", start=T0 - timedelta(hours=1), end=T0 + timedelta(hours=1),
                          gpus=[AllocatedGpu("n1", 0)])
    sqlite_store.ingest([straddle, *series("n1", 0, hours=1, sm_active=0.9)])
    r = run_audit(sqlite_store, Config(), T0, T0 + timedelta(hours=12))
    assert usage(sqlite_store, r.run_id)["s"]["reserved_s"] == 3600


def test_findings_thresholds(sqlite_store: Store) -> None:
    recs = [
        job("idle", [AllocatedGpu("n1", 0)]),
        job("short-idle", [AllocatedGpu("n1", 1)], hours=0.5),
        job("mirage", [AllocatedGpu("n1", 2)]),
        job("partial", [AllocatedGpu("n2", 0), AllocatedGpu("n2", 1), AllocatedGpu("n2", 2), AllocatedGpu("n2", 3)]),
        job("busy", [AllocatedGpu("n1", 3)]),
        *series("n1", 0, sm_active=0.0, gpu_util=0.0), *series("n1", 1, hours=0.5, sm_active=0.0),
        *series("n1", 2, sm_active=0.02, gpu_util=1.0), *series("n1", 3, sm_active=0.7),
        *series("n2", 0, sm_active=0.8), *series("n2", 1, sm_active=0.0), *series("n2", 2, sm_active=0.0),
        *series("n2", 3, sm_active=0.0),
    ]
    sqlite_store.ingest(recs)
    r = run_audit(sqlite_store, Config(), W0, W1)
    assert kinds(sqlite_store, r.run_id) == {"idle": ["idle_allocation"], "mirage": ["util_mirage"],
                                             "partial": ["idle_gpus"]}
    with sqlite_store.engine.connect() as conn:
        ev = conn.execute(text("SELECT evidence FROM findings WHERE kind = 'idle_gpus'")).scalar()
    import json

    ev = json.loads(ev) if isinstance(ev, str) else ev
    assert ev["idle_gpus"] == 3 and ev["total_gpus"] == 4 and ev["idle_gpu_indices"] == [1, 2, 3]
    assert len(ev["sparkline"]["sm"]) == 2 and ev["sparkline"]["bin_hours"] == 1  # 2 h: two bins of an hour
    # the thresholds are stored once, with the run (a finding's evidence does not repeat them)
    assert "thresholds" not in ev
    with sqlite_store.engine.connect() as conn:
        th = conn.execute(text("SELECT thresholds FROM audit_runs WHERE id = :r"), {"r": r.run_id}).scalar()
    assert (json.loads(th) if isinstance(th, str) else th)["idle_sm"] == 0.05


def test_share_weights_hours(sqlite_store: Store) -> None:
    mig = job("mig", [AllocatedGpu("n1", 0, share=1 / 7, mig_profile="1g.10gb")])
    sqlite_store.ingest([mig, *series("n1", 0, sm_active=0.7)])
    u = usage(sqlite_store, run_audit(sqlite_store, Config(), W0, W1).run_id)["mig"]
    assert u["reserved_s"] == pytest.approx(7200 / 7) and u["working_s"] == pytest.approx(7200 / 7)


@pytest.mark.service
def test_same_results_on_postgresql(store: Store) -> None:
    store.ingest([job("1", [AllocatedGpu("n1", 0), AllocatedGpu("n1", 1)]),
                  *series("n1", 0, sm_active=0.0), *series("n1", 1, sm_active=0.9)])
    r = run_audit(store, Config(), W0, W1)
    u = usage(store, r.run_id)["1"]
    assert (u["idle_s"], u["working_s"], u["unknown_s"]) == (7200, 7200, 0)
    assert u["effective_s"] == pytest.approx(0.9 * 7200)
    assert kinds(store, r.run_id) == {"1": ["idle_gpus"]}


def test_usage_allocation_carries_team_costs_and_effective_written_set_wise(store: Store) -> None:
    """usage_allocation is written by one INSERT ... SELECT (auditor.audit.totals): the team from the label's
    value (read by the server), else from the account mapping, else "(unmapped)" (an empty label value is no
    team), the price card's price, the costs and the effective seconds."""
    from auditor.config import PriceCard, Team

    cfg = Config(prices=PriceCard(default=2.0), teams=[Team(name="acct-team", accounts=["acct"])])
    store.ingest([job("lab", [AllocatedGpu("n1", 0)], source="kubernetes", labels={"team": "vision"}),
                  job("acc", [AllocatedGpu("n2", 0)]),
                  job("empty", [AllocatedGpu("n3", 0)], source="kubernetes", labels={"team": ""}, account="other"),
                  *series("n1", 0, sm_active=0.6), *series("n2", 0, sm_active=0.0, gpu_util=0.0),
                  *series("n3", 0, sm_active=0.6)])
    run = run_audit(store, cfg, W0, W1)
    u = usage(store, run.run_id)
    # 2 h reserved at 2.0 per GPU-hour = 4.0; "acc" idle for all of it: idle cost 4.0; "lab" worked at SM 0.6
    assert (u["lab"]["reserved_cost"], u["lab"]["idle_cost"], u["acc"]["idle_cost"]) == (4.0, 0.0, 4.0)
    assert u["lab"]["effective_s"] == pytest.approx(0.6 * 7200) and u["acc"]["effective_s"] == 0
    assert (u["lab"]["team"], u["acc"]["team"], u["empty"]["team"]) == ("vision", "acct-team", "(unmapped)")
    assert {k: u[k]["price_per_gpu_hour"] for k in u} == {"lab": 2.0, "acc": 2.0, "empty": 2.0}
