"""Kueue's reserved quota (issue 42): gpu_quotas gains reserved_gpus, the GPUs of a queue's quota reserved for
admitted workloads at the latest sighting (Kueue ClusterQueue status.flavorsUsage), read beside the nominal
quota by the idle-quota finding (reserved but unused). NULL for existing rows and where the system does not say.

Revision ID: 0037_quota_reserved
Revises: 0036_stock_counters
Create Date: 2026-12-05
"""
import sqlalchemy as sa
from alembic import op

revision = "0037_quota_reserved"
down_revision = "0036_stock_counters"
branch_labels = None
depends_on = None

COMMENT = ("GPUs of it reserved for admitted workloads at the latest sighting (Kueue ClusterQueue "
           "status.flavorsUsage, borrowed included); NULL where the system does not say.")


def upgrade() -> None:
    with op.batch_alter_table("gpu_quotas", schema=None) as batch_op:
        batch_op.add_column(sa.Column("reserved_gpus", sa.Float(), nullable=True, comment=COMMENT))


def downgrade() -> None:
    with op.batch_alter_table("gpu_quotas", schema=None) as batch_op:
        batch_op.drop_column("reserved_gpus")
