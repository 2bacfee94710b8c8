"""allocations.restarts: how many times the scheduler restarted (requeued) a job, as Slurm reports it
(scontrol Restarts, squeue --json restart_cnt), or a pod's container restarts. Slurm resets a requeued
job's submit time, so each run is its own stored instance; this count also covers runs never collected. Read by the goodput rules
(auditor/audit/goodput.py). NULL where the source does not say (sacct, rows stored before this revision).

Revision ID: 0017_goodput
Revises: 0016_job_exit_cpu
Create Date: 2026-12-02
"""
import sqlalchemy as sa
from alembic import op

revision = "0017_goodput"
down_revision = "0016_job_exit_cpu"
branch_labels = None
depends_on = None

RESTARTS = ("Times the scheduler restarted the job (Slurm Restarts, squeue --json restart_cnt: requeues, each a "
            "new run with its own submit time; Kubernetes: the pod's container restarts, the sum of "
            "restartCount); NULL when the source does not say.")


def upgrade() -> None:
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("restarts", sa.Integer(), nullable=True, comment=RESTARTS))


def downgrade() -> None:
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.drop_column("restarts")
