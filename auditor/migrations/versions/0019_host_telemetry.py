"""node_buckets: what each node's host did per bucket (node_exporter: CPU cores busy, in I/O wait and pegged;
disk, InfiniBand, NFS and Lustre client traffic), for the host side of "Where the waiting goes" (issue 36).

Revision ID: 0019_host_telemetry
Revises: 0018_inference
Create Date: 2026-12-03
"""
import sqlalchemy as sa
from alembic import op

revision = "0019_host_telemetry"
down_revision = "0018_inference"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "node_buckets",
        sa.Column("cluster", sa.String(length=128), nullable=False, comment='Cluster name.'),
        sa.Column("node", sa.String(length=255), nullable=False,
                  comment='Node (host) name, as GPU telemetry and the schedulers name it: the key that ties the '
                          'bucket to the allocations on the node.'),
        sa.Column("start_ts", sa.Integer(), nullable=False, comment='Bucket start (UTC epoch seconds)'),
        sa.Column("seconds", sa.Integer(), nullable=False, comment='Bucket length, seconds (3600 once rolled up).'),
        sa.Column("samples", sa.Integer(), nullable=False,
                  comment="Samples of the exporter's CPU counters in the bucket (per series)."),
        sa.Column("observed_s", sa.Float(), nullable=True,
                  comment="Seconds of the bucket the exporter's samples covered (NULL: not known; the whole bucket "
                          "when samples > 0)."),
        sa.Column("cpus", sa.Float(), nullable=True, comment='CPU cores the exporter reports (mean over the bucket).'),
        sa.Column("cpu_busy", sa.Float(), nullable=True,
                  comment='Cores busy in user, nice, system, irq and softirq modes: the per-second rate of '
                          'node_cpu_seconds_total, mean over the bucket.'),
        sa.Column("cpu_iowait", sa.Float(), nullable=True,
                  comment='Cores idle in I/O wait (mode iowait), mean over the bucket; the share is cpu_iowait / '
                          'cpus.'),
        sa.Column("cpu_pegged", sa.Float(), nullable=True,
                  comment="Cores busy at least the connector's pegged_core_busy share of the bucket."),
        sa.Column("disk_read_bps", sa.Float(), nullable=True,
                  comment="Bytes/s read from local disks (node_disk_read_bytes_total, devices the connector's "
                          "disk_exclude does not drop)."),
        sa.Column("disk_write_bps", sa.Float(), nullable=True, comment='Bytes/s written to local disks.'),
        sa.Column("disk_busy", sa.Float(), nullable=True,
                  comment="0-1: the busiest local disk's share of the bucket with I/O in flight "
                          "(node_disk_io_time_seconds_total)."),
        sa.Column("ib_rx_bps", sa.Float(), nullable=True, comment='InfiniBand bytes/s received, all devices and ports.'),
        sa.Column("ib_tx_bps", sa.Float(), nullable=True,
                  comment='InfiniBand bytes/s transmitted, all devices and ports.'),
        sa.Column("nfs_read_bps", sa.Float(), nullable=True,
                  comment='Bytes/s read from NFS servers, all mounts (node_mountstats_nfs_total_read_bytes_total).'),
        sa.Column("nfs_write_bps", sa.Float(), nullable=True, comment='Bytes/s written to NFS servers, all mounts.'),
        sa.Column("nfs_ops", sa.Float(), nullable=True,
                  comment='NFS client requests/s, all procedures (node_nfs_requests_total).'),
        sa.Column("lustre_read_bps", sa.Float(), nullable=True,
                  comment='Lustre client bytes/s read (lustre_read_bytes_total, component client).'),
        sa.Column("lustre_write_bps", sa.Float(), nullable=True, comment='Lustre client bytes/s written.'),
        sa.PrimaryKeyConstraint("cluster", "node", "start_ts", name=op.f("pk_node_buckets")),
        comment="Per node and bucket: the host's CPU, I/O wait, disk, InfiniBand, NFS and Lustre client activity "
                "(node_exporter), per-second means; NULL = the exporter did not report it.",
    )
    with op.batch_alter_table("node_buckets", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_node_buckets_start_ts"), ["start_ts"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("node_buckets", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_node_buckets_start_ts"))
    op.drop_table("node_buckets")
