"""waste: usage_gpu/usage_allocation gain the sums that split a mirage (mean GPU-Util and power while
mirage: hung_collective, ghost_busy) and the energy sums (measured joules and the seconds they cover, of all
observed time and of idle time). Existing audit runs read 0 (no power was summed then): re-run an audit.

Revision ID: 0007_waste
Revises: 0006_faults
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op

revision = "0007_waste"
down_revision = "0006_faults"
branch_labels = None
depends_on = None

COLUMNS = [
    ("mirage_util_s", "Sum over mirage buckets of observed seconds x GPU-Util (mean GPU-Util while mirage; "
                      "hung_collective, ghost_busy)."),
    ("mirage_power_s", "Sum over mirage buckets with power of observed seconds x power (W): joules."),
    ("mirage_power_observed_s", "Observed mirage seconds that had a power reading."),
    ("energy_s", "Sum of observed seconds x power (W) x share: measured joules."),
    ("power_observed_s", "Observed seconds that had a power reading (the rest of reserved time is estimated "
                         "from the model's idle power)."),
    ("idle_energy_s", "Sum over idle, idle-by-util and mirage buckets of observed seconds x power: joules."),
    ("idle_power_observed_s", "Idle, idle-by-util and mirage seconds that had a power reading."),
]


def upgrade() -> None:
    for table in ("usage_gpu", "usage_allocation"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            for name, comment in COLUMNS:
                batch_op.add_column(sa.Column(name, sa.Float(), server_default="0", nullable=False,
                                              comment=comment))


def downgrade() -> None:
    for table in ("usage_allocation", "usage_gpu"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            for name, _comment in reversed(COLUMNS):
                batch_op.drop_column(name)
