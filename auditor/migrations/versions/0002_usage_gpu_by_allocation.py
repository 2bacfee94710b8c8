"""usage_gpu by (run, allocation): findings and sparklines look up an allocation's GPUs in one run

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("usage_gpu", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_usage_gpu_run_id_allocation_id"), ["run_id", "allocation_id"],
                              unique=False)


def downgrade() -> None:
    with op.batch_alter_table("usage_gpu", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_usage_gpu_run_id_allocation_id"))
