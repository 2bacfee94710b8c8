"""The judged aggregate: judged_hours (per GPU, clock hour, job key and threshold set the verdict sums of its
buckets), judged_dirty (hours written since they were judged) and judged_sets (the threshold set kept, from
which hour on). No data changes: the first official audit after the upgrade builds the aggregate from the
buckets of its window on (docs/performance.md "The judged aggregate").

Revision ID: 0015_judged_aggregate
Revises: 0014_observed_cover
Create Date: 2026-12-01
"""
import sqlalchemy as sa
from alembic import op

revision = "0015_judged_aggregate"
down_revision = "0014_observed_cover"
branch_labels = None
depends_on = None

#: the verdict sums of a judged_hours row (column, comment)
SUMS = [
    ('idle', 'Observed seconds judged idle (SM-verified).'),
    ('idle_by_util', 'Observed seconds judged idle by the GPU-Util fallback.'),
    ('mirage', 'Observed seconds judged mirage.'),
    ('low', 'Observed seconds judged low.'),
    ('working', 'Observed seconds judged working.'),
    ('busy_unverified', 'Observed seconds judged busy-unverified (no SM activity, not idle by GPU-Util).'),
    ('gpu_util', 'Sum of observed seconds x GPU-Util.'),
    ('util_observed', 'Observed seconds of rows that had GPU-Util.'),
    ('sm', 'Sum of observed seconds x SM activity.'),
    ('sm_observed', 'Observed seconds of rows that had SM activity.'),
    ('tensor', 'Sum of observed seconds x Tensor activity.'),
    ('dram', 'Sum of observed seconds x DRAM activity.'),
    ('io_bps', 'Sum of observed seconds x (PCIe + NVLink bytes/s).'),
    ('peak_fb', 'Peak frame buffer used in observed rows, MiB.'),
    ('idle_fb', 'Peak frame buffer used in idle, idle-by-util or mirage rows, MiB.'),
    ('mirage_util', 'Sum over mirage rows of observed seconds x GPU-Util.'),
    ('mirage_power', 'Sum over mirage rows of observed seconds x power (W).'),
    ('mirage_power_observed', 'Observed mirage seconds with a power reading.'),
    ('energy', 'Sum of observed seconds x power (W): joules.'),
    ('power_observed', 'Observed seconds with a power reading.'),
    ('idle_energy', 'Sum over idle, idle-by-util and mirage rows of observed seconds x power (W).'),
    ('idle_power_observed', 'Idle, idle-by-util and mirage seconds with a power reading.'),
]


def upgrade() -> None:
    op.create_table(
        "judged_hours",
        sa.Column("ths", sa.String(length=16), nullable=False,
                  comment='Threshold-set hash: the first 16 hex digits of the SHA-256 of the verdict SQL that judged the row (the thresholds and the rules); one set is kept, the one of the latest official audit.'),
        sa.Column("gpu_id", sa.Integer(), autoincrement=False, nullable=False,
                  comment='telemetry_gpus.id (no foreign key: the id comes from gpu_buckets, and no code deletes telemetry_gpus rows).'),
        sa.Column("hour", sa.Integer(), autoincrement=False, nullable=False,
                  comment='Clock hour: bucket_ts / 3600 of the buckets judged (UTC epoch hours).'),
        sa.Column("job", sa.String(length=512), nullable=False,
                  comment="Job key: '' = the unlabelled rows of buckets without a labelled sibling; else the rows with exactly this job label (an allocation with that job key reads both)."),
        *[sa.Column(name, sa.Float(), nullable=True, comment=text) for name, text in SUMS],
        sa.PrimaryKeyConstraint("ths", "gpu_id", "hour", "job", name=op.f("pk_judged_hours")),
        sqlite_with_rowid=False,
        comment="The judged aggregate: per GPU, clock hour, job key and threshold set the verdict sums of its buckets, each bucket seen whole (an allocation holding the whole hour). The audit reads an allocation's whole hours here and judges only its partial edge hours from gpu_buckets; hours listed in judged_dirty are judged from gpu_buckets until re-judged.",
    )
    op.create_table(
        "judged_dirty",
        sa.Column("gpu_id", sa.Integer(), autoincrement=False, nullable=False,
                  comment='telemetry_gpus.id.'),
        sa.Column("hour", sa.Integer(), autoincrement=False, nullable=False,
                  comment='Clock hour (bucket_ts / 3600) whose buckets changed since judged_hours was judged.'),
        sa.Column("mark", sa.BigInteger(), nullable=False,
                  comment='Random token of the write that marked it: a re-judging clears only the marks it read.'),
        sa.Column("unfit", sa.Integer(), server_default="0", nullable=False,
                  comment="1: re-judged, but the hour holds a bucket crossing the hour's end or a comma-joined job label, so it stays judged from gpu_buckets (cleared by the next write to the hour)."),
        sa.PrimaryKeyConstraint("gpu_id", "hour", name=op.f("pk_judged_dirty")),
        sqlite_with_rowid=False,
        comment='Hours of telemetry written (ingest, roll-ups) and not yet re-judged into judged_hours.',
    )
    op.create_table(
        "judged_sets",
        sa.Column("ths", sa.String(length=16), nullable=False,
                  comment='Threshold-set hash (judged_hours.ths).'),
        sa.Column("from_hour", sa.Integer(), nullable=False,
                  comment='judged_hours holds this set for every hour from here on (earlier hours: gpu_buckets).'),
        sa.Column("built_ts", sa.Integer(), nullable=False,
                  comment='When the set was first built (UTC epoch seconds)'),
        sa.PrimaryKeyConstraint("ths", name=op.f("pk_judged_sets")),
        comment='The threshold set judged_hours holds, and from which hour on.',
    )


def downgrade() -> None:
    op.drop_table("judged_sets")
    op.drop_table("judged_dirty")
    op.drop_table("judged_hours")
