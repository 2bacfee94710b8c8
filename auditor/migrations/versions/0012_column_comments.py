"""Column comments on PostgreSQL as the models say them; findings.evidence no longer repeats the thresholds.

The models' comments of 21 columns (the usage sums, "observed" and "unknown" as defined since the verdict
sub-rows, findings.kind's newer kinds) had changed without a migration, so a PostgreSQL store described
them in the old words; SQLite keeps no comments, so the model/migration comparison could not see it
(tests/test_store.py now compares every comment on PostgreSQL).

Every finding's evidence carried the same 1.2 kB thresholds object, 60,000 copies per 16,384-GPU week
encoded one by one as the audit wrote them and stripped again by every export; they are the run's
(audit_runs.thresholds), stored once. Rows written before keep theirs; nothing reads them.

Revision ID: 0012_column_comments
Revises: 0011_audit_output_fks
Create Date: 2026-11-30
"""
from alembic import op

revision = "0012_column_comments"
down_revision = "0011_audit_output_fks"
branch_labels = None
depends_on = None

#: (table, column, comment before, comment now)
COMMENTS = [
    ('usage_gpu', 'observed_s',
     'Reserved GPU-seconds covered by telemetry samples.',
     'Reserved GPU-seconds covered by samples (coverage = observed/reserved); SM-verified '
     '(sm_observed_s) plus GPU-Util-only (idle_by_util_s + busy_unverified_s).'),
    ('usage_gpu', 'unknown_s',
     'GPU-seconds not judged: no samples, unattributed, or no usable signal.',
     'GPU-seconds without samples (or unattributed): reserved - observed - infra. Never idle.'),
    ('usage_gpu', 'effective_s',
     'Sum of overlap x SM activity x share: GPU-seconds of real work.',
     'Sum of observed seconds x SM activity x share: GPU-seconds of real work.'),
    ('usage_gpu', 'gpu_util_s',
     'Sum of overlap x GPU-Util (for the mean the dashboard shows).',
     'Sum of observed seconds x GPU-Util (for the mean the dashboard shows).'),
    ('usage_gpu', 'util_observed_s',
     'Overlap seconds of buckets that had GPU-Util.',
     'Observed seconds of buckets that had GPU-Util.'),
    ('usage_gpu', 'sm_s',
     'Sum of overlap x SM activity over buckets that had it.',
     'Sum of observed seconds x SM activity over buckets that had it.'),
    ('usage_gpu', 'sm_observed_s',
     'Overlap seconds of buckets that had SM activity.',
     'Observed seconds verified by SM activity (idle + mirage + low + working).'),
    ('usage_gpu', 'tensor_s',
     'Sum of overlap x Tensor activity.',
     'Sum of observed seconds x Tensor activity.'),
    ('usage_gpu', 'dram_s',
     'Sum of overlap x DRAM activity.',
     'Sum of observed seconds x DRAM activity.'),
    ('usage_gpu', 'io_bps_s',
     'Sum of overlap x (PCIe + NVLink bytes/s), for the input/communication-wait hint.',
     'Sum of observed seconds x (PCIe + NVLink bytes/s), for the input/communication-wait hint.'),
    ('usage_allocation', 'observed_s',
     'Reserved GPU-seconds covered by telemetry samples.',
     'Reserved GPU-seconds covered by samples (coverage = observed/reserved); SM-verified '
     '(sm_observed_s) plus GPU-Util-only (idle_by_util_s + busy_unverified_s).'),
    ('usage_allocation', 'unknown_s',
     'GPU-seconds not judged: no samples, unattributed, or no usable signal.',
     'GPU-seconds without samples (or unattributed): reserved - observed - infra. Never idle.'),
    ('usage_allocation', 'effective_s',
     'Sum of overlap x SM activity x share: GPU-seconds of real work.',
     'Sum of observed seconds x SM activity x share: GPU-seconds of real work.'),
    ('usage_allocation', 'gpu_util_s',
     'Sum of overlap x GPU-Util (for the mean the dashboard shows).',
     'Sum of observed seconds x GPU-Util (for the mean the dashboard shows).'),
    ('usage_allocation', 'util_observed_s',
     'Overlap seconds of buckets that had GPU-Util.',
     'Observed seconds of buckets that had GPU-Util.'),
    ('usage_allocation', 'sm_s',
     'Sum of overlap x SM activity over buckets that had it.',
     'Sum of observed seconds x SM activity over buckets that had it.'),
    ('usage_allocation', 'sm_observed_s',
     'Overlap seconds of buckets that had SM activity.',
     'Observed seconds verified by SM activity (idle + mirage + low + working).'),
    ('usage_allocation', 'tensor_s',
     'Sum of overlap x Tensor activity.',
     'Sum of observed seconds x Tensor activity.'),
    ('usage_allocation', 'dram_s',
     'Sum of overlap x DRAM activity.',
     'Sum of observed seconds x DRAM activity.'),
    ('usage_allocation', 'io_bps_s',
     'Sum of overlap x (PCIe + NVLink bytes/s), for the input/communication-wait hint.',
     'Sum of observed seconds x (PCIe + NVLink bytes/s), for the input/communication-wait hint.'),
    ('findings', 'kind',
     'idle_allocation, idle_gpus, util_mirage, idle_episode, low_efficiency, idle_reservation or unmonitored.',
     'idle_allocation, idle_gpus, util_mirage, hung_collective, ghost_busy, idle_episode, '
     'low_efficiency, idle_reservation, unmonitored, idle_while_queued or idle_quota (no allocation: '
     "account = the quota's account, evidence.quota)."),
    ('findings', 'evidence',
     'Metrics, window, thresholds, coverage and a sparkline.',
     "Metrics, window, coverage and a sparkline (the thresholds are the run's: audit_runs.thresholds)."),
]


def _set(which: int) -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    for row in COMMENTS:
        table, column, text = row[0], row[1], row[which]
        op.execute(f"COMMENT ON COLUMN {table}.{column} IS '" + text.replace("'", "''") + "'")


def upgrade() -> None:
    _set(3)


def downgrade() -> None:
    _set(2)
