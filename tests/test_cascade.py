"""The audit's output tables without per-row foreign keys on PostgreSQL (migration 0011_audit_output_fks):
the deletes ON DELETE CASCADE did are done by the code that deletes the parent (auditor.store.cascade), on
both engines, and an audit drops its rows whose GPU an ingest deleted while it ran."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from auditor.audit import run as audit_run
from auditor.config import Config
from auditor.records import AllocatedGpu, Allocation, GpuBucket, Reservation
from auditor.store.engine import Store

pytestmark = pytest.mark.service

T0 = datetime(2026, 11, 20, tzinfo=UTC)
OUTPUT_TABLES = ("usage_gpu", "usage_allocation", "findings")


def _job(*gpus: int) -> Allocation:
    return Allocation("c", "slurm", "7", name="train", user="alice", account="a", state="COMPLETED",
                      submit=T0, start=T0, end=T0 + timedelta(hours=2),
                      gpus=[AllocatedGpu("n1", g) for g in gpus])


def _buckets() -> list[GpuBucket]:
    # 2 hours of 5-minute buckets on GPUs 0 and 1 of n1, both idle (SM 0.0)
    return [GpuBucket("c", "n1", g, T0 + timedelta(minutes=5 * i), 300, 10, sm_active=0.0, gpu_util=0.0)
            for i in range(24) for g in (0, 1)]


def _usage_gpus(store: Store, run_id: int) -> list[tuple[int, int]]:
    """(allocated_gpu_id, gpu_index) of the run's usage_gpu rows."""
    with store.engine.connect() as conn:
        return sorted(tuple(r) for r in conn.execute(text(
            "SELECT allocated_gpu_id, gpu_index FROM usage_gpu WHERE run_id = :r"), {"r": run_id}))


def _reservation_findings(store: Store, run_id: int) -> list[int]:
    with store.engine.connect() as conn:
        return [r for (r,) in conn.execute(text("SELECT reservation_id FROM findings WHERE run_id = :r AND "
                                                "reservation_id IS NOT NULL"), {"r": run_id})]


def _allocated(store: Store) -> dict[int, int]:
    """slot -> allocated_gpus.id"""
    with store.engine.connect() as conn:
        return {r.slot: r.id for r in conn.execute(text("SELECT id, slot FROM allocated_gpus"))}


def _fks(store: Store, table: str) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM pg_constraint WHERE contype = 'f' AND conrelid = "
                                     "to_regclass(:t)"), {"t": table}).scalar() or 0)


def _comment(store: Store, table: str, column: str) -> str | None:
    with store.engine.connect() as conn:
        return conn.execute(text("SELECT col_description(to_regclass(:t), a.attnum) FROM pg_attribute a WHERE "
                                 "a.attrelid = to_regclass(:t) AND a.attname = :c"), {"t": table, "c": column}).scalar()


def test_migration_drops_the_output_tables_keys_and_back(pg_schema_url: str) -> None:
    from alembic import command

    store = Store.open(pg_schema_url)
    store.upgrade("0010_partitions")
    # 0001's keys: usage_gpu 2 (run, GPU), usage_allocation 2 (run, allocation), findings 3 (+ reservation)
    assert [_fks(store, t) for t in OUTPUT_TABLES] == [2, 2, 3]
    store.upgrade()
    assert [_fks(store, t) for t in OUTPUT_TABLES] == [0, 0, 0]
    assert _fks(store, "allocated_gpus") == 1  # not an output table: kept
    from auditor.store import schema

    for table, column in [("usage_gpu", "run_id"), ("usage_gpu", "allocated_gpu_id"), ("usage_allocation", "run_id"),
                          ("usage_allocation", "allocation_id"), ("findings", "run_id"),
                          ("findings", "allocation_id"), ("findings", "reservation_id"), ("store_meta", "key")]:
        assert _comment(store, table, column) == schema.metadata.tables[table].c[column].comment, (table, column)
    assert _comment(store, "usage_gpu", "allocated_gpu_id").startswith(
        "allocated_gpus.id (a foreign key on SQLite; none on PostgreSQL")
    with store.begin() as conn:  # a row that refers to nothing can now land ...
        conn.execute(text("INSERT INTO findings (run_id, kind, cluster, account, user_name, team, gpu_hours, "
                          "idle_gpu_hours, cost) VALUES (999, 'idle_allocation', 'c', '', '', '', 0, 0, 0)"))
    command.downgrade(store.alembic_config(), "0010_partitions")  # ... and is what the downgrade deletes
    assert [_fks(store, t) for t in OUTPUT_TABLES] == [2, 2, 3]
    assert store.count("findings") == 0
    assert _comment(store, "usage_gpu", "allocated_gpu_id") == "allocated_gpus.id."
    store.engine.dispose()


def test_a_gpu_dropped_from_an_allocation_takes_its_usage_rows(store: Store) -> None:
    store.ingest([_job(0, 1), *_buckets()], seen_at_ts=1)
    slots = _allocated(store)
    res = audit_run.run_audit(store, Config(), T0, T0 + timedelta(hours=2))
    assert _usage_gpus(store, res.run_id) == [(slots[0], 0), (slots[1], 1)]
    store.ingest([_job(0)], seen_at_ts=2)  # the scheduler now says the job held GPU 0 only
    assert sorted(_allocated(store).values()) == [slots[0]]
    assert _usage_gpus(store, res.run_id) == [(slots[0], 0)]  # GPU 1's row went with it (as the cascade did)
    store.engine.dispose()


def test_a_merged_reservation_takes_its_findings(store: Store) -> None:
    # two stored pieces of "maint", 00:00-01:00 and 02:00-03:00, seen after both ended (apart: two rows) ...
    seen = int((T0 + timedelta(hours=4)).timestamp())
    store.ingest([Reservation("c", "maint", T0, T0 + timedelta(hours=1), nodes=["n1"], gpu_count=8)],
                 seen_at_ts=seen)
    store.ingest([Reservation("c", "maint", T0 + timedelta(hours=2), T0 + timedelta(hours=3), nodes=["n1"],
                              gpu_count=8)], seen_at_ts=seen)
    with store.engine.connect() as conn:
        first, second = [r for (r,) in conn.execute(text("SELECT id FROM reservations ORDER BY id"))]
    with store.begin() as conn:  # a finding about each piece, under one run
        run = conn.execute(text("INSERT INTO audit_runs (started_ts, since_ts, until_ts, status, what_if) "
                                "VALUES (1, 0, 1, 'ok', :f) RETURNING id"), {"f": False}).scalar()
        for rid in (first, second):
            conn.execute(text("INSERT INTO findings (run_id, kind, cluster, reservation_id, account, user_name, team, "
                              "gpu_hours, idle_gpu_hours, cost) VALUES (:run, 'idle_reservation', 'c', :r, '', '', "
                              "'', 8, 8, 0)"), {"run": run, "r": rid})
    # ... then one sighting 00:00-03:00 that overlaps both: one reservation is kept (the older row)
    store.ingest([Reservation("c", "maint", T0, T0 + timedelta(hours=3), nodes=["n1"], gpu_count=8)], seen_at_ts=seen)
    with store.engine.connect() as conn:
        assert [r for (r,) in conn.execute(text("SELECT id FROM reservations"))] == [first]
        assert [r for (r,) in conn.execute(text("SELECT reservation_id FROM findings"))] == [first]
    store.engine.dispose()


def test_rows_of_a_gpu_an_ingest_deleted_while_the_audit_ran_are_dropped(
        pg_schema_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Right after the audit's connection wrote its usage rows, before it commits, another connection
    re-ingests the job with GPU 1 dropped and commits (no foreign key makes it wait; its delete cannot see the
    uncommitted rows). The run's row for GPU 1 then refers to nothing; the audit deletes it before it
    commits. PostgreSQL only: on SQLite the audit holds the write lock."""
    import threading

    from auditor.audit import usage

    store = Store.open(pg_schema_url)
    store.upgrade()
    store.ingest([_job(0, 1), *_buckets()], seen_at_ts=1)
    slots = _allocated(store)
    other = Store.open(pg_schema_url)
    real, once = usage.attribute_and_judge, threading.Lock()

    def then_ingest(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = real(*args, **kwargs)
        conn, run_id = args[0], args[4]  # the share that judged the job (the others judge nothing)
        mine = conn.execute(text("SELECT count(*) FROM usage_gpu WHERE run_id = :r"), {"r": run_id}).scalar()
        if mine and once.acquire(blocking=False):
            other.ingest([_job(0)], seen_at_ts=2)
        return out

    from auditor.audit import clusters

    monkeypatch.setattr(clusters, "attribute_and_judge", then_ingest)
    res = audit_run.run_audit(store, Config(), T0, T0 + timedelta(hours=2))
    assert once.locked()
    assert _usage_gpus(store, res.run_id) == [(slots[0], 0)]
    other.engine.dispose()
    store.engine.dispose()


def test_the_sweep_reads_the_run_only_after_a_delete(pg_schema_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep is skipped unless a GPU or reservation was deleted since the audit began (the store_meta
    token): a row that refers to nothing but was not left by a delete (planted here) stays; once a delete
    changed the token, the next audit's sweep removes the rows of its run that refer to nothing."""
    from sqlalchemy import insert

    from auditor.store import cascade, schema

    store = Store.open(pg_schema_url)
    store.upgrade()
    store.ingest([_job(0, 1), *_buckets()], seen_at_ts=1)
    from auditor.audit.totals import AllocationRows

    real = AllocationRows.write
    delete_too = False

    def plant(self, *args):  # type: ignore[no-untyped-def]
        run_id = self.run_id
        with store.begin() as other:
            other.execute(insert(schema.usage_gpu).values(run_id=run_id, allocated_gpu_id=10**6, allocation_id=1,
                                                          attribution="index"))
            other.execute(insert(schema.findings).values(run_id=run_id, kind="idle_reservation", cluster="c",
                                                         reservation_id=10**6))
            if delete_too:
                cascade.delete_allocated_gpus(other, [10**6 + 1])  # nothing to delete, but a delete all the same
        return real(self, *args)

    monkeypatch.setattr(AllocationRows, "write", plant)
    cfg = Config()
    first = audit_run.run_audit(store, cfg, T0, T0 + timedelta(hours=2))
    assert (10**6, None) in _usage_gpus(store, first.run_id)  # no delete: not swept
    assert _reservation_findings(store, first.run_id) == [10**6]
    delete_too = True
    second = audit_run.run_audit(store, cfg, T0, T0 + timedelta(hours=2))
    assert (10**6, None) not in _usage_gpus(store, second.run_id)
    assert _reservation_findings(store, second.run_id) == []
    store.engine.dispose()
