"""PostgreSQL's weekly partitions of gpu_buckets (migration 0010_partitions): the migration converts a
populated table and back, ingest creates the weeks it writes, a bucket for an unknown GPU never lands (no
per-row foreign key on PostgreSQL any more), and retention exchanges whole old weeks for rolled-up copies
with exactly the rows the row-wise path (SQLite) leaves."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from auditor.records import GpuBucket
from auditor.store.engine import Store

# Monday 2026-11-02 00:00 UTC = 1_793_577_600 (20,759 days after the epoch; 20,759 - 4 = 20,755 = 7 x 2,965,
# so a week boundary: the epoch's first Monday is 1970-01-05)
MON = datetime(2026, 11, 2, tzinfo=UTC)
MON_TS = 1_793_577_600


def _buckets(start: datetime, n: int, gpus: int = 2, job: str = "") -> list[GpuBucket]:
    return [GpuBucket("c", "n1", g, start + timedelta(minutes=5 * i), 300, 10, sm_active=0.01 * (i % 50),
                      gpu_util=0.5, power_w=100.0 + g, fb_used_mib=float(i), hpc_job=job or None)
            for i in range(n) for g in range(gpus)]


def _parts(store: Store) -> dict[str, int]:
    """{partition: rows}."""
    with store.engine.connect() as conn:
        rels = [r[0] for r in conn.execute(text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = to_regclass('gpu_buckets') ORDER BY 1"))]
        return {r: int(conn.execute(text(f"SELECT count(*) FROM {r}")).scalar() or 0) for r in rels}


def _rows(store: Store) -> list[tuple]:
    with store.engine.connect() as conn:
        return [tuple(round(v, 9) if isinstance(v, float) else v for v in r) for r in conn.execute(text(
            "SELECT t.host, t.gpu_index, b.bucket_ts, b.job, b.bucket_s, b.samples, b.observed_s, b.span_start, "
            "b.span_end, b.sm_active, b.gpu_util, b.power_w, b.fb_used_mib FROM gpu_buckets b JOIN telemetry_gpus t "
            "ON t.id = b.gpu_id ORDER BY 1, 2, 3, 4"))]


def _fk_count(store: Store) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM pg_constraint WHERE contype = 'f' AND conrelid = "
                                     "to_regclass('gpu_buckets')")).scalar() or 0)


def test_week_bounds() -> None:
    from auditor.store import partitions

    assert MON_TS == int(MON.timestamp())
    assert partitions.week_lo(MON_TS) == MON_TS
    assert partitions.week_lo(MON_TS - 1) == MON_TS - 7 * 86400  # Sunday 23:59:59 is the week before
    assert partitions.week_lo(MON_TS + 7 * 86400 - 1) == MON_TS
    assert partitions.name(MON_TS) == "gpu_buckets_w20261102"


def test_migration_converts_a_populated_table_and_back(pg_schema_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from auditor.store import judged

    store = Store.open(pg_schema_url)
    store.upgrade("0009_queue")
    # Sunday 2026-11-01 23:00 .. Monday 2026-11-02 01:00: 24 five-minute buckets x 2 GPUs, 12 x 2 each side
    with monkeypatch.context() as m:  # today's ingest into a 0009 store: it has no judged_dirty (0015) to mark
        m.setattr(judged, "mark_rows", lambda conn, rows: 0)
        from auditor.store import ingest  # nor gpu_buckets.sm_exact (0032)

        row, n = ingest._row, len(ingest.EXACT_FIELDS)
        m.setattr(ingest, "BUCKET_COLS", ingest.BUCKET_COLS[:-n])
        m.setattr(ingest, "EXACT_FIELDS", ())
        m.setattr(ingest, "_row", lambda gid, b: row(gid, b)[:-n])
        store.ingest(_buckets(MON - timedelta(hours=1), 24), seen_at_ts=1)
    before = _rows(store)
    assert len(before) == 48 and _fk_count(store) == 1
    store.upgrade()
    assert _parts(store) == {"gpu_buckets_w20261026": 24, "gpu_buckets_w20261102": 24}
    assert _rows(store) == before
    assert _fk_count(store) == 0
    from alembic import command

    command.downgrade(store.alembic_config(), "0009_queue")  # and back: a plain table with its foreign key
    with store.engine.connect() as conn:
        kind = conn.execute(text("SELECT relkind FROM pg_class WHERE oid = to_regclass('gpu_buckets')")).scalar()
    assert kind == "r" and _fk_count(store) == 1
    assert _rows(store) == before
    store.upgrade()
    assert _rows(store) == before
    store.engine.dispose()


def test_upgrade_of_an_empty_store_then_ingest_creates_its_weeks(pg_schema_url: str) -> None:
    store = Store.open(pg_schema_url)
    store.upgrade()
    assert _parts(store) == {}
    # Sunday 23:50 .. Monday 00:05: 5 buckets (23:50, 23:55 | 00:00, 00:05 ... ) x 2 GPUs
    store.ingest(_buckets(MON - timedelta(minutes=10), 4), seen_at_ts=1)
    assert _parts(store) == {"gpu_buckets_w20261026": 4, "gpu_buckets_w20261102": 4}
    store.ingest(_buckets(MON - timedelta(minutes=10), 4), seen_at_ts=2)  # again: nothing new, no error
    assert _parts(store) == {"gpu_buckets_w20261026": 4, "gpu_buckets_w20261102": 4}
    store.engine.dispose()


@pytest.mark.parametrize("copy_min", [1, 10**9], ids=["copy", "executemany"])
def test_a_bucket_for_an_unknown_gpu_cannot_land(store_url: str, copy_min: int,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL has no per-row foreign key on gpu_buckets.gpu_id since 0010: the batch check refuses a
    row whose id is not in telemetry_gpus, and nothing of its batch is written (SQLite: the foreign key)."""
    from auditor.store import ingest

    monkeypatch.setattr(ingest, "COPY_MIN_ROWS", copy_min)
    store = Store.open(store_url)
    store.upgrade()
    store.ingest(_buckets(MON, 1, gpus=1), seen_at_ts=1)
    with store.engine.connect() as conn:
        gid = conn.execute(text("SELECT id FROM telemetry_gpus")).scalar()
    good = ingest._row(gid, _buckets(MON + timedelta(hours=1), 1, gpus=1)[0])
    bad = (gid + 1000, *good[1:])
    with pytest.raises(Exception, match=r"(?i)unknown telemetry GPU id|foreign key"):
        with store.begin() as conn:
            ingest.write_bucket_rows(conn, [good, bad])
    assert store.count("gpu_buckets") == 1  # only the first ingest's row
    store.engine.dispose()


def test_prune_exchanges_whole_weeks_and_matches_the_row_wise_path(pg_schema_url: str, tmp_path) -> None:
    from auditor.store.retention import prune

    # 2 GPUs, 5-minute buckets from Monday 2026-11-02 00:00 for 16 days (2 whole weeks + 2 days), two jobs on
    # GPU 0/1 alternating per day would add sub-rows: keep one job label per GPU ('' and '7')
    recs = _buckets(MON, 16 * 288) + _buckets(MON, 16 * 288, gpus=1, job="7")
    pg = Store.open(pg_schema_url)
    pg.upgrade()
    lite = Store.open(f"sqlite:///{tmp_path / 'lite.db'}")
    lite.upgrade()
    for s in (pg, lite):
        s.ingest(recs, seen_at_ts=1)
    parts = _parts(pg)
    assert parts == {"gpu_buckets_w20261102": 3 * 7 * 288, "gpu_buckets_w20261109": 3 * 7 * 288,
                     "gpu_buckets_w20261116": 3 * 2 * 288}
    with pg.engine.connect() as conn:
        oids = dict(conn.execute(text("SELECT relname, oid FROM pg_class WHERE relname LIKE 'gpu_buckets_w%' "
                                      "AND relnamespace = current_schema()::regnamespace")).all())
    # keep 1 week before 2026-11-20 12:00: cutoff Friday 2026-11-13 12:00 -> week 1 whole, week 2 partial
    now = int((MON + timedelta(days=18, hours=12)).timestamp())
    res = {s.dialect: prune(s, now=now, keep_weeks=1) for s in (pg, lite)}
    # week 1: 3 series x 7 x 24 hourly rows; week 2 up to Friday 12:00: 3 x (4 x 24 + 12) hourly rows
    assert res["postgresql"].hourly_rows_written == res["sqlite"].hourly_rows_written == 3 * (7 * 24 + 4 * 24 + 12)
    assert res["postgresql"].fine_rows_rolled == res["sqlite"].fine_rows_rolled == 3 * (11 * 288 + 144)
    after = _parts(pg)
    assert after["gpu_buckets_w20261102"] == 3 * 7 * 24  # the rolled-up copy
    assert after["gpu_buckets_w20261109"] == 3 * (4 * 24 + 12) + 3 * (3 * 288 - 144)  # row-wise: hourly + fine
    assert after["gpu_buckets_w20261116"] == 3 * 2 * 288  # untouched
    with pg.engine.connect() as conn:
        now_oids = dict(conn.execute(text("SELECT relname, oid FROM pg_class WHERE relname LIKE 'gpu_buckets_w%' "
                                          "AND relnamespace = current_schema()::regnamespace")).all())
        gone = conn.execute(text("SELECT count(*) FROM pg_class WHERE oid = :o"),
                            {"o": oids["gpu_buckets_w20261102"]}).scalar()
    assert gone == 0, "the old partition of the whole week was dropped"
    assert now_oids["gpu_buckets_w20261102"] != oids["gpu_buckets_w20261102"]
    assert now_oids["gpu_buckets_w20261109"] == oids["gpu_buckets_w20261109"]  # partial week: same table
    assert now_oids["gpu_buckets_w20261116"] == oids["gpu_buckets_w20261116"]
    assert _rows(pg) == _rows(lite)  # the exchange leaves exactly the rows of the row-wise path
    # pruning again changes nothing; ingesting a fine bucket of a rolled-up hour is dropped as before
    again = _rows(pg)
    prune(pg, now=now, keep_weeks=1)
    pg.ingest(_buckets(MON, 1), seen_at_ts=2)
    assert _rows(pg) == again
    for s in (pg, lite):
        s.engine.dispose()


def test_a_week_created_in_a_rolled_back_transaction_is_created_again(pg_schema_url: str) -> None:
    from auditor.store import ingest

    store = Store.open(pg_schema_url)
    store.upgrade()
    store.ingest(_buckets(MON, 1, gpus=1), seen_at_ts=1)
    with store.engine.connect() as conn:
        gid = conn.execute(text("SELECT id FROM telemetry_gpus")).scalar()
    later = ingest._row(gid, _buckets(MON + timedelta(days=14), 1, gpus=1)[0])
    with pytest.raises(RuntimeError), store.begin() as conn:
        ingest.write_bucket_rows(conn, [later])  # creates the week of 2026-11-16 ...
        ingest.write_bucket_rows(conn, [later[:1] + (later[1] + 300,) + later[2:]])  # ... and sees it
        raise RuntimeError("rolled back")  # ... which takes the partition away again
    assert _parts(store) == {"gpu_buckets_w20261102": 1}
    store.ingest(_buckets(MON + timedelta(days=14), 2, gpus=1), seen_at_ts=2)  # same pooled connection
    assert _parts(store) == {"gpu_buckets_w20261102": 1, "gpu_buckets_w20261116": 2}
    store.engine.dispose()
