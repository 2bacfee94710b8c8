"""ib_port_buckets.ecn_share: on a RoCE port, the share of the packets it received that a switch marked congested
(node_exporter's node_infiniband_np_ecn_marked_roce_packets_received_total over
node_infiniband_port_packets_received_total), the congested link of a RoCE fabric (issue 48). No data changes:
collection fills it.

Revision ID: 0042_roce_ecn
Revises: 0041_ib_ports
Create Date: 2026-12-06
"""
import sqlalchemy as sa
from alembic import op

revision = "0042_roce_ecn"
down_revision = "0041_ib_ports"
branch_labels = None
depends_on = None

OLD_COMMENT = ("Per InfiniBand port and bucket: its transmit wait share and link errors (node_exporter); NULL = not "
               "measured.")
NEW_COMMENT = ("Per InfiniBand or RoCE port and bucket: its transmit wait share, link errors and ECN-marked share "
               "(node_exporter); NULL = not measured.")


def upgrade() -> None:
    with op.batch_alter_table("ib_port_buckets", schema=None) as batch_op:
        batch_op.add_column(sa.Column(
            "ecn_share", sa.Float(), nullable=True,
            comment="0-1, RoCE: share of the packets the port received that a switch marked congested "
            "(node_infiniband_np_ecn_marked_roce_packets_received_total / node_infiniband_port_packets_received_total; "
            "docs/node-telemetry.md \"Per port\")."))
    if op.get_bind().dialect.name != "sqlite":  # SQLite keeps no comments
        op.create_table_comment("ib_port_buckets", NEW_COMMENT, existing_comment=OLD_COMMENT)


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        op.create_table_comment("ib_port_buckets", OLD_COMMENT, existing_comment=NEW_COMMENT)
    with op.batch_alter_table("ib_port_buckets", schema=None) as batch_op:
        batch_op.drop_column("ecn_share")
