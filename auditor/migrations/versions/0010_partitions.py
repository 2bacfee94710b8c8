"""PostgreSQL: gpu_buckets range-partitioned by week on bucket_ts; its foreign key to telemetry_gpus dropped

One partition per week (bounds Monday 00:00 UTC, ``gpu_buckets_w<YYYYMMDD>``), created here for every week
the table holds and afterwards on demand by each writer (:mod:`auditor.store.partitions`; no DEFAULT
partition). The primary key (gpu_id, bucket_ts, job) already holds the partition key. The per-row
foreign-key trigger on gpu_id was half of PostgreSQL's bucket merge: every writer now takes its ids from
telemetry_gpus in the same transaction and checks them set-wise before writing (and no code deletes
telemetry_gpus rows). An existing table is converted in place: renamed, its rows copied into the
partitions, dropped. SQLite is unchanged (one WITHOUT ROWID table, foreign key kept).

Revision ID: 0010_partitions
Revises: 0009_queue
Create Date: 2026-11-30
"""
from datetime import UTC, datetime

from alembic import op

revision = "0010_partitions"
down_revision = "0009_queue"
branch_labels = None
depends_on = None

WEEK, MONDAY = 7 * 86400, 4 * 86400  # as auditor.store.partitions (kept here: a migration never changes)
TABLE_COMMENT = ("Normalised per-GPU telemetry buckets (never raw samples), one row per GPU, bucket and job. "
                 "PostgreSQL: partitioned by week on bucket_ts (gpu_buckets_wYYYYMMDD, Monday 00:00 UTC).")
OLD_TABLE_COMMENT = "Normalised per-GPU telemetry buckets (never raw samples), one row per GPU, bucket and job."
GPU_ID = ("telemetry_gpus.id (a foreign key on SQLite; on PostgreSQL every writer takes it from telemetry_gpus "
          "in the same transaction and checks the batch's ids set-wise).")


def _forget() -> None:
    op.get_bind().connection.info.pop("gpu_buckets_partitioned", None)  # auditor.store.partitions' cache


def _quote(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def upgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    _forget()
    op.execute("ALTER TABLE gpu_buckets RENAME TO gpu_buckets_flat")
    op.execute("ALTER TABLE gpu_buckets_flat RENAME CONSTRAINT pk_gpu_buckets TO pk_gpu_buckets_flat")
    op.execute("CREATE TABLE gpu_buckets (LIKE gpu_buckets_flat INCLUDING DEFAULTS INCLUDING COMMENTS) "
               "PARTITION BY RANGE (bucket_ts)")
    op.execute(f"COMMENT ON TABLE gpu_buckets IS {_quote(TABLE_COMMENT)}")
    op.execute(f"COMMENT ON COLUMN gpu_buckets.gpu_id IS {_quote(GPU_ID)}")
    lows = [r[0] for r in op.get_bind().exec_driver_sql(
        f"SELECT DISTINCT CAST(floor((bucket_ts - {MONDAY}) / {WEEK}.0) * {WEEK} + {MONDAY} AS bigint) "
        "FROM gpu_buckets_flat")]
    for lo in sorted(lows):
        name = f"gpu_buckets_w{datetime.fromtimestamp(lo, UTC):%Y%m%d}"
        hi = lo + WEEK if lo + WEEK <= 2**31 - 1 else "MAXVALUE"  # bucket_ts is an int4
        op.execute(f"CREATE TABLE {name} PARTITION OF gpu_buckets FOR VALUES FROM ({lo}) TO ({hi})")
    # rows first, key after: each partition's index is then built by one sort, not row by row
    op.execute("INSERT INTO gpu_buckets SELECT * FROM gpu_buckets_flat")
    op.execute("ALTER TABLE gpu_buckets ADD CONSTRAINT pk_gpu_buckets PRIMARY KEY (gpu_id, bucket_ts, job)")
    op.execute("DROP TABLE gpu_buckets_flat")


def downgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    _forget()
    op.execute("CREATE TABLE gpu_buckets_flat (LIKE gpu_buckets INCLUDING DEFAULTS INCLUDING COMMENTS)")
    op.execute("INSERT INTO gpu_buckets_flat SELECT * FROM gpu_buckets")
    op.execute("DROP TABLE gpu_buckets")  # and its partitions
    op.execute("ALTER TABLE gpu_buckets_flat RENAME TO gpu_buckets")
    op.execute("ALTER TABLE gpu_buckets ADD CONSTRAINT pk_gpu_buckets PRIMARY KEY (gpu_id, bucket_ts, job)")
    op.execute("ALTER TABLE gpu_buckets ADD CONSTRAINT fk_gpu_buckets_gpu_id_telemetry_gpus "
               "FOREIGN KEY (gpu_id) REFERENCES telemetry_gpus (id)")
    op.execute(f"COMMENT ON TABLE gpu_buckets IS {_quote(OLD_TABLE_COMMENT)}")
    op.execute("COMMENT ON COLUMN gpu_buckets.gpu_id IS 'telemetry_gpus.id.'")
