"""SM activity from DCGM 4.x's cycle counters (issue 43): gpu_buckets.sm_exact says which buckets' SM activity
is exact (the increase of DCGM_FI_PROF_SM_CYCLES_ACTIVE_TOTAL over _ELAPSED_TOTAL) rather than sampled, and the
audit sums the exact seconds (judged_hours.sm_exact, usage_gpu/usage_allocation.sm_exact_s) so a finding's
evidence says how much of its SM activity is exact. No data changes: buckets stored before had no counters
(NULL reads as not exact), and the changed verdict SQL is a new threshold set, so the next official audit
rebuilds judged_hours.

Revision ID: 0033_sm_exact
Revises: 0032_sluid
Create Date: 2026-12-05
"""
import sqlalchemy as sa
from alembic import op

revision = "0033_sm_exact"
down_revision = "0032_sluid"
branch_labels = None
depends_on = None

BUCKETS = ("sm_exact", "Share of the row's SM activity taken from DCGM 4.x's SM cycle counters (exact: their "
           "increase over the bucket) instead of sampled SM_ACTIVE readings: 1 or 0 as collected, the observed-seconds "
           "weighted share in a rolled-up hour; NULL without SM activity.")
JUDGED = ("sm_exact", "Of sm_observed, the seconds whose SM activity came from DCGM 4.x's SM cycle counters (exact).")
USAGE = ("sm_exact_s", "Of sm_observed_s, the seconds whose SM activity is exact: taken from DCGM 4.x's SM cycle "
         "counters, not sampled (times share).")


def upgrade() -> None:
    # PostgreSQL: gpu_buckets is partitioned; a column added to the parent reaches every partition
    with op.batch_alter_table("gpu_buckets", schema=None) as batch_op:
        batch_op.add_column(sa.Column(BUCKETS[0], sa.Float(), nullable=True, comment=BUCKETS[1]))
    with op.batch_alter_table("judged_hours", schema=None) as batch_op:
        batch_op.add_column(sa.Column(JUDGED[0], sa.Float(), nullable=True, comment=JUDGED[1]))
    for table in ("usage_gpu", "usage_allocation"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column(USAGE[0], sa.Float(), nullable=False, server_default="0", comment=USAGE[1]))


def downgrade() -> None:
    for table in ("usage_allocation", "usage_gpu"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column(USAGE[0])
    with op.batch_alter_table("judged_hours", schema=None) as batch_op:
        batch_op.drop_column(JUDGED[0])
    with op.batch_alter_table("gpu_buckets", schema=None) as batch_op:
        batch_op.drop_column(BUCKETS[0])
