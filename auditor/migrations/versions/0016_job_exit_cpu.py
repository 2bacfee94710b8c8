"""allocations.exit_code, cpus and cpu_time_s: what Slurm accounting says of a finished job's host side (sacct
ExitCode, the cpu count of AllocTRES, TotalCPU), shown by `gpu-audit job` and the web allocation page as the
exit code and the CPU efficiency jobstats and seff show. NULL where the source does not say (Kubernetes pods,
rows stored before this revision): the job view then says "not collected".

Revision ID: 0016_job_exit_cpu
Revises: 0015_judged_aggregate
Create Date: 2026-12-01
"""
import sqlalchemy as sa
from alembic import op

revision = "0016_job_exit_cpu"
down_revision = "0015_judged_aggregate"
branch_labels = None
depends_on = None

EXIT_CODE = ("Slurm ExitCode of the job, return code:signal (e.g. 0:0, 1:0, 0:9); NULL when the source "
             "does not say.")
CPUS = "CPUs allocated (the cpu count of Slurm's AllocTRES); NULL when the source does not say."
CPU_TIME = ("CPU seconds the job used (Slurm TotalCPU: user + system over its steps); NULL when the source "
            "does not say or reports 0 for a job that ran (sacct -X may leave it empty).")


def upgrade() -> None:
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("exit_code", sa.Text(), nullable=True, comment=EXIT_CODE))
        batch_op.add_column(sa.Column("cpus", sa.Integer(), nullable=True, comment=CPUS))
        batch_op.add_column(sa.Column("cpu_time_s", sa.Float(), nullable=True, comment=CPU_TIME))


def downgrade() -> None:
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.drop_column("cpu_time_s")
        batch_op.drop_column("cpus")
        batch_op.drop_column("exit_code")
