"""Verdict v2: telemetry sub-rows per job, observed seconds and spans; busy_unverified; the store's meta

gpu_buckets gains ``job`` (in the primary key: series of one GPU with different job labels stay apart),
``observed_s`` (seconds the samples cover; existing rows: bucket_s when they had samples, else 0) and
``span_start``/``span_end``. telemetry_gpus gains ``has_jobs``; usage_gpu/usage_allocation gain
``busy_unverified_s`` and ``idle_peak_fb_mib``; ``store_meta`` records the bucket width the data was collected at.

Revision ID: 0005_verdict
Revises: 0004_enforce
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op

revision = "0005_verdict"
down_revision = "0004_enforce"
branch_labels = None
depends_on = None

METRICS = [
    ('gpu_util', 'NVML GPU-Util as a 0-1 ratio: share of time any kernel ran (the misleading one).'),
    ('gr_engine', 'DCGM GR engine activity, 0-1 (time-based like GPU-Util).'),
    ('sm_active', 'DCGM SM activity, 0-1: share of cycles with a warp resident, averaged over all SMs.'),
    ('sm_occupancy', 'DCGM SM occupancy, 0-1.'),
    ('tensor_active', 'DCGM Tensor pipe activity, 0-1.'),
    ('dram_active', 'DCGM DRAM activity (memory bandwidth busy), 0-1.'),
    ('fp64_active', 'DCGM FP64 pipe activity, 0-1.'),
    ('fp32_active', 'DCGM FP32 pipe activity, 0-1.'),
    ('fp16_active', 'DCGM FP16 pipe activity, 0-1.'),
    ('fb_used_mib', 'Frame buffer memory used, MiB (bucket maximum).'),
    ('power_w', 'Board power draw, W.'),
    ('pcie_tx_bps', 'PCIe transmit, bytes/s.'),
    ('pcie_rx_bps', 'PCIe receive, bytes/s.'),
    ('nvlink_tx_bps', 'NVLink transmit, bytes/s.'),
    ('nvlink_rx_bps', 'NVLink receive, bytes/s.'),
]
LABELS = [("hpc_job", "dcgm-exporter hpc_job label(s), comma-joined."), ("pod", "Pod label from telemetry."),
          ("namespace", "Namespace label from telemetry."), ("container", "Container label from telemetry.")]
OLD_COLS = ["gpu_id", "bucket_ts", "bucket_s", "samples", *(m for m, _c in METRICS), *(c for c, _t in LABELS)]
JOB = ("COALESCE(NULLIF(hpc_job, ''), CASE WHEN COALESCE(pod, '') <> '' THEN COALESCE(namespace, '') || '/' || pod "
       "END, '')")
BUSY = ("Observed GPU-seconds without SM activity that GPU-Util does not call idle: busy by GPU-Util (or no "
        "utilization field), work not verifiable.")


def _bucket_columns() -> list:
    return [
        sa.Column("gpu_id", sa.Integer(), nullable=False, comment="telemetry_gpus.id."),
        sa.Column("bucket_ts", sa.Integer(), autoincrement=False, nullable=False,
                  comment="Bucket start (UTC epoch seconds), aligned to bucket_s."),
        sa.Column("job", sa.String(length=512), server_default="", nullable=False,
                  comment="Job key of the series: hpc_job label (comma-joined if several) or namespace/pod; '' = "
                  "no job label. Series of one GPU with different jobs are separate rows (sub-rows), never merged."),
        sa.Column("bucket_s", sa.Integer(), nullable=False, comment="Bucket length in seconds (300 fine, 3600 "
                  "rolled up)."),
        sa.Column("samples", sa.Integer(), nullable=False, comment="Raw samples behind the bucket; 0 = not observed."),
        sa.Column("observed_s", sa.Float(), nullable=False, comment="Seconds of the bucket the samples cover "
                  "(0..bucket_s; bucket_s when the source cannot tell)."),
        sa.Column("span_start", sa.Integer(), nullable=True, comment="First sample time; NULL = the whole bucket."),
        sa.Column("span_end", sa.Integer(), nullable=True, comment="Last sample time + sample interval; NULL = the "
                  "whole bucket."),
        *[sa.Column(m, sa.Float(), nullable=True, comment=c) for m, c in METRICS],
        *[sa.Column(c, sa.String(length=255), nullable=True, comment=t) for c, t in LABELS],
    ]


def upgrade() -> None:
    cols = ", ".join(OLD_COLS)
    op.create_table(
        "gpu_buckets_v3", *_bucket_columns(),
        sa.ForeignKeyConstraint(["gpu_id"], ["telemetry_gpus.id"], name="fk_gpu_buckets_v3_gpu_id"),
        sa.PrimaryKeyConstraint("gpu_id", "bucket_ts", "job", name="pk_gpu_buckets_v3"),
        comment="Normalised per-GPU telemetry buckets (never raw samples), one row per GPU, bucket and job.",
        sqlite_with_rowid=False)
    op.execute(f"INSERT INTO gpu_buckets_v3 ({cols}, job, observed_s) SELECT {cols}, {JOB}, "
               "CASE WHEN samples > 0 THEN bucket_s ELSE 0 END FROM gpu_buckets")
    op.drop_table("gpu_buckets")
    op.rename_table("gpu_buckets_v3", "gpu_buckets")
    if op.get_context().dialect.name == "postgresql":
        op.execute("ALTER TABLE gpu_buckets RENAME CONSTRAINT pk_gpu_buckets_v3 TO pk_gpu_buckets")
        op.execute("ALTER TABLE gpu_buckets RENAME CONSTRAINT fk_gpu_buckets_v3_gpu_id "
                   "TO fk_gpu_buckets_gpu_id_telemetry_gpus")
    with op.batch_alter_table("telemetry_gpus", schema=None) as batch_op:
        batch_op.add_column(sa.Column("has_jobs", sa.Integer(), server_default="0", nullable=False,
                                      comment="1 once a bucket row with a job label was stored for it (its rows "
                                      "may need combining)."))
    op.execute("UPDATE telemetry_gpus SET has_jobs = 1 WHERE id IN (SELECT DISTINCT gpu_id FROM gpu_buckets "
               "WHERE job <> '')")
    for table, held in (("usage_gpu", "Peak frame buffer held in idle or mirage buckets, MiB (a live process "
                                      "holding the GPU while idle)."),
                        ("usage_allocation", "Peak frame buffer held on any of its GPUs while idle or mirage, MiB.")):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("busy_unverified_s", sa.Float(), server_default="0", nullable=False,
                                          comment=BUSY))
            batch_op.add_column(sa.Column("idle_peak_fb_mib", sa.Float(), nullable=True, comment=held))
    op.create_table(
        "store_meta",
        sa.Column("key", sa.String(length=64), nullable=False, comment="Setting, e.g. bucket_seconds or "
                  "rolled_up_before."),
        sa.Column("value", sa.String(length=255), nullable=False, comment="Its value."),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_store_meta")),
        comment="Facts about the stored data: the bucket width it was collected at, how far it is rolled up.")
    op.execute("INSERT INTO store_meta (key, value) SELECT 'bucket_seconds', CAST(MIN(bucket_s) AS VARCHAR(16)) "
               "FROM gpu_buckets WHERE bucket_s < 3600 HAVING COUNT(*) > 0")


def downgrade() -> None:
    """Back to one row per GPU and bucket: of several job rows the one with the smallest job key stays."""
    op.drop_table("store_meta")
    for table in ("usage_allocation", "usage_gpu"):
        op.execute(f"ALTER TABLE {table} DROP COLUMN idle_peak_fb_mib")
        op.execute(f"ALTER TABLE {table} DROP COLUMN busy_unverified_s")
    op.execute("ALTER TABLE telemetry_gpus DROP COLUMN has_jobs")
    old = [c for c in _bucket_columns() if c.name not in ("job", "observed_s", "span_start", "span_end")]
    op.create_table(
        "gpu_buckets_v2", *old,
        sa.ForeignKeyConstraint(["gpu_id"], ["telemetry_gpus.id"], name="fk_gpu_buckets_v2_gpu_id"),
        sa.PrimaryKeyConstraint("gpu_id", "bucket_ts", name="pk_gpu_buckets_v2"),
        comment="Normalised per-GPU telemetry buckets (never raw samples).", sqlite_with_rowid=False)
    cols = ", ".join(OLD_COLS)
    op.execute(f"INSERT INTO gpu_buckets_v2 ({cols}) SELECT {cols} FROM gpu_buckets b WHERE NOT EXISTS (SELECT 1 "
               "FROM gpu_buckets o WHERE o.gpu_id = b.gpu_id AND o.bucket_ts = b.bucket_ts AND o.job < b.job)")
    op.drop_table("gpu_buckets")
    op.rename_table("gpu_buckets_v2", "gpu_buckets")
    if op.get_context().dialect.name == "postgresql":
        op.execute("ALTER TABLE gpu_buckets RENAME CONSTRAINT pk_gpu_buckets_v2 TO pk_gpu_buckets")
        op.execute("ALTER TABLE gpu_buckets RENAME CONSTRAINT fk_gpu_buckets_v2_gpu_id "
                   "TO fk_gpu_buckets_gpu_id_telemetry_gpus")
