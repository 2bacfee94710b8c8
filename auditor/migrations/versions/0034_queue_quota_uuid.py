"""Kubernetes queues and DRA devices (issue 42): gpu_quotas.kind gains ``queue`` (a Kueue ClusterQueue, KAI-Scheduler
or Volcano queue's GPU quota, counted against the allocations of that partition) and usage_gpu.attribution gains
``uuid`` (an allocated GPU tied to its telemetry GPU by the UUID the scheduler gave: a DRA device's). Only the
column comments change (the columns are free text); SQLite keeps no comments.

Revision ID: 0034_queue_quota_uuid
Revises: 0033_sm_exact
Create Date: 2026-12-05
"""
from alembic import op

revision = "0034_queue_quota_uuid"
down_revision = "0033_sm_exact"
branch_labels = None
depends_on = None

#: (table, column, comment before, comment now)
COMMENTS = [
    ("gpu_quotas", "kind",
     "qos (Slurm QOS GrpTRES) or account (Slurm association GrpTRES of an account): which allocations count "
     "against it.",
     "qos (Slurm QOS GrpTRES), account (Slurm association GrpTRES of an account) or queue (a Kubernetes queue's "
     "GPU quota: Kueue ClusterQueue, KAI-Scheduler or Volcano queue; the allocations of that partition): which "
     "allocations count against it."),
    ("gpu_quotas", "name", "QOS or account name.", "QOS, account or queue name."),
    ("usage_gpu", "attribution",
     "index (node+GPU from the scheduler), label (telemetry labels), node (whole node) or unattributed.",
     "index (node+GPU from the scheduler), uuid (the GPU's UUID from the scheduler, e.g. a DRA device), label "
     "(telemetry labels), node (whole node) or unattributed."),
]


def _set(which: int) -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    for row in COMMENTS:
        table, column, text = row[0], row[1], row[which]
        op.execute(f"COMMENT ON COLUMN {table}.{column} IS '" + text.replace("'", "''") + "'")


def upgrade() -> None:
    _set(3)


def downgrade() -> None:
    _set(2)
