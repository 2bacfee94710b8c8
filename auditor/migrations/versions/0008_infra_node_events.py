"""infra: node_events (XID errors, fault throttling, ECC/row-remap faults, drained/down/NotReady/cordoned
nodes) and the infra_s sum of usage_gpu/usage_allocation (infrastructure-affected reserved time, its own
class, never idle). Existing audit runs read 0: re-run an audit.

Revision ID: 0008_infra
Revises: 0007_waste
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op

revision = "0008_infra"
down_revision = "0007_waste"
branch_labels = None
depends_on = None

INFRA = ("Infrastructure-affected GPU-seconds: reserved time inside a node event (XID error, fault "
         "throttling, ECC/row-remap fault, drained/down/NotReady/cordoned node); judged by no other "
         "class, never idle, billed in its own column.")


def upgrade() -> None:
    op.create_table(
        "node_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False, comment="Surrogate key."),
        sa.Column("cluster", sa.String(length=128), nullable=False, comment="Cluster name."),
        sa.Column("node", sa.Text(), nullable=False,
                  comment="Node name as the scheduler or telemetry names it."),
        sa.Column("gpu_index", sa.Integer(), nullable=False,
                  comment="GPU index the event is about; -1 = the whole node."),
        sa.Column("kind", sa.String(length=16), nullable=False,
                  comment="xid, throttle, ecc_dbe, row_remap (GPU faults from telemetry), drain, down (Slurm), "
                          "not_ready, cordoned (Kubernetes)."),
        sa.Column("start_ts", sa.Integer(), nullable=False, comment="Start of the interval (UTC epoch seconds)"),
        sa.Column("end_ts", sa.Integer(), nullable=True,
                  comment="End of the interval; NULL while ongoing (UTC epoch seconds)"),
        sa.Column("reason", sa.Text(), nullable=False,
                  comment="Why: the scheduler's reason (Slurm drain reason, Kubernetes condition message) or "
                          "the fault (e.g. XID 79)."),
        sa.Column("source", sa.String(length=32), nullable=False,
                  comment="sacctmgr, sinfo, kubernetes, dcgm, ..."),
        sa.Column("first_seen_ts", sa.Integer(), nullable=True,
                  comment="First collection that reported it (UTC epoch seconds)"),
        sa.Column("last_seen_ts", sa.Integer(), nullable=True,
                  comment="Latest collection that reported it (UTC epoch seconds)"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_node_events")),
        sa.UniqueConstraint("cluster", "node", "gpu_index", "kind", "start_ts",
                            name=op.f("uq_node_events_cluster_node_gpu_index_kind_start_ts")),
        comment="Infrastructure events: intervals when a node or GPU was faulty or taken out of service. "
                "Reserved time inside one is infrastructure-affected (infra_s), never idle.",
    )
    for table in ("usage_gpu", "usage_allocation"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("infra_s", sa.Float(), server_default="0", nullable=False,
                                          comment=INFRA))


def downgrade() -> None:
    for table in ("usage_allocation", "usage_gpu"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("infra_s")
    op.drop_table("node_events")
