"""ib_port_buckets: per InfiniBand port (node, device, port) and bucket, the share of the bucket the port had
data to send and sent none (node_exporter's node_infiniband_port_transmit_wait_total) and the link errors
counted in it, for the congested link (issue 48 §2). No data changes: collection fills it.

Revision ID: 0041_ib_ports
Revises: 0040_judged_edges
Create Date: 2026-12-05
"""
import sqlalchemy as sa
from alembic import op

revision = "0041_ib_ports"
down_revision = "0040_judged_edges"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ib_port_buckets",
        sa.Column("cluster", sa.String(length=128), nullable=False, comment="Cluster name."),
        sa.Column("node", sa.String(length=255), nullable=False, comment="Node (host) name, as in node_buckets."),
        sa.Column("device", sa.String(length=64), nullable=False,
                  comment="InfiniBand device (HCA) as node_exporter labels it, e.g. mlx5_2."),
        sa.Column("port", sa.String(length=16), nullable=False, comment="Port number of the device, e.g. 1."),
        sa.Column("start_ts", sa.Integer(), nullable=False, comment="Bucket start (UTC epoch seconds)"),
        sa.Column("seconds", sa.Integer(), nullable=False, comment="Bucket length, seconds (3600 once rolled up)."),
        sa.Column("wait_share", sa.Float(), nullable=True,
                  comment="0-1: share of the bucket the port had data to send and sent none "
                  "(node_infiniband_port_transmit_wait_total ticks x 8 bytes / node_infiniband_rate_bytes_per_second; "
                  "docs/node-telemetry.md \"Per port\")."),
        sa.Column("link_errors", sa.Float(), nullable=True,
                  comment="Link errors counted in the bucket: the increase of symbol errors, link error recoveries, "
                  "links downed and received packets with errors."),
        sa.PrimaryKeyConstraint("cluster", "node", "device", "port", "start_ts", name=op.f("pk_ib_port_buckets")),
        comment="Per InfiniBand port and bucket: its transmit wait share and link errors (node_exporter); NULL = not "
                "measured.",
    )
    with op.batch_alter_table("ib_port_buckets", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_ib_port_buckets_start_ts"), ["start_ts"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("ib_port_buckets", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ib_port_buckets_start_ts"))
    op.drop_table("ib_port_buckets")
