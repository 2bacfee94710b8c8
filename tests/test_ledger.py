"""The ledger on real histories (issue 13 §3): Slurm job id reuse and the migration that keys jobs by
instance, on SQLite and PostgreSQL, with numbers computed by hand in the comments."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select, text

from auditor.audit.run import run_audit
from auditor.config import Config
from auditor.records import AllocatedGpu, Allocation
from auditor.store import schema
from auditor.store.engine import Store

T0 = datetime(2026, 11, 16, tzinfo=UTC)
W0, W1 = T0 - timedelta(days=1), T0 + timedelta(days=1)
H = timedelta(hours=1)


def slurm(ext: str, submit: datetime | None, start: datetime | None, end: datetime | None,
          gpus: list[AllocatedGpu], **kw: Any) -> Allocation:
    return Allocation("c", "slurm", ext, user=kw.pop("user", "u"), account=kw.pop("account", "acct"),
                      state=kw.pop("state", "COMPLETED" if end else "RUNNING"), submit=submit, start=start,
                      end=end, gpus=gpus, **kw)


def rows(store: Store) -> list[Any]:
    t = schema.allocations
    with store.engine.connect() as conn:
        return list(conn.execute(select(t).order_by(t.c.instance_ts)))


def gpu_indices(store: Store, alloc_id: int) -> list[int | None]:
    g = schema.allocated_gpus
    with store.engine.connect() as conn:
        return [r.gpu_index for r in conn.execute(select(g.c.gpu_index).where(g.c.allocation_id == alloc_id)
                                                   .order_by(g.c.slot))]


def reserved_hours(store: Store, run_id: int) -> dict[tuple[str, int], float]:
    sql = ("SELECT a.external_id, a.instance_ts, u.reserved_s FROM usage_allocation u JOIN allocations a "
           "ON a.id = u.allocation_id WHERE u.run_id = :r")
    with store.engine.connect() as conn:
        return {(r.external_id, r.instance_ts): r.reserved_s / 3600 for r in conn.execute(text(sql), {"r": run_id})}


@pytest.mark.service
def test_reused_job_id_keeps_both_jobs(store: Store) -> None:
    """Job 100 (submitted T0, 2 GPUs with indices 0-1 seen while running, T0..T0+2h) and, after a
    slurmctld state loss, another job 100 (submitted T0+10h, 3 GPUs, T0+10h..T0+11h).
    Hand: first 2 GPUs x 2 h = 4 GPU-h, second 3 GPUs x 1 h = 3 GPU-h, together 7 GPU-h in two rows.
    (Keyed by id alone, the second overwrote the first: one row, 3 GPU-h.)"""
    running = slurm("100", T0, T0, None, [AllocatedGpu("n1", 0), AllocatedGpu("n1", 1)])
    done = slurm("100", T0, T0, T0 + 2 * H, [AllocatedGpu("n1", None), AllocatedGpu("n1", None)])
    reused = slurm("100", T0 + 10 * H, T0 + 10 * H, T0 + 11 * H, [AllocatedGpu("n2", None)] * 3)
    store.ingest([running], seen_at_ts=1000)
    store.ingest([done], seen_at_ts=2000)  # first seen running, then finished: still one row
    assert len(rows(store)) == 1
    store.ingest([done, reused], seen_at_ts=3000)
    store.ingest([reused, done], seen_at_ts=3000)  # the same history twice, any order: nothing changes
    first, second = rows(store)
    assert (first.instance_ts, first.end_ts, first.gpu_count) == (int(T0.timestamp()),
                                                                  int((T0 + 2 * H).timestamp()), 2)
    assert (second.instance_ts, second.start_ts, second.gpu_count) == (int((T0 + 10 * H).timestamp()),
                                                                       int((T0 + 10 * H).timestamp()), 3)
    assert gpu_indices(store, first.id) == [0, 1]  # indices learned while it ran are kept
    assert first.first_seen_ts == 1000 and second.first_seen_ts == 3000
    r = run_audit(store, Config(), W0, W1)
    hours = reserved_hours(store, r.run_id)
    assert hours == {("100", int(T0.timestamp())): pytest.approx(4.0),
                     ("100", int((T0 + 10 * H).timestamp())): pytest.approx(3.0)}
    assert sum(hours.values()) == pytest.approx(7.0)


@pytest.mark.service
def test_job_without_submit_time_is_told_apart_by_start(store: Store) -> None:
    """A source without submit times (e.g. a file export): start times tell reused ids apart; a sighting
    with a submit time matches the stored start; one with neither time is the latest job of that id.
    Hand: job 7 at T0 (1 GPU, 1 h) and job 7 again at T0+5h (1 GPU, 3 h): 1 + 3 = 4 GPU-h, two rows."""
    a = slurm("7", None, T0, T0 + H, [AllocatedGpu("n1", 0)])
    b_running = slurm("7", None, T0 + 5 * H, None, [AllocatedGpu("n1", 3)])
    b_done = slurm("7", T0 + 4 * H, T0 + 5 * H, T0 + 8 * H, [AllocatedGpu("n1", None)])
    timeless = slurm("7", None, None, None, [AllocatedGpu("n1", None)], name="renamed")
    store.ingest([a], seen_at_ts=10)
    store.ingest([b_running], seen_at_ts=20)
    store.ingest([b_done], seen_at_ts=30)  # has a submit time now; matched by its start
    store.ingest([timeless], seen_at_ts=40)
    first, second = rows(store)
    assert first.instance_ts == int(T0.timestamp()) and first.name == ""
    assert second.instance_ts == int((T0 + 5 * H).timestamp())
    assert second.submit_ts == int((T0 + 4 * H).timestamp()) and second.name == "renamed"
    assert gpu_indices(store, second.id) == [3]
    r = run_audit(store, Config(), W0, W1)
    assert sorted(reserved_hours(store, r.run_id).values()) == [pytest.approx(1.0), pytest.approx(3.0)]


@pytest.mark.service
def test_pods_keep_one_row_per_uid(store: Store) -> None:
    """Kubernetes pod UIDs are never reused: instance 0 whatever the times say (a pod seen first without
    a start, then started, is one row)."""
    pending = Allocation("c", "kubernetes", "uid-1", submit=T0, gpus=[AllocatedGpu("n1", None)])
    started = Allocation("c", "kubernetes", "uid-1", submit=T0 + H, start=T0 + H, gpus=[AllocatedGpu("n1", None)])
    store.ingest([pending], seen_at_ts=1)
    store.ingest([started], seen_at_ts=2)
    (row,) = rows(store)
    assert row.instance_ts == 0 and row.start_ts == int((T0 + H).timestamp())


@pytest.mark.service
def test_migration_0003_fills_instances(store_url: str) -> None:
    """Rows written before 0003 get instance_ts = submit (else start, else 0; pods 0) and a reused id after
    the upgrade becomes a second row."""
    s = Store.open(store_url)
    try:
        s.upgrade("0002")
        t0 = int(T0.timestamp())
        with s.engine.begin() as conn:
            for ext, source, submit, start in (("1", "slurm", t0, t0 + 60), ("2", "slurm", None, t0 + 120),
                                               ("uid", "kubernetes", t0, t0)):
                conn.execute(text(
                    "INSERT INTO allocations (cluster, source, external_id, name, user_name, account, partition,"
                    " qos, state, submit_ts, start_ts, reservation, owner_workload, gpu_count) VALUES ('c', :s,"
                    " :e, '', '', '', '', '', '', :sub, :st, '', '', 1.0)"),
                    {"s": source, "e": ext, "sub": submit, "st": start})
        s.upgrade()
        with s.engine.connect() as conn:
            got = dict(conn.execute(text("SELECT external_id, instance_ts FROM allocations")).all())
        assert got == {"1": t0, "2": t0 + 120, "uid": 0}
        s.ingest([slurm("1", T0 + 9 * H, T0 + 9 * H, T0 + 10 * H, [AllocatedGpu("n1", 0)])], seen_at_ts=5)
        s.ingest([slurm("1", T0, T0 + timedelta(seconds=60), T0 + H, [AllocatedGpu("n1", 0)])], seen_at_ts=6)
        with s.engine.connect() as conn:
            assert conn.execute(text("SELECT COUNT(*) FROM allocations WHERE external_id = '1'")).scalar() == 2
        from alembic import command

        command.downgrade(s.alembic_config(), "0002")  # keeps the latest job of each id
        with s.engine.connect() as conn:
            assert conn.execute(text("SELECT COUNT(*) FROM allocations")).scalar() == 3
    finally:
        s.engine.dispose()


@pytest.mark.service
def test_capacity_counts_a_node_from_when_it_was_first_seen(store: Store) -> None:
    """Window T0..T0+10h. n1 (4 h100): inventory first seen T0+6h, telemetry from T0+4h -> 4 GPUs x 6 h =
    24 GPU-h. n2 (2 h100): seen only at T0+8h -> 2 x 2 h = 4. m1 (2 a100): seen the day before -> 2 x 10 h
    = 20, a job held GPU 0 T0+2h..T0+5h -> 3 allocated, 17 free. Per model: h100 6 GPUs, 28 GPU-h, all free,
    mean 28 / 10 = 2.8 free GPUs; a100 2 GPUs, 20 GPU-h, 3 allocated, 17 free (was 60 h100 GPU-h: every
    inventory GPU counted for the whole window)."""
    from auditor.audit.capacity import capacity
    from auditor.records import GpuBucket, GpuInventory

    recs: list[Any] = [GpuInventory("c", "n1", g, "h100", seen_at=T0 + 6 * H) for g in range(4)]
    recs += [GpuInventory("c", "n2", g, "h100", seen_at=T0 + 8 * H) for g in range(2)]
    recs += [GpuInventory("c", "m1", g, "a100", seen_at=T0 - 24 * H) for g in range(2)]
    recs += [GpuBucket("c", "n1", 0, T0 + 4 * H + timedelta(minutes=5 * i), 300, 10, sm_active=0.5)
             for i in range(6)]
    recs.append(slurm("j", T0 + 2 * H, T0 + 2 * H, T0 + 5 * H, [AllocatedGpu("m1", 0)]))
    store.ingest(recs, seen_at_ts=int((T0 + 9 * H).timestamp()))
    t0 = int(T0.timestamp())
    with store.engine.connect() as conn:
        rows = {r["model"]: r for r in capacity(conn, t0, t0 + 36000, horizon=t0 + 36000)}
    h, a = rows["h100"], rows["a100"]
    assert (h["gpus"], h["gpu_hours"], h["allocated_gpu_hours"], h["free_gpu_hours"]) == (6, 28, 0, 28)
    assert h["mean_free_gpus"] == pytest.approx(2.8)
    assert (a["gpus"], a["gpu_hours"], a["allocated_gpu_hours"], a["free_gpu_hours"]) == (2, 20, 3, 17)


def test_one_collect_keeps_both_jobs_of_a_reused_id() -> None:
    """One read: sacct still lists the earlier job 100 (submitted T0, finished) and slurmctld runs a new job
    100 (submitted T0+10h, GPU indices 2-3). Both come out; the running view merges only with its own
    history row (same submit time), so the earlier job keeps its end and count-only GPUs."""
    from connectors.base import Window
    from connectors.slurm import assemble
    from connectors.slurm.reading import Reading

    old = slurm("100", T0, T0, T0 + 2 * H, [AllocatedGpu("n1", None)])
    new_hist = slurm("100", T0 + 10 * H, T0 + 10 * H, None, [AllocatedGpu("n2", None)] * 2, qos="high")
    new_run = slurm("100", T0 + 10 * H, T0 + 10 * H, None, [AllocatedGpu("n2", 2), AllocatedGpu("n2", 3)])
    new_run.labels["gpu_placement"] = "idx"
    reading = Reading(history=[old, new_hist], running=[new_run], running_complete=False)
    out = [a for a in assemble(reading, Window(T0 - H, T0 + 12 * H), "c") if isinstance(a, Allocation)]
    assert sorted((a.submit, a.end, [g.index for g in a.gpus], a.qos) for a in out) == [
        (T0, T0 + 2 * H, [None], ""), (T0 + 10 * H, None, [2, 3], "high")]


@pytest.mark.service
def test_timeless_sighting_then_times_is_one_job(store: Store) -> None:
    """A file export lists job 55 first without any time (pending), later with its start: one row, and its
    1 GPU x 2 h = 2 GPU-h are audited."""
    store.ingest([slurm("55", None, None, None, [AllocatedGpu("n1", None)], state="PENDING")], seen_at_ts=1)
    store.ingest([slurm("55", None, T0, T0 + 2 * H, [AllocatedGpu("n1", 1)])], seen_at_ts=2)
    (row,) = rows(store)
    assert (row.instance_ts, row.start_ts, row.state) == (0, int(T0.timestamp()), "COMPLETED")
    r = run_audit(store, Config(), W0, W1)
    assert list(reserved_hours(store, r.run_id).values()) == [pytest.approx(2.0)]
