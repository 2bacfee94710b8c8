"""allocations.sluid: Slurm 25.11's SLUID of the run (a requeue gives the same job id a new one), read from
squeue/scontrol/slurmrestd (the job's SLUID) and sacct (OriginalSLUID, else SLUID). Enforcement's rule (c)
compares it with the live job's: a requeued job with the judged job id is another run. NULL where the source
or the Slurm release does not say (older Slurm, Kubernetes, rows stored before this revision).

Revision ID: 0032_sluid
Revises: 0031_drop_shards
Create Date: 2026-12-05
"""
import sqlalchemy as sa
from alembic import op

revision = "0032_sluid"
down_revision = "0031_drop_shards"
branch_labels = None
depends_on = None

SLUID = ("Slurm 25.11+ SLUID of this run of the job (s + 13 base-32 characters; squeue/scontrol SLUID, sacct "
         "OriginalSLUID, else SLUID): a requeue gives the same job id a new SLUID, and enforcement acts only on the "
         "run with the judged SLUID; NULL where the source or Slurm release does not say (older Slurm, Kubernetes).")


def upgrade() -> None:
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sluid", sa.Text(), nullable=True, comment=SLUID))


def downgrade() -> None:
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.drop_column("sluid")
