"""The store: migrations match the models, every column is documented, ingest is idempotent and
order-independent on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select
from storecheck import checksum

from auditor.records import AllocatedGpu, Allocation, GpuBucket, GpuInventory, Reservation
from auditor.store import schema
from auditor.store.engine import Store
from connectors.base import RunningSnapshot

T0 = datetime(2026, 11, 20, tzinfo=UTC)


def buckets(start_h: int, hours: int, host: str = "n1", gpus: int = 2) -> list[GpuBucket]:
    out = []
    for i in range(start_h * 12, (start_h + hours) * 12):
        for g in range(gpus):
            out.append(GpuBucket("c", host, g, T0 + timedelta(minutes=5 * i), 300, 10, sm_active=0.1 * g,
                                 gpu_util=0.5, fb_used_mib=100.0 + i, hpc_job="7"))
    return out


def allocs() -> list[Allocation]:
    return [Allocation("c", "slurm", "7", name="train", user="alice", account="a", state="COMPLETED",
                       start=T0, end=T0 + timedelta(hours=3), gpus=[AllocatedGpu("n1", 0), AllocatedGpu("n1", 1)]),
            Allocation("c", "slurm", "8_1", name="arr", user="bob", account="b", state="RUNNING",
                       start=T0 + timedelta(hours=1), gpus=[AllocatedGpu("n1", None)])]


def other() -> list:
    return [Reservation("c", "maint", T0, T0 + timedelta(hours=5), nodes=["n1"], gpu_count=8, users=["alice"]),
            GpuInventory("c", "n1", 0, "h100"), GpuInventory("c", "n1", 1, "h100")]


@pytest.mark.service
def test_upgrade_and_current(store: Store) -> None:
    assert store.current() == store.head()
    store.require_current()


def test_migrations_match_models(tmp_path) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    s = Store.open(f"sqlite:///{tmp_path / 'm.db'}")
    s.upgrade()
    with s.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), schema.metadata)
    assert diff == [], f"auditor/store/schema.py and migrations/ disagree: {diff}"


@pytest.mark.service
def test_postgresql_comments_are_the_models(pg_schema_url: str) -> None:
    """The migrations leave PostgreSQL with every table's and column's comment as auditor/store/schema.py
    says (SQLite keeps none, so test_migrations_match_models cannot see a comment changed without a
    migration). Partitions (gpu_buckets_*) are not model tables."""
    from sqlalchemy import text

    s = Store.open(pg_schema_url)
    s.upgrade()
    with s.engine.connect() as conn:
        cols = {(r[0], r[1]): r[2] for r in conn.execute(text(
            "SELECT c.relname, a.attname, col_description(c.oid, a.attnum) FROM pg_class c JOIN pg_attribute a "
            "ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped WHERE c.relnamespace = "
            "current_schema()::regnamespace AND c.relkind IN ('r', 'p')"))}
        tables = {r[0]: r[1] for r in conn.execute(text(
            "SELECT relname, obj_description(oid, 'pg_class') FROM pg_class WHERE relnamespace = "
            "current_schema()::regnamespace AND relkind IN ('r', 'p')"))}
    s.engine.dispose()
    wrong = [(t.name, c.name, cols.get((t.name, c.name)), c.comment) for t in schema.metadata.tables.values()
             for c in t.columns if cols.get((t.name, c.name)) != c.comment]
    assert wrong == [], "a comment changed in schema.py needs a migration that sets it on PostgreSQL"
    assert [(t.name, tables.get(t.name)) for t in schema.metadata.tables.values()
            if tables.get(t.name) != t.comment] == []


def test_every_table_and_column_is_documented() -> None:
    from auditor.store.schemadoc import schema_markdown

    for table in schema.metadata.tables.values():
        assert table.comment, table.name
        for col in table.columns:
            assert col.comment, f"{table.name}.{col.name}"
    md = schema_markdown()
    assert all(f"## {t}" in md for t in schema.metadata.tables)


def test_docs_schema_is_current() -> None:
    from pathlib import Path

    from auditor.store.schemadoc import schema_markdown

    doc = Path(__file__).resolve().parent.parent / "docs" / "schema.md"
    assert doc.read_text().strip() == schema_markdown().strip(), "regenerate: gpu-audit db schema > docs/schema.md"


@pytest.mark.service
def test_same_input_twice_is_identical(store: Store) -> None:
    recs = [*allocs(), *other(), *buckets(0, 3)]
    store.ingest(recs, seen_at_ts=1000)
    first = checksum(store)
    store.ingest(recs, seen_at_ts=1000)
    assert checksum(store) == first
    assert store.count("gpu_buckets") == 3 * 12 * 2
    assert store.count("allocations") == 2


@pytest.mark.service
def test_overlapping_and_out_of_order_windows(store: Store, tmp_path) -> None:
    """Windows [0,3h) then [2,5h), versus [2,5h) then [0,3h), versus one [0,5h): same tables."""
    store.ingest([*allocs(), *buckets(0, 3)], seen_at_ts=1000)
    store.ingest([*allocs(), *buckets(2, 3)], seen_at_ts=1000)
    a = checksum(store)
    other_store = Store.open(f"sqlite:///{tmp_path / 'b.db'}")
    other_store.upgrade()
    other_store.ingest([*allocs(), *buckets(2, 3)], seen_at_ts=1000)
    other_store.ingest([*allocs(), *buckets(0, 3)], seen_at_ts=1000)
    one = Store.open(f"sqlite:///{tmp_path / 'c.db'}")
    one.upgrade()
    one.ingest([*allocs(), *buckets(0, 5)], seen_at_ts=1000)
    assert a["gpu_buckets"] == checksum(other_store)["gpu_buckets"] == checksum(one)["gpu_buckets"]
    assert a["allocations"] == checksum(one)["allocations"]


@pytest.mark.service
def test_gpu_indices_recorded_while_running_survive_a_count_only_history(store: Store) -> None:
    running = Allocation("c", "slurm", "9", state="RUNNING", start=T0,
                         gpus=[AllocatedGpu("n1", 4), AllocatedGpu("n1", 6)])
    history = Allocation("c", "slurm", "9", state="COMPLETED", start=T0, end=T0 + timedelta(hours=1),
                         gpus=[AllocatedGpu("n1", None), AllocatedGpu("n1", None)])
    store.ingest([running], seen_at_ts=100)
    store.ingest([history], seen_at_ts=200)
    with store.engine.connect() as conn:
        idx = sorted(r.gpu_index for r in conn.execute(select(schema.allocated_gpus.c.gpu_index)))
        a = conn.execute(select(schema.allocations)).one()
    assert idx == [4, 6]
    assert a.state == "COMPLETED" and a.end_ts == int((T0 + timedelta(hours=1)).timestamp())
    assert a.gpu_count == 2
    store.ingest([running], seen_at_ts=150)  # a stale running sighting never reopens it
    with store.engine.connect() as conn:
        a = conn.execute(select(schema.allocations)).one()
    assert a.state == "COMPLETED" and a.end_ts is not None


@pytest.mark.service
def test_a_new_gpu_keeps_the_uuid_and_model_some_bucket_knew(store: Store) -> None:
    """One batch, one new GPU, two sources: the DCGM bucket knows uuid and model, the jobstats bucket after
    it knows neither. The GPU's row keeps what was known (the last bucket alone would store NULLs). A second
    new GPU whose buckets name two models takes the later one."""
    dcgm = GpuBucket("c", "n1", 0, T0, 300, 10, uuid="GPU-aaaa", model="NVIDIA H100", sm_active=0.8)
    jobstats = GpuBucket("c", "n1", 0, T0 + timedelta(minutes=5), 300, 10, gpu_util=0.5, hpc_job="7")
    first = GpuBucket("c", "n1", 1, T0, 300, 10, model="NVIDIA A100")
    later = GpuBucket("c", "n1", 1, T0 + timedelta(minutes=5), 300, 10, model="NVIDIA A100-SXM4-80GB")
    store.ingest([dcgm, first, jobstats, later])
    t = schema.telemetry_gpus
    with store.engine.connect() as conn:
        got = {r.gpu_index: (r.uuid, r.model) for r in conn.execute(select(t.c.gpu_index, t.c.uuid, t.c.model))}
    assert got == {0: ("GPU-aaaa", "NVIDIA H100"), 1: (None, "NVIDIA A100-SXM4-80GB")}


@pytest.mark.service
def test_bucket_with_more_samples_wins(store: Store) -> None:
    full = GpuBucket("c", "n1", 0, T0, 300, 10, sm_active=0.8)
    partial = GpuBucket("c", "n1", 0, T0, 300, 3, sm_active=0.1)
    store.ingest([full])
    store.ingest([partial])
    with store.engine.connect() as conn:
        row = conn.execute(select(schema.gpu_buckets.c.samples, schema.gpu_buckets.c.sm_active)).one()
    assert (row.samples, row.sm_active) == (10, 0.8)


@pytest.mark.service
def test_snapshot_closes_allocations_that_vanished(store: Store) -> None:
    pod = Allocation("c", "kubernetes", "uid-1", start=T0, gpus=[AllocatedGpu("n1", None)])
    t0 = int(T0.timestamp())  # seen after its start, as a real collector sees it (an end before the start is clamped)
    store.ingest([pod, RunningSnapshot("c", "kubernetes", T0)], seen_at_ts=t0 + 1000)
    store.ingest([RunningSnapshot("c", "kubernetes", T0)], seen_at_ts=t0 + 2000)
    with store.engine.connect() as conn:
        a = conn.execute(select(schema.allocations)).one()
    assert (a.end_ts, a.state) == (t0 + 1000, "GONE")


def test_watermark_only_moves_forward(tmp_path) -> None:
    s = Store.open(f"sqlite:///{tmp_path / 'w.db'}")
    s.upgrade()
    with s.begin() as conn:
        s.set_watermark(conn, "c", "telemetry[0]:file", 500)
    with s.begin() as conn:
        s.set_watermark(conn, "c", "telemetry[0]:file", 300)
    assert s.watermark("c", "telemetry[0]:file") == 500


def test_unmigrated_store_is_a_clear_error(tmp_path) -> None:
    from auditor.errors import StoreError

    s = Store.open(f"sqlite:///{tmp_path / 'empty.db'}")
    with pytest.raises(StoreError, match="gpu-audit db upgrade"):
        s.require_current()


def test_sqlite_pragmas(tmp_path) -> None:
    from sqlalchemy import text

    s = Store.open(f"sqlite:///{tmp_path / 'p.db'}")
    with s.engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1


def test_missing_database_driver_is_a_one_line_error() -> None:
    # pg8000 is a real SQLAlchemy PostgreSQL dialect whose driver this project does not install: opening such a
    # store must say which driver is missing and how to get one, not escape as ModuleNotFoundError
    from auditor.errors import StoreError
    from auditor.store.engine import Store

    with pytest.raises(StoreError, match=r"driver 'pg8000'.*pip install 'gpu-audit\[postgres\]'"):
        Store.open("postgresql+pg8000://u@127.0.0.1/db")
