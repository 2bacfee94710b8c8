"""The fleet simulator (deterministic, streaming, a realistic mix), the judging's agreement between whole hours
from the judged aggregate and every bucket judged afresh on a simulated fleet, and retention (``gpu-audit db
prune``) on SQLite and PostgreSQL."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from auditor.audit import run as audit
from auditor.audit.judging import Judging
from auditor.config import Config, Thresholds
from auditor.records import Allocation, GpuBucket
from auditor.simulate import BLOCK_NODES, FleetSpec, block_jobs, fleet_records, populate
from auditor.store.engine import Store
from auditor.store.retention import prune

SMALL = FleetSpec(gpus=64, days=1)
#: three blocks (multi-node Slurm, mixed Slurm, Kubernetes), nodes without profiling fields, telemetry gaps
SIM = FleetSpec(gpus=192, days=2, seed=15)


def test_same_seed_same_records_other_seed_other_records() -> None:
    a = list(itertools.islice(fleet_records(FleetSpec(gpus=128, days=1, seed=3)), 3000))
    b = list(itertools.islice(fleet_records(FleetSpec(gpus=128, days=1, seed=3)), 3000))
    c = list(itertools.islice(fleet_records(FleetSpec(gpus=128, days=1, seed=4)), 3000))
    assert a == b
    assert a != c


def test_streams_lazily_in_store_key_order() -> None:
    it = fleet_records(FleetSpec(gpus=16_384, days=7))
    first = list(itertools.islice(it, 5000))  # a 33M-bucket fleet starts at once: nothing is materialised
    buckets = [b for b in first if isinstance(b, GpuBucket)]
    assert buckets, "the first block's buckets follow its allocations"
    keys = [(b.host, b.gpu, b.start) for b in buckets]
    assert keys == sorted(keys)


def test_job_mix_sizes_and_no_double_booking() -> None:
    spec = FleetSpec(gpus=2048, days=7)
    jobs = [j for block in range(-(-spec.nodes // BLOCK_NODES)) for j in block_jobs(spec, block)[2]]
    behaviours = Counter(j.behaviour for j in jobs)
    assert set(behaviours) == {"working", "inference", "low", "idle", "mirage", "partial", "episode"}
    assert behaviours["working"] > behaviours["idle"] > behaviours["mirage"] > 0
    sizes = {len(j.gpus) for j in jobs}
    assert {1, 2, 4, 8} <= sizes and any(s >= 16 for s in sizes)
    assert len(jobs) / spec.gpus >= 200_000 / 16_384  # a 16,384-GPU week has >= 200k allocations
    held: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for j in jobs:
        for g in j.gpus:
            held.setdefault(g, []).append((j.start, j.end))
    for spans in held.values():
        spans.sort()
        assert all(e0 <= s1 for (_, e0), (s1, _) in zip(spans, spans[1:], strict=False))


def test_bucket_count_and_units() -> None:
    recs = list(fleet_records(SMALL))
    buckets = [r for r in recs if isinstance(r, GpuBucket)]
    assert 0.9 * SMALL.gpus * SMALL.buckets_per_gpu <= len(buckets) <= SMALL.gpus * SMALL.buckets_per_gpu
    assert all(0 <= b.gpu_util <= 1 for b in buckets)  # ratios, not percent
    assert all(b.sm_active is None or 0 <= b.sm_active <= 1 for b in buckets)
    assert {r.source for r in recs if isinstance(r, Allocation)} <= {"slurm", "kubernetes"}


@pytest.fixture(scope="module")
def sim_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    path = tmp_path_factory.mktemp("sim") / "sim.db"
    store = Store.open(f"sqlite:///{path}")
    store.upgrade()
    stats = populate(store, SIM)
    assert stats.buckets > 0 and stats.allocations > 0
    return store


def _usage(store: Store, run_id: int) -> list[tuple]:
    with store.engine.connect() as conn:
        return [tuple(r)[1:] for r in conn.execute(text(
            "SELECT * FROM usage_gpu WHERE run_id = :r ORDER BY allocated_gpu_id"), {"r": run_id})]


def _same(x: tuple, y: tuple) -> bool:
    return all(u == v or (isinstance(u, float) and isinstance(v, float)
                          and math.isclose(u, v, rel_tol=1e-12, abs_tol=1e-9)) for u, v in zip(x, y, strict=True))


@pytest.mark.parametrize("th", [Thresholds(), Thresholds(util_fallback=False),
                                Thresholds(working_sm=0.03, idle_power_w=100.0)])
def test_aggregate_path_agrees_with_every_bucket_judged(sim_store: Store, th: Thresholds) -> None:
    """Multi-node jobs, Kubernetes pods attributed by labels, nodes without profiling fields and telemetry gaps:
    the audit reading whole hours from the judged aggregate (built for ``th``) writes the usage rows of the
    audit judging every bucket from gpu_buckets (``Judging(whole_hours=False)``), under three threshold sets."""
    spec = SIM
    fast = audit.run_audit(sim_store, Config(), spec.start, spec.end, thresholds=th)
    with sim_store.engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM judged_hours")).scalar() > 0
    ref = audit.run_audit(sim_store, Config(), spec.start, spec.end, thresholds=th,
                          judging=Judging(whole_hours=False))
    a, b = _usage(sim_store, fast.run_id), _usage(sim_store, ref.run_id)
    assert len(a) == len(b) > 100
    assert [x for x, y in zip(a, b, strict=True) if not _same(x, y)] == []
    signals = Counter(r[5] for r in a)
    assert signals["sm_active"] > 0 and signals["gpu_util"] > 0  # nodes without profiling fields
    assert (sum(r[9] for r in a) > 0) == th.util_fallback  # idle_by_util_s only when the fallback is on


def test_simulated_problems_are_found(sim_store: Store) -> None:
    spec = SIM
    res = audit.run_audit(sim_store, Config(), spec.start, spec.end)
    kinds = res.summary["findings"]
    assert kinds.get("idle_allocation", 0) > 0 and kinds.get("util_mirage", 0) > 0
    assert kinds.get("idle_gpus", 0) > 0
    assert res.summary["idle_gpu_hours"] > 0 and res.summary["working_gpu_hours"] > 0
    with sim_store.engine.connect() as conn:
        attributions = {r[0] for r in conn.execute(text(
            "SELECT DISTINCT attribution FROM usage_gpu WHERE run_id = :r"), {"r": res.run_id})}
    assert {"index", "label"} <= attributions  # Slurm by index, Kubernetes pods through telemetry labels


def _bucket_totals(store: Store) -> tuple:
    with store.engine.connect() as conn:
        return tuple(conn.execute(text(
            "SELECT SUM(samples), SUM(sm_active * samples) / SUM(CASE WHEN sm_active IS NOT NULL THEN samples END),"
            " SUM(gpu_util * samples) / SUM(CASE WHEN gpu_util IS NOT NULL THEN samples END), MAX(fb_used_mib)"
            " FROM gpu_buckets")).one())


def test_prune_rolls_up_hourly_idempotently_and_deletes_old_runs(store: Store) -> None:
    spec = FleetSpec(gpus=16, days=1, seed=2)
    populate(store, spec)
    for _ in range(2):
        audit.run_audit(store, Config(), spec.start, spec.end)
    before = _bucket_totals(store)
    fine = store.count("gpu_buckets")
    now = int(spec.start.timestamp()) + 8 * 7 * 86400 + 12 * 3600  # the first 12 h are past 8 weeks
    dry = prune(store, now=now, keep_weeks=8, dry_run=True)
    assert store.count("gpu_buckets") == fine and 0 < dry.fine_rows_rolled < fine
    res = prune(store, now=now, keep_weeks=8, keep_runs_days=20)
    assert res.fine_rows_rolled == dry.fine_rows_rolled
    assert res.fine_rows_rolled / 12 <= res.hourly_rows_written < res.fine_rows_rolled
    after = _bucket_totals(store)
    assert after[0] == before[0] and after[3] == before[3]
    assert after[1] == pytest.approx(before[1], rel=1e-9) and after[2] == pytest.approx(before[2], rel=1e-9)
    with store.engine.connect() as conn:
        kinds = dict(conn.execute(text("SELECT bucket_s, COUNT(*) FROM gpu_buckets GROUP BY bucket_s")).all())
        old = conn.execute(text("SELECT COUNT(*) FROM gpu_buckets WHERE bucket_ts < :c AND bucket_s < 3600"),
                           {"c": res.cutoff_ts}).scalar()
        runs = conn.execute(text("SELECT COUNT(*) FROM audit_runs")).scalar()
        orphans = conn.execute(text("SELECT COUNT(*) FROM usage_gpu WHERE run_id NOT IN "
                                    "(SELECT id FROM audit_runs)")).scalar()
    assert old == 0 and kinds[3600] == res.hourly_rows_written and kinds[300] == fine - res.fine_rows_rolled
    assert res.runs_deleted == 1 and runs == 1 and orphans == 0  # the newest official run stays
    again = prune(store, now=now, keep_weeks=8, keep_runs_days=20)
    assert (again.fine_rows_rolled, again.hourly_rows_written, again.runs_deleted) == (0, 0, 0)
    assert _bucket_totals(store)[0] == before[0]


def test_db_prune_command(tmp_path: Path) -> None:
    from auditor.cli import db as cli_db_prune
    from auditor.cli import main

    if "prune" not in main.commands["db"].commands:  # type: ignore[attr-defined]
        cli_db_prune.register(main)
    db = tmp_path / "s.db"
    store = Store.open(f"sqlite:///{db}")
    store.upgrade()
    populate(store, SMALL)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\nurl = "sqlite:///{db}"\n', encoding="utf-8")
    runner = CliRunner()
    res = runner.invoke(main, ["-c", str(cfg), "--json", "db", "prune", "--keep-weeks", "0", "--dry-run",
                               "--now", "2026-11-10"])
    assert res.exit_code == 0, res.output
    assert '"fine_rows_rolled": ' + str(store.count("gpu_buckets")) in res.output
    res = runner.invoke(main, ["-c", str(cfg), "db", "prune", "--keep-weeks", "0", "--now", "2026-11-10"])
    assert res.exit_code == 0, res.output
    assert "rolled up" in res.output and "hourly buckets" in res.output
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT MIN(bucket_s) FROM gpu_buckets")).scalar() == 3600
