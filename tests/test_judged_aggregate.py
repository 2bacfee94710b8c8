"""The judged aggregate (auditor/audit/aggregate.py) gives the figures of judging every bucket.

The reference is the audit with ``Judging(whole_hours=False)`` (every bucket judged from gpu_buckets, the path
the oracle of tests/test_oracle.py checked before the aggregate existed); both runs of one store are compared
by a digest of their usage rows and findings (bench.audit.run_digest: floats to 9 digits, since sums added
in another order differ in the last bits). Each test also checks the aggregate path was taken (allocated
GPUs read whole hours from judged_hours), so an aggregate that is never read cannot pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

import pytest
from helpers import migrated_store
from hypothesis import HealthCheck, assume, given, settings
from oracle_fleets import fleets
from sqlalchemy import text
from test_oracle import FEATURES, clear, config, scraped

from auditor.audit import judging
from auditor.audit.judging import Judging
from auditor.audit.run import run_audit
from auditor.config import Config, Thresholds
from auditor.records import Allocation, GpuBucket
from auditor.simulate import FleetSpec, fleet_records
from auditor.store.engine import Store
from auditor.store.retention import prune
from bench.audit import run_digest


@pytest.fixture
def taken() -> Iterator[list[int]]:
    """Allocated GPUs judged through the aggregate, per audit (judging.whole_hour_gpus' results)."""
    seen: list[int] = []
    inner = judging.whole_hour_gpus

    def counted(*args: Any, **kw: Any) -> int:
        n = inner(*args, **kw)
        seen.append(n)
        return n

    with mock.patch.object(judging, "whole_hour_gpus", counted):
        yield seen


def audit(store: Store, cfg: Config, since: datetime, until: datetime, *, whole_hours: bool,
          what_if: bool = False, thresholds: Thresholds | None = None, now: datetime | None = None,
          edges: bool = True) -> dict:
    """One audit on the chosen path; its digest (the run itself is left in the store)."""
    with mock.patch("auditor.audit.run.utcnow", return_value=now or until):
        rid = run_audit(store, cfg, since, until, thresholds=thresholds, what_if=what_if,
                        judging=Judging(whole_hours=whole_hours, edges=edges)).run_id
    return run_digest(store, rid)


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.service)])
def fleet_store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    with migrated_store(request.param, tmp_path_factory.mktemp("agg"), "agg") as store:
        yield store


@pytest.mark.slow
def test_aggregate_equals_buckets_on_oracle_fleets(fleet_store: Store, taken: list[int]) -> None:
    """The oracle's generated fleets (labels, sub-rows, comma-joined labels, partial buckets, infrastructure
    events, roll-ups by prune): the aggregate path writes the usage rows and findings of the bucket path."""
    stats = {"fleets": 0, "whole_hour_gpus": 0}

    @settings(max_examples=25, derandomize=True, database=None, deadline=None, print_blob=False,
              suppress_health_check=list(HealthCheck))
    @given(fleets(FEATURES))
    def differential(fleet: Any) -> None:
        assume(_a_whole_hour(fleet))  # else both paths judge every bucket the same way
        clear(fleet_store)
        for op in fleet.ops:
            if op[0] == "ingest":
                fleet_store.ingest(scraped(op[1]), seen_at_ts=fleet.since)
            else:
                prune(fleet_store, now=op[1], keep_weeks=op[2], keep_runs_days=10_000)
        cfg = config(fleet)
        since, until = (datetime.fromtimestamp(x, UTC) for x in (fleet.since, fleet.until))
        now = datetime.fromtimestamp(fleet.now, UTC)
        want = audit(fleet_store, cfg, since, until, whole_hours=False, now=now)
        taken.clear()
        got = audit(fleet_store, cfg, since, until, whole_hours=True, now=now)
        assert got == want, fleet
        # the audit after it reads the edges kept by the first (judged_edges): the same figures
        assert audit(fleet_store, cfg, since, until, whole_hours=True, now=now) == want, fleet
        stats["fleets"] += 1
        stats["whole_hour_gpus"] += sum(taken)

    differential()
    assert stats["fleets"] >= 20 and stats["whole_hour_gpus"] > 0, stats


def _a_whole_hour(fleet: Any) -> bool:
    """Some allocation of the fleet holds a whole clock hour inside the audit window (the aggregate's part)."""
    hi = min(fleet.until, fleet.now)
    for op in fleet.ops:
        for r in op[1] if op[0] == "ingest" else []:
            if isinstance(r, Allocation):
                s = max(int(r.start.timestamp()), fleet.since)
                e = min(int(r.end.timestamp()) if r.end is not None else hi, hi)
                if -(-s // 3600) < e // 3600:
                    return True
    return False


SPEC = FleetSpec(gpus=24, days=0.5, seed=3)


@pytest.fixture
def sim(store: Store) -> Store:
    """A small simulated fleet (index- and label-attributed GPUs, half a day)."""
    store.ingest(fleet_records(SPEC), seen_at_ts=int(SPEC.end.timestamp()))
    return store


def test_aggregate_path_matches_buckets_and_is_taken(sim: Store, taken: list[int]) -> None:
    cfg = Config()
    want = audit(sim, cfg, SPEC.start, SPEC.end, whole_hours=False)
    got = audit(sim, cfg, SPEC.start, SPEC.end, whole_hours=True)
    assert got == want
    assert sum(taken) > 0
    with sim.engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM judged_hours")).scalar() > 0


def test_changed_thresholds_give_the_bucket_totals(sim: Store, taken: list[int]) -> None:
    """An official audit under new thresholds builds their own set (the old one dropped); a what-if under
    yet other thresholds reads no aggregate: both equal the bucket path under the same thresholds."""
    base = Config()
    audit(sim, base, SPEC.start, SPEC.end, whole_hours=True)  # builds the default set
    th = base.thresholds.model_copy(update={"idle_sm": 0.2, "working_sm": 0.6})
    cfg = base.model_copy(update={"thresholds": th})
    want = audit(sim, cfg, SPEC.start, SPEC.end, whole_hours=False)
    assert want != audit(sim, base, SPEC.start, SPEC.end, whole_hours=False), "the new thresholds change nothing"
    taken.clear()
    assert audit(sim, cfg, SPEC.start, SPEC.end, whole_hours=True) == want
    assert sum(taken) > 0
    with sim.engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM judged_sets")).scalar() == 1
    other = th.model_copy(update={"idle_sm": 0.3, "working_sm": 0.7})
    want_if = audit(sim, base, SPEC.start, SPEC.end, whole_hours=False, what_if=True, thresholds=other)
    taken.clear()
    assert audit(sim, base, SPEC.start, SPEC.end, whole_hours=True, what_if=True, thresholds=other) == want_if
    assert taken and sum(taken) == 0  # judged from buckets: the kept set is not this one


def test_a_late_ingest_into_a_judged_hour_is_rejudged(sim: Store, taken: list[int]) -> None:
    """Buckets written into hours the aggregate already judged (a late source, more samples) are re-judged
    before the next audit reads them: the figures change, and equal the bucket path's."""
    cfg = Config()
    before = audit(sim, cfg, SPEC.start, SPEC.end, whole_hours=True)
    with sim.engine.connect() as conn:
        rows = conn.execute(text("SELECT tg.cluster, tg.host, tg.gpu_index, b.bucket_ts, b.bucket_s FROM gpu_buckets b "
                                 "JOIN telemetry_gpus tg ON tg.id = b.gpu_id WHERE b.job = '' AND tg.has_jobs = 0 "
                                 "ORDER BY b.gpu_id, b.bucket_ts")).fetchall()
    mid = SPEC.start + timedelta(hours=4)
    late = [GpuBucket(cluster=r.cluster, host=r.host, gpu=r.gpu_index, start=datetime.fromtimestamp(r.bucket_ts, UTC),
                      seconds=r.bucket_s, samples=1000, sm_active=0.9, gpu_util=0.95)
            for r in rows if mid <= datetime.fromtimestamp(r.bucket_ts, UTC) < mid + timedelta(hours=3)]
    assert late
    sim.ingest(late, seen_at_ts=int(SPEC.end.timestamp()))
    want = audit(sim, cfg, SPEC.start, SPEC.end, whole_hours=False)
    assert want != before, "the late buckets change no figure"
    taken.clear()
    assert audit(sim, cfg, SPEC.start, SPEC.end, whole_hours=True) == want
    assert sum(taken) > 0


def test_an_unlabelled_row_beside_the_jobs_row_is_not_counted(store: Store, taken: list[int]) -> None:
    """Job 7's exporter labels its rows; a second, unlabelled source reports the same GPU busy. Only the
    labelled rows apply (definitions: an unlabelled row counts only without a labelled sibling), in the
    aggregate's whole hours as at its edges. Hand count: [T0+1800, T0+12600) is 3 h reserved, every bucket
    of job 7 idle (SM 0) and fully sampled: idle 10,800 s, working 0 s; 2 of those hours are whole."""
    from auditor.records import AllocatedGpu, Allocation

    t0 = datetime(2026, 11, 2, tzinfo=UTC)
    alloc = Allocation(cluster="c", source="slurm", external_id="7", user="u", account="a", state="COMPLETED",
                       start=t0 + timedelta(seconds=1800), end=t0 + timedelta(seconds=12600),
                       gpus=[AllocatedGpu(node="n0", index=0)])
    rows = []
    for k in range(4 * 12):
        ts = t0 + timedelta(seconds=300 * k)
        rows.append(GpuBucket(cluster="c", host="n0", gpu=0, start=ts, seconds=300, samples=10, sm_active=0.0,
                              gpu_util=0.0, hpc_job="7"))
        rows.append(GpuBucket(cluster="c", host="n0", gpu=0, start=ts, seconds=300, samples=10, sm_active=0.9,
                              gpu_util=0.9))
    store.ingest([alloc, *rows], seen_at_ts=int(t0.timestamp()) + 4 * 3600)
    cfg = Config()
    since, until = t0, t0 + timedelta(hours=4)
    want = audit(store, cfg, since, until, whole_hours=False)
    taken.clear()
    assert audit(store, cfg, since, until, whole_hours=True) == want
    assert sum(taken) == 1  # (PostgreSQL: one call per judging connection)
    with store.engine.connect() as conn:
        idle, working = conn.execute(text("SELECT idle_s, working_s FROM usage_gpu WHERE run_id = "
                                          "(SELECT MAX(id) FROM audit_runs)")).one()
    assert (idle, working) == (pytest.approx(10_800), 0)


def test_the_reference_path_reads_no_aggregate(sim: Store, taken: list[int]) -> None:
    """``Judging(whole_hours=False)`` is a parameter of the run, not a switch of the module: the run neither
    builds the aggregate nor plans a whole hour from it; the next default run of the same store builds and
    reads it, with the same figures."""
    cfg = Config()
    want = audit(sim, cfg, SPEC.start, SPEC.end, whole_hours=False)
    assert taken == [0]
    with sim.engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM judged_sets")).scalar() == 0
    taken.clear()
    assert audit(sim, cfg, SPEC.start, SPEC.end, whole_hours=True) == want
    assert sum(taken) > 0


def _edge_hours(store: Store) -> list[tuple[int, int]]:
    """(gpu_id, hour) of the edges the audits kept."""
    with store.engine.connect() as conn:
        return [(r.gpu_id, h) for r in conn.execute(text("SELECT gpu_id, lo_hour, hi_hour FROM judged_edges"))
                for h in range(r.lo_hour, r.hi_hour + 1)]


def _kept_usage(store: Store) -> list[tuple]:
    """The latest run's usage rows of the allocated GPUs whose edges are kept (judged_edges)."""
    with store.engine.connect() as conn:
        return [tuple(round(x, 6) if isinstance(x, float) else x for x in r) for r in conn.execute(text(
            "SELECT u.allocated_gpu_id, u.observed_s, u.idle_s, u.working_s, u.low_s, u.sm_s, u.gpu_util_s "
            "FROM usage_gpu u WHERE u.run_id = (SELECT MAX(id) FROM audit_runs) AND u.allocated_gpu_id IN "
            "(SELECT allocated_gpu_id FROM judged_edges) ORDER BY u.allocated_gpu_id"))]


def test_edges_are_judged_once(sim: Store, taken: list[int]) -> None:
    """Issue 46: an audit keeps the allocated GPUs' edges it judged (judged_edges) and the next audit reads them,
    not the buckets. Shown by changing the edge hours' buckets behind the store's back (no mark, as no write
    does): the next audit's usage rows of those allocated GPUs stay those of the first (their whole hours come
    from judged_hours); judging the edges again (Judging(edges=False))
    reads the changed buckets and differs, so the kept edges were what the audit read."""
    cfg = Config()
    first = audit(sim, cfg, SPEC.start, SPEC.end, whole_hours=True)
    kept = _kept_usage(sim)
    assert len(kept) > 10
    assert first == audit(sim, cfg, SPEC.start, SPEC.end, whole_hours=False)
    hours = sorted(set(_edge_hours(sim)))
    assert len(hours) > 20
    with sim.begin() as conn:
        for g, h in hours:
            conn.execute(text("UPDATE gpu_buckets SET sm_active = 0.97, gpu_util = 0.99 WHERE gpu_id = :g AND "
                              "bucket_ts >= :lo AND bucket_ts < :hi"), {"g": g, "lo": h * 3600, "hi": h * 3600 + 3600})
    audit(sim, cfg, SPEC.start, SPEC.end, whole_hours=True)
    assert _kept_usage(sim) == kept
    audit(sim, cfg, SPEC.start, SPEC.end, whole_hours=True, edges=False)
    assert _kept_usage(sim) != kept, "the changed edge buckets change no figure"


def test_late_telemetry_and_a_changed_allocation_rejudge_the_edges(sim: Store) -> None:
    """An edge kept by one audit is judged again when a write touches its hours (late telemetry marks them;
    the re-judging of marked hours deletes the kept edges) or when its allocation changes (a new end: the
    kept tail no longer matches): each time the figures equal those of every bucket judged afresh."""
    cfg = Config()
    audit(sim, cfg, SPEC.start, SPEC.end, whole_hours=True)
    with sim.engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT tg.cluster, tg.host, tg.gpu_index, b.bucket_ts, b.bucket_s FROM judged_edges e JOIN gpu_buckets b "
            "ON b.gpu_id = e.gpu_id AND b.bucket_ts >= e.lo_hour * 3600 AND b.bucket_ts < e.hi_hour * 3600 + 3600 "
            "JOIN telemetry_gpus tg ON tg.id = b.gpu_id WHERE b.job = '' AND tg.has_jobs = 0 ORDER BY b.gpu_id, "
            "b.bucket_ts")).fetchall()
    late = [GpuBucket(cluster=r.cluster, host=r.host, gpu=r.gpu_index, start=datetime.fromtimestamp(r.bucket_ts, UTC),
                      seconds=r.bucket_s, samples=1000, sm_active=0.93, gpu_util=0.96) for r in rows[::3]]
    assert late
    before = audit(sim, cfg, SPEC.start, SPEC.end, whole_hours=True)
    sim.ingest(late, seen_at_ts=int(SPEC.end.timestamp()))
    want = audit(sim, cfg, SPEC.start, SPEC.end, whole_hours=False)
    assert want != before, "the late buckets change no figure"
    assert audit(sim, cfg, SPEC.start, SPEC.end, whole_hours=True) == want
    # a changed allocation: a finished job's end moved back 40 minutes (the scheduler corrected it)
    from auditor.store import schema

    with sim.engine.connect() as conn:
        a = conn.execute(text("SELECT a.id, a.end_ts FROM allocations a JOIN allocated_gpus ag ON ag.allocation_id "
                              "= a.id JOIN judged_edges e ON e.allocated_gpu_id = ag.id WHERE e.side = 1 AND "
                              "e.edge_ts = a.end_ts AND COALESCE(e.sm_observed, e.util_observed) > 0 "
                              "ORDER BY a.id")).first()
    assert a is not None
    with sim.begin() as conn:
        conn.execute(schema.allocations.update().where(schema.allocations.c.id == a.id).values(end_ts=a.end_ts - 2400))
    want = audit(sim, cfg, SPEC.start, SPEC.end, whole_hours=False)
    assert audit(sim, cfg, SPEC.start, SPEC.end, whole_hours=True) == want
