"""Evidence tiers (issue 42): a GPU without SM activity is judged on the stock counters the GPU Operator's
dcgm-exporter ships (GR engine, Tensor, DRAM) before GPU-Util. usage_gpu and usage_allocation gain the
seconds of the three stock-counter verdicts (idle-by-counters, busy-by-counters, engine spin), judged_hours
their sums; idle_s and observed_s say they include them, usage_gpu.signal names the counters tier. No data
changes: the changed verdict SQL is a new threshold set, so the next official audit rebuilds judged_hours.

Revision ID: 0036_stock_counters
Revises: 0035_starved_gpus
Create Date: 2026-12-05
"""
import sqlalchemy as sa
from alembic import op

revision = "0036_stock_counters"
down_revision = "0035_starved_gpus"
branch_labels = None
depends_on = None

#: judged_hours columns (column, comment)
JUDGED = [
    ("idle_by_counters", "Observed seconds judged idle on the stock counters (GR engine, Tensor, DRAM idle)."),
    ("busy_by_counters", "Observed seconds judged busy on the stock counters (Tensor or DRAM active)."),
    ("engine_spin", "Observed seconds judged an engine spin on the stock counters (GR engine busy, Tensor and DRAM "
                    "idle)."),
]
#: usage_gpu and usage_allocation columns (column, comment)
USAGE = [
    ("idle_by_counters_s", "Of idle_s, judged on the stock counters (no SM activity): GR engine, Tensor and DRAM "
                           "activity all below their idle thresholds."),
    ("busy_by_counters_s", "GPU-seconds judged busy on the stock counters (no SM activity): Tensor or DRAM "
                           "activity at or above its idle threshold."),
    ("engine_spin_s", "GPU-seconds judged an engine spin on the stock counters (no SM activity): GR engine busy, "
                      "Tensor and DRAM idle; a spin or a wait, never verified work, not billed as idle."),
]
#: usage columns whose comment changes: name -> (old, new)
COMMENTS = {
    "observed_s": ("Reserved GPU-seconds covered by samples (coverage = observed/reserved); SM-verified "
                   "(sm_observed_s) plus GPU-Util-only (idle_by_util_s + busy_unverified_s).",
                   "Reserved GPU-seconds covered by samples (coverage = observed/reserved); SM-verified "
                   "(sm_observed_s) plus stock counters (idle_by_counters_s + busy_by_counters_s + engine_spin_s) "
                   "plus GPU-Util-only (idle_by_util_s + busy_unverified_s)."),
    "idle_s": ("GPU-seconds judged idle (idle-by-util included).",
               "GPU-seconds judged idle (idle-by-util and idle-by-counters included)."),
}
SIGNAL = ("What judged it: sm_active, gpu_util (low confidence) or none.",
          "The strongest evidence tier that judged it: sm_active (verified), counters (the stock GR engine, Tensor "
          "and DRAM counters), gpu_util (low confidence) or none.")


def upgrade() -> None:
    with op.batch_alter_table("judged_hours", schema=None) as batch_op:
        for name, text in JUDGED:
            batch_op.add_column(sa.Column(name, sa.Float(), nullable=True, comment=text))
    for table in ("usage_gpu", "usage_allocation"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            for name, text in USAGE:
                batch_op.add_column(sa.Column(name, sa.Float(), nullable=False, server_default="0", comment=text))
            for name, (old, new) in COMMENTS.items():
                batch_op.alter_column(name, existing_type=sa.Float(), existing_nullable=False, comment=new,
                                      existing_comment=old)
            if table == "usage_gpu":
                batch_op.alter_column("signal", existing_type=sa.String(length=16), existing_nullable=True,
                                      comment=SIGNAL[1], existing_comment=SIGNAL[0])


def downgrade() -> None:
    for table in ("usage_allocation", "usage_gpu"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            if table == "usage_gpu":
                batch_op.alter_column("signal", existing_type=sa.String(length=16), existing_nullable=True,
                                      comment=SIGNAL[0], existing_comment=SIGNAL[1])
            for name, (old, new) in COMMENTS.items():
                batch_op.alter_column(name, existing_type=sa.Float(), existing_nullable=False, comment=old,
                                      existing_comment=new)
            for name, _text in USAGE:
                batch_op.drop_column(name)
    with op.batch_alter_table("judged_hours", schema=None) as batch_op:
        for name, _text in JUDGED:
            batch_op.drop_column(name)
