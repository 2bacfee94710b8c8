"""queue: GPU jobs that waited (gpu_waits) and GPU quotas (gpu_quotas), for the opportunity-cost findings
idle_while_queued and idle_quota.

Revision ID: 0009_queue
Revises: 0008_infra
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op

revision = "0009_queue"
down_revision = "0008_infra"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpu_waits",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False,
                  comment='Surrogate key.'),
        sa.Column("cluster", sa.String(length=128), nullable=False,
                  comment='Cluster name.'),
        sa.Column("source", sa.String(length=16), nullable=False,
                  comment='slurm or kubernetes.'),
        sa.Column("external_id", sa.Text(), nullable=False,
                  comment='Slurm job id or Kubernetes pod UID.'),
        sa.Column("instance_ts", sa.Integer(), server_default="0", nullable=False,
                  comment='Which job of that id: its submit time (UTC epoch seconds; the eligible time when the scheduler gave no submit time), as in allocations.'),
        sa.Column("name", sa.Text(), nullable=False,
                  comment='Job or pod name (user-controlled text).'),
        sa.Column("user_name", sa.Text(), nullable=False,
                  comment='Owner user.'),
        sa.Column("account", sa.Text(), nullable=False,
                  comment='Slurm account or Kubernetes namespace.'),
        sa.Column("partition", sa.Text(), nullable=False,
                  comment="Slurm partition it waited in; '' for Kubernetes (the cluster is one queue)."),
        sa.Column("qos", sa.Text(), nullable=False,
                  comment='Slurm QOS.'),
        sa.Column("state", sa.Text(), nullable=False,
                  comment='Scheduler state when last seen, e.g. PENDING.'),
        sa.Column("gpus", sa.Float(), nullable=False,
                  comment='GPUs requested.'),
        sa.Column("submit_ts", sa.Integer(), nullable=True,
                  comment='Submission time (UTC epoch seconds)'),
        sa.Column("eligible_ts", sa.Integer(), nullable=False,
                  comment="When it could have started (Slurm Eligible; a Pending pod's creation) (UTC epoch seconds)"),
        sa.Column("end_ts", sa.Integer(), nullable=True,
                  comment='When the wait ended: the job started, or left the queue without starting; NULL while it waits (the audit then ends the wait at last_seen_ts) (UTC epoch seconds)'),
        sa.Column("first_seen_ts", sa.Integer(), nullable=True,
                  comment='First sighting (UTC epoch seconds)'),
        sa.Column("last_seen_ts", sa.Integer(), nullable=True,
                  comment='Latest sighting (UTC epoch seconds)'),
        sa.PrimaryKeyConstraint('id', name=op.f("pk_gpu_waits")),
        sa.UniqueConstraint('cluster', 'source', 'external_id', 'instance_ts', name=op.f("uq_gpu_waits_cluster_source_external_id_instance_ts")),
        comment='GPU jobs and pods that waited for GPUs (pending), one row per job: the demand idle GPUs blocked (finding idle_while_queued).',
    )
    with op.batch_alter_table("gpu_waits", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_gpu_waits_cluster_eligible_ts"), ['cluster', 'eligible_ts'], unique=False)
    op.create_table(
        "gpu_quotas",
        sa.Column("cluster", sa.String(length=128), nullable=False,
                  comment='Cluster name.'),
        sa.Column("kind", sa.String(length=16), nullable=False,
                  comment='qos (Slurm QOS GrpTRES) or account (Slurm association GrpTRES of an account): which allocations count against it.'),
        sa.Column("name", sa.String(length=255), nullable=False,
                  comment='QOS or account name.'),
        sa.Column("gpus", sa.Float(), nullable=False,
                  comment='GPUs the quota allows at once (gres/gpu=N).'),
        sa.Column("first_seen_ts", sa.Integer(), nullable=True,
                  comment='First sighting (UTC epoch seconds)'),
        sa.Column("last_seen_ts", sa.Integer(), nullable=True,
                  comment='Latest sighting (UTC epoch seconds)'),
        sa.PrimaryKeyConstraint('cluster', 'kind', 'name', name=op.f("pk_gpu_quotas")),
        comment='GPU quotas held by teams or queues, with their latest definition (finding idle_quota).',
    )


def downgrade() -> None:
    with op.batch_alter_table("gpu_waits", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_gpu_waits_cluster_eligible_ts"))
    op.drop_table("gpu_waits")
    op.drop_table("gpu_quotas")
