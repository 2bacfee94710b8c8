"""Judged once: the observed seconds of the classes memory-bound, communication wait and host/input wait of
"where the waiting goes" (auditor/audit/waiting.py ``class_case``) and of the rows that could lead a lockstep
job or wait on it (the straggler rule's candidates) as sums of judged_hours and columns of usage_gpu, so the
audit reads them with the verdict sums instead of classifying every bucket a second time. No data changes:
the changed verdict SQL is a new threshold set, so the next official audit rebuilds judged_hours.

Revision ID: 0023_judged_classes
Revises: 0022_shards
Create Date: 2026-12-04
"""
import sqlalchemy as sa
from alembic import op

revision = "0023_judged_classes"
down_revision = "0022_shards"
branch_labels = None
depends_on = None

#: judged_hours columns (column, comment)
JUDGED = [
    ("memory", "Observed seconds in the class memory-bound (where the waiting goes)."),
    ("communication", "Observed seconds in the class communication wait (where the waiting goes)."),
    ("starved", "Observed seconds in the class host/input wait (where the waiting goes)."),
    ("lead", "Observed seconds of rows with SM activity that computed (SM >= working_sm) or ran the link saturated "
             "(PCIe + NVLink >= straggler_link_bps): when the GPU could lead its lockstep peers (stragglers)."),
    ("waitable", "Observed seconds of rows with SM activity below straggler_peer_sm (stragglers)."),
    ("waits", "Observed seconds of rows that wait on a lockstep peer: not computing nor running the link saturated, "
              "idle_sm <= SM activity < straggler_peer_sm (stragglers)."),
]
#: usage_gpu columns (column, comment)
USAGE = [
    ("memory_s", "GPU-seconds memory-bound: SM below working_sm, DRAM activity >= hint_dram_high (times share)."),
    ("communication_s", "GPU-seconds waiting on communication: SM below working_sm, DRAM not high, PCIe + NVLink "
                        ">= hint_io_bps (times share)."),
    ("starved_s", "GPU-seconds waiting on the host: SM below working_sm, DRAM and links measured and quiet "
                  "(times share)."),
    ("lead_s", "GPU-seconds the GPU computed (SM >= working_sm) or ran its link saturated (PCIe + NVLink >= "
               "straggler_link_bps): when it could lead its lockstep peers (times share)."),
    ("waitable_s", "GPU-seconds with SM activity below straggler_peer_sm (times share)."),
    ("waits_s", "GPU-seconds the GPU waited on a lockstep peer: not computing nor running its link saturated, "
                "idle_sm <= SM activity < straggler_peer_sm (times share)."),
]


def upgrade() -> None:
    with op.batch_alter_table("judged_hours", schema=None) as batch_op:
        for name, text in JUDGED:
            batch_op.add_column(sa.Column(name, sa.Float(), nullable=True, comment=text))
    with op.batch_alter_table("usage_gpu", schema=None) as batch_op:
        for name, text in USAGE:
            batch_op.add_column(sa.Column(name, sa.Float(), nullable=False, server_default="0", comment=text))


def downgrade() -> None:
    with op.batch_alter_table("usage_gpu", schema=None) as batch_op:
        for name, _text in USAGE:
            batch_op.drop_column(name)
    with op.batch_alter_table("judged_hours", schema=None) as batch_op:
        for name, _text in JUDGED:
            batch_op.drop_column(name)
