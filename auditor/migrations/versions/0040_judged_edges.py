"""Edges judged once: judged_edges keeps, per allocated GPU and edge (the partial clock hour at either end of
its reserved interval), the verdict sums of the edge's buckets as the audit judged them, with what they were
judged for (telemetry GPU, edge time, job key). An audit reads an allocated GPU's edges here while they still
match and no write marked their hours (judged_dirty; the re-judging of marked hours deletes the edges they
touch), so no bucket is judged twice across audits. No data changes: the next audit judges and keeps them.

Revision ID: 0040_judged_edges
Revises: 0039_pod_failure
Create Date: 2026-12-05
"""
import sqlalchemy as sa
from alembic import op

revision = "0040_judged_edges"
down_revision = "0039_pod_failure"
branch_labels = None
depends_on = None


#: the verdict sums of a row (column, comment): judged_hours' sums at this revision
SUMS = [
    ('idle', 'Observed seconds judged idle (SM-verified).'),
    ('idle_by_util', 'Observed seconds judged idle by the GPU-Util fallback.'),
    ('mirage', 'Observed seconds judged mirage.'),
    ('low', 'Observed seconds judged low.'),
    ('working', 'Observed seconds judged working.'),
    ('busy_unverified', 'Observed seconds judged busy-unverified (no SM activity, not idle by GPU-Util).'),
    ('idle_by_counters', 'Observed seconds judged idle on the stock counters (GR engine, Tensor, DRAM idle).'),
    ('busy_by_counters', 'Observed seconds judged busy on the stock counters (Tensor or DRAM active).'),
    ('engine_spin', 'Observed seconds judged an engine spin on the stock counters (GR engine busy, Tensor and DRAM idle).'),
    ('gpu_util', 'Sum of observed seconds x GPU-Util.'),
    ('util_observed', 'Observed seconds of rows that had GPU-Util.'),
    ('sm', 'Sum of observed seconds x SM activity.'),
    ('sm_observed', 'Observed seconds of rows that had SM activity.'),
    ('sm_exact', "Of sm_observed, the seconds whose SM activity came from DCGM 4.x's SM cycle counters (exact)."),
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
    ('memory', 'Observed seconds in the class memory-bound (where the waiting goes).'),
    ('communication', 'Observed seconds in the class communication wait (where the waiting goes).'),
    ('starved', 'Observed seconds in the class host/input wait (where the waiting goes).'),
    ('lead', 'Observed seconds of rows with SM activity that computed (SM >= working_sm) or ran the link saturated (PCIe + NVLink >= straggler_link_bps): when the GPU could lead its lockstep peers (stragglers).'),
    ('waitable', 'Observed seconds of rows with SM activity below straggler_peer_sm (stragglers).'),
    ('waits', 'Observed seconds of rows that wait on a lockstep peer: not computing nor running the link saturated, idle_sm <= SM activity < straggler_peer_sm (stragglers).'),
]


def upgrade() -> None:
    op.create_table(
        "judged_edges",
        sa.Column("ths", sa.String(length=16), nullable=False,
                  comment="Threshold-set hash (judged_hours.ths) the edge was judged under."),
        sa.Column("allocated_gpu_id", sa.Integer(), autoincrement=False, nullable=False,
                  comment="allocated_gpus.id (no foreign key: a row is read only while every column it was judged "
                  "for still matches)."),
        sa.Column("side", sa.Integer(), autoincrement=False, nullable=False,
                  comment="0: the head (buckets before the first whole hour), 1: the tail (after the last)."),
        sa.Column("gpu_id", sa.Integer(), nullable=False, comment="telemetry_gpus.id the edge was judged on."),
        sa.Column("edge_ts", sa.Integer(), nullable=False,
                  comment="The reserved interval's start (head) or end (tail) inside the audit window, UTC epoch "
                  "seconds, that the edge was judged for."),
        sa.Column("lo_hour", sa.Integer(), nullable=False,
                  comment="First clock hour of the buckets read (a mark on any hour in [lo_hour, hi_hour] deletes "
                  "the row)."),
        sa.Column("hi_hour", sa.Integer(), nullable=False, comment="Last clock hour of the buckets read."),
        sa.Column("jkey", sa.Text(), nullable=True, comment="The allocation's job key in telemetry labels."),
        sa.Column("lab", sa.Integer(), nullable=False,
                  comment="1 when the telemetry GPU had carried job labels (telemetry_gpus.has_jobs)."),
        *[sa.Column(name, sa.Float(), nullable=True, comment=text) for name, text in SUMS],
        sa.PrimaryKeyConstraint("ths", "allocated_gpu_id", "side", name=op.f("pk_judged_edges")),
        sqlite_with_rowid=False,
        comment="Edges judged once: per allocated GPU and edge the verdict sums of the buckets of its partial "
                "clock hours, read by later audits while the GPU, edge time, job key and thresholds match and no "
                "write marked those hours.",
    )
    op.create_index("ix_judged_edges_gpu_hour", "judged_edges", ["gpu_id", "lo_hour"])


def downgrade() -> None:
    op.drop_index("ix_judged_edges_gpu_hour", table_name="judged_edges")
    op.drop_table("judged_edges")
