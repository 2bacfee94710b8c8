"""Hand-computed scenarios end to end (ingest -> audit -> findings -> money): every finding at and just
around its threshold, jobs sharing a GPU one after another or at once, multi-node jobs, MIG and
time-slicing, jobs cut by the window, clock skew between scheduler and telemetry, and a calendar month
whose edge in the report's timezone is not UTC midnight."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import text
from test_findings_extra import IDLE, WORK, job, run

from auditor.audit.run import run_audit
from auditor.config import Config, PriceCard, ReportConfig
from auditor.records import AllocatedGpu, Allocation, GpuBucket
from auditor.report import chargeback as cb
from auditor.store.engine import Store

T0 = datetime(2026, 11, 16, tzinfo=UTC)
W0, W1 = T0 - timedelta(days=1), T0 + timedelta(days=1)
MIRAGE = {"sm_active": 0.02, "gpu_util": 0.97}


@pytest.fixture
def store(tmp_path) -> Store:
    s = Store.open(f"sqlite:///{tmp_path / 'a.db'}")
    s.upgrade()
    return s


def audit(store: Store, cfg: Config | None = None, since: datetime = W0,
          until: datetime = W1) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]]]:
    """(usage per job id, finding kinds per job id) of a fresh audit."""
    rid = run_audit(store, cfg or Config(), since, until).run_id
    with store.engine.connect() as conn:
        use = {r.external_id: dict(r._mapping) for r in conn.execute(text(
            "SELECT a.external_id, u.* FROM usage_allocation u JOIN allocations a ON a.id = u.allocation_id "
            "WHERE u.run_id = :r"), {"r": rid})}
        kinds: dict[str, list[str]] = {}
        for r in conn.execute(text("SELECT a.external_id, f.kind FROM findings f JOIN allocations a ON "
                                   "a.id = f.allocation_id WHERE f.run_id = :r ORDER BY f.kind"), {"r": rid}):
            kinds.setdefault(r.external_id, []).append(r.kind)
    return use, kinds


def test_each_finding_at_and_around_its_threshold(store: Store) -> None:
    recs: list[Any] = []

    def add(name: str, idx: int, hours: float, *parts: tuple[int, dict[str, Any]]) -> None:
        recs.append(job(name, [AllocatedGpu("n1", idx)], hours=hours))
        first = 0
        for n, m in parts:
            if m is not None:
                recs.extend(run("n1", idx, first, n, **m))
            first += n

    add("idle80", 0, 5, (48, IDLE), (12, WORK))          # 80% idle: idle_allocation
    add("idle78", 1, 5, (47, IDLE), (13, WORK))          # 78%: not; 3.9 h in a row is an episode,
    # and a mean SM activity of 17% over 5 GPU-hours is low efficiency
    add("idle1h", 2, 1, (12, IDLE))                      # 1 GPU-hour reserved: enough
    add("idle55", 3, 55 / 60, (11, IDLE))                # 55 min: too little to flag
    add("cov50", 4, 2, (12, IDLE), (12, None))           # half observed: judged (idle)
    add("cov46", 5, 2, (11, IDLE), (13, None))           # 46% observed: unmonitored, not idle
    add("mirage30", 6, 4, (6, MIRAGE), (42, WORK))       # 30 min mirage: util_mirage
    add("mirage25", 7, 4, (5, MIRAGE), (43, WORK))       # 25 min: not
    add("ep2h", 8, 4, (12, WORK), (24, IDLE), (12, WORK))  # exactly 2 h idle: episode
    add("ep115", 9, 4, (12, WORK), (23, IDLE), (13, WORK))  # 1 h 55: not
    recs.append(job("pair", [AllocatedGpu("n2", 0), AllocatedGpu("n2", 1)], hours=2))
    recs += run("n2", 0, 0, 24, **WORK) + run("n2", 1, 0, 20, **IDLE) + run("n2", 1, 20, 4, **WORK)  # 83% idle
    recs.append(job("pair79", [AllocatedGpu("n3", 0), AllocatedGpu("n3", 1)], hours=2))
    recs += run("n3", 0, 0, 24, **WORK) + run("n3", 1, 0, 19, **IDLE) + run("n3", 1, 19, 5, **WORK)  # 79%
    store.ingest(recs)
    use, kinds = audit(store)
    assert kinds == {"idle80": ["idle_allocation"], "idle78": ["idle_episode", "low_efficiency"],
                     "idle1h": ["idle_allocation"],
                     "cov50": ["idle_allocation"], "cov46": ["unmonitored"], "mirage30": ["util_mirage"],
                     "ep2h": ["idle_episode"], "pair": ["idle_gpus"]}
    assert use["cov46"]["unknown_s"] == 13 * 300 and use["cov46"]["idle_s"] == 11 * 300
    assert use["idle80"]["idle_cost"] == pytest.approx(4 * 2.0)  # 4 idle GPU-hours at the default price


def test_gpu_shared_back_to_back_and_at_once(store: Store) -> None:
    first = job("first", [AllocatedGpu("n1", 0)], hours=1)
    second = job("second", [AllocatedGpu("n1", 0)], hours=1, start=T0 + timedelta(hours=1))
    a = job("slice-a", [AllocatedGpu("n2", 0, share=0.5)], hours=2)
    b = job("slice-b", [AllocatedGpu("n2", 0, share=0.5)], hours=1, start=T0 + timedelta(hours=1))
    store.ingest([first, second, a, b, *run("n1", 0, 0, 12, **IDLE), *run("n1", 0, 12, 12, **WORK),
                  *run("n2", 0, 0, 24, sm_active=0.6)])
    use, kinds = audit(store)
    assert (use["first"]["idle_s"], use["first"]["working_s"]) == (3600, 0)
    assert (use["second"]["idle_s"], use["second"]["working_s"]) == (0, 3600)
    assert use["second"]["effective_s"] == pytest.approx(0.8 * 3600)
    # time-sliced halves: each charged half the GPU for the time it held it
    assert use["slice-a"]["reserved_s"] == 3600 and use["slice-a"]["effective_s"] == pytest.approx(0.6 * 3600)
    assert use["slice-b"]["reserved_s"] == 1800 and use["slice-b"]["reserved_cost"] == pytest.approx(0.5 * 2.0)
    assert kinds == {"first": ["idle_allocation"]}


def test_multi_node_job(store: Store) -> None:
    gpus = [AllocatedGpu(n, i) for n in ("n1", "n2") for i in (0, 1)]
    store.ingest([job("mpi", gpus, hours=3), *run("n1", 0, 0, 36, **WORK), *run("n1", 1, 0, 36, **WORK),
                  *run("n2", 0, 0, 36, **IDLE), *run("n2", 1, 0, 36, **IDLE)])
    use, kinds = audit(store)
    u = use["mpi"]
    assert (u["gpus"], u["reserved_s"], u["idle_s"], u["working_s"]) == (4, 12 * 3600, 6 * 3600, 6 * 3600)
    assert kinds == {"mpi": ["idle_gpus"]}
    with store.engine.connect() as conn:
        f = conn.execute(text("SELECT idle_gpu_hours, cost FROM findings WHERE kind = 'idle_gpus'")).one()
    assert (f.idle_gpu_hours, f.cost) == (6.0, 12.0)


def test_mig_slices_charged_their_share(store: Store) -> None:
    cfg = Config(prices=PriceCard(models={"a100": 4.2}, mig={"1g.10gb": 0.6}))
    s1 = job("mig1", [AllocatedGpu("n1", 0, model="A100-SXM4-40GB", share=1 / 7, mig_profile="1g.10gb")], hours=2)
    s3 = job("mig3", [AllocatedGpu("n1", 0, model="A100-SXM4-40GB", share=3 / 7, mig_profile="3g.40gb")], hours=2)
    store.ingest([s1, s3, *run("n1", 0, 0, 24, sm_active=0.5)])
    use, _ = audit(store, cfg)
    assert use["mig1"]["reserved_s"] == pytest.approx(7200 / 7)
    assert use["mig1"]["reserved_cost"] == pytest.approx(2 * 0.6)  # the card's slice price
    assert use["mig3"]["reserved_cost"] == pytest.approx(2 * 3 / 7 * 4.2)  # unlisted profile: its share
    rows = cb.chargeback(store, cfg, W0, W1, "account")
    assert rows[0]["reserved_gpu_hours"] == Decimal("1.142857") and rows[0]["reserved_cost"] == Decimal("4.8")


def test_window_edges_cut_jobs(store: Store) -> None:
    before = job("before", [AllocatedGpu("n1", 0)], hours=4, start=T0 - timedelta(hours=1))
    running = Allocation("c", "slurm", "running", start=T0 + timedelta(hours=1), end=None,
                         gpus=[AllocatedGpu("n1", 1)])
    recs = [before, running, *[GpuBucket("c", "n1", 0, T0 - timedelta(minutes=5 * i), 300, 10, **WORK)
                               for i in range(1, 13)], *run("n1", 0, 0, 36, **IDLE), *run("n1", 1, 0, 48, **IDLE)]
    store.ingest(recs)
    use, kinds = audit(store, since=T0, until=T0 + timedelta(hours=2))
    assert (use["before"]["reserved_s"], use["before"]["idle_s"]) == (7200, 7200)
    assert use["running"]["reserved_s"] == 3600  # a running job ends at the window's end
    assert kinds == {"before": ["idle_allocation"], "running": ["idle_allocation"]}
    use, kinds = audit(store, since=T0 - timedelta(hours=1), until=T0 + timedelta(hours=1))
    assert (use["before"]["working_s"], use["before"]["idle_s"]) == (3600, 3600) and "running" not in use


@pytest.mark.parametrize("skew_s", [7, -7, 3])
def test_clock_skew_between_scheduler_and_telemetry(store: Store, skew_s: int) -> None:
    store.ingest([job("skewed", [AllocatedGpu("n1", 0)], hours=2, start=T0 + timedelta(seconds=skew_s)),
                  *run("n1", 0, 0, 24, **IDLE)])
    use, kinds = audit(store)
    u = use["skewed"]
    assert u["reserved_s"] == 7200
    assert (u["unknown_s"], u["idle_s"]) == (abs(skew_s), 7200 - abs(skew_s))  # seconds, not a bucket
    assert kinds == {"skewed": ["idle_allocation"]}


def test_month_edge_in_report_timezone(store: Store) -> None:
    """A job on Sep 30 21:00-23:00 UTC is half in October for Europe/Berlin (UTC+2), all September in UTC."""
    start = datetime(2026, 9, 30, 21, tzinfo=UTC)
    store.ingest([Allocation("c", "slurm", "edge", account="a", start=start, end=start + timedelta(hours=2),
                             gpus=[AllocatedGpu("n1", 0)]),
                  *[GpuBucket("c", "n1", 0, start + timedelta(minutes=5 * i), 300, 10, **WORK) for i in range(24)]])
    for tz, hours in (("Europe/Berlin", Decimal(1)), ("UTC", None)):
        c = Config(report=ReportConfig(timezone=tz))
        s, u = cb.month_window("2026-10", cb.report_tz(c))
        rows = cb.chargeback(store, c, s, u, "account", period="2026-10")
        if hours is None:
            assert rows == []
        else:
            assert rows[0]["reserved_gpu_hours"] == hours == rows[0]["working_gpu_hours"]
            assert rows[0]["effective_gpu_hours"] == Decimal("0.8")
